"""The gate's effect on accuracy: Δ with its cluster-bootstrap intervals, Δ(f) and the
oracle gap (Tables 2, 12, 14, 28; Fig. 7).

Pure functions of the replay frames; conventions in :mod:`pagestats.metrics`.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats import stats
from pagestats.core import defaults, formulas
from pagestats.core.columns import MATRIX_CELL, MODEL_CELL, input_key, key_codes, require_columns
from pagestats.metrics import engine
from pagestats.metrics.engine import ROWS, grouped, names, query, uniq
from pagestats.metrics.sides import capacity_side
from pagestats.core.schema import INPUT_KEY

__all__ = [
    "equal_inputs",
    "evicted_on_equal_inputs",
    "same_inputs",
    "accuracy",
    "full_accuracy",
    "delta",
    "delta_bootstrap",
    "delta_of_f",
    "oracle_gap",
    "task_oracle",
]


def equal_inputs(frame: pl.DataFrame, by=MODEL_CELL, across: str = "evictor",
                 reference=defaults.EVICTORS) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Put the cells compared side by side on the same inputs.

    Within each group of ``by`` (default a (model, context) cell), the cells are the values of
    ``across`` (default the evictors of Table 2). The compared inputs are those that every
    ``reference`` cell of the group holds (default the paper's four evictors, §4; every cell
    when none of them is logged); every cell keeps only those inputs, so a difference between
    two cells is never a difference of inputs (e.g. a second input draw logged for SnapKV only).
    A cell outside ``reference`` that lacks some of them (a baseline run on a few inputs)
    keeps the ones it has; its ``n_inputs`` shows it.

    Returns
    -------
    (polars.DataFrame, polars.DataFrame)
        The rows of ``frame`` on the compared inputs, and per (``by``, ``across``) how many of
        its inputs were left out: ``by``, ``across``, ``n_left_out``.
    """
    by = [by] if isinstance(by, str) else list(by)
    require_columns(frame, [*by, across, *INPUT_KEY], "equal_inputs")
    key = [c for c in INPUT_KEY if c not in by]  # by may hold task (Table 29's cells)
    units = frame.select(*by, across, *key).unique()
    names = units.select(*by, across).unique()
    ref = names.filter(pl.col(across).is_in(list(reference or [])))
    ref = ref.vstack(names.join(ref.select(by).unique(), on=by, how="anti", nulls_equal=True))  # groups without one
    ref_units = units.join(ref, on=[*by, across], how="semi", nulls_equal=True)
    n_ref = ref.group_by(by).agg(pl.len().alias("_cells"))
    common = (ref_units.group_by([*by, *key]).agg(pl.len().alias("_in"))
              .join(n_ref, on=by, nulls_equal=True).filter(pl.col("_in") == pl.col("_cells")).select(*by, *key))
    out = units.join(common, on=[*by, *key], how="anti", nulls_equal=True)
    # nothing left out: the frame itself, not a copy of every row (the report's gated rows at 1M inputs)
    kept = frame if out.height == 0 else frame.join(common, on=[*by, *key], how="semi", nulls_equal=True)
    left = out.group_by([*by, across]).agg(pl.len().cast(pl.Int64).alias("n_left_out"))
    counts = names.join(left, on=[*by, across], how="left", nulls_equal=True)
    return kept, counts.with_columns(pl.col("n_left_out").fill_null(0)).sort([*by, across])


def evicted_on_equal_inputs(frame: pl.DataFrame, by=MODEL_CELL):
    """The rows of ``frame`` with b < 1 (:func:`pagestats.core.formulas.evicted`), the evictors of each
    ``by`` group on the same inputs (:func:`equal_inputs` of those rows), as a DuckDB relation over
    ``frame``'s own columns (:func:`pagestats.metrics.engine.relation`): the rows are not copied (at 1M
    inputs a polars filter of the report's gated rows is a copy of 8M rows, about 0.9 GiB). Run a
    metric over it with :func:`pagestats.metrics.engine.on_rows` (``like=frame``).
    """
    by = [by] if isinstance(by, str) else list(by)
    rows = engine.relation(frame).filter(formulas.evicted())
    key = uniq(by, ["evictor"], [c for c in INPUT_KEY if c not in by])
    units = query(rows, f"SELECT DISTINCT {names(key)} FROM {ROWS}")
    kept, _ = equal_inputs(units, by=by)
    if kept is units:  # nothing left out
        return rows
    same = " AND ".join(f'r."{c}" IS NOT DISTINCT FROM u."{c}"' for c in key)  # nulls equal, as equal_inputs
    return rows.set_alias("r").join(engine.relation(kept).set_alias("u"), same, how="semi")


