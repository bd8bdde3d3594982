"""Shared look of every paper figure: single-column size, fonts, colours, saving.

Figures are built on :class:`matplotlib.figure.Figure` directly (never ``pyplot``), so no
GUI backend is touched, nothing is registered in pyplot's figure list (nothing to close)
and rendering works headless with the Agg canvas. Notebooks display the returned
``Figure`` as usual.
"""

from __future__ import annotations

import contextlib
import math
import os
import textwrap
from collections.abc import Sequence

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pagestats.core.escape import terminal

#: Single-column width of a two-column paper, inches.
COLUMN_WIDTH = 3.3
#: Height of one row of panels, inches.
ROW_HEIGHT = 1.45

RC = {
    "font.size": 7,
    "axes.titlesize": 7,
    "axes.labelsize": 7,
    "xtick.labelsize": 6,
    "ytick.labelsize": 6,
    "legend.fontsize": 6,
    "legend.frameon": False,
    "legend.handlelength": 1.8,
    "axes.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "xtick.major.size": 2.5,
    "ytick.major.size": 2.5,
    "lines.linewidth": 1.1,
    "lines.markersize": 3.5,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.5,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "savefig.dpi": 200,
    "figure.dpi": 150,
}

#: Arm colours/styles (Fig. 3: plain solid, gated dashed).
ARM_STYLE = {
    "full": {"color": "0.55", "linestyle": ":", "marker": None, "label": "full KV"},
    "plain": {"color": "0.15", "linestyle": "-", "marker": "o", "label": "plain"},
    "gated": {"color": "#1f77b4", "linestyle": "--", "marker": "s", "label": "gated"},
}
#: Task-class colours (capacity-bound warm, dilution-prone cool).
CLASS_COLOR = {"capacity-bound": "#d62728", "dilution-prone": "#1f77b4"}
CLASS_MARKER = {"capacity-bound": "^", "dilution-prone": "o"}
EARLY_COLOR = "#2ca02c"
LATE_COLOR = "#9467bd"
TAU_COLOR = "0.3"


#: A scatter of more markers than this is drawn as an image inside a vector file (PDF), at the
#: figure's dpi; fewer stay vector. Fig. 2 at 1M inputs draws a million dots (one per input).
RASTER_MARKERS = 50_000


def many_markers(n: int) -> bool:
    """Whether a scatter of ``n`` markers is rasterized in a PDF (:data:`RASTER_MARKERS`); the PNG is
    the same either way."""
    return n > RASTER_MARKERS


def class_color(task_class: str) -> str:
    return CLASS_COLOR.get(task_class, "0.4")


#: Qualitative hues of the per-task lines (matplotlib's tab10, ten hues told apart at a glance),
#: split so that capacity-bound tasks take the warm ones (as :data:`CLASS_COLOR`) and the
#: dilution-prone tasks the others while they last.
WARM_HUES = ("#d62728", "#ff7f0e", "#8c564b", "#e377c2")
COOL_HUES = ("#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#bcbd22", "#7f7f7f")
#: Line styles of the per-task lines: the next one is taken once all ten hues are spent.
TASK_LINESTYLES = ("-", "--", ":", "-.")


def task_styles(order: Sequence[str], capacity: set | frozenset = frozenset()) -> dict[str, dict]:
    """A colour and a line style per task, no two tasks alike (Fig. 5).

    Parameters
    ----------
    order : sequence of str
        The tasks in the figures' order (:func:`pagestats.figures._frames.task_order`).
    capacity : set of str
        The capacity-bound tasks: they take the warm hues first, the others the cool hues first.

    Returns
    -------
    dict
        ``task → {"color", "linestyle"}``: each task the first hue of its class's preference no
        earlier task of the same line style has; once the ten hues are spent, the next line style
        (so up to 40 tasks are told apart).

    Raises
    ------
    ValueError
        With more tasks than hue × line-style pairs (40): the lines could not be told apart.
    """
    order = list(dict.fromkeys(order))
    if len(order) > len(WARM_HUES + COOL_HUES) * len(TASK_LINESTYLES):
        raise ValueError(f"task_styles: {len(order)} tasks; at most "
                         f"{len(WARM_HUES + COOL_HUES) * len(TASK_LINESTYLES)} lines can be told apart")
    styles, used, round_ = {}, set(), 0
    for task in order:
        preference = WARM_HUES + COOL_HUES if task in capacity else COOL_HUES + WARM_HUES
        free = [c for c in preference if c not in used]
        if not free:
            round_, used = round_ + 1, set()
            free = list(preference)
        styles[task] = {"color": free[0], "linestyle": TASK_LINESTYLES[round_]}
        used.add(free[0])
    return styles


def cycle_colors(n: int) -> list:
    """``n`` distinguishable colours (tab10, then tab20)."""
    cmap = mpl.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


@contextlib.contextmanager
def style():
    """Context in which figures of this package are created and drawn."""
    with mpl.rc_context(RC):
        yield


