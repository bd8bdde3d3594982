"""Writing one report entry's result to files (figures as PNG/PDF; tables as CSV, Markdown and,
with a :class:`~pagestats.tables.Layout`, HTML), and the report folder itself, moved into place
only once complete (:func:`staged_directory`): a failure never leaves a half-written report.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import polars as pl
from matplotlib.figure import Figure

from pagestats.figures import save_figure
from pagestats.tables import Layout, write_table

#: Figure formats written by default.
FIGURE_FORMATS = ("png", "pdf")


class _EmptyOutput(ValueError):
    """An entry produced a figure without data or a table without rows (reported as a skip)."""


def _figure_of(item):
    if isinstance(item, Figure):
        return item
    fig = getattr(item, "figure", None)
    if isinstance(fig, Figure):
        return fig
    raise TypeError(f"a figure entry must return a Figure or an Axes, got {type(item).__name__}")


def _write_figure(item, stem: Path, formats: Sequence[str] = FIGURE_FORMATS) -> list[str]:
    fig = _figure_of(item)
    if not fig.axes or not any(ax.has_data() for ax in fig.axes):
        raise _EmptyOutput("the figure came out without data")
    return save_figure(fig, stem, formats=formats)


def _table_parts(item) -> tuple[pl.DataFrame, Layout | None]:
    """(frame, layout or None) of a table entry's result: a polars frame, or (frame, Layout)."""
    if isinstance(item, pl.DataFrame):
        return item, None
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], pl.DataFrame) and isinstance(item[1], Layout):
        return item
    raise TypeError(f"a table entry must return a polars DataFrame or (DataFrame, Layout), got {type(item).__name__}")


def _write_table(item, stem: Path, formats=None) -> list[str]:
    frame, layout = _table_parts(item)
    if frame.height == 0:
        raise _EmptyOutput("the table came out without rows")
    # the report's names are categorical (io.categorical_names); every writer gets them as text, so that
    # the CSV escapes them (escape.csv_frame reads text columns) and great_tables aligns them as text
    frame = frame.cast({c: pl.String for c, t in frame.schema.items() if isinstance(t, pl.Categorical)})
    # the Markdown file lists the tidy numbers (4 significant digits); HTML is the typeset table
    return [*write_table(frame, stem, layout, formats=("csv",)), *write_table(frame, stem, None, formats=("md",)),
            *write_table(frame, stem, layout, formats=("html",))]


@contextlib.contextmanager
def staged_directory(out) -> Iterator[Path]:
    """A fresh folder beside ``out`` to write into; on success it replaces ``out`` (a previous
    report is removed only then), on failure it is removed and ``out`` is left as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    os.chmod(tmp, 0o755)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:12]}"
    had_old = out.is_dir()
    if had_old:
        os.rename(out, old)
    os.rename(tmp, out)
    if had_old:
        shutil.rmtree(old)
