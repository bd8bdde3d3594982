"""Figure of the scaling relation: per-input recovery rate ρ against the accuracy headroom
1 − A_full, with the through-origin slope fitted on dilution-prone rows (Fig. 9)."""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.transforms import Bbox

from pagestats import metrics
from pagestats.core import defaults
from pagestats.figures import _style as st
from pagestats.figures._frames import n_inputs, require, select_cells, short_task, task_key, task_order


def scaling_data(gated: pl.DataFrame, *, evictor=None, rule: str = defaults.DILUTION_RULE) -> pl.DataFrame:
    """ρ and headroom per (model, context_length, task) row, with the through-origin fit
    (data of Fig. 9).

    Parameters
    ----------
    gated : polars.DataFrame
        ``replay.gated_outcomes(...)`` including the budget-1.0 rows.
    evictor : str, optional
        Plain evictor whose ρ is used (needed when the frame holds several).

    Returns
    -------
    polars.DataFrame
        The rows of :func:`pagestats.metrics.scaling_rows` (``model, context_length, task,
        task_class, n, a_full, headroom, k, rho, low, high``, …) plus ``fit_slope``,
        ``fit_se``, ``fit_n`` (:func:`pagestats.metrics.scaling_fit`: binomial GLM slope
        through the origin of ρ on headroom over the dilution-prone rows of ``rule`` with
        headroom > 0; NaN when there are none or none recovered) and ``fitted`` (slope × headroom).

    References
    ----------
    PAGE paper, §5 "Scaling Relation", Eq. 4; App. A.6.4, Table 25; Figure 9 (slope 0.34).
    """
    require(gated, ("task", "budget", "score_full", "score_plain"), "scaling_data")
    sub = select_cells(gated, evictor=evictor)
    if "evictor" in sub.columns and sub["evictor"].n_unique() > 1:
        raise ValueError(f"scaling_data: choose one evictor of {sub['evictor'].unique().sort().to_list()}")
    rows = metrics.on_frame(metrics.scaling_rows, sub)
    dil = rows.filter(metrics.in_fit(rule) & pl.col("rho").is_not_null() & (pl.col("headroom") > 0))
    slope = se = np.nan
    n = dil.height
    if n and int(dil["k"].sum()) > 0:
        fit = metrics.scaling_fit(rows, rule=rule)
        slope, se, n = fit.slope, fit.se, fit.n
    return rows.with_columns(
        pl.lit(slope, dtype=pl.Float64).alias("fit_slope"),
        pl.lit(se, dtype=pl.Float64).alias("fit_se"),
        pl.lit(n, dtype=pl.Int64).alias("fit_n"),
        (pl.lit(slope, dtype=pl.Float64) * pl.col("headroom")).alias("fitted"),
    )


def rho_vs_headroom(gated: pl.DataFrame, *, evictor=None, ax=None, rule: str = defaults.DILUTION_RULE):
    """Figure 9: ρ against headroom 1 − A_full per (model, context, task) row; dilution-prone
    rows as filled circles with the fitted through-origin line, capacity-bound rows as open
    triangles; Wilson 95% intervals on ρ as vertical bars; each point (or pile of coinciding
    points) labelled by its task, clear of the other labels and markers; the legend under the axes.

    Returns
    -------
    matplotlib.figure.Figure

    References
    ----------
    PAGE paper, Figure 9.
    """
    data = scaling_data(gated, evictor=evictor, rule=rule)
    with st.style():
        fig, (axis,) = st.panels(1, ax, row_height=2.0)
        for cls in (defaults.DILUTION_PRONE, defaults.CAPACITY_BOUND):
            c = data.filter(pl.col("task_class") == cls)
            if c.height == 0:
                continue
            color = st.class_color(cls)
            x, y = c["headroom"].to_numpy(), c["rho"].to_numpy()
            if "low" in c.columns:
                axis.vlines(x, c["low"].to_numpy(), c["high"].to_numpy(), color=color, alpha=0.35,
                            linewidth=0.6)
            axis.scatter(x, y, marker=st.CLASS_MARKER[cls], s=14,
                         facecolors=color if cls == defaults.DILUTION_PRONE else "white",
                         edgecolors=color, linewidths=0.8, label=cls, zorder=3)
        slope = float(data["fit_slope"][0])
        xmax = max(float(data["headroom"].max()), 0.05) * 1.05
        if np.isfinite(slope):
            xs = np.array([0.0, xmax])
            axis.plot(xs, slope * xs, color=st.class_color(defaults.DILUTION_PRONE), linewidth=0.9,
                      linestyle="--", label=rf"binomial fit ({rule}) $\rho = {slope:.2f}\,(1 - A_\mathrm{{full}})$", zorder=2)
        axis.set_xlim(0, xmax)
        axis.set_ylim(bottom=-0.01)
        axis.set_xlabel(r"headroom $1 - A_\mathrm{full}$")
        axis.set_ylabel(r"recovery rate $\rho$ (plain)")
        handles, labels = axis.get_legend_handles_labels()
        legend = fig.legend(handles, labels, loc="outside lower center", ncols=2)  # off the points
        _label_points(axis, data, legend=legend)
    st.stamp(fig, n_inputs(gated if evictor is None else select_cells(gated, evictor=evictor)),
             "no τ (ρ reads the plain arm)")
    return fig


