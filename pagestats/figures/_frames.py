"""Small frame helpers shared by the figure modules (checking and ordering only; every
statistic comes from :mod:`pagestats.metrics`, :mod:`pagestats.replay` or
:mod:`pagestats.stats`)."""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl

from pagestats.core import defaults
from pagestats.core.columns import MODEL_CELL, require_columns, rows_where
from pagestats.core.escape import terminal


def require(frame: pl.DataFrame, columns: Iterable[str], what: str) -> None:
    """Raise a clear error when ``frame`` lacks any of ``columns`` or is empty."""
    require_columns(frame, list(columns), what, non_empty=True)


def short_task(task: str) -> str:
    """Compact RULER task label for tick labels (niah_multikey_3 → MK3), as plain text (``$`` escaped);
    :func:`task_key` spells the abbreviations out."""
    return (terminal(task).replace("niah_", "").replace("multikey_", "MK").replace("multiquery", "MQ")
            .replace("multivalue", "MV").replace("single_", "S").replace("$", r"\$"))


def task_key(tasks: Iterable[str]) -> str:
    """The key to the abbreviations of :func:`short_task`, e.g. ``"MK3 = niah_multikey_3,
    vt = variable tracking"``: every abbreviated task in the order given, then the RULER
    tasks whose short names are not words (vt, cwe, fwe); plain text (``$`` escaped)."""
    spelled = {"vt": "variable tracking", "cwe": "common words", "fwe": "frequent words"}
    items = []
    for task in dict.fromkeys(tasks):
        short, plain = short_task(task), terminal(task).replace("$", r"\$")  # plain text, as short_task
        if short != plain:
            items.append(f"{short} = {plain}")
        elif task in spelled:
            items.append(f"{task} = {spelled[task]}")
    return ", ".join(items)


def n_inputs(frame: pl.DataFrame) -> int:
    """The distinct inputs (run_id, task, input_id; those present) of a frame a figure draws."""
    key = present(frame, ("run_id", "task", "input_id"))
    require_columns(frame, ["input_id"], "n_inputs")
    return frame.select(key).n_unique()


def tau_text(frame: pl.DataFrame | None = None, tau: float | None = None) -> str:
    """The threshold a figure's gated numbers were computed at, as its stamp says it: ``τ = 0.07``
    (``tau`` given, else the one value of the frame's ``tau`` column), ``τ = a–b (per calibration
    group)`` when it varies (a z-scored or midpoint τ), or that the policy sets no τ (the oracle)."""
    if tau is not None:
        return f"τ = {tau:g}"
    if frame is None or "tau" not in frame.columns:
        return "τ not recorded in the rows drawn"
    values = frame.select(pl.col("tau").drop_nulls().unique().sort())["tau"]
    if values.len() == 0:
        return "no τ (the policy decides without a threshold)"
    if values.len() == 1:
        return f"τ = {values[0]:g}"
    return f"τ = {values.min():.3g}–{values.max():.3g} (per calibration group)"


def present(frame: pl.DataFrame, keys: Iterable[str]) -> list[str]:
    """The subset of ``keys`` that are columns of ``frame``, in order."""
    return [k for k in keys if k in frame.columns]


def select_cells(frame: pl.DataFrame, **filters) -> pl.DataFrame:
    """Rows whose columns equal the given non-None filter values (a value may be a list)."""
    for name, value in filters.items():
        if value is None:
            continue
        if name not in frame.columns:
            raise ValueError(f"cannot filter on {name!r}: no such column")
        values = list(value) if isinstance(value, (list, tuple, set)) else [value]
        frame = rows_where(frame, pl.col(name).is_in(values))
        if frame.height == 0:
            raise ValueError(f"no rows with {name} in {values}")
    return frame


def task_order(frame: pl.DataFrame) -> list[str]:
    """The one task order of every figure that lists tasks: capacity-bound tasks first, then
    the others, each class in the order of :data:`pagestats.core.defaults.RULER_TASKS` (RULER's own
    order: NIAH single, multikey 1-3, multivalue, multiquery, vt, cwe, fwe, qa_1, qa_2), tasks
    outside RULER after those, by name.

    A task is capacity-bound when any of its rows of ``frame`` is (``task_class``); without a
    ``task_class`` column every task is ranked by the RULER order alone. The order depends on
    the task names and classes only, never on a measured value, so a task sits in the same place
    in every figure and every panel (a panel shows the tasks it holds, in this order).

    References
    ----------
    PAGE paper, §4 "The partition" (capacity-bound vs dilution-prone), Table 3; Figures 2, 3, 5, 10, 11.
    """
    require_columns(frame, ["task"], "task_order")
    if "task_class" in frame.columns:
        summary = frame.group_by("task").agg(
            (pl.col("task_class") == defaults.CAPACITY_BOUND).any().alias("_cap"))
        capacity = {t for t, cap in summary.iter_rows() if cap}
    else:
        capacity = set()
    ruler = {t: i for i, t in enumerate(defaults.RULER_TASKS)}
    tasks = frame["task"].unique().to_list()
    if any(t is None for t in tasks):
        raise ValueError("task_order: a row has no task")
    return sorted(tasks, key=lambda t: (t not in capacity, ruler.get(t, len(ruler)), t))


def cells(frame: pl.DataFrame, keys=MODEL_CELL) -> list[dict]:
    """Distinct cells (dicts of the present ``keys``), sorted."""
    keys = present(frame, keys)
    if not keys:
        return [{}]
    return frame.select(keys).unique().sort(keys).to_dicts()


def where(frame: pl.DataFrame, cell: dict) -> pl.DataFrame:
    """Rows of one cell."""
    for k, v in cell.items():
        frame = frame.filter(pl.col(k) == v) if v is not None else frame.filter(pl.col(k).is_null())
    return frame
