"""Rendering of the tidy table frames: CSV, Markdown, and HTML / LaTeX through great_tables.

The table functions return numbers only. Formatting — ``"0.75 [0.61, 0.86]"`` intervals,
spanners, source notes with n, method and correction — happens here and nowhere else
(STYLE.md, "From great_tables").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pagestats.core.escape import csv_frame, markdown


def markdown_table(frame: pl.DataFrame, float_digits: int = 4) -> str:
    """A GitHub pipe table of ``frame`` (floats to ``float_digits`` significant digits)."""

    def cell(v) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return "NaN" if v != v else f"{v:.{float_digits}g}"
        if isinstance(v, (list, tuple)):
            return ", ".join(cell(x) for x in v)
        return markdown(v)

    header = "| " + " | ".join(markdown(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join([header, rule, *rows]) + "\n"


def _flat_for_csv(frame: pl.DataFrame) -> pl.DataFrame:
    """Nested columns as text, and every text cell escaped for CSV (:func:`pagestats.core.escape.csv_frame`)."""
    nested = [c for c, t in frame.schema.items() if isinstance(t, (pl.List, pl.Array, pl.Struct))]
    flat = frame.with_columns(pl.col(c).map_elements(str, return_dtype=pl.String) for c in nested) if nested else frame
    return csv_frame(flat)


@dataclass(frozen=True)
class Layout:
    """How a tidy table frame is typeset.

    Parameters
    ----------
    title : str
        Table title (the paper item it reproduces).
    intervals : mapping
        Display column → ``(estimate, low, high)`` columns merged into ``"est [low, high]"``.
    decimals : int
        Digits of every float column.
    spanners : mapping
        Spanner label → columns under it (display names).
    notes : sequence of str
        Source notes (n, method, correction).
    hide : sequence of str
        Columns of the tidy frame left out of the typeset table.
    """

    title: str = ""
    intervals: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    decimals: int = 3
    spanners: Mapping[str, Sequence[str]] = field(default_factory=dict)
    notes: Sequence[str] = ()
    hide: Sequence[str] = ()


def format_interval(estimate: str, low: str, high: str, decimals: int = 3) -> pl.Expr:
    """A polars expression ``"est [low, high]"`` (empty string where the estimate is null)."""

    def num(c):
        return pl.col(c).round(decimals).cast(pl.String)

    text = pl.format("{} [{}, {}]", num(estimate), num(low), num(high))
    return pl.when(pl.col(estimate).is_null() | pl.col(estimate).is_nan()).then(pl.lit("")).otherwise(text)


def display_frame(frame: pl.DataFrame, layout: Layout) -> pl.DataFrame:
    """The frame as it is typeset: intervals merged, hidden columns dropped, floats rounded."""
    merged = [c for triple in layout.intervals.values() for c in triple]
    out = frame.with_columns(
        format_interval(*cols, decimals=layout.decimals).alias(name) for name, cols in layout.intervals.items()
    )
    keep, seen = [], set()
    for c in frame.columns:
        if c in layout.hide or c in seen:
            continue
        if c in merged:
            # the merged column takes the place of its estimate column
            for name, cols in layout.intervals.items():
                if c == cols[0] and name not in seen:
                    keep.append(name)
                    seen.add(name)
            continue
        keep.append(c)
        seen.add(c)
    out = out.select(keep)
    floats = [c for c, t in out.schema.items() if t in (pl.Float32, pl.Float64)]
    return out.with_columns(pl.col(c).round(layout.decimals) for c in floats)


def to_gt(frame: pl.DataFrame, layout: Layout, table_id: str | None = None):
    """A great_tables ``GT`` of ``frame`` typeset by ``layout``.

    ``table_id`` becomes the HTML element id; without it great_tables draws a random one,
    so give it wherever the output should be byte-reproducible (the report does).
    """
    from great_tables import GT  # 0.2 s CPU, paid only where a table is typeset (ARCHITECTURE.md)

    shown = display_frame(frame, layout)
    gt = GT(shown, id=table_id)
    if layout.title:
        gt = gt.tab_header(title=layout.title)
    for label, cols in layout.spanners.items():
        cols = [c for c in cols if c in shown.columns]
        if cols:
            gt = gt.tab_spanner(label=label, columns=cols)
    floats = [c for c, t in shown.schema.items() if t in (pl.Float32, pl.Float64)]
    if floats:
        gt = gt.fmt_number(columns=floats, decimals=layout.decimals)
    for note in layout.notes:
        gt = gt.tab_source_note(note)
    return gt


def to_markdown(frame: pl.DataFrame, layout: Layout | None = None) -> str:
    """GitHub pipe table of ``frame`` (typeset by ``layout`` when given), notes below."""
    shown = display_frame(frame, layout) if layout is not None else frame
    text = markdown_table(shown)
    if layout is not None and layout.notes:
        text += "\n" + "\n".join(f"*{n}*" for n in layout.notes) + "\n"
    return text


def write_table(frame: pl.DataFrame, stem, layout: Layout | None = None, *, formats=("csv", "md", "html", "tex")) -> list[str]:
    """Write ``frame`` as ``stem.csv`` (numbers at full precision), ``stem.md`` (typeset by
    ``layout`` when given, with its notes) and — with a ``layout`` — ``stem.html`` and
    ``stem.tex`` through great_tables (element id ``stem``'s name, so the HTML is
    byte-reproducible). The one table writer of the package. Returns the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    if "csv" in formats:
        _flat_for_csv(frame).write_csv(f"{stem}.csv", float_precision=None)
        paths.append(f"{stem}.csv")
    if "md" in formats:
        Path(f"{stem}.md").write_text(to_markdown(frame, layout))
        paths.append(f"{stem}.md")
    if layout is not None:
        gt = to_gt(frame, layout, table_id=stem.name)
        if "html" in formats:
            Path(f"{stem}.html").write_text(gt.as_raw_html())
            paths.append(f"{stem}.html")
        if "tex" in formats:
            Path(f"{stem}.tex").write_text(gt.as_latex())
            paths.append(f"{stem}.tex")
    return paths