def same_inputs(*frames: pl.DataFrame, by=MODEL_CELL) -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """Put frames compared side by side (replays of the same logs under different policies or
    pilot definitions) on the same inputs: each keeps only the inputs that every frame holds.

    Replays of one set of logs differ in their inputs only where a held-out pilot
    (:func:`pagestats.replay.pilot_mask`) leaves its inputs out of the evaluated numbers; a
    comparison of two policies must then leave them out of both. Within an input every
    frame keeps all of its rows (every evictor and budget); put the evictors of a cell on the
    same inputs with :func:`equal_inputs`.

    Returns
    -------
    (list of polars.DataFrame, list of polars.DataFrame)
        The frames on the common inputs, in order, and for each frame per ``by`` group how
        many of its inputs were left out: ``by``, ``n_left_out``.
    """
    by = [by] if isinstance(by, str) else list(by)
    key = [*by, *[c for c in INPUT_KEY if c not in by]]
    for frame in frames:
        require_columns(frame, key, "same_inputs")
    units = [frame.select(key).unique() for frame in frames]
    common = units[0]
    for u in units[1:]:
        common = common.join(u, on=key, how="semi", nulls_equal=True)
    # a frame none of whose inputs is left out is kept itself, not copied (common ⊆ its units)
    kept = [frame if u.height == common.height else frame.join(common, on=key, how="semi", nulls_equal=True)
            for frame, u in zip(frames, units)]
    left = []
    for u in units:
        n = u.group_by(by).agg(pl.len().cast(pl.Int64).alias("_n")).join(
            common.group_by(by).agg(pl.len().cast(pl.Int64).alias("_c")), on=by, how="left", nulls_equal=True)
        left.append(n.select(*by, (pl.col("_n") - pl.col("_c").fill_null(0)).alias("n_left_out")).sort(by))
    return kept, left


def accuracy(rows, by=(*MATRIX_CELL, "budget")) -> pl.DataFrame:
    """Mean accuracy of the full-KV, plain and gated arms per group, over every budget present
    (the b = 1 audit rows included), and their difference Δ = gated − plain (§3 Eq. 2; Table 13):
    :data:`pagestats.core.formulas.ACCURACY` and :data:`~pagestats.core.formulas.DELTA`, the
    aggregates of ``pagestats whatif``.

    Put ``budget`` in ``by`` for A(b) at each budget, as ``pagestats whatif`` does; select the
    rows b < 1 first for the paper's means over eviction budgets.

    Parameters
    ----------
    rows : duckdb.DuckDBPyRelation
        Gated outcomes (:mod:`pagestats.metrics.engine`).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``acc_full`` (null where a full-KV outcome is unknown), ``acc_plain``,
        ``acc_gated``, ``delta``, ``n_inputs`` (distinct inputs).
    """
    by = engine.outcome_rows(rows, by, ["score_full", "score_plain", "score_gated"], "accuracy")
    acc = ", ".join(f"{sql} AS {name}" for name, sql in formulas.ACCURACY.items())
    out = query(rows, f"""
        SELECT *, {formulas.DELTA} AS delta FROM (
            SELECT {names(by)}{", " if by else ""}{acc}, count(DISTINCT ({names(engine.input_key(rows))})) AS n_inputs
            FROM {ROWS} {grouped(by)})""")
    return out.select(*by, *(pl.col(c).cast(pl.Float64) for c in formulas.ACCURACY), pl.col("delta").cast(pl.Float64),
                      pl.col("n_inputs").cast(pl.Int64)).sort(by)


