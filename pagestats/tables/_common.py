"""Small helpers shared by the table modules.

Only what the engine (:mod:`pagestats.metrics`, :mod:`pagestats.stats`) does not provide
lives here: the *ordering margin* of Tables 5–6, 9 and 10 over the task means of D
(:func:`pagestats.metrics.task_means`) (the anchor NIAH-MK3 below the other side), the selection of one evictor's rows, and the gate at a recalibrated τ
beside every sweep of D (:func:`gate_at`, App. A.3.1). Everything else is called from the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import polars as pl

from pagestats import metrics, replay
from pagestats.core import defaults, formulas
from pagestats.core.columns import MODEL_CELL, headline_evictor, input_key, require_columns, rows_where
from pagestats.replay.pilot import pilot_need
from pagestats.replay.policies import FixedTau
from pagestats.core.schema import INPUT_KEY


def group_tau(col: str = "tau") -> pl.Expr:
    """τ of a group of gate rows, :func:`pagestats.core.formulas.group_tau` (the value itself when
    constant, so that a parallel group-by stays bit-reproducible; else the mean)."""
    return formulas.expr(formulas.group_tau(col)).alias(col)


def as_list(by) -> list[str]:
    return [by] if isinstance(by, str) else list(by)


def one_evictor(frame: pl.DataFrame, evictor: str | None) -> tuple[pl.DataFrame, str]:
    """Rows of ``evictor`` (default :func:`headline_evictor`); raises if it is not logged."""
    require_columns(frame, ["evictor"], "one_evictor")
    ev = evictor if evictor is not None else headline_evictor(frame["evictor"].unique().to_list())
    sub = rows_where(frame, pl.col("evictor") == ev)  # no copy when the frame holds one evictor
    if sub.height == 0:
        raise ValueError(f"evictor {ev!r} is not in the outcomes ({sorted(frame['evictor'].unique().to_list())})")
    return sub, ev


def logged_evictor(logs, evictor: str | None) -> str:
    """The evictor a table of ``logs`` reads (default :func:`headline_evictor`); raises if it is not logged."""
    return one_evictor(logs.outcomes.select("evictor").unique(), evictor)[1]


def ordering_margin(means: pl.DataFrame, by=MODEL_CELL, *, value: str = "mean", exclude: Sequence[str] = (),
                    anchor: Sequence[str] | None = defaults.ANCHOR_TASKS, others: str = "dilution-prone") -> pl.DataFrame:
    """The ordering margin of Tables 5–6, 9 and 10 per ``by`` group.

    ``margin = min over the other side's tasks of the task mean − max over the anchor's task
    means``: positive iff every anchor task mean lies strictly below every task mean of the other
    side, i.e. a single threshold separates them on task means. The paper's anchor is NIAH-MK3
    (:data:`pagestats.core.defaults.ANCHOR_TASKS`; ``None``: the capacity-bound class); the other side
    is, with ``others="dilution-prone"``, the dilution-prone tasks (Table 9: "the gap between mean D
    on NIAH-MK3 and the smallest mean D among the dilution-prone tasks"; Tables 5–6) and, with
    ``others="other"``, every other task (Table 10: "the smallest mean D among the other tasks").
    Tasks in ``exclude`` are left out (Table 6's "margin−" excludes niah_multivalue).

    Returns
    -------
    polars.DataFrame
        ``by``, ``capacity_max`` (largest anchor task mean), ``dilution_min`` (smallest task mean
        of the other side), ``margin``, ``ordered`` (margin > 0), ``n_capacity_tasks``,
        ``n_dilution_tasks``; margin null when a side is missing.
    """
    by = as_list(by)
    if others not in ("dilution-prone", "other"):
        raise ValueError(f"others must be 'dilution-prone' or 'other', got {others!r}")
    require_columns(means, [*by, "task", "task_class", value], "ordering_margin")
    m = means.filter(~pl.col("task").is_in(list(exclude)))
    cap = metrics.capacity_side(anchor)
    dil = metrics.dilution_side(anchor) if others == "dilution-prone" else ~cap
    agg = [
        pl.col(value).filter(cap).max().alias("capacity_max"),
        pl.col(value).filter(dil).min().alias("dilution_min"),
        cap.sum().cast(pl.Int64).alias("n_capacity_tasks"),
        dil.sum().cast(pl.Int64).alias("n_dilution_tasks"),
    ]
    out = m.group_by(by).agg(*agg) if by else m.select(*agg)
    out = out.with_columns((pl.col("dilution_min") - pl.col("capacity_max")).alias("margin"))
    out = out.with_columns((pl.col("margin") > 0).alias("ordered"))
    cols = [*by, "capacity_max", "dilution_min", "margin", "ordered", "n_capacity_tasks", "n_dilution_tasks"]
    return out.select(cols).sort(by) if by else out.select(cols)


def same_as(rows, like: pl.DataFrame, by) -> pl.DataFrame:
    """``by`` (with ``evictor``) and ``same_as``: the evictors whose outcomes equal the row's on every
    evicting row of the group (:func:`pagestats.metrics.identical_evictors`), over the relation ``rows``
    of gated rows of ``like`` (:func:`pagestats.metrics.on_rows`)."""
    group = [c for c in by if c != "evictor"]
    return metrics.on_rows(metrics.identical_evictors, rows, like, by=group).select(*group, "evictor", "same_as")


def inputs_per(logs, by: Sequence[str]) -> pl.DataFrame:
    """``by`` and ``n``: the number of distinct inputs (:data:`~pagestats.core.schema.INPUT_KEY`) of each group of ``logs``."""
    return logs.inputs.group_by(list(by)).agg(pl.struct(*INPUT_KEY).n_unique().alias("n"))


def decision_blocks(logs, policy, spec: replay.ProfileSpec):
    """:func:`pagestats.replay.decisions_by_draw`, each block recorded as one row per input and
    head-pair draw (its contract; :func:`pagestats.metrics.engine.known_unique`), so that a metric
    over it reads each row as one input's instead of gathering them."""
    for block in replay.decisions_by_draw(logs, policy, spec):
        metrics.engine.known_unique(block, metrics.engine.input_key(block))
        yield block


def gate_at(logs, spec: replay.ProfileSpec, recalibrate: str, tau: float, pilot_n: int) -> pl.DataFrame:
    """Per (model, context): the gate at the fixed τ carried to the statistic of ``spec``
    (:func:`pagestats.replay.recalibrate`, App. A.3.1: "any sweep of a parameter that rescales D
    must recalibrate τ alongside it").

    Returns
    -------
    polars.DataFrame
        ``model, context_length``, ``tau_gate`` (τ of the cell: its value when constant, as
        :func:`group_tau`, else the mean over inputs and head-pair draws), ``p_open`` (over inputs
        and draws, :func:`pagestats.metrics.p_open`), ``degenerate`` (:data:`pagestats.core.formulas.DEGENERATE`)
        and ``recalibration`` (what was done). A model with too few inputs for the held-out pilot
        of ``pilot_n`` (``recalibrate="z"``) has null numbers and a ``recalibration`` saying why.
    """
    sizes = inputs_per(logs, ["model"])
    cells = logs.inputs.select(*MODEL_CELL).unique()
    small = (sizes.filter(pl.col("n") < pilot_need(pilot_n, defaults.PILOT_SPLIT)) if recalibrate == "z"
             else sizes.head(0))
    out = []
    if small.height < sizes.height:
        policy = replay.recalibrate(FixedTau(tau), recalibrate, pilot_n=pilot_n)
        fit = logs if small.height == 0 else dataclasses.replace(
            logs, inputs=logs.inputs.join(small.select("model"), on="model", how="anti"))
        # a block of head-pair draws at a time (Table 9): per cell the sums that τ's mean and p_open need
        per_block = []
        for block in decision_blocks(fit, policy, spec):
            by = [*MODEL_CELL, *(["pair_draw"] if "pair_draw" in block.columns else [])]
            opened = metrics.p_open(block, by=by).group_by(list(MODEL_CELL)).agg(pl.col("k", "n").sum())
            taus = metrics.engine.query(block, f"SELECT {metrics.engine.names(MODEL_CELL)}, min(tau) AS _tau_min, "
                                               f"max(tau) AS _tau_max, sum(CAST(tau AS DECIMAL(38, 18))) AS _tau_sum, "
                                               f"count(*) AS _n_rows FROM {metrics.engine.ROWS} GROUP BY ALL")
            per_block.append(fit.typed_names(taus.join(opened, on=list(MODEL_CELL))))
        sums = pl.concat(per_block).group_by(list(MODEL_CELL)).agg(
            pl.col("_tau_sum", "_n_rows", "k", "n").sum(), pl.col("_tau_min").min(), pl.col("_tau_max").max())
        out.append(sums.select(
            *MODEL_CELL,
            pl.when(pl.col("_tau_min") == pl.col("_tau_max")).then(pl.col("_tau_min"))
            .otherwise(pl.col("_tau_sum").cast(pl.Float64) / pl.col("_n_rows")).alias("tau_gate"),
            (pl.col("k") / pl.col("n")).alias("p_open"),
        ).with_columns(formulas.expr(formulas.DEGENERATE).alias("degenerate"),
                       pl.lit(f"{recalibrate} (fixed τ = {tau})").alias("recalibration")))
    if small.height:
        out.append(cells.join(small.select("model"), on="model").with_columns(
            pl.lit(None, pl.Float64).alias("tau_gate"), pl.lit(None, pl.Float64).alias("p_open"),
            pl.lit(None, pl.Boolean).alias("degenerate"),
            pl.format("not computed: the held-out pilot of {} inputs needs more than the model's {}",
                      pl.lit(pilot_n), pl.col("model").replace_strict(small["model"], small["n"], return_dtype=pl.Int64))
            .alias("recalibration")))
    return pl.concat(out, how="vertical_relaxed").select(*MODEL_CELL, "tau_gate", "p_open", "degenerate", "recalibration")
