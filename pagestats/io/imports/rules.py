"""The record rules every schema of a release shares, each written once: one line per bad record
(file and line, at most :data:`~pagestats.io.imports.records.MAX_LINES_NAMED` per rule).

``rows`` are a file's records in the project's terms (``task``, ``input_id``, ``budget``, ``_line`` …,
file order); each function returns the lines of the records that break its rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from pagestats.core import defaults
from pagestats.io.imports.records import MAX_LINES_NAMED, Records, RecordError, missing_keys


@dataclass(frozen=True)
class Threshold:
    """The τ a file's stored gate ran at: every τ in (``low``, ``high``] reproduces its ``gate_open``;
    ``tau`` is the paper's 0.07 when it lies there, else the shortest decimal that does."""

    tau: float
    low: float  # largest D of a closed input (−inf when none is closed)
    high: float  # smallest D of an open input (+inf when none is open)


def _shortest_decimal(low: float, high: float) -> float:
    """The number in (low, high] with the fewest decimals (ties: the smallest)."""
    for digits in range(0, 17):
        scale = 10.0 ** digits
        candidate = math.floor(low * scale) / scale + 1 / scale
        candidate = round(candidate, digits)
        if low < candidate <= high:
            return candidate
    return high


def infer_tau(drops: pl.Series, gate_open: pl.Series) -> Threshold | None:
    """The threshold of a stored gate (one value per input), or ``None`` when no single τ gives it.

    The gate is open iff D ≥ τ (Eq. 2), so the stored decisions fit exactly the τ in
    (max D of the closed inputs, min D of the open ones]. The paper's default τ = 0.07 is recorded
    when it fits (App. F); otherwise the shortest decimal that fits (the release's Qwen2.5-3B file
    ran at 0.04, its README says). With every input on one side, one bound is infinite and τ is the
    paper's default when it fits, else the open bound's side of it.
    """
    closed = drops.filter(~gate_open)
    opened = drops.filter(gate_open)
    low = float(closed.max()) if closed.len() else -math.inf
    high = float(opened.min()) if opened.len() else math.inf
    if not low < high:
        return None
    if low < defaults.TAU <= high:
        return Threshold(defaults.TAU, low, high)
    if math.isinf(high):
        return Threshold(_shortest_decimal(low, low + 1.0), low, high)
    if math.isinf(low):
        return Threshold(_shortest_decimal(high - 1.0, high), low, high)
    return Threshold(_shortest_decimal(low, high), low, high)


def lines(path: str, bad: pl.DataFrame, message: Callable[[dict], str]) -> list[str]:
    """``path:line: message`` for the first bad records."""
    return [f"{path}:{r['_line']}: {message(r)}" for r in bad.head(MAX_LINES_NAMED).iter_rows(named=True)]


def repeated(path: str, rows: pl.DataFrame) -> list[str]:
    """A (task, id, budget) that an earlier record of the file holds."""
    key = pl.struct("task", "input_id", "budget")
    return lines(path, rows.filter(key.is_duplicated() & ~key.is_first_distinct()),
                 lambda r: f"(task, id, budget) = ({r['task']}, {r['input_id']}, {r['budget']:g}) repeats an earlier record")


def differing(path: str, rows: pl.DataFrame, columns: dict[str, str]) -> list[str]:
    """A per-input value (``columns``: column → the name a line gives it) that differs from the input's first record's."""
    out = []
    for column, what in columns.items():
        first = rows.group_by("task", "input_id", maintain_order=True).agg(pl.col(column).first().alias("_first"))
        bad = rows.join(first, on=["task", "input_id"]).filter(pl.col(column) != pl.col("_first"))
        out += lines(path, bad, lambda r, c=column, w=what: f"{w} {r[c]} of input ({r['task']}, {r['input_id']}) "
                     f"differs from its first record's {r['_first']}")
    return out


def stored_threshold(path: str, per_input: pl.DataFrame) -> Threshold:
    """The τ the file's stored gate ran at (:func:`infer_tau`); a :class:`RecordError` naming the closed
    and the open input that no single τ separates."""
    threshold = infer_tau(per_input["drop"], per_input["gate_open"])
    if threshold is not None:
        return threshold
    closed = per_input.filter(~pl.col("gate_open")).sort("drop", descending=True).row(0, named=True)
    opened = per_input.filter(pl.col("gate_open")).sort("drop").row(0, named=True)
    raise RecordError(path, [f"{path}:{closed['_line']}: the stored gate fits no single τ: input ({closed['task']}, "
                             f"{closed['input_id']}) is closed at D = {closed['drop']!r}, at or above the D = "
                             f"{opened['drop']!r} of open input ({opened['task']}, {opened['input_id']}, line "
                             f"{opened['_line']})"])


def keyed_rows(records: Records, *columns: pl.Expr) -> pl.DataFrame:
    """A file's records as ``task, input_id, budget, n_tokens``, then ``columns``, then ``_line``; a
    :class:`RecordError` names a record that lacks a key its schema requires, or says a value has the
    wrong type."""
    path, frame = records.path, records.frame
    problems = missing_keys(records)
    if problems:
        raise RecordError(path, problems)
    try:
        return frame.select(pl.col("task").cast(pl.String), pl.col("id").cast(pl.Int64).alias("input_id"),
                            pl.col("budget").cast(pl.Float64), pl.col("T").cast(pl.Int64).alias("n_tokens"),
                            *columns, "_line")
    except pl.exceptions.InvalidOperationError as err:
        raise RecordError(path, [f"{path}: a value of the wrong type ({str(err).splitlines()[0]})"]) from None
