"""Figures of the per-input recovery indicator r(x): its distribution per task pooled over
cells (Fig. 10) and the fraction of strictly recovered inputs per task and cell (Fig. 11)."""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats import metrics, stats
from pagestats.core.columns import MODEL_CELL
from pagestats.figures import _style as st
from pagestats.figures._frames import (cells, n_inputs, present, require, short_task, task_key, task_order, tau_text,
                                       where)

R_VALUES = (-1, 0, 1)


def _indicator(gated: pl.DataFrame) -> pl.DataFrame:
    require(gated, ("task", "input_id", "budget", "score_plain", "score_gated"), "recovery indicator")
    return metrics.on_frame(metrics.recovery_indicator, gated)


def recovery_distribution_data(gated: pl.DataFrame) -> pl.DataFrame:
    """Distribution of r(x) per task, pooled over (model, context, evictor) cells
    (data of Fig. 10).

    Parameters
    ----------
    gated : polars.DataFrame
        ``replay.gated_outcomes(...)`` including the budget-1.0 rows.

    Returns
    -------
    polars.DataFrame
        One row per (task, r) for r ∈ {−1, 0, +1} (zero counts kept): ``task``,
        ``task_class``, ``r``, ``count``, ``n`` (inputs of the task) and ``fraction``.
        r(x) is :func:`pagestats.metrics.recovery_indicator`.

    References
    ----------
    PAGE paper, App. A.7.1, Figure 10 (r = −1 is empty by construction).
    """
    r = _indicator(gated)
    keys = ["task"] + present(r, ("task_class",))
    tasks = r.select(keys).unique()
    grid = tasks.join(pl.DataFrame({"r": list(R_VALUES)}, schema={"r": pl.Int64}), how="cross")
    counts = r.with_columns(pl.col("r").cast(pl.Int64)).group_by(*keys, "r").agg(pl.len().alias("count"))
    out = grid.join(counts, on=[*keys, "r"], how="left").with_columns(
        pl.col("count").fill_null(0).cast(pl.Int64)
    )
    out = out.with_columns(pl.col("count").sum().over(keys).alias("n"))
    return out.with_columns((pl.col("count") / pl.col("n")).alias("fraction")).sort([*keys, "r"])


