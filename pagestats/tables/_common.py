"""Small pure helpers shared by the table modules.

Only what the engine (:mod:`pagestats.metrics`, :mod:`pagestats.stats`) does not provide
lives here: per-task means of a per-input statistic, the class *ordering margin* of
Tables 6, 9 and 10, and the selection of one evictor's rows. Everything else is called
from the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from pagestats import defaults
from pagestats.columns import MODEL_CELL, headline_evictor, input_key, require_columns
from pagestats.schema import INPUT_KEY


def group_tau(col: str = "tau") -> pl.Expr:
    """τ of a group of gate rows: the value itself when constant, else the mean.

    A fixed, z-scored or midpoint τ is one number per calibration group, repeated on every
    row; averaging the copies would round differently with the (thread-dependent) summation
    order of a parallel group-by, so the report would not be bit-reproducible. The mean is
    used only when τ really varies in the group (head-pair draws, a custom policy).
    """
    tau = pl.col(col)
    return pl.when(tau.n_unique() == 1).then(tau.first()).otherwise(tau.mean()).alias(col)


def as_list(by) -> list[str]:
    return [by] if isinstance(by, str) else list(by)


def one_evictor(frame: pl.DataFrame, evictor: str | None) -> tuple[pl.DataFrame, str]:
    """Rows of ``evictor`` (default :func:`headline_evictor`); raises if it is not logged."""
    require_columns(frame, ["evictor"], "one_evictor")
    ev = evictor if evictor is not None else headline_evictor(frame["evictor"].unique().to_list())
    sub = frame.filter(pl.col("evictor") == ev)
    if sub.height == 0:
        raise ValueError(f"evictor {ev!r} is not in the outcomes ({sorted(frame['evictor'].unique().to_list())})")
    return sub, ev


def logged_evictor(logs, evictor: str | None) -> str:
    """The evictor a table of ``logs`` reads (default :func:`headline_evictor`); raises if it is not logged."""
    return one_evictor(logs.outcomes.select("evictor").unique(), evictor)[1]


def input_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per input (and head-pair draw) of a gate or gated-outcome frame."""
    return frame.unique(subset=input_key(frame), keep="first", maintain_order=True)


def task_means(frame: pl.DataFrame, value: str = "drop", by=MODEL_CELL) -> pl.DataFrame:
    """Mean, SD (ddof=1) and count of a per-input ``value`` per (``by``, task, task_class).

    Each input (and head-pair draw) counts once, so a gated-outcome frame gives the same
    result as the gate frame it came from.
    """
    by = as_list(by)
    require_columns(frame, [*by, *INPUT_KEY, "task_class", value], "task_means")
    keys = [*by, "task", "task_class"]
    out = input_rows(frame).group_by(keys).agg(
        pl.col(value).mean().alias("mean"), pl.col(value).std(ddof=1).alias("sd"),
        pl.len().cast(pl.Int64).alias("n"),
    )
    return out.sort(keys)


def ordering_margin(means: pl.DataFrame, by=MODEL_CELL, *, value: str = "mean", exclude: Sequence[str] = ()) -> pl.DataFrame:
    """The class ordering margin of Tables 6, 9 and 10 per ``by`` group.

    ``margin = min over dilution-prone tasks of the task mean − max over capacity-bound
    tasks of the task mean``: positive iff every capacity-bound task mean lies strictly
    below every dilution-prone task mean, i.e. a single threshold separates the classes
    on task means (Table 9: "the gap between mean D on NIAH-MK3 and the smallest mean D
    among the dilution-prone tasks"). Tasks in ``exclude`` are left out (Table 6's
    "margin−" excludes niah_multivalue).

    Returns
    -------
    polars.DataFrame
        ``by``, ``capacity_max``, ``dilution_min``, ``margin``, ``ordered`` (margin > 0),
        ``n_capacity_tasks``, ``n_dilution_tasks``; margin null when a class is missing.
    """
    by = as_list(by)
    require_columns(means, [*by, "task", "task_class", value], "ordering_margin")
    m = means.filter(~pl.col("task").is_in(list(exclude)))
    cap = pl.col("task_class") == defaults.CAPACITY_BOUND
    dil = pl.col("task_class") == defaults.DILUTION_PRONE
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


@dataclass(frozen=True)
class LogsView:
    """The part of :class:`pagestats.io.Logs` a replay reads (``inputs``, ``topk``), e.g. one model's rows."""

    inputs: pl.DataFrame
    topk: pl.DataFrame | None = None
