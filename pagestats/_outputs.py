"""Writing one report entry's result to files: figures (PNG/PDF) and tables (CSV, Markdown,
HTML when typeset with great_tables) — DESIGN §5 ``pagestats report`` outputs.

Below both :mod:`pagestats.report` and :mod:`pagestats.tables` in the data flow: the
report writes entries with these functions, and the table renderer reuses
:func:`markdown_table`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

#: Figure formats written by default.
FIGURE_FORMATS = ("png", "pdf")


class _EmptyOutput(ValueError):
    """An entry produced a figure without data or a table without rows (reported as a skip)."""


def _figure_of(item):
    from matplotlib.figure import Figure

    if isinstance(item, Figure):
        return item
    fig = getattr(item, "figure", None)
    if isinstance(fig, Figure):
        return fig
    raise TypeError(f"a figure entry must return a Figure or an Axes, got {type(item).__name__}")


def _write_figure(item, stem: Path, formats: Sequence[str] = FIGURE_FORMATS) -> list[str]:
    from pagestats.figures import save_figure

    fig = _figure_of(item)
    if not fig.axes or not any(ax.has_data() for ax in fig.axes):
        raise _EmptyOutput("the figure came out without data")
    return save_figure(fig, stem, formats=formats)


def _table_parts(item) -> tuple[pl.DataFrame, object | None]:
    """(frame, great_tables GT or None) of a table entry's result."""
    if isinstance(item, pl.DataFrame):
        return item, None
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], pl.DataFrame):
        return item[0], item[1]
    data = getattr(item, "_tbl_data", None)  # a great_tables.GT built from a polars frame
    if isinstance(data, pl.DataFrame):
        return data, item
    raise TypeError(f"a table entry must return a polars DataFrame or a great_tables GT, got {type(item).__name__}")


def markdown_table(frame: pl.DataFrame, float_digits: int = 4) -> str:
    """A GitHub pipe table of ``frame`` (floats to ``float_digits`` significant digits)."""

    def cell(v) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return "NaN" if v != v else f"{v:.{float_digits}g}"
        if isinstance(v, (list, tuple)):
            return ", ".join(cell(x) for x in v)
        return str(v).replace("|", "\\|").replace("\n", " ")

    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join([header, rule, *rows]) + "\n"


def _flat_for_csv(frame: pl.DataFrame) -> pl.DataFrame:
    nested = [c for c, t in frame.schema.items() if isinstance(t, (pl.List, pl.Array, pl.Struct))]
    return frame.with_columns(pl.col(c).map_elements(str, return_dtype=pl.String) for c in nested) if nested else frame


def _write_table(item, stem: Path, formats=None) -> list[str]:
    frame, gt = _table_parts(item)
    if frame.height == 0:
        raise _EmptyOutput("the table came out without rows")
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [f"{stem}.csv", f"{stem}.md"]
    _flat_for_csv(frame).write_csv(paths[0], float_precision=None)
    Path(paths[1]).write_text(markdown_table(frame))
    if gt is not None:
        Path(f"{stem}.html").write_text(gt.as_raw_html())
        paths.append(f"{stem}.html")
    return paths
