"""Accuracy figures: accuracy against the nominal budget (Fig. 3) and against the achieved
kept-KV fraction, with the accuracy–memory frontier (Fig. 4)."""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.lines import Line2D

from pagestats import metrics
from pagestats.core import formulas
from pagestats.core.columns import MATRIX_CELL, input_key, with_task_class
from pagestats.figures import _style as st
from pagestats.figures._frames import (
    cells,
    n_inputs,
    present,
    require,
    select_cells,
    short_task,
    task_key,
    task_order,
    tau_text,
    where,
)

GATED_COLUMNS = ("task", "budget", "score_full", "score_plain", "score_gated")
ARMS = ("full", "plain", "gated")


# --------------------------------------------------------------------------- Fig. 3
def accuracy_by_budget_data(gated: pl.DataFrame) -> pl.DataFrame:
    """Mean accuracy per (cell, task, budget, arm) (data of Fig. 3).

    Parameters
    ----------
    gated : polars.DataFrame
        ``replay.gated_outcomes(...)``: one row per (input, evictor, budget) with
        ``score_full``, ``score_plain`` and ``score_gated``.

    Returns
    -------
    polars.DataFrame
        Long frame: the present cell columns (model, context_length, evictor), ``task``,
        ``task_class``, ``budget``, ``arm`` ("full", "plain", "gated"), ``accuracy`` (mean
        score over the inputs) and ``n_inputs``.

    References
    ----------
    PAGE paper, §4.1 "Catastrophic Failure Prevention", Figure 3 (plain solid, gated
    dashed); Eq. 2 (gated outcome).
    """
    require(gated, GATED_COLUMNS, "accuracy_by_budget_data")
    gated = with_task_class(gated)
    keys = present(gated, MATRIX_CELL) + ["task", "task_class", "budget"]
    wide = metrics.on_frame(metrics.accuracy, gated, by=keys).select(
        *keys, *(pl.col(f"acc_{arm}").alias(arm) for arm in ARMS), "n_inputs")
    return (
        wide.unpivot(index=[*keys, "n_inputs"], on=list(ARMS), variable_name="arm", value_name="accuracy")
        .select(*keys, "arm", "accuracy", "n_inputs")
        .sort([*keys, "arm"])
    )


def accuracy_vs_budget(gated: pl.DataFrame, *, model=None, context_length=None, evictor=None,
                       tasks=None, ax=None):
    """Figure 3: accuracy against the KV budget, plain (solid) and gated (dashed), one small
    multiple per task, for one (model, context_length, evictor) cell.

    Parameters
    ----------
    gated : polars.DataFrame
        ``replay.gated_outcomes(...)``.
    model, context_length, evictor, tasks
        Select the cell (and tasks); required when the frame holds several cells.
    ax : sequence of Axes, optional
        One per task.

    Returns
    -------
    matplotlib.figure.Figure

    References
    ----------
    PAGE paper, Figure 3 (Mistral-7B 4K NIAH-MK3, SnapKV).
    """
    sub = select_cells(gated, model=model, context_length=context_length, evictor=evictor, task=tasks)
    data = accuracy_by_budget_data(sub)
    groups = cells(data, MATRIX_CELL)
    if len(groups) > 1:
        raise ValueError(f"accuracy_vs_budget draws one cell; select one of {groups}")
    order = task_order(data)
    budgets = np.sort(data["budget"].unique().to_numpy())
    with st.style():
        ncols = min(len(order), 3)
        fig, axes = st.panels(len(order), ax, ncols=ncols, sharex=True, sharey=True, row_height=1.25)
        for i, (axis, task) in enumerate(zip(axes, order)):
            t = data.filter(pl.col("task") == task)
            for arm in ARMS:
                a = t.filter(pl.col("arm") == arm).sort("budget")
                style = dict(st.ARM_STYLE[arm])
                axis.plot(a["budget"].to_numpy(), a["accuracy"].to_numpy(), markersize=2.5, **style)
            axis.set_xscale("log", base=2)
            ticks = _power_ticks(budgets)
            axis.set_xticks(ticks, [_budget_label(b) for b in ticks])
            axis.minorticks_off()
            axis.set_ylim(-0.04, 1.04)
            n = int(t["n_inputs"].max())
            axis.set_title(f"{short_task(task)} (N={n})", fontsize=6)
            if i % ncols == 0:
                axis.set_ylabel("accuracy")
            if i >= len(order) - ncols:
                axis.set_xlabel("KV budget b")
        handles, labels = axes[0].get_legend_handles_labels()
        title = st.cell_label(groups[0])
        legend = fig.legend(handles, labels, loc="outside lower center", ncols=3, title=title or None,
                            title_fontsize=6)
        st.add_task_key(fig, task_key(order), legend=legend)
    st.stamp(fig, n_inputs(sub), tau_text(sub))
    return fig


