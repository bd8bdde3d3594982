"""Tables of the gate's effect: the Δ matrix (Tables 2, 12), the budget axis (Table 13),
the task-label oracle gap (Table 14), best plain vs best gated evictor (Table 17), Δ across
(model, context) cells (Table 20), compression and static batching (Tables 22–23), each over
:func:`pagestats.replay.gated_outcomes` frames.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from pagestats import metrics
from pagestats.core import defaults, formulas
from pagestats.core.columns import MATRIX_CELL, MODEL_CELL, input_key, names_like, require_columns, rows_where
from pagestats.core.schema import INPUT_KEY
from pagestats.tables._common import group_tau, one_evictor, same_as

__all__ = [
    "delta_matrix_table",
    "delta_by_task_table",
    "budget_axis_table",
    "oracle_gap_table",
    "best_evictor_table",
    "cross_cell_table",
    "compression_table",
    "batching_table",
]

def _rest(rows, anchor):
    """The rows of the relation ``rows`` (gated rows) of the inputs outside the anchor: a filter in
    DuckDB, not a polars copy (at 1M inputs the gated rows are a gigabyte)."""
    return rows.filter(f"NOT ({metrics.capacity_sql(anchor)})")


def _rest_open(rows, like: pl.DataFrame, by, anchor) -> pl.DataFrame:
    """Gate-open fraction over the inputs outside the anchor in each group of the relation ``rows``
    (gated rows of ``like``), and whether it is 1."""
    po = metrics.on_rows(metrics.p_open, _rest(rows, anchor), like, by=by)
    return po.select(*by, pl.col("p_open").alias("p_open_rest"), (pl.col("k") == pl.col("n")).alias("identical"))


def delta_matrix_table(gated: pl.DataFrame, *, anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> pl.DataFrame:
    """Tables 2 and 12 (summary): Δ per (model, context, evictor) cell, with and without the
    capacity-bound anchor (the paper's "excluding NIAH-MK3"), the gate-open fraction on the other
    inputs, the identity marker, and the evictors whose outcomes are the same system.

    Parameters
    ----------
    gated : polars.DataFrame
    anchor : sequence of str or None
        The tasks left out of ``delta_rest`` (default :data:`pagestats.core.defaults.ANCHOR_TASKS`,
        NIAH-MK3; ``None``: the capacity-bound class).

    Returns
    -------
    polars.DataFrame
        ``model, context_length, evictor, delta`` (all tasks), ``delta_rest`` (the anchor's
        tasks excluded; null when only they are logged), ``n_inputs``,
        ``p_open_rest`` (gate-open fraction on the inputs outside the anchor) and
        ``identical`` (the gate opens on every input outside the anchor, so there gated ≡
        plain exactly and ``delta_rest`` is 0 by construction; the paper's † rows), and
        ``n_left_out``: the evictors of a (model, context) are compared on the same inputs
        (:func:`pagestats.metrics.equal_inputs`), and this many of the cell's logged inputs
        are not among them; ``same_as``: the other evictors of the (model, context) whose
        outcomes equal this one's on every evicting row (b < 1), so that their cells agree by
        construction, not as a finding (the paper's "Qwen2.5-14B H2O is not an independent cell";
        :func:`pagestats.metrics.identical_evictors`).

    References
    ----------
    PAGE §4.1 "Transfer Across Eviction Mechanisms", Table 2 (grand mean +22.9 pp; +4.5 pp
    excluding NIAH-MK3, exactly 0.000 in 8 of 16 cells), App. A.4.1, Table 12.
    """
    by = list(MATRIX_CELL)
    gated, left = metrics.equal_inputs(gated)
    rows = metrics.relation(gated)
    full = metrics.on_rows(metrics.delta, rows, gated, by=by)
    rest = metrics.on_rows(metrics.delta, _rest(rows, anchor), gated, by=by)  # no row outside: a null delta_rest
    out = (full.select(*by, "delta", "n_inputs").join(rest.select(*by, pl.col("delta").alias("delta_rest")), on=by,
                                                      how="left")
           .join(_rest_open(rows, gated, by, anchor), on=by, how="left").join(left, on=by, how="left")
           .join(same_as(rows, gated, by), on=by, how="left"))
    return out.select(*by, "delta", "delta_rest", "n_inputs", "n_left_out", "p_open_rest", "identical",
                      "same_as").sort(by)


def delta_by_task_table(gated: pl.DataFrame, *, anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> pl.DataFrame:
    """Table 12: per-task Δ (gated − plain, b < 1) for every matrix cell, with the
    per-task gate-open fraction and the cell's identity marker.

    Returns
    -------
    polars.DataFrame
        ``model, context_length, evictor, task, task_class, delta, n_inputs, p_open``
        (of the task's inputs) and ``identical`` (the cell's † marker of
        :func:`delta_matrix_table`: the gate opens on every input outside ``anchor``, the
        paper's "non-MK3 inputs").
    """
    by = [*MATRIX_CELL, "task", "task_class"]
    gated, _ = metrics.equal_inputs(gated)  # the evictors of a cell on the same inputs, as Table 2
    rows = metrics.relation(gated)
    d = metrics.on_rows(metrics.delta, rows, gated, by=by)
    po = metrics.on_rows(metrics.p_open, rows, gated, by=[*MODEL_CELL, "task"]).select(*MODEL_CELL, "task", "p_open")
    out = d.join(po, on=[*MODEL_CELL, "task"], how="left").join(_rest_open(rows, gated, list(MATRIX_CELL), anchor),
                                                                on=list(MATRIX_CELL), how="left")
    return out.select(*by, "delta", "n_inputs", "p_open", "identical").sort(by)


def budget_axis_table(gated: pl.DataFrame) -> pl.DataFrame:
    """Table 13: plain vs gated accuracy per budget, per (model, context, evictor), tasks pooled.

    Returns
    -------
    polars.DataFrame
        ``model, context_length, evictor, budget, n_inputs, acc_full, acc_plain,
        acc_gated, delta`` (:func:`pagestats.metrics.delta` with ``budget`` in ``by``),
        ``kept_kv_gated`` (:func:`pagestats.metrics.kept_kv`), ``same_as`` (the other evictors of the
        (model, context) whose outcomes equal this one's on every input at this budget, e.g. every
        evictor that keeps only the protected positions when ⌊b·T⌋ is below them:
        :func:`pagestats.metrics.identical_evictors`); budgets b < 1, each row one budget.

    References
    ----------
    PAGE App. A.4.1 "Budget convention", Table 13 (plain 0.88 → 0.19, gated 0.61–0.88).
    """
    by = [*MATRIX_CELL, "budget"]
    require_columns(gated, [*by, "score_full", "score_plain", "score_gated"], "budget_axis_table")
    read = [*input_key(gated), *by, "score_full", "score_plain", "score_gated", "n_kept_plain", "n_kept_gated", "n_tokens",
            "gate_open"]
    read = gated.select(read)  # the columns read; the rows b < 1, the evictors on the same inputs, not a copy
    rows = metrics.evicted_on_equal_inputs(read)
    acc = metrics.on_rows(metrics.accuracy, rows, read, by=by).drop("delta", "n_inputs")
    d = metrics.on_rows(metrics.delta, rows, read, by=by).select(*by, "delta", "n_inputs")
    kept = metrics.on_rows(metrics.kept_kv, rows, read, by=by).select(*by, pl.col("kept_kv").alias("kept_kv_gated"))
    out = acc.join(d, on=by).join(kept, on=by).join(same_as(rows, read, by), on=by, how="left")
    return out.select(*by, "n_inputs", "acc_full", "acc_plain", "acc_gated", "delta", "kept_kv_gated", "same_as").sort(by)


def oracle_gap_table(gated: pl.DataFrame, gated_oracle: pl.DataFrame) -> pl.DataFrame:
    """Table 14: Δ of the gate vs Δ of the task-label oracle per cell.

    Parameters
    ----------
    gated, gated_oracle : polars.DataFrame
        Gated outcomes under the policy and under the task-label oracle: the paper's closes on
        NIAH-MK3 and opens elsewhere (:func:`pagestats.metrics.task_oracle` of ``gated``;
        :class:`pagestats.replay.policies.TaskOracle` closes on the whole capacity-bound class).

    Returns
    -------
    polars.DataFrame
        :func:`pagestats.metrics.oracle_gap` columns plus ``same_decisions`` (the two
        policies take the same decision on every input of the cell, so the gap is exactly 0).
        The two policies are compared on the same inputs (a held-out pilot's inputs are
        left out of both, :func:`pagestats.metrics.same_inputs`), and the evictors of a
        (model, context) on the same inputs as in Table 2 (:func:`pagestats.metrics.equal_inputs`).

    References
    ----------
    PAGE §4.1, App. A.4.3, Table 14.
    """
    (gated, gated_oracle), _ = metrics.same_inputs(gated, gated_oracle)
    gated, _ = metrics.equal_inputs(gated)
    gated_oracle, _ = metrics.equal_inputs(gated_oracle)
    gap = names_like(metrics.oracle_gap(metrics.relation(gated), metrics.relation(gated_oracle), by=MATRIX_CELL), gated)
    key = [*INPUT_KEY, *MATRIX_CELL]
    a = gated.select(*key, "gate_open").unique()
    b = gated_oracle.select(*key, pl.col("gate_open").alias("_oracle")).unique()
    same = a.join(b, on=key).group_by(list(MATRIX_CELL)).agg((pl.col("gate_open") == pl.col("_oracle")).all().alias("same_decisions"))
    return gap.join(same, on=list(MATRIX_CELL), how="left").sort(list(MATRIX_CELL))


def best_evictor_table(gated: pl.DataFrame) -> pl.DataFrame:
    """Table 17: best plain evictor vs best gated evictor per (model, context).

    Accuracy of an arm is its mean score over inputs and budgets b < 1 (the Δ convention of
    Table 2); the best evictor of an arm maximises it (ties: first by name).

    Returns
    -------
    polars.DataFrame
        ``model, context_length, best_plain, acc_best_plain, best_gated, acc_best_gated,
        gain`` (= acc_best_gated − acc_best_plain), ``n_evictors``.
    """
    require_columns(gated, [*MATRIX_CELL, "budget", "score_full", "score_plain", "score_gated"], "best_evictor_table")
    gated, _ = metrics.equal_inputs(gated)  # the best evictor is chosen on the same inputs for all
    # the columns read, then the rows (a filter copies every column it keeps; a lazy query sums in another order)
    read = [*input_key(gated), *MATRIX_CELL, "budget", "score_full", "score_plain", "score_gated"]
    acc = metrics.on_frame(metrics.accuracy, rows_where(gated.select(read), formulas.EVICTED), by=MATRIX_CELL)
    acc = acc.select(*MATRIX_CELL, pl.col("acc_plain").alias("plain"), pl.col("acc_gated").alias("gated"))
    out = acc.group_by(list(MODEL_CELL), maintain_order=True).agg(
        pl.col("evictor").sort_by("plain", descending=True, maintain_order=True).first().alias("best_plain"),
        pl.col("plain").max().alias("acc_best_plain"),
        pl.col("evictor").sort_by("gated", descending=True, maintain_order=True).first().alias("best_gated"),
        pl.col("gated").max().alias("acc_best_gated"),
        pl.len().cast(pl.Int64).alias("n_evictors"),
    )
    out = out.with_columns((pl.col("acc_best_gated") - pl.col("acc_best_plain")).alias("gain"))
    return out.select(*MODEL_CELL, "best_plain", "acc_best_plain", "best_gated", "acc_best_gated", "gain",
                      "n_evictors").sort(list(MODEL_CELL))


def cross_cell_table(gated_fixed: pl.DataFrame, gated_calibrated: pl.DataFrame | None = None, *,
                     evictor: str | None = None, notes: pl.DataFrame | None = None) -> pl.DataFrame:
    """Table 20: Δ across (model, context) cells at the fixed τ and at the calibrated τ.

    Parameters
    ----------
    gated_fixed : polars.DataFrame
        Gated outcomes at the fixed τ.
    gated_calibrated : polars.DataFrame, optional
        Gated outcomes under a calibrated policy (the paper: the midpoint recipe, Eq. 5).
    evictor : str, optional
        Default the headline evictor.
    notes : polars.DataFrame, optional
        ``model, context_length, note``: why a cell has no calibrated τ (e.g. the rows of
        :meth:`pagestats.replay.Midpoint.shortfall`); adds a ``note`` column.

    Returns
    -------
    polars.DataFrame
        ``model, context_length, evictor, n_inputs, tau_fixed, delta_fixed, p_open_fixed``
        and, with a calibrated frame, ``tau_calibrated, delta_calibrated, p_open_calibrated``
        (null in a cell it does not calibrate); in a cell both frames hold, the two thresholds
        are compared on the same inputs (:func:`pagestats.metrics.same_inputs`).
    """
    # the columns read (the joins below copy what they keep)
    read = [*input_key(gated_fixed), *MODEL_CELL, "evictor", "budget", "tau", "gate_open", "score_plain", "score_gated"]
    sub, ev = one_evictor(gated_fixed.select(read), evictor)
    if gated_calibrated is not None:  # in the cells it calibrates, on the same inputs as the fixed τ
        gated_calibrated = rows_where(gated_calibrated.select(read), pl.col("evictor") == ev)
        cal_cells = gated_calibrated.select(pl.struct(MODEL_CELL)).to_series().unique().implode()
        calibrated = pl.struct(MODEL_CELL).is_in(cal_cells)  # rows_where: no copy when it calibrates every cell
        (both, gated_calibrated), _ = metrics.same_inputs(rows_where(sub, calibrated), gated_calibrated)
        sub = pl.concat([both, rows_where(sub, ~calibrated)])

    def arm(frame, suffix):
        d = metrics.on_frame(metrics.delta, frame, by=MODEL_CELL).select(
            *MODEL_CELL, "n_inputs", pl.col("delta").alias(f"delta_{suffix}"))
        po = metrics.on_frame(metrics.p_open, frame, by=MODEL_CELL).select(
            *MODEL_CELL, pl.col("p_open").alias(f"p_open_{suffix}"))
        tau = frame.group_by(list(MODEL_CELL)).agg(group_tau().alias(f"tau_{suffix}"))
        return d.join(tau, on=list(MODEL_CELL)).join(po, on=list(MODEL_CELL))

    out = arm(sub, "fixed")
    cols = [*MODEL_CELL, "evictor", "n_inputs", "tau_fixed", "delta_fixed", "p_open_fixed"]
    if gated_calibrated is not None:
        cal = arm(gated_calibrated, "calibrated").drop("n_inputs")
        out = out.join(cal, on=list(MODEL_CELL), how="left")
        cols += ["tau_calibrated", "delta_calibrated", "p_open_calibrated"]
    if notes is not None:
        out = out.join(notes.select(*MODEL_CELL, "note"), on=list(MODEL_CELL), how="left")
        cols.append("note")
    return out.with_columns(pl.lit(ev).alias("evictor")).select(cols).sort(list(MODEL_CELL))


def compression_table(gated: pl.DataFrame, *, evictor: str | None = None) -> pl.DataFrame:
    """Table 22: achieved kept-KV and compression of the gated deployment, per budget and grid mean.

    Returns
    -------
    polars.DataFrame
        ``model, context_length, evictor, budget`` (null on the "grid mean" row, which
        averages the budgets b < 1), ``kept_kv_plain``, ``kept_kv_gated``, ``compression``
        (gated, = 1/kept_kv_gated), ``kept_kv_open`` (gate-open inputs only) and ``p_open``
        (per-input, independent of b; the compression floor is 1 − p_open).

    References
    ----------
    PAGE App. A.6.2, Table 22 (plain keeps the nominal fraction; grid mean 0.453).
    """
    sub, ev = one_evictor(gated, evictor)
    parts = []
    for by, grid in (([*MODEL_CELL, "budget"], False), (list(MODEL_CELL), True)):
        g = metrics.on_frame(metrics.kept_kv, sub, by=by, arm="gated")
        p = metrics.on_frame(metrics.kept_kv, sub, by=by, arm="plain").select(
            *by, pl.col("kept_kv").alias("kept_kv_plain"))
        part = g.join(p, on=by).rename({"kept_kv": "kept_kv_gated"})
        if grid:
            part = part.with_columns(pl.lit(None, pl.Float64).alias("budget"))
        parts.append(part.select(*MODEL_CELL, "budget", "kept_kv_plain", "kept_kv_gated", "compression", "kept_kv_open"))
    out = pl.concat(parts)
    po = metrics.on_frame(metrics.p_open, sub, by=MODEL_CELL).select(*MODEL_CELL, "p_open")
    out = out.join(po, on=list(MODEL_CELL)).with_columns(pl.lit(ev).alias("evictor"))
    return out.select(*MODEL_CELL, "evictor", "budget", "kept_kv_plain", "kept_kv_gated", "compression",
                      "kept_kv_open", "p_open").sort([*MODEL_CELL, "budget"], nulls_last=True)


def batching_table(gated: pl.DataFrame, *, evictor: str | None = None, budget: float | None = None,
                   batch_sizes: Sequence[int] = defaults.BATCH_SIZES) -> pl.DataFrame:
    """Table 23: compression under static batch provisioning (:func:`pagestats.metrics.static_batching`).

    ``p_open`` and ``kept_open`` per (model, context) come from Table 22 at ``budget``
    (default the smallest logged budget; the paper: b = 0.0625).

    Returns
    -------
    polars.DataFrame
        ``model, context_length, evictor, budget, batch_size, p_open, kept_open,
        p_all_open, provisioned, compression``.
    """
    sub, ev = one_evictor(gated, evictor)
    evict = sub.filter(formulas.EVICTED)
    if evict.height == 0:
        raise ValueError("batching_table: no eviction budgets b < 1")
    b = float(evict["budget"].min()) if budget is None else float(budget)
    at = evict.filter(pl.col("budget") == b)
    if at.height == 0:
        raise ValueError(f"batching_table: budget {b} is not logged")
    kept = metrics.on_frame(metrics.kept_kv, at, by=MODEL_CELL)
    po = metrics.on_frame(metrics.p_open, at, by=MODEL_CELL).select(*MODEL_CELL, "p_open")
    cells = kept.join(po, on=list(MODEL_CELL)).sort(list(MODEL_CELL))
    parts = []
    for row in cells.iter_rows(named=True):
        k_open = row["kept_kv_open"] if row["kept_kv_open"] is not None else 1.0  # no open input: full cache
        sb = metrics.static_batching(row["p_open"], k_open, batch_sizes)
        parts.append(sb.with_columns(pl.lit(row["model"]).alias("model"),
                                     pl.lit(row["context_length"], pl.Int64).alias("context_length")))
    out = pl.concat(parts)
    out = out.with_columns(pl.lit(ev).alias("evictor"), pl.lit(b).alias("budget"))
    return out.select(*MODEL_CELL, "evictor", "budget", "batch_size", "p_open", "kept_open", "p_all_open",
                      "provisioned", "compression")