def full_accuracy(rows, by=MATRIX_CELL, column: str = "score_full") -> pl.DataFrame:
    """The full-KV accuracy A_full of each group: the mean of the full-KV score over the group's
    distinct inputs, each once whatever its evictors and budgets (Table 25's ``1 − A_full``
    headroom; Fig. 3's full-cache line), null where any input's is unknown
    (:func:`pagestats.core.formulas.with_full`).

    Parameters
    ----------
    rows : duckdb.DuckDBPyRelation
        Gated outcomes, or per-input rows (``column="full_score"``).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``acc_full``, ``n`` (distinct inputs).
    """
    by = engine.group_by(by, "full_accuracy", rows)
    key = engine.uniq(by, engine.input_key(rows))
    engine.check(rows, [*key, column], "full_accuracy")
    out = query(rows, f"""
        SELECT {names(by)}{", " if by else ""}{formulas.ACCURACY["acc_full"]} AS acc_full, count(*) AS n
        FROM (SELECT DISTINCT ON ({names(key)}) {names(key)}, "{column}" AS score_full FROM {ROWS}) {grouped(by)}""")
    return out.with_columns(pl.col("acc_full").cast(pl.Float64), pl.col("n").cast(pl.Int64)).sort(by)


def delta(rows, by=MATRIX_CELL) -> pl.DataFrame:
    """Gating Δ: mean over inputs and budgets b < 1 of ``score_gated − score_plain`` (Table 2;
    :data:`pagestats.core.formulas.PAIRED_DIFFERENCE`, an exact mean: :func:`pagestats.core.formulas.mean`).

    Add ``task`` to ``by`` for the per-task breakdown (Table 12).

    Parameters
    ----------
    rows : duckdb.DuckDBPyRelation
        Gated outcomes (:mod:`pagestats.metrics.engine`).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``delta``, ``n_inputs`` (distinct inputs, whatever the evictors pooled), ``n_rows``.
    """
    return deltas(rows, [by])[0]


def deltas(rows, groupings) -> list[pl.DataFrame]:
    """:func:`delta` by each of ``groupings`` (each a ``by``), from one scan of ``rows`` (GROUPING SETS):
    frame i is ``delta(rows, by=groupings[i])``, the same exact means (Table N1 reads Δ per task and
    per cell of 9M gated rows for each of its 19 pilot definitions)."""
    groupings = [engine.outcome_rows(rows, by, ["score_gated", "score_plain"], "delta") for by in groupings]
    parts = engine.by_groupings(rows, groupings, f"{formulas.mean(formulas.PAIRED_DIFFERENCE)} AS delta, "
                                f"count(DISTINCT ({names(engine.input_key(rows))})) AS n_inputs, count(*) AS n_rows",
                                where=f"WHERE {formulas.evicted()}")
    return [part.with_columns(pl.col("delta").cast(pl.Float64), pl.col("n_inputs", "n_rows").cast(pl.Int64))
            .select(*by, "delta", "n_inputs", "n_rows").sort(by) for part, by in zip(parts, groupings)]