def _power_ticks(values) -> list[float]:
    """Powers of two spanning ``values`` (tick positions on a log2 axis)."""
    values = np.asarray(values, float)
    # rounded, not floored: an achieved fraction of 0.0624 (⌊b·T⌋/T) still ticks at 1/16
    lo, hi = np.round(np.log2(values.min())), np.round(np.log2(values.max()))
    return [float(2.0**e) for e in np.arange(lo, hi + 1)]


def _budget_label(b: float) -> str:
    if b >= 1:
        return "1"
    inv = 1 / b
    return f"1/{inv:.0f}" if abs(inv - round(inv)) < 1e-9 else f"{b:g}"


# --------------------------------------------------------------------------- Fig. 4
def frontier_data(gated: pl.DataFrame, *, by=MATRIX_CELL) -> pl.DataFrame:
    """Accuracy against the achieved kept-KV fraction per budget and arm, with the Pareto
    frontier of each cell (data of Fig. 4).

    Parameters
    ----------
    gated : polars.DataFrame
        ``replay.gated_outcomes(...)`` with ``n_kept_plain``, ``n_kept_gated`` and
        ``n_tokens``; all tasks of a cell are pooled (the mixed suite).
    by : tuple of str
        Cell columns (those present are used).

    Returns
    -------
    polars.DataFrame
        One row per (cell, budget b < 1, arm ∈ {plain, gated}) plus one "full" row per cell
        (budget 1, kept_kv 1, the full-KV accuracy): ``kept_kv`` (achieved mean
        n_kept / n_tokens, :func:`pagestats.metrics.kept_kv` — not the nominal budget),
        ``accuracy`` (mean score), ``n_inputs`` and ``on_frontier`` (no other point of the cell, of either arm, keeps at most as
        much cache with at least the accuracy and is strictly better in one of the two, up to
        :data:`PARETO_ATOL`: :func:`pareto_mask`).

    References
    ----------
    PAGE paper, §4.1 "Accuracy-Memory Frontier", Figure 4; Eq. 2 (closed gate keeps
    n_kept = n_tokens); docs/DEFINITIONS.md (kept-KV).
    """
    require(gated, ("budget", "n_tokens", "gate_open", "score_full", "score_plain", "score_gated",
                    "n_kept_plain", "n_kept_gated"), "frontier_data")
    keys = present(gated, by)
    # the columns read, then the rows: a filter copies every column it keeps (9M rows at 1M inputs)
    read = [*input_key(gated), *keys, "budget", "score_full", "score_plain", "score_gated"]
    evicted = gated.select(list(dict.fromkeys(read))).filter(formulas.EVICTED)
    if evicted.height == 0:
        raise ValueError("frontier_data: no eviction budgets b < 1")
    points = []
    acc = metrics.on_frame(metrics.accuracy, evicted, by=[*keys, "budget"])
    for arm in ("plain", "gated"):
        kept = metrics.on_frame(metrics.kept_kv, gated, by=[*keys, "budget"], arm=arm).select(
            *keys, "budget", "kept_kv")
        points.append(kept.join(acc.select(*keys, "budget", pl.col(f"acc_{arm}").alias("accuracy"), "n_inputs"),
                                on=[*keys, "budget"], nulls_equal=True).with_columns(pl.lit(arm).alias("arm")))
    full = metrics.on_frame(metrics.full_accuracy, gated, by=keys).select(
        *keys, pl.col("acc_full").alias("accuracy"), pl.col("n").alias("n_inputs"),
        pl.lit(1.0).alias("budget"), pl.lit(1.0).alias("kept_kv"), pl.lit("full").alias("arm"))
    cols = [*keys, "budget", "arm", "kept_kv", "accuracy", "n_inputs"]
    data = pl.concat([p.select(cols) for p in points] + [full.select(cols)], how="vertical_relaxed")
    parts = []
    for cell in cells(data, keys):
        sub = where(data, cell)
        parts.append(sub.with_columns(pl.Series("on_frontier", pareto_mask(sub["kept_kv"].to_numpy(),
                                                                           sub["accuracy"].to_numpy()))))
    return pl.concat(parts).sort([*keys, "arm", "budget"])


#: Absolute tolerance of the frontier's comparisons (:func:`pareto_mask`). Accuracies are means of
#: scores that are multiples of 1/60 (or 0/1), kept-KV fractions means of n_kept / T; summed in
#: different orders, two equal means differ in their last bits (≈1e-16), while two different
#: ones differ by at least 1/(60·N) for N ≤ 10⁸ inputs, far above 1e-9. Values within this of
#: each other are equal.
PARETO_ATOL = 1e-9