#: Points closer than this (in points, on the page) to each other are one pile, named by one label
#: (their markers, about 3.7 pt wide, cover each other).
PILE_DISTANCE = 3.0
#: Radius (points) around a marker that no label may cover.
MARKER_RADIUS = 3.5
#: Offsets (points) and alignments tried in turn for a label: right, left, above and below its
#: point, then diagonally, then farther out.
_LABEL_SPOTS = tuple(
    [(4, 0, "left", "center"), (-4, 0, "right", "center"), (0, 5, "center", "bottom"), (0, -5, "center", "top")]
    + [(sx * dx, sy * dy, "left" if sx > 0 else "right", "bottom" if sy > 0 else "top")
       for dx, dy in ((4, 5), (6, 12), (8, 20)) for sy in (1, -1) for sx in (1, -1)]
)


#: Labels farther than this (points, vertically) from their point get a leader line to it.
LEADER_FROM = 6


def _piles(xy: np.ndarray, distance: float) -> list[list[int]]:
    """Indices of ``xy`` (display coordinates) grouped into piles: single linkage, two points
    closer than ``distance`` in one pile; piles and their members in index order."""
    parent = list(range(len(xy)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(xy)):
        for j in range(i + 1, len(xy)):
            if np.hypot(*(xy[i] - xy[j])) < distance:
                parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(len(xy)):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values())


def _pile_label(rows: list[dict], several: list[str]) -> str:
    """One label for the rows of a pile: each task once, with the cells it is drawn for."""
    by_task: dict[str, list[str]] = {}
    for row in sorted(rows, key=lambda r: tuple(r[k] for k in several)):
        by_task.setdefault(row["task"], []).append(st.cell_label({k: row[k] for k in several}) if several else "")
    parts = []
    for task, where_ in by_task.items():
        cells_ = ", ".join(w for w in where_ if w)
        parts.append(f"{short_task(task)} {cells_}" if cells_ else short_task(task))
    return "; ".join(parts)


def _label_points(axis, data: pl.DataFrame, *, legend=None) -> None:
    """Label the points by their task (and model and context, where the figure holds several).

    Points closer than :data:`PILE_DISTANCE` on the page (coinciding rows, e.g. several cells at
    headroom 0 and ρ = 0) are one pile with one label naming every row of it. Each label takes the
    first spot of :data:`_LABEL_SPOTS` whose rendered box stays inside the axes and covers no
    label placed before it and no marker (within :data:`MARKER_RADIUS`); where every spot covers
    something, the spot that covers the fewest; a label set farther than :data:`LEADER_FROM` from
    its point is tied to it by a thin line. The boxes are measured by the figure's renderer
    after the layout is settled, so the limits and legend must be set first; the key to the
    abbreviations goes under the figure first (the title of ``legend`` when given).
    """
    several = [k for k in ("model", "context_length") if k in data.columns and data[k].n_unique() > 1]
    st.add_task_key(axis.figure, task_key(task_order(data)), legend=legend)
    axis.figure.draw_without_rendering()  # settle the layout: the boxes measured below are final
    frame = axis.get_window_extent()
    points = data.sort("headroom", "rho", "task", *several).to_dicts()
    xy = axis.transData.transform(np.column_stack([[r["headroom"] for r in points], [r["rho"] for r in points]]))
    px = axis.figure.dpi / 72.0  # display units per point
    radius = MARKER_RADIUS * px
    markers = [Bbox.from_extents(x - radius, y - radius, x + radius, y + radius) for x, y in xy]
    placed = []  # the window extents of the labels so far
    for pile in _piles(xy, PILE_DISTANCE * px):
        label = _pile_label([points[i] for i in pile], several)
        anchor = (float(np.mean([points[i]["headroom"] for i in pile])), float(np.mean([points[i]["rho"] for i in pile])))
        best = None
        for dx, dy, ha, va in _LABEL_SPOTS:
            far = abs(dy) > LEADER_FROM  # a label set off from its point is tied to it by a thin line
            text = axis.annotate(label, anchor, xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                                 fontsize=4.5, color="0.25", zorder=4,
                                 arrowprops=dict(arrowstyle="-", color="0.55", linewidth=0.4, shrinkA=0.5,
                                                 shrinkB=2.5) if far else None)
            box = text.get_window_extent()
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            clashes = (0 if inside else 1000) + sum(box.overlaps(b) for b in placed) + sum(box.overlaps(m) for m in markers)
            if best is None or clashes < best[0]:
                if best is not None:
                    best[1].remove()
                best = (clashes, text, box)
            else:
                text.remove()
            if clashes == 0:
                break
        placed.append(best[2])