def delta_bootstrap(
    rows,
    by=MATRIX_CELL,
    *,
    rng: np.random.Generator,
    n_boot: int = defaults.N_BOOTSTRAP,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
    q: float = defaults.FDR_Q,
    shared_inputs: bool = False,
) -> pl.DataFrame:
    """Δ per cell with cluster-bootstrap intervals and BH-adjusted p-values (Table 28).

    Each group of ``by`` is a cell. SQL gives its (units × budgets b < 1) matrix of paired
    differences :data:`~pagestats.core.formulas.PAIRED_DIFFERENCE` (units, then budgets, in
    ascending order) and its Δ (the SQL of :func:`delta`, the same number as Table 2's); NumPy resamples the
    units (:func:`pagestats.stats.cluster_bootstrap`, cells in ``by`` order, one ``rng``).
    Benjamini–Hochberg at ``q`` runs across all cells of the call (:func:`pagestats.stats.bh`).
    ``shared_inputs=True`` resamples the inputs jointly across cells (see
    :func:`~pagestats.stats.cluster_bootstrap`); every cell must then hold the same inputs.

    Parameters
    ----------
    rows : duckdb.DuckDBPyRelation
        Gated outcomes (:mod:`pagestats.metrics.engine`).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``delta``, ``low``, ``high``, ``p_value``, ``p_adjusted``,
        ``rejected``, ``n_inputs``, ``n_budgets``, ``n_boot``, ``note`` ("one input" or "no
        variation": p is NaN and the cell is left out of the BH family; else null).

    Raises
    ------
    ValueError
        A cell whose units do not all carry the same set of budgets (the bootstrap needs
        a balanced grid so that Δ is the mean of per-input means).
    """
    by = engine.outcome_rows(rows, by, ["score_gated", "score_plain"], "delta_bootstrap")
    unit = engine.unit_key(rows)
    evicted = f"FROM {ROWS} WHERE {formulas.evicted()}"
    order = f"ORDER BY {names(by)}" if by else ""
    shape = query(rows, f"SELECT {names(by)}{', ' if by else ''}count(DISTINCT ({names(unit)})) AS _units, "
                        f"count(DISTINCT budget) AS _budgets, count(*) AS _rows, "
                        f"{formulas.mean(formulas.PAIRED_DIFFERENCE)} AS _delta {evicted} {grouped(by)} {order}")
    if shape.height and not by and shape["_rows"].item() == 0:
        shape = shape.clear()  # no rows: no cell
    # no (unit, budget) twice (engine.outcome_rows): units × budgets rows means every unit holds every budget
    unbalanced = shape.filter(pl.col("_rows") != pl.col("_units") * pl.col("_budgets"))
    if unbalanced.height:
        raise ValueError(f"delta_bootstrap: cell {unbalanced.select(by).row(0, named=True)} has units with different "
                         "budget sets")
    if shared_inputs and shape.height > 1:
        key = names(engine.input_key(rows))
        cells_per_input = query(rows, f"SELECT count(DISTINCT ({names(by)})) AS n {evicted} GROUP BY {key}")["n"]
        if (cells_per_input != shape.height).any():
            raise ValueError("delta_bootstrap: shared_inputs=True but the cells do not hold the same inputs")
    diffs = query(rows, f"SELECT {formulas.PAIRED_DIFFERENCE} AS _d {evicted} "
                        f"ORDER BY {names(uniq(by, unit, ['budget']))}")["_d"].to_numpy().astype(np.float64)
    cells, start = [], 0
    for n_units, n_budgets in shape.select("_units", "_budgets").iter_rows():
        cells.append(diffs[start:start + n_units * n_budgets].reshape(n_units, n_budgets))
        start += n_units * n_budgets
    keys = shape.select(by)
    if not cells:
        return bootstrap_frame(keys, [], None, rng=rng, n_boot=n_boot, confidence_level=confidence_level, q=q,
                               shared_inputs=shared_inputs)
    return bootstrap_frame(keys, cells, shape["_delta"].cast(pl.Float64).to_numpy(), rng=rng, n_boot=n_boot,
                           confidence_level=confidence_level, q=q, shared_inputs=shared_inputs)


def bootstrap_frame(keys: pl.DataFrame, cells, estimate, *, rng, n_boot, confidence_level, q, shared_inputs):
    """The bootstrap, BH and result frame of :func:`delta_bootstrap` from its per-cell matrices.

    Parameters
    ----------
    keys : polars.DataFrame
        One row per cell: its ``by`` values.
    cells : list of numpy.ndarray
        Per cell, the (n_inputs × n_budgets) matrix of paired differences gated − plain
        (App. A.7.2), rows in unit order.
    estimate : numpy.ndarray or None
        Δ per cell (:func:`delta`); None when there are no cells.
    rng, n_boot, confidence_level, q, shared_inputs
        As :func:`delta_bootstrap`.

    Returns
    -------
    polars.DataFrame
        As :func:`delta_bootstrap`.
    """
    if not cells:
        schema = {**keys.schema, "delta": pl.Float64, "low": pl.Float64,
                  "high": pl.Float64, "p_value": pl.Float64, "p_adjusted": pl.Float64,
                  "rejected": pl.Boolean, "n_inputs": pl.Int64, "n_budgets": pl.Int64, "n_boot": pl.Int64,
                  "note": pl.String}
        return pl.DataFrame(schema=schema)
    res = stats.cluster_bootstrap(
        cells, rng=rng, n_boot=n_boot, confidence_level=confidence_level, shared_inputs=shared_inputs
    )
    adj = stats.bh(res.p_value, q=q)
    return keys.with_columns(
        pl.Series("delta", estimate, dtype=pl.Float64),
        pl.Series("low", res.low),
        pl.Series("high", res.high),
        pl.Series("p_value", res.p_value),
        pl.Series("p_adjusted", adj.adjusted),
        pl.Series("rejected", adj.rejected),
        pl.Series("n_inputs", res.n_inputs),
        pl.Series("n_budgets", res.n_budgets),
        pl.lit(res.n_boot, pl.Int64).alias("n_boot"),
    ).with_columns(
        pl.when(pl.col("n_inputs") == 1).then(pl.lit("one input"))
        .when(pl.col("p_value").is_nan()).then(pl.lit("no variation")).otherwise(pl.lit(None, pl.String)).alias("note"),
    )


