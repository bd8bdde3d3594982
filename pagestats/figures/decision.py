"""The decision figure: the accuracy–memory frontier of the gate over every threshold τ and
budget b, per base evictor, with the kept KV cache as a fraction and in GiB per sequence.

This is the picture to look at before choosing τ: each (τ, b) is one operating point (gated
accuracy, mean kept-KV); τ = −∞ is plain eviction, τ = +∞ the full cache. The frontier is
the set of points no other point of the same evictor beats on both axes.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.lines import Line2D

from pagestats.core import defaults
from pagestats.figures import _style as st
from pagestats.figures._frames import cells, present, require, where
from pagestats.figures.accuracy import pareto_mask

#: Keys of one frontier: the points of one evictor in one (model, context) cell.
FRONTIER_KEYS = ("model", "context_length", "evictor")


def decision_frontier_data(curve: pl.DataFrame, accuracy: pl.DataFrame, gib: pl.DataFrame | None = None) -> pl.DataFrame:
    """Gated accuracy and kept-KV at every (τ, budget) point, with the frontier of each evictor.

    Parameters
    ----------
    curve : polars.DataFrame
        ``replay.tau_curve(logs, taus, by=("model", "context_length", "evictor", "budget"))``:
        per (cell, b < 1, τ) the mean Δ = gated − plain and the gated arm's kept-KV.
    accuracy : polars.DataFrame
        ``metrics.accuracy(gated, by=(model, context_length, evictor, budget))``: the plain
        accuracy per (cell, b), and ``acc_full``.
    gib : polars.DataFrame, optional
        ``metrics.full_cache_gib(...)``: the full cache of one sequence per (model, context);
        adds ``kv_gib`` = kept_kv × full_gib.

    Returns
    -------
    polars.DataFrame
        One row per (model, context_length, evictor, budget, τ): ``tau``, ``budget``,
        ``accuracy`` (= acc_plain(b) + Δ(τ, b), the gated accuracy, Eq. 2), ``kept_kv``,
        ``p_open``, ``delta``, ``acc_full``, [``kv_gib``], [``n_inputs``, from the curve], and ``on_frontier`` (no other point
        of the same evictor and cell keeps at most as much cache with at least the accuracy,
        strictly better in one, up to :data:`pagestats.figures.accuracy.PARETO_ATOL`:
        :func:`pagestats.figures.accuracy.pareto_mask`).

    References
    ----------
    PAGE paper, §3 (Eq. 2, the gate); §4.1 "Accuracy-Memory Frontier", Figure 4 (the frontier
    over budgets); App. A.3.4 (threshold sensitivity, the τ axis); Table 22 (kept-KV).
    """
    require(curve, ("tau", "budget", "delta", "kept_kv", "p_open"), "decision_frontier_data")
    require(accuracy, ("budget", "acc_plain", "acc_full"), "decision_frontier_data")
    keys = present(curve, FRONTIER_KEYS)
    join = [*keys, "budget"]
    data = curve.join(accuracy.select(*join, "acc_plain", "acc_full"), on=join, how="inner").with_columns(
        (pl.col("acc_plain") + pl.col("delta")).alias("accuracy"))
    if data.height == 0:
        raise ValueError("decision_frontier_data: the curve and the accuracy frame share no (cell, budget)")
    if gib is not None:
        cell = present(gib, ("model", "context_length"))
        data = data.join(gib.select(*cell, "full_gib"), on=cell, how="left").with_columns(
            (pl.col("kept_kv") * pl.col("full_gib")).alias("kv_gib")).drop("full_gib")
    parts = []
    for cell in cells(data, keys):
        sub = where(data, cell)
        parts.append(sub.with_columns(pl.Series("on_frontier", pareto_mask(sub["kept_kv"].to_numpy(),
                                                                          sub["accuracy"].to_numpy()))))
    columns = [*keys, "tau", "budget", "accuracy", "kept_kv", *(["kv_gib"] if gib is not None else []),
               "p_open", "delta", "acc_full", *(["n_inputs"] if "n_inputs" in data.columns else []), "on_frontier"]
    return pl.concat(parts).select(columns).sort([*keys, "budget", "tau"])


def decision_frontier(data: pl.DataFrame, *, tau: float | None = defaults.TAU, ax=None):
    """The decision figure: gated accuracy against kept-KV over every (τ, b), one colour per
    evictor, one panel per (model, context); the frontier as a line, every other point faint,
    the full cache as a star, and the points at threshold ``tau`` (one per budget) joined.

    Parameters
    ----------
    data : polars.DataFrame
        :func:`decision_frontier_data`.
    tau : float or None
        Threshold whose points are marked (default the fixed τ = 0.07; the nearest τ of the
        data is used). ``None`` marks none.
    ax : Axes or sequence of Axes, optional
        One per (model, context) cell.

    Returns
    -------
    matplotlib.figure.Figure
        Every panel on the same accuracy range, that of the data (:func:`accuracy_range`). With ``kv_gib`` in ``data`` (and one panel's GiB per unit of kept-KV), a top axis in GiB
        per sequence.

    References
    ----------
    PAGE paper, Figure 4 (frontier over budgets), App. A.3.4 (the τ axis).
    """
    keys = present(data, ("model", "context_length"))
    groups = cells(data, keys)
    evictors = data["evictor"].unique().sort().to_list() if "evictor" in data.columns else [None]
    colors = dict(zip(evictors, st.cycle_colors(len(evictors))))
    ylim = accuracy_range(data)
    with st.style():
        ncols = min(len(groups), 2)
        fig, axes = st.panels(len(groups), ax, ncols=ncols, row_height=3.0, width=st.COLUMN_WIDTH * (1 + 0.6 * (ncols - 1)))
        for i, (axis, cell) in enumerate(zip(axes, groups)):
            sub = where(data, cell)
            shown_tau = None
            if tau is not None:
                finite = sub.filter(pl.col("tau").is_finite())["tau"].unique().to_numpy()
                shown_tau = float(finite[np.argmin(np.abs(finite - tau))]) if finite.size else None
            for ev in evictors:
                e = sub.filter(pl.col("evictor") == ev) if ev is not None else sub
                if e.height == 0:
                    continue
                color = colors[ev]
                axis.scatter(e["kept_kv"].to_numpy(), e["accuracy"].to_numpy(), s=2, color=color, alpha=0.12,
                             linewidths=0, zorder=1, rasterized=st.many_markers(e.height))
                front = e.filter(pl.col("on_frontier")).sort("kept_kv")
                axis.plot(front["kept_kv"].to_numpy(), front["accuracy"].to_numpy(), color=color, linewidth=1.1,
                          drawstyle="steps-post", zorder=3, label=st.plain_text(ev) if ev is not None else "frontier")
                if shown_tau is not None:
                    at = e.filter(pl.col("tau") == shown_tau).sort("kept_kv")
                    axis.plot(at["kept_kv"].to_numpy(), at["accuracy"].to_numpy(), color=color, linestyle="none",
                              marker="o", markersize=2.6, markerfacecolor="white", markeredgewidth=0.8, zorder=4)
            if sub["acc_full"].null_count() == 0:  # unknown where a release lacks full-KV outcomes
                axis.plot([1.0], [float(sub["acc_full"].mean())], marker="*", color="0.2", markersize=6,
                          linestyle="none", zorder=5)
            axis.set_xlim(0, 1.03)
            axis.set_ylim(*ylim)
            axis.set_xlabel("kept KV (share of the prompt)")
            if i % 2 == 0:
                axis.set_ylabel("gated accuracy")
            st.percent_axis(axis, "x")
            if "kv_gib" in sub.columns:
                ratio = (sub["kv_gib"] / sub["kept_kv"]).drop_nans().drop_nulls()
                if ratio.len() and float(ratio.max() - ratio.min()) <= 1e-9 * max(float(ratio.max()), 1e-30):
                    g = float(ratio[0])
                    top = axis.secondary_xaxis("top", functions=(lambda x, g=g: x * g, lambda y, g=g: y / g))
                    top.set_xlabel("GiB per sequence", fontsize=6)
                    top.tick_params(labelsize=5)
            title = st.cell_label(cell)
            axis.set_title(title, fontsize=6, pad=14 if "kv_gib" in sub.columns else 4)
        # one entry per evictor of any panel (an evictor logged in one cell only is still named)
        handles = [Line2D([], [], color=colors[ev], linewidth=1.1) for ev in evictors]
        labels = [st.plain_text(ev) if ev is not None else "frontier" for ev in evictors]
        handles.append(Line2D([], [], marker="*", color="0.2", linestyle="none", markersize=6))
        labels.append("full KV")
        if tau is not None:
            handles.append(Line2D([], [], marker="o", color="0.3", markerfacecolor="white", linestyle="none",
                                  markersize=2.6))
            labels.append(f"τ = {tau:g}, one point per budget")
        handles.append(Line2D([], [], marker="o", color="0.5", alpha=0.3, linestyle="none", markersize=2))
        labels.append("other (τ, b)")
        fig.legend(handles, labels, loc="outside lower center", ncols=3)
    said = "every τ of the sweep" + (f", circles at τ = {tau:g}" if tau is not None else "")
    if "n_inputs" in data.columns:  # per (model, context), the most inputs any of its points counts
        cell = present(data, ("model", "context_length"))
        per = data.group_by(cell).agg(pl.col("n_inputs").max()) if cell else data.select(pl.col("n_inputs").max())
        st.stamp(fig, int(per["n_inputs"].sum()), said)
    else:
        fig.suptitle(said, fontsize=5, color="0.35")
    return fig


def accuracy_range(data: pl.DataFrame) -> tuple[float, float]:
    """The y range of the decision figure: from the lowest to the highest accuracy of ``data``
    (every point and the full cache), padded by 5 % of the span (at least 0.0025) each side and
    kept within [−0.02, 1.02], so that a model whose accuracies stay below 0.5 fills its panel."""
    values = np.concatenate([data["accuracy"].to_numpy(), data["acc_full"].to_numpy()]).astype(float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        raise ValueError("accuracy_range: no finite accuracy")
    lo, hi = float(values.min()), float(values.max())
    pad = max(0.05 * (hi - lo), 0.0025)
    return max(lo - pad, -0.02), min(hi + pad, 1.02)