def pareto_mask(cost: np.ndarray, value: np.ndarray, *, atol: float = PARETO_ATOL) -> np.ndarray:
    """Points not dominated by another: a point j dominates i when it costs no more and is worth
    no less, and is strictly better in one of the two, with every comparison up to ``atol``
    (``cost_j ≤ cost_i + atol``, ``value_j ≥ value_i − atol`` and ``cost_j < cost_i − atol`` or
    ``value_j > value_i + atol``), vectorised over all pairs.

    Parameters
    ----------
    cost, value : array_like
        One entry per point (kept-KV and accuracy for the frontiers of Fig. 4 and the decision
        figure). NaN is refused.
    atol : float
        Absolute tolerance (:data:`PARETO_ATOL`): equal accuracies whose float sums differ in
        their last bits compare equal, so a point that only seems better by float noise does not
        push an equally accurate, cheaper one off the frontier, nor keep a dearer one on it.

    Returns
    -------
    numpy.ndarray of bool
        True on the frontier.

    References
    ----------
    PAGE paper, §4.1 "Accuracy-Memory Frontier", Figure 4.
    """
    cost = np.asarray(cost, float)[:, None]
    value = np.asarray(value, float)[:, None]
    if np.isnan(cost).any() or np.isnan(value).any():
        raise ValueError("pareto_mask: NaN cost or value")
    if not atol >= 0:
        raise ValueError(f"pareto_mask: atol must be ≥ 0, got {atol}")
    no_worse = (cost.T <= cost + atol) & (value.T >= value - atol)
    better = (cost.T < cost - atol) | (value.T > value + atol)
    return ~(no_worse & better).any(axis=1)


def accuracy_vs_kept_kv(gated: pl.DataFrame, *, evictor=None, context_length=None, model=None, ax=None):
    """Figure 4: accuracy against the achieved kept-KV fraction, plain (solid) and gated
    (dashed), one colour per (model, context) cell, with each cell's frontier drawn as a
    light band behind the points.

    Returns
    -------
    matplotlib.figure.Figure

    References
    ----------
    PAGE paper, Figure 4 (mixed 4K suite, SnapKV).
    """
    sub = select_cells(gated, evictor=evictor, context_length=context_length, model=model)
    data = frontier_data(sub)
    keys = present(data, MATRIX_CELL)
    groups = cells(data, keys)
    colors = st.cycle_colors(len(groups))
    with st.style():
        fig, (axis,) = st.panels(1, ax, row_height=2.1)
        for color, cell in zip(colors, groups):
            c = where(data, cell)
            front = c.filter(pl.col("on_frontier")).sort("kept_kv")
            axis.step(front["kept_kv"].to_numpy(), front["accuracy"].to_numpy(), where="post",
                      color=color, alpha=0.25, linewidth=3.5, solid_capstyle="round", zorder=1)
            label = st.cell_label({k: v for k, v in cell.items() if k != "evictor" or len(groups) == 1})
            full = c.filter(pl.col("arm") == "full")
            axis.plot(full["kept_kv"].to_numpy(), full["accuracy"].to_numpy(), marker="*", markersize=5,
                      color=color, linestyle="none", zorder=3)
            for arm in ("plain", "gated"):
                a = c.filter(pl.col("arm") == arm).sort("budget")
                style = st.ARM_STYLE[arm]
                axis.plot(a["kept_kv"].to_numpy(), a["accuracy"].to_numpy(), color=color,
                          linestyle=style["linestyle"], marker=style["marker"], markersize=2.5,
                          markerfacecolor="white" if arm == "gated" else color, zorder=2,
                          label=f"{label}" if arm == "plain" else None)
        axis.set_xscale("log", base=2)
        ticks = _power_ticks(data["kept_kv"].to_numpy())
        axis.set_xticks(ticks, [_budget_label(t) for t in ticks])
        axis.minorticks_off()
        axis.set_xlabel("achieved kept-KV fraction (mean n_kept / T)")
        axis.set_ylabel("accuracy")
        arm_handles = [Line2D([], [], color="0.2", linestyle=st.ARM_STYLE[a]["linestyle"],
                              marker=st.ARM_STYLE[a]["marker"], markersize=2.5,
                              markerfacecolor="white" if a == "gated" else "0.2", label=a) for a in ("plain", "gated")]
        arm_handles.append(Line2D([], [], color="0.2", marker="*", markersize=5, linestyle="none", label="full KV"))
        arm_handles.append(Line2D([], [], color="0.6", alpha=0.4, linewidth=3.5, label="frontier"))
        cell_handles, cell_labels = axis.get_legend_handles_labels()
        # two columns: three of (model, context) labels overflow the one panel's width
        fig.legend(handles=arm_handles + cell_handles, loc="outside lower center", ncols=2)
    st.stamp(fig, n_inputs(sub), tau_text(sub))
    return fig
