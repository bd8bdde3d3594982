"""Figure of the scaling relation: per-input recovery rate ρ against the accuracy headroom
1 − A_full, with the through-origin slope fitted on dilution-prone rows (Fig. 9)."""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats import defaults, metrics
from pagestats.figures import _style as st
from pagestats.figures._frames import require, select_cells, short_task, task_key


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
    rows = metrics.scaling_rows(sub)
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
    triangles; Wilson 95% intervals on ρ as vertical bars; each point labelled by its task.

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
        axis.legend(loc="upper left")
        _label_points(axis, data)
    return fig


#: Vertical offsets (points) tried in turn for a label: just above its point, then below and above
#: it in turn, farther each time.
_LABEL_OFFSETS = (2, -8, 8, -14, 14, 20, 26)


def _label_points(axis, data: pl.DataFrame) -> None:
    """Label each point by its task (and model and context, where the figure holds several).

    Each label takes the first offset of :data:`_LABEL_OFFSETS` whose rendered box stays within
    the axes' height and overlaps no label placed before it (the boxes are measured by the
    figure's renderer after the layout is settled, so the limits and legend must be set first);
    the key to the abbreviations goes under the figure first."""
    several = [k for k in ("model", "context_length") if k in data.columns and data[k].n_unique() > 1]
    st.add_task_key(axis.figure, task_key(data.sort("task")["task"].unique(maintain_order=True).to_list()))
    axis.figure.draw_without_rendering()  # settle the layout: the boxes measured below are final
    frame = axis.get_window_extent()  # a label must not cross the axes' top or bottom
    placed = []  # the window extents of the labels so far
    for row in data.sort("headroom", "rho").iter_rows(named=True):
        label = short_task(row["task"])
        if several:
            label += f" {st.cell_label({k: row[k] for k in several})}"
        for dy in _LABEL_OFFSETS:
            text = axis.annotate(label, (row["headroom"], row["rho"]), xytext=(3, dy), textcoords="offset points",
                                 fontsize=4.5, color="0.25", zorder=4)
            box = text.get_window_extent()
            inside = frame.y0 <= box.y0 and box.y1 <= frame.y1
            if dy == _LABEL_OFFSETS[-1] or (inside and not any(box.overlaps(other) for other in placed)):
                break
            text.remove()
        placed.append(box)
