"""Small frame helpers shared by the figure modules (checking and ordering only; every
statistic comes from :mod:`pagestats.metrics`, :mod:`pagestats.replay` or
:mod:`pagestats.stats`)."""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl

from pagestats.columns import MODEL_CELL, require_columns
from pagestats.escape import terminal


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
        frame = frame.filter(pl.col(name).is_in(values))
        if frame.height == 0:
            raise ValueError(f"no rows with {name} in {values}")
    return frame


def task_order(frame: pl.DataFrame, value: str | None = None) -> list[str]:
    """Tasks ordered capacity-bound first, then by ascending mean ``value`` (or by name)."""
    keys = ["task"] + (["task_class"] if "task_class" in frame.columns else [])
    agg = [pl.len().alias("_n")]
    if value is not None:
        agg.append(pl.col(value).mean().alias("_v"))
    summary = frame.group_by(keys).agg(agg)
    if "task_class" in summary.columns:
        summary = summary.with_columns((pl.col("task_class") != "capacity-bound").alias("_c"))
    else:
        summary = summary.with_columns(pl.lit(True).alias("_c"))
    by = ["_c"] + (["_v"] if value is not None else []) + ["task"]
    return summary.sort(by)["task"].unique(maintain_order=True).to_list()


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