def delta_of_f(delta_capacity, delta_rest, f):
    """Δ as a function of the capacity-bound share ``f`` of the workload (§4.1, Fig. 7).

    ``Δ(f) = f·Δ_capacity + (1 − f)·Δ_rest``, vectorised (NumPy broadcasting) over all
    three arguments; per-task accuracy is additive under reweighting, so this is exact
    for a workload mixing the two classes in proportion ``f``.
    """
    f = np.asarray(f, dtype=np.float64)
    if not np.all((f >= 0) & (f <= 1)):
        raise ValueError("f must lie in [0, 1]")
    out = f * np.asarray(delta_capacity, dtype=np.float64) + (1.0 - f) * np.asarray(delta_rest, dtype=np.float64)
    return out.item() if out.ndim == 0 else out


def task_oracle(gated: pl.DataFrame, closed=defaults.ANCHOR_TASKS) -> pl.DataFrame:
    """The gated outcomes of the task-label oracle, from the gated outcomes of any policy on the same rows
    (§4.1, App. A.4.3, Table 14: "a task-label oracle that closes on NIAH-MK3 and opens elsewhere").

    The oracle's gate is closed on the inputs of the ``closed`` tasks (default
    :data:`pagestats.core.defaults.ANCHOR_TASKS`; ``None``: the capacity-bound class, as
    :class:`pagestats.replay.policies.TaskOracle`) and open elsewhere; its arm is Eq. 2 on that
    decision (:data:`pagestats.core.formulas.SCORE_GATED`, :data:`~pagestats.core.formulas.N_KEPT_GATED`),
    evaluated on the rows' own plain and full-cache outcomes, so the two policies are compared on
    the same inputs by construction.

    Returns
    -------
    polars.DataFrame
        ``gated`` with ``gate_open``, ``score_gated`` and ``n_kept_gated`` (where present) the
        oracle's and ``tau`` null (where present); the other columns as they are.
    """
    need = ["task", "score_plain", "score_full", *(["task_class"] if closed is None else [])]
    require_columns(gated, need, "task_oracle")
    kept = "n_kept_gated" in gated.columns
    if kept:
        require_columns(gated, ["n_kept_plain", "n_tokens"], "task_oracle")
    arm = gated.select((~capacity_side(closed)).alias("gate_open"), pl.col("score_plain").alias("score"),
                       pl.col("score_full").alias("full_score"),
                       *([pl.col("n_kept_plain").alias("n_kept"), pl.col("n_tokens")] if kept else []))
    new = arm.select("gate_open", formulas.expr(formulas.SCORE_GATED).alias("score_gated"),
                     *([formulas.expr(formulas.N_KEPT_GATED).alias("n_kept_gated")] if kept else []))
    if "tau" in gated.columns:
        new = new.with_columns(pl.lit(None, pl.Float64).alias("tau"))
    return gated.with_columns(new.get_columns())


def oracle_gap(rows_policy, rows_oracle, by=MATRIX_CELL) -> pl.DataFrame:
    """Δ of a gate policy minus Δ of the task-label oracle per cell (§4.1, App. A.4.3, Table 14).

    Both relations are gated outcomes of the same logs, under the policy and under
    :class:`pagestats.replay.policies.TaskOracle` (close on capacity-bound tasks, open elsewhere);
    Δ of each is :func:`delta`. A gap of exactly 0 means the gate reproduced the oracle's
    decisions; positive needs within-task per-input variation.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``delta_policy``, ``delta_oracle``, ``gap``, ``n_inputs``.
    """
    a = delta(rows_policy, by).rename({"delta": "delta_policy"})
    b = delta(rows_oracle, by).rename({"delta": "delta_oracle"})
    by = [by] if isinstance(by, str) else list(by)
    if a.height != b.height or a.join(b, on=by, how="anti", nulls_equal=True).height:
        raise ValueError("oracle_gap: the two relations do not cover the same cells")
    out = a.join(b.select(*by, "delta_oracle"), on=by, nulls_equal=True)
    return out.select(*by, "delta_policy", "delta_oracle", (pl.col("delta_policy") - pl.col("delta_oracle")).alias("gap"),
                      "n_inputs").sort(by)