def new_figure(n_panels: int = 1, *, ncols: int | None = None, width: float = COLUMN_WIDTH,
               row_height: float = ROW_HEIGHT, sharex: bool = False, sharey: bool = False):
    """A Figure with ``n_panels`` axes on a grid; returns ``(fig, axes_list)``.

    Unused grid slots are removed. ``ncols`` defaults to min(n_panels, 3). With ``sharex`` the
    lowest panel of every column shows its x tick labels (matplotlib leaves them to the bottom
    row only, so a column whose bottom slot is removed would have none).
    """
    if n_panels < 1:
        raise ValueError("n_panels must be ≥ 1")
    ncols = ncols or min(n_panels, 3)
    nrows = math.ceil(n_panels / ncols)
    fig = Figure(figsize=(width, 0.45 + row_height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex, sharey=sharey)
    axes = list(grid.ravel())
    for ax in axes[n_panels:]:
        ax.remove()
    if sharex:
        for index, ax in enumerate(axes[:n_panels]):
            if index + ncols >= n_panels:  # nothing below it
                ax.xaxis.set_tick_params(labelbottom=True)
    return fig, axes[:n_panels]


def panels(n_panels: int, ax, **kwargs):
    """Axes for ``n_panels`` facets: ``ax`` given by the caller (one Axes or a sequence of
    exactly ``n_panels``) or a new grid. Returns ``(fig, axes_list)``."""
    if ax is None:
        return new_figure(n_panels, **kwargs)
    axes = list(np.ravel(ax)) if isinstance(ax, (Sequence, np.ndarray)) else [ax]
    if len(axes) != n_panels:
        raise ValueError(f"this figure draws {n_panels} panel(s); got {len(axes)} axes")
    return axes[0].figure, axes


def percent_axis(ax, axis: str = "y") -> None:
    """Format a [0, 1] axis as percent."""
    fmt = mpl.ticker.PercentFormatter(xmax=1.0, decimals=0)
    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(fmt)


def save_figure(fig: Figure, stem: str | os.PathLike, formats: Sequence[str] = ("png", "pdf")) -> list[str]:
    """Write ``fig`` as ``stem.png`` and ``stem.pdf`` (Agg canvas); returns the paths."""
    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    paths = []
    os.makedirs(os.path.dirname(os.fspath(stem)) or ".", exist_ok=True)
    for fmt in formats:
        path = f"{os.fspath(stem)}.{fmt}"
        with style():
            fig.savefig(path, metadata=_metadata(fmt))
        paths.append(path)
    return paths


def _metadata(fmt: str) -> dict | None:
    # Reproducible bytes: no creation date in PDF/PNG metadata.
    if fmt == "pdf":
        return {"CreationDate": None, "Creator": "pagestats"}
    if fmt == "png":
        return {"Software": "pagestats"}
    return None


def plain_text(name) -> str:
    """A name from the logs as matplotlib plain text: ``$`` escaped, so that a task or model
    name is never parsed as mathtext (``$\\frac{a$`` would abort the drawing), and control and
    format characters written as escapes (:func:`pagestats.core.escape.terminal`): a raw CR has no glyph,
    and matplotlib's warning about it relayed the CR to stderr."""
    return terminal(name).replace("$", r"\$")


def cell_label(row: dict) -> str:
    """Short label of a (model, context_length[, evictor]) cell."""
    parts = []
    if row.get("model") is not None:
        parts.append(str(row["model"]))
    if row.get("context_length") is not None:
        ctx = int(row["context_length"])
        parts.append(f"{ctx // 1024}K" if ctx % 1024 == 0 and ctx >= 1024 else str(ctx))
    if row.get("evictor") is not None:
        parts.append(str(row["evictor"]))
    return plain_text(" ".join(parts))



def stamp(fig, n: int, tau: str, *, what: str = "inputs") -> None:
    """State what a figure is computed on at its top: ``n = 450 inputs; τ = 0.07`` (the figure's suptitle,
    small and grey; a figure whose caller gave it a suptitle keeps it). Every figure of the paper says
    its N and the threshold its gated numbers used (§4 "Setup"; e.g. Figs. 2, 3)."""
    if fig._suptitle is not None and fig._suptitle.get_text():
        return
    fig.suptitle(f"n = {n:,} {what}; {tau}", fontsize=5, color="0.35")


def add_task_key(fig, key: str, *, legend=None, width: int = 80) -> None:
    """Spell out the task abbreviations (:func:`pagestats.figures._frames.task_key`), wrapped
    to ``width`` characters: as the title of the figure's ``legend`` when there is one (under
    its existing title), else as a note under the figure."""
    if not key:
        return
    text = "\n".join(textwrap.wrap(key, width))
    if legend is None:
        fig.supxlabel(text, fontsize=5, color="0.35")
        return
    title = legend.get_title().get_text()
    legend.set_title(f"{title}\n{text}" if title else text)
    legend.get_title().set_fontsize(5)
    legend.get_title().set_color("0.35")
