"""Tables of the gate's effect with their intervals: the cluster-bootstrap intervals of the
matrix Δ (Table 28) and of the remaining headline numbers (Table 29), and the input-draw
replicates (Table 30), each over :func:`pagestats.replay.gated_outcomes` frames.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from pagestats import metrics, stats
from pagestats.core import defaults, formulas
from pagestats.core.columns import MATRIX_CELL, MODEL_CELL, input_key, require_columns
from pagestats.tables._common import one_evictor, same_as

__all__ = ["bootstrap_table", "draw_replicates_table", "remaining_deltas_table"]


def bootstrap_table(gated: pl.DataFrame, *, rng: np.random.Generator, by=MATRIX_CELL, tasks: Sequence[str] | None = None,
                    n_boot: int = defaults.N_BOOTSTRAP, confidence_level: float = defaults.CONFIDENCE_LEVEL,
                    q: float = defaults.FDR_Q) -> pl.DataFrame:
    """Tables 28–29: Δ per cell with cluster-bootstrap 95% intervals and BH-adjusted p-values.

    Parameters
    ----------
    gated : polars.DataFrame
    rng : numpy.random.Generator
    by : sequence of str
        Cells (Table 28: the matrix cells (model, context, evictor)); add ``task`` for a
        per-task family (Table 29's NIAH-MK3 rows).
    tasks : sequence of str, optional
        Restrict to these tasks first.

    Returns
    -------
    polars.DataFrame
        :func:`pagestats.metrics.delta_bootstrap` columns (``delta, low, high, p_value,
        p_adjusted, rejected, n_inputs, n_budgets, n_boot, note``; a cell without variation
        has p = NaN, note "no variation", and is left out of the BH family), ``n_left_out``
        (with ``evictor`` in ``by``: the evictors of a group are compared on the same inputs,
        :func:`pagestats.metrics.equal_inputs`), ``same_as`` (with ``evictor`` in ``by``: the other
        evictors of the group whose outcomes equal this one's on every evicting row,
        :func:`pagestats.metrics.identical_evictors`; their intervals agree by construction) and
        ``excludes_zero``.

    References
    ----------
    PAGE App. A.7.2, Tables 28–29 (10,000 replicates, 2.5–97.5 percentiles, BH at q = 0.05).
    """
    sub = gated if tasks is None else gated.filter(pl.col("task").is_in(list(tasks)))
    by = list(by)
    left = None
    if "evictor" in by:  # cells that differ by evictor are compared on the same inputs
        sub, left = metrics.equal_inputs(sub, by=[c for c in by if c != "evictor"])
    rows = metrics.relation(sub)
    out = metrics.on_rows(metrics.delta_bootstrap, rows, sub, by=by, rng=rng, n_boot=n_boot,
                          confidence_level=confidence_level, q=q)
    if left is not None:
        out = (out.join(left, on=[c for c in left.columns if c != "n_left_out"], how="left")
               .join(same_as(rows, sub, by), on=by, how="left"))
    return out.with_columns(((pl.col("low") > 0) | (pl.col("high") < 0)).alias("excludes_zero"))


def draw_replicates_table(gated: pl.DataFrame, input_draws: pl.DataFrame, *, evictor: str | None = None,
                          anchor: Sequence[str] | None = defaults.ANCHOR_TASKS,
                          decode_limited: pl.DataFrame | None = None) -> pl.DataFrame:
    """Table 30: Δ per input-draw replicate, with mean, SD (ddof=1) and range over draws.

    Parameters
    ----------
    gated : polars.DataFrame
    input_draws : polars.DataFrame
        ``run_id`` → ``draw`` (e.g. ``logs.inputs.select("run_id", "draw").unique()``).
    decode_limited : polars.DataFrame, optional
        ``run_id, task``: the (run, task)s whose full-KV answers the decode limit may have cut
        (:func:`pagestats.io.decoding.flagged_tasks`, e.g. a draw collected with the first 32-token
        limit); the rows that draw on them say so.

    Returns
    -------
    polars.DataFrame
        ``subset`` ("all tasks", or the anchor's tasks: the paper's lower block, "NIAH-MK3 only";
        ``anchor=None``: "capacity-bound", the class), ``model, context_length, evictor, draw,
        delta, n_inputs``, per (subset, cell) ``mean, sd, range, n_draws``, and ``decode_limited``
        (the tasks of the row's inputs whose answers the decode limit may have cut, joined by ", ";
        null when none or when ``decode_limited`` is not given).

    References
    ----------
    PAGE App. A.7.3, Table 30 (three draws of the 4K split; lower block NIAH-MK3 only).

    Notes
    -----
    Within a cell only the tasks present in every draw are compared, since a replicate
    run may cover a subset of the tasks (e.g. the shipped second draw).
    """
    require_columns(input_draws, ["run_id", "draw"], "draw_replicates_table")
    sub, ev = one_evictor(gated, evictor)
    sub = sub.join(input_draws.select("run_id", "draw").unique(), on="run_id", how="left")
    if sub["draw"].null_count():
        raise ValueError("draw_replicates_table: some runs have no draw")
    # Compare like with like: a replicate run may cover only some tasks, so each cell keeps
    # the tasks that every one of its draws has (the others are left out of this table only).
    draws_per_cell = sub.group_by(MATRIX_CELL).agg(pl.col("draw").n_unique().alias("_all"))
    common = (sub.group_by([*MATRIX_CELL, "task"]).agg(pl.col("draw").n_unique().alias("_n"))
              .join(draws_per_cell, on=MATRIX_CELL).filter(pl.col("_n") == pl.col("_all")).select(*MATRIX_CELL, "task"))
    sub = sub.join(common, on=[*MATRIX_CELL, "task"], how="semi")
    by = [*MATRIX_CELL, "draw"]
    parts = [metrics.on_frame(metrics.delta, sub, by=by).with_columns(pl.lit("all tasks").alias("subset"))]
    cap = sub.filter(metrics.capacity_side(anchor))
    if cap.height:
        parts.append(metrics.on_frame(metrics.delta, cap, by=by).with_columns(
            pl.lit(metrics.anchor_name(anchor)).alias("subset")))
    out = pl.concat(parts)
    grp = ["subset", *MATRIX_CELL]
    out = out.with_columns(
        pl.col("delta").mean().over(grp).alias("mean"), pl.col("delta").std(ddof=1).over(grp).alias("sd"),
        (pl.col("delta").max() - pl.col("delta").min()).over(grp).alias("range"),
        pl.len().over(grp).cast(pl.Int64).alias("n_draws"),
    )
    marks = pl.DataFrame(schema={"subset": pl.String, **{c: out.schema[c] for c in by}, "decode_limited": pl.String})
    if decode_limited is not None and decode_limited.height:
        require_columns(decode_limited, ["run_id", "task"], "draw_replicates_table")
        text = {"run_id": pl.String, "task": pl.String}
        cut = (sub.select(*by, "run_id", "task", "task_class").unique().cast(text)
               .join(decode_limited.select("run_id", "task").cast(text).unique(), on=["run_id", "task"]))
        if cut.height:
            marks = pl.concat([
                cut.with_columns(pl.lit("all tasks").alias("subset")),
                cut.filter(metrics.capacity_side(anchor)).with_columns(pl.lit(metrics.anchor_name(anchor)).alias("subset")),
            ]).group_by("subset", *by).agg(pl.col("task").unique().sort().str.join(", ").alias("decode_limited"))
            marks = marks.select("subset", *by, "decode_limited")
    out = out.join(marks, on=["subset", *by], how="left", nulls_equal=True)
    return out.select(*grp, "draw", "delta", "n_inputs", "mean", "sd", "range", "n_draws",
                      "decode_limited").sort([*grp, "draw"])


def remaining_deltas_table(gated: pl.DataFrame, calibrated: pl.DataFrame | None, *, rng: np.random.Generator,
                           evictor: str | None = None, budget: float = defaults.HEADLINE_BUDGET,
                           showcase_task: str = "niah_multikey_3", anchor: Sequence[str] | None = defaults.ANCHOR_TASKS,
                           n_boot: int = defaults.N_BOOTSTRAP,
                           confidence_level: float = defaults.CONFIDENCE_LEVEL, q: float = defaults.FDR_Q) -> pl.DataFrame:
    """Table 29: 95% intervals for the remaining headline numbers, as far as the logs hold them.

    Three kinds of row (``row``), for the headline evictor:

    * ``calibrated τ (Table 20)``: Δ per (model, context) with the midpoint τ of Eq. 5 (the
      ``calibrated`` gated outcomes; none when it is ``None``), cluster bootstrap;
    * ``capacity-bound anchor``: Δ per (model, context, task) on each task of ``anchor`` (default
      NIAH-MK3, the paper's rows: "Restricted to NIAH-MK3"; ``None``: every capacity-bound task),
      cluster bootstrap;
    * ``showcase, plain`` / ``showcase, gated``: accuracy of each arm on ``showcase_task`` at
      ``budget`` (the paper's Mistral NIAH-MK3 cell, §4 and Fig. 3: 0.00 plain, 0.89 gated),
      Wilson score interval on the inputs' scores (their sum as the count of successes).

    Returns
    -------
    polars.DataFrame
        ``row, model, context_length, evictor, task, estimate, low, high, interval`` ("cluster
        bootstrap" or "Wilson"), ``n_inputs``, ``p_value`` and ``p_adjusted`` (Benjamini–Hochberg
        across every bootstrap row of the table; null for Wilson rows), ``excludes_zero``.
        The paper's cross-architecture and DBTrimKV rows need models and an arm the collector
        does not log (Tables 16 and 19).

    References
    ----------
    PAGE App. A.7.2, Table 29 ("95% CIs for the remaining headline deltas ... The Mistral NIAH-MK3
    showcase entries are Wilson score intervals on N=100").
    """
    sub, ev = one_evictor(gated, evictor)
    read = list(dict.fromkeys([*input_key(gated), *MODEL_CELL, "evictor", "task", "task_class", "budget",
                               "score_plain", "score_gated"]))

    def rows(frame: pl.DataFrame, where: pl.Expr) -> pl.DataFrame:
        # the columns read, then the rows (a filter copies every column it keeps); each kind's rows are
        # made when its bootstrap runs and let go after it, so no two are held at once
        return frame.select(read).filter(formulas.EVICTED & where)

    cols = ["row", "model", "context_length", "evictor", "task", "estimate", "low", "high", "interval", "n_inputs",
            "p_value"]
    parts = []
    kinds = [("capacity-bound anchor", lambda: rows(sub, metrics.capacity_side(anchor)),
              [*MODEL_CELL, "evictor", "task"])]
    if calibrated is not None:
        # every row of the evictor: delta_bootstrap reads the eviction budgets itself, and without a
        # filter the frame shares the gated rows' columns (a filter would copy 8M rows at 1M inputs)
        kinds.insert(0, ("calibrated τ (Table 20)", lambda: one_evictor(calibrated, ev)[0].select(read),
                         [*MODEL_CELL, "evictor"]))
    for label, make, by in kinds:
        frame = make()
        if frame.height == 0:
            continue
        boot = metrics.on_frame(metrics.delta_bootstrap, frame, by=by, rng=rng, n_boot=n_boot,
                                confidence_level=confidence_level, q=q)
        del frame
        parts.append(boot.with_columns(pl.lit(label).alias("row"), pl.lit("cluster bootstrap").alias("interval"),
                                       *([] if "task" in by else [pl.lit(None, pl.String).alias("task")]))
                     .rename({"delta": "estimate"}).select(cols).sort(by))
    show = rows(sub, (pl.col("task") == showcase_task) & (pl.col("budget") == budget))
    binary = show.select(pl.col("score_plain", "score_gated").is_in([0.0, 1.0]).all()).row(0) == (True, True)
    if show.height and binary:  # a Wilson interval counts successes: 0/1 scores
        for arm in ("plain", "gated"):
            acc = show.group_by(*MODEL_CELL, "evictor", "task").agg(
                pl.col(f"score_{arm}").sum().alias("k"), pl.len().alias("n"), pl.col(f"score_{arm}").mean().alias("estimate"))
            iv = stats.wilson(acc["k"].to_numpy(), acc["n"].to_numpy(), confidence_level)
            parts.append(acc.with_columns(pl.lit(f"showcase, {arm} at b = {budget}").alias("row"),
                                          pl.Series("low", iv.low), pl.Series("high", iv.high),
                                          pl.lit("Wilson").alias("interval"), pl.col("n").alias("n_inputs"),
                                          pl.lit(None, pl.Float64).alias("p_value")).select(cols)
                         .sort(*MODEL_CELL))
    if not parts:
        return pl.DataFrame(schema={c: pl.String for c in cols})
    out = pl.concat(parts, how="vertical_relaxed")
    tested = out["p_value"].is_not_null() & out["p_value"].is_not_nan()
    adjusted = np.full(out.height, np.nan)
    if tested.any():
        adjusted[tested.to_numpy()] = stats.bh(out.filter(tested)["p_value"].to_numpy(), q).adjusted
    return out.with_columns(pl.Series("p_adjusted", adjusted).fill_nan(None).cast(pl.Float64),
                            ((pl.col("low") > 0) | (pl.col("high") < 0)).alias("excludes_zero"))