def recovery_distribution(gated: pl.DataFrame, *, ax=None):
    """Figure 10: distribution of r(x) ∈ {−1, 0, +1} per task (one small multiple per task),
    pooled over cells; bars coloured by task class, counts annotated.

    Returns
    -------
    matplotlib.figure.Figure

    References
    ----------
    PAGE paper, Figure 10.
    """
    data = recovery_distribution_data(gated)
    order = task_order(data)
    ncols = min(len(order), 4)
    with st.style():
        fig, axes = st.panels(len(order), ax, ncols=ncols, sharey=True, row_height=1.15)
        for i, (axis, task) in enumerate(zip(axes, order)):
            t = data.filter(pl.col("task") == task).sort("r")
            color = st.class_color(t["task_class"][0]) if "task_class" in t.columns else "0.4"
            bars = axis.bar(t["r"].to_numpy(), t["fraction"].to_numpy(), width=0.7, color=color, alpha=0.8)
            for rect, count in zip(bars, t["count"].to_list()):
                axis.annotate(str(count), (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                              xytext=(0, 1), textcoords="offset points", ha="center", va="bottom", fontsize=5)
            axis.set_xticks(list(R_VALUES), ["−1", "0", "+1"])
            axis.set_ylim(0, 1.18)
            axis.set_title(f"{short_task(task)} (N={int(t['n'][0])})", fontsize=6)
            if i % ncols == 0:
                axis.set_ylabel("share of inputs")
                st.percent_axis(axis)
            if i >= len(order) - ncols:
                axis.set_xlabel("r(x)")
        st.add_task_key(fig, task_key(order))
    st.stamp(fig, n_inputs(gated), tau_text(gated))
    return fig


def recovery_fraction_data(gated: pl.DataFrame, *, confidence_level: float = 0.95) -> pl.DataFrame:
    """Fraction of inputs with strict recovery r(x) > 0 per (model, context) cell and task,
    with a Wilson interval (data of Fig. 11).

    Returns
    -------
    polars.DataFrame
        ``model, context_length, task, task_class, k`` (inputs with r > 0), ``n``,
        ``fraction``, ``low``, ``high`` (:func:`pagestats.stats.wilson`). Inputs of
        different evictors count separately (an input is one (input, evictor) pair).

    References
    ----------
    PAGE paper, App. A.7.1, Figure 11.
    """
    r = _indicator(gated)
    keys = present(r, MODEL_CELL) + ["task"] + present(r, ("task_class",))
    out = r.group_by(keys).agg((pl.col("r") > 0).sum().cast(pl.Int64).alias("k"), pl.len().cast(pl.Int64).alias("n"))
    ci = stats.wilson(out["k"].to_numpy(), out["n"].to_numpy(), confidence_level=confidence_level)
    return out.with_columns(
        pl.Series("fraction", np.atleast_1d(ci.estimate)),
        pl.Series("low", np.atleast_1d(ci.low)),
        pl.Series("high", np.atleast_1d(ci.high)),
    ).sort(keys)


def recovery_fraction(gated: pl.DataFrame, *, confidence_level: float = 0.95, ax=None):
    """Figure 11: fraction of inputs with r(x) > 0 per task (bars, Wilson 95% bars, the count
    k/n written above each interval, inside the panel), one small multiple per (model, context)
    cell showing only the tasks that cell holds, in the figures' one task order.

    Returns
    -------
    matplotlib.figure.Figure

    References
    ----------
    PAGE paper, Figure 11.
    """
    data = recovery_fraction_data(gated, confidence_level=confidence_level)
    groups = cells(data, MODEL_CELL)
    order = task_order(data)
    ncols = min(len(groups), 2 if len(groups) <= 4 else 3)
    ymax = max(float(data["high"].max()), 0.05) * 1.15  # then raised where the k/n labels need it
    with st.style():
        fig, axes = st.panels(len(groups), ax, ncols=ncols, sharey=True, row_height=1.3)
        for i, (axis, cell) in enumerate(zip(axes, groups)):
            sub = where(data, cell)
            # only the tasks this cell holds, in the global order
            shown = [t for t in order if t in set(sub["task"].to_list())]
            pos = {t: j for j, t in enumerate(shown)}
            sub = sub.with_columns(pl.col("task").replace_strict(pos, return_dtype=pl.Int64).alias("_x")).sort("_x")
            x = sub["_x"].to_numpy()
            frac = sub["fraction"].to_numpy()
            colors = [st.class_color(c) for c in sub["task_class"].to_list()] if "task_class" in sub.columns else "0.4"
            axis.bar(x, frac, width=0.7, color=colors, alpha=0.8)
            axis.errorbar(x, frac, yerr=[frac - sub["low"].to_numpy(), sub["high"].to_numpy() - frac],
                          fmt="none", ecolor="0.2", elinewidth=0.6, capsize=1.2)
            # a zero share is a measured 0 (k of n), not a missing bar
            for xi, k, n, top in zip(x, sub["k"].to_list(), sub["n"].to_list(), sub["high"].to_list()):
                axis.annotate(f"{k}/{n}", (xi, top), xytext=(0, 1.5), textcoords="offset points", ha="center",
                              va="bottom", fontsize=4.5, color="0.3", rotation=90)
            axis.set_xticks(range(len(shown)), [short_task(t) for t in shown], rotation=60, ha="right")
            axis.set_xlim(-0.6, len(shown) - 0.4)
            axis.set_ylim(0, ymax)
            axis.set_title(st.cell_label(cell), fontsize=6)
            if i % ncols == 0:
                axis.set_ylabel("share with r(x) > 0")
                st.percent_axis(axis)
        st.add_task_key(fig, task_key(order) + "; k/n = inputs with r(x) > 0 / inputs")
        st.stamp(fig, n_inputs(gated), tau_text(gated))
        _room_for_annotations(fig, axes)
    return fig


def _room_for_annotations(fig, axes) -> None:
    """Raise the (shared) top of ``axes`` until every annotation of theirs lies inside its panel:
    the k/n labels have a size on the page, not in data units, so the room they need is measured
    once the layout is settled (and shrinks in data units as the top rises)."""
    for _ in range(5):
        fig.draw_without_rendering()
        need = []
        for axis in axes:
            top = axis.get_window_extent().y1
            heights = [t.get_window_extent().y1 for t in axis.texts]
            if heights and max(heights) > top:
                to_data = axis.transData.inverted()
                need.append(to_data.transform((0, max(heights)))[1])
        if not need:
            return
        top = max(need) * 1.03
        for axis in axes:
            axis.set_ylim(0, max(axis.get_ylim()[1], top))
