"""The validation problem record and the helpers that turn bad rows into problems.

:class:`Problem` (one line of a validation report) and :class:`LogError` (all of them,
raised by ``load(strict=True)``), plus the row helpers every rule of
:mod:`pagestats.io.validation` shares: :func:`emit` (at most :data:`MAX_ROWS_PER_RULE` rows
per rule and file, then a count of the rest), the required-column null rule, the
duplicate-key rule, the range rule and the per-run mode used as a reference. Row
numbers are 0-based positions within the file.

References
----------
docs/SCHEMA.md (reader rules: every problem names the file and the row; no rule stops at the
first problem; required columns non-null; no duplicate inputs, outcome rows or topk rows).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import polars as pl

from pagestats import schema

#: Rows reported per (rule, file) before the rest are summarised in one line.
MAX_ROWS_PER_RULE = 20


@dataclass(frozen=True)
class Problem:
    """One validation problem: the file, the 0-based row within it (or ``None``), a message.

    ``str(problem)`` is one line, ``"FILE:row N: message"`` or ``"FILE: message"``, as
    printed by ``pagestats validate``.
    """

    file: str
    row: int | None
    message: str

    def __str__(self) -> str:
        where = self.file if self.row is None else f"{self.file}:row {self.row}"
        return one_line(f"{where}: {self.message}")


def one_line(text: str) -> str:
    """``text`` with every control, format or line/paragraph-separator character escaped
    (``\\n``, ``\\x1b``, ``\\u2028`` …), so that names from the logs cannot break a
    message into several lines or restyle a terminal."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in _ESCAPED else ch for ch in str(text)
    )


#: Unicode categories escaped by :func:`one_line`: control, format, surrogate (undecodable bytes
#: of a file name), line and paragraph separators.
_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


class LogError(ValueError):
    """Raised by ``load(strict=True)``; carries every problem."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = [str(p) for p in self.problems]
        head = f"{len(lines)} problem{'s' if len(lines) != 1 else ''} in the logs"
        super().__init__("\n".join([head, *lines]))


class ExclusionError(LogError):
    """Raised for an ``exclude`` argument that is malformed or matches no row (a usage error)."""


def _fmt_key(values) -> str:
    return "(" + ", ".join(repr(v) if isinstance(v, str) else str(v) for v in values) + ")"


def emit(bad: pl.DataFrame, files: list[str], rule: str, detail=None) -> list[Problem]:
    """Problems for the rows of ``bad`` (which has ``_file`` and ``_row``), at most
    :data:`MAX_ROWS_PER_RULE` per file, then one line counting the rest.

    ``detail`` is ``None``, the name of a column of per-row text, or a callable taking the
    row as a dict and returning text (called for the reported rows only).
    """
    if bad.height == 0:
        return []
    out: list[Problem] = []
    bad = bad.sort("_file", "_row")
    for (file_idx,), group in bad.group_by("_file", maintain_order=True):
        name = files[int(file_idx)]
        head = group.head(MAX_ROWS_PER_RULE)
        for rec in head.iter_rows(named=True):
            if detail is None:
                msg = rule
            elif callable(detail):
                msg = f"{rule}: {detail(rec)}"
            else:
                msg = f"{rule}: {rec[detail]}"
            out.append(Problem(name, int(rec["_row"]), msg))
        rest = group.height - head.height
        if rest:
            out.append(Problem(name, None, f"{rest} more rows with: {rule}"))
    return out


def _nulls(frame: pl.DataFrame, table: str, files: list[str]) -> list[Problem]:
    """Nulls in required columns, and null elements inside any list column (a list's
    min/max/length rules do not see them)."""
    out = []
    for col in schema.columns(table):
        if col.name not in frame.columns:
            continue
        if col.required and frame[col.name].null_count():
            out += emit(frame.filter(pl.col(col.name).is_null()), files, f"{table} column {col.name!r} is null")
        if isinstance(frame.schema[col.name], pl.List):
            holes = pl.col(col.name).list.eval(pl.element().is_null()).list.any().fill_null(False)
            bad = frame.filter(holes)
            bad = bad.with_columns(pl.format("{} of {} elements null", pl.col(col.name).list.eval(
                pl.element().is_null()).list.sum(), pl.col(col.name).list.len()).alias("_d"))
            out += emit(bad, files, f"{table} column {col.name!r} has null elements", "_d")
    return out


def _duplicates(
    frame: pl.DataFrame, key: tuple[str, ...], files: list[str], what: str, candidates: pl.Expr | None = None
) -> tuple[list[Problem], pl.DataFrame]:
    """Problems for later occurrences of a repeated ``key``, and the frame without them.

    ``candidates`` (a cheap boolean expression, e.g. a duplicated hash) narrows the exact
    comparison of ``key`` to the rows that can be duplicates.
    """
    sub = frame.filter(candidates) if candidates is not None else frame
    if sub.height == 0:
        return [], frame
    later = ~pl.struct(list(key)).is_first_distinct()
    dups = sub.filter(later)
    if dups.height == 0:
        return [], frame
    first = sub.filter(~later).select(*key, pl.col("_file").alias("_f0"), pl.col("_row").alias("_r0"))
    dups = dups.join(first, on=list(key), how="left", nulls_equal=True)

    def detail(rec):
        values = _fmt_key(rec[k] for k in key)
        return f"{_fmt_key(key)} = {values}, first at {files[int(rec['_f0'])]}:row {rec['_r0']}".replace("'", "")

    kept = frame.join(dups.select("_file", "_row"), on=["_file", "_row"], how="anti", maintain_order="left")
    return emit(dups, files, f"duplicate {what}", detail), kept


def _out_of_range(frame, col, lo, hi, files, rule, lo_open=False):
    x = pl.col(col)
    low = (x <= lo) if lo_open else (x < lo)
    bad = frame.filter(x.is_not_null() & (x.is_nan() | low | (x > hi)))
    bad = bad.with_columns(pl.format(f"{col} = {{}}", x).alias("_detail"))
    return emit(bad, files, rule, "_detail")


def _mode_per_run(frame: pl.DataFrame, value: str) -> pl.DataFrame:
    """Most common ``value`` per run_id (ties → smallest), columns run_id, ``value``."""
    counts = frame.group_by("run_id", value).len()
    return counts.sort(["run_id", "len", value], descending=[False, True, False]).unique(
        "run_id", keep="first", maintain_order=True
    ).drop("len")
