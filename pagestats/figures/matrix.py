"""Figures of the method-agnostic matrix: Δ per (model, evictor) cell (Fig. 8) and Δ as a
function of the capacity-bound share of the workload (Fig. 7)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
import polars as pl
from matplotlib.patches import Rectangle

from pagestats import metrics
from pagestats.core import defaults
from pagestats.core.columns import MATRIX_CELL, MODEL_CELL
from pagestats.figures import _style as st
from pagestats.figures._frames import cells, present, require, tau_text, where

_NEEDS = ("task_class", "budget", "score_plain", "score_gated", "input_id", "task")


# --------------------------------------------------------------------------- Fig. 8
def delta_matrix_data(gated: pl.DataFrame) -> pl.DataFrame:
    """Gating Δ of every (model, context_length, evictor) cell (data of Fig. 8).

    Parameters
    ----------
    gated : polars.DataFrame
        ``replay.gated_outcomes(...)``.

    Returns
    -------
    polars.DataFrame
        One row per cell: ``delta`` (mean over inputs and budgets b < 1 of gated − plain,
        :func:`pagestats.metrics.delta`), ``n_inputs``, ``n_left_out``: the evictors of a
        (model, context) row are compared on the same inputs, as in Table 2
        (:func:`pagestats.metrics.equal_inputs`), and this many of the cell's logged inputs
        are not among them.

    References
    ----------
    PAGE paper, §4.1 "Transfer Across Eviction Mechanisms", Table 2, Figure 8; docs/DEFINITIONS.md (Δ).
    """
    require(gated, _NEEDS, "delta_matrix_data")
    keys = present(gated, MATRIX_CELL)
    if "evictor" not in keys:
        return metrics.on_frame(metrics.delta, gated, by=keys).with_columns(
            pl.lit(0, pl.Int64).alias("n_left_out")).sort(keys)
    rows = present(gated, MODEL_CELL)
    gated, left = metrics.equal_inputs(gated, by=rows)
    return metrics.on_frame(metrics.delta, gated, by=keys).join(left, on=keys, how="left").sort(keys)


def delta_matrix(gated: pl.DataFrame, *, ax=None):
    """Figure 8: the Δ matrix as an annotated heatmap in percentage points, one row per
    (model, context) and one column per evictor; a cell the logs do not hold reads "n/a".

    The colour scale is sequential from 0 when every Δ has one sign (blues for gains, reds for
    losses: the colour reads as the size of the effect) and diverging, centred at 0, when the
    signs differ (:func:`delta_colour_scale`). When there are more evictors than (model, context)
    rows the matrix is drawn transposed, evictors as rows, so that their names read across
    instead of being rotated over each other; the figure is as wide as its labels need, a label
    longer than :data:`LABEL_WIDTH` characters wrapped.

    Returns
    -------
    matplotlib.figure.Figure

    References
    ----------
    PAGE paper, Figure 8 (headline 4 × 4 matrix; grand mean +22.9 pp).
    """
    data = delta_matrix_data(gated)
    row_keys = present(data, ("model", "context_length"))
    rows = cells(data, row_keys)
    evictors = data["evictor"].unique().sort().to_list() if "evictor" in data.columns else [""]
    grid = np.full((len(rows), len(evictors)), np.nan)
    for i, row in enumerate(rows):
        sub = where(data, row)
        for j, ev in enumerate(evictors):
            hit = sub.filter(pl.col("evictor") == ev) if ev else sub
            if hit.height:
                grid[i, j] = hit["delta"][0] * 100
    cmap, vmin, vmax = delta_colour_scale(grid)
    evictor_labels = [_wrapped(st.plain_text(e)) for e in evictors]
    cell_labels = ["\n".join(_wrapped(line) for line in _two_line_cell(r).split("\n")) for r in rows]
    transposed = len(evictors) > len(rows)
    shown = grid.T if transposed else grid
    y_labels, x_labels = (evictor_labels, cell_labels) if transposed else (cell_labels, evictor_labels)
    # room for the row labels and the column labels (about 0.05 in per character at 6 pt), at
    # least 0.5 in per column, and 1 in for the axis label and the colour bar
    label_in = 0.05 * max(len(line) for label in y_labels for line in label.split("\n"))
    column_in = max(0.5, 0.05 * max(len(line) for label in x_labels for line in label.split("\n")) + 0.15)
    width = max(st.COLUMN_WIDTH, label_in + column_in * shown.shape[1] + 1.0)
    x_lines = max(label.count("\n") + 1 for label in x_labels)
    row_in = max(0.3, 0.1 * max(label.count("\n") + 1 for label in y_labels) + 0.05)  # ≈ 0.1 in per line
    with st.style():
        # 0.15 in for the stamp (n, τ) on top
        fig, (axis,) = st.panels(1, ax, width=width, row_height=row_in * shown.shape[0] + 0.5 + 0.12 * x_lines)
        image = axis.imshow(shown, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        scale = max(abs(vmin), abs(vmax))  # the light end of every scale is at 0
        for i in range(shown.shape[0]):
            for j in range(shown.shape[1]):
                if np.isfinite(shown[i, j]):
                    dark = abs(shown[i, j]) > 0.6 * scale
                    axis.text(j, i, f"{shown[i, j]:+.1f}", ha="center", va="center", fontsize=6,
                              color="white" if dark else "black")
                else:  # a cell the logs do not hold
                    axis.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="0.93", edgecolor="none"))
                    axis.text(j, i, "n/a", ha="center", va="center", fontsize=6, color="0.45")
        axis.set_xticks(range(shown.shape[1]), x_labels)
        axis.set_yticks(range(shown.shape[0]), y_labels)
        axis.xaxis.tick_top()
        axis.xaxis.set_label_position("top")
        axis.tick_params(length=0)
        for spine in axis.spines.values():
            spine.set_visible(False)
        if transposed:
            axis.set_ylabel("base evictor")
        else:
            axis.set_xlabel("base evictor")
        bar = fig.colorbar(image, ax=axis, shrink=0.9, pad=0.02, aspect=max(8, 6 * shown.shape[0] ** 0.5))
        bar.set_label("Δ gated − plain (pp)")
        bar.outline.set_visible(False)
        grand = float(np.nanmean(grid))
        left = int(data["n_left_out"].sum())
        note = f"; same inputs per row ({left} left out)" if left else ""
        axis.set_title(f"Δ over budgets b < 1; grand mean {grand:+.1f} pp{note}", fontsize=6)
    per_cell = data.group_by(present(data, MODEL_CELL)).agg(pl.col("n_inputs").max()) if present(data, MODEL_CELL) \
        else data.select(pl.col("n_inputs").max())
    st.stamp(fig, int(per_cell["n_inputs"].sum()), tau_text(gated))
    return fig


def delta_colour_scale(grid) -> tuple[str, float, float]:
    """The colour map and limits of Fig. 8's heatmap of Δ in pp (NaN cells ignored).

    Every Δ ≥ 0 (and one > 0): sequential ``"Blues"`` from 0 to the largest Δ; every Δ ≤ 0 (and
    one < 0): sequential ``"Reds_r"`` from the smallest Δ to 0; Δ of both signs, or all 0:
    diverging ``"RdBu"`` centred at 0, from −m to +m with m the largest |Δ|. The far end is at
    least 1 pp from 0, so that a matrix of tiny effects is not painted at full strength.

    Returns
    -------
    tuple
        ``(cmap_name, vmin, vmax)``.

    Raises
    ------
    ValueError
        When no cell is finite.
    """
    values = np.asarray(grid, float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        raise ValueError("delta_colour_scale: no finite Δ")
    lo, hi = float(values.min()), float(values.max())
    if lo >= 0 and hi > 0:
        return "Blues", 0.0, max(hi, 1.0)
    if hi <= 0 and lo < 0:
        return "Reds_r", min(lo, -1.0), 0.0
    limit = max(abs(lo), abs(hi), 1.0)
    return "RdBu", -limit, limit


#: Characters per line of Fig. 8's tick labels: a longer name is wrapped (a 300-letter evictor
#: name would otherwise make the figure 15 inches wide).
LABEL_WIDTH = 40


def _wrapped(label: str, width: int = LABEL_WIDTH) -> str:
    """``label`` on lines of at most ``width`` characters (broken inside a word where needed)."""
    return "\n".join(textwrap.wrap(label, width, break_long_words=True, break_on_hyphens=False)) or label


def _two_line_cell(cell: dict) -> str:
    """A (model, context) label on two lines (the model, then the context), as plain text."""
    model = cell.get("model")
    rest = st.cell_label({k: v for k, v in cell.items() if k != "model"})
    if model is None:
        return rest
    return f"{st.plain_text(str(model))}\n{rest}" if rest else st.plain_text(str(model))


# --------------------------------------------------------------------------- Fig. 7
def delta_of_f_data(gated: pl.DataFrame, *, f=None, anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> pl.DataFrame:
    """Δ(f) = f·Δ_MK3 + (1 − f)·Δ_rest for every matrix cell and their mean (data of Fig. 7).

    Parameters
    ----------
    gated : polars.DataFrame
        ``replay.gated_outcomes(...)`` with ``task_class``.
    f : array_like, optional
        Capacity-bound shares in [0, 1] (default 0, 0.05, …, 1).
    anchor : sequence of str or None
        The capacity-bound side (default :data:`pagestats.core.defaults.ANCHOR_TASKS`, NIAH-MK3: the
        paper's Δ_MK3; ``None``: the capacity-bound class); Δ_rest is over every other task.

    Returns
    -------
    polars.DataFrame
        Long frame with the cell columns (null on the mean line), ``line`` ("cell" or
        "mean"), ``f`` and ``delta`` (:func:`pagestats.metrics.delta_of_f` of the cell's
        :func:`pagestats.metrics.delta` on the anchor's inputs and on the others'; cells lacking
        either are left out), plus ``suite_share`` (the anchor's share of the inputs in
        ``gated``, pooled) and ``n_inputs`` (inputs of the cells drawn, pooled).

    References
    ----------
    PAGE paper, App. A.4.1 "Per-task decomposition of the matrix", Figure 7 (grey lines per
    cell, mean line, marker at the suite's f = 0.25).
    """
    require(gated, _NEEDS, "delta_of_f_data")
    grid = np.linspace(0.0, 1.0, 21) if f is None else np.asarray(f, dtype=float).ravel()
    if grid.size == 0 or np.any((grid < 0) | (grid > 1)) or not np.all(np.isfinite(grid)):
        raise ValueError("f must be a non-empty array of shares in [0, 1]")
    keys = present(gated, MATRIX_CELL)
    if "evictor" in keys:  # the cells of a (model, context) on the same inputs, as Table 2
        gated, _ = metrics.equal_inputs(gated, by=present(gated, MODEL_CELL))
    side = pl.when(metrics.capacity_side(anchor)).then(pl.lit("capacity")).otherwise(pl.lit("rest")).alias("_side")
    by_side = metrics.on_frame(metrics.delta, gated.with_columns(side), by=[*keys, "_side"])
    wide = by_side.pivot(on="_side", index=keys or None, values="delta")
    name = metrics.anchor_name(anchor)
    for col, what in (("capacity", f"no {name} inputs"), ("rest", f"no inputs outside {name}")):
        if col not in wide.columns:
            raise ValueError(f"delta_of_f_data: {what}; Δ(f) needs both")
    wide = wide.drop_nulls(["capacity", "rest"])
    if wide.height == 0:
        raise ValueError(f"delta_of_f_data: no cell has inputs of {name} and of another task")
    lines_np = metrics.delta_of_f(wide["capacity"].to_numpy()[:, None], wide["rest"].to_numpy()[:, None], grid[None, :])
    lines = wide.select(keys).with_columns(
        pl.Series("f", [grid.tolist()] * wide.height), pl.Series("delta", lines_np.tolist())
    ).explode(["f", "delta"])
    mean = lines.group_by("f").agg(pl.col("delta").mean()).sort("f")
    inputs = gated.select(*present(gated, ("run_id",)), "task", "input_id", "task_class").unique()
    share = float(inputs.select(metrics.capacity_side(anchor).mean()).item())
    cell_rows = lines.select(*keys, "f", "delta").with_columns(pl.lit("cell").alias("line"))
    mean_rows = mean.with_columns(
        *(pl.lit(None, dtype=lines.schema[k]).alias(k) for k in keys), pl.lit("mean").alias("line")
    ).select(cell_rows.columns)
    return pl.concat([cell_rows, mean_rows]).with_columns(pl.lit(share).alias("suite_share"),
                                                          pl.lit(inputs.height, pl.Int64).alias("n_inputs")).sort(
        ["line", *keys, "f"], nulls_last=True
    )


def delta_of_f(gated: pl.DataFrame, *, f=None, ax=None, anchor: Sequence[str] | None = defaults.ANCHOR_TASKS):
    """Figure 7: gating Δ against the share f of the capacity-bound anchor (NIAH-MK3, the paper's
    Δ(f) = f·Δ_MK3 + (1 − f)·Δ_rest; ``anchor=None``: the capacity-bound class), grey lines per cell,
    the mean in blue, and a dashed marker at the suite's own share; the legend under the axes.

    Returns
    -------
    matplotlib.figure.Figure

    References
    ----------
    PAGE paper, Figure 7.
    """
    data = delta_of_f_data(gated, f=f, anchor=anchor)
    keys = present(data, MATRIX_CELL)
    share = float(data["suite_share"][0])
    with st.style():
        fig, (axis,) = st.panels(1, ax, row_height=1.9)
        cell_lines = data.filter(pl.col("line") == "cell")
        for i, cell in enumerate(cells(cell_lines, keys)):
            c = where(cell_lines, cell).sort("f")
            axis.plot(c["f"].to_numpy(), c["delta"].to_numpy() * 100, color="0.7", linewidth=0.7,
                      label="matrix cells" if i == 0 else None)
        mean = data.filter(pl.col("line") == "mean").sort("f")
        fm, dm = mean["f"].to_numpy(), mean["delta"].to_numpy() * 100
        axis.plot(fm, dm, color="#1f77b4", linewidth=1.6, label="mean of cells")
        axis.axvline(share, color="0.3", linestyle="--", linewidth=0.8)
        axis.plot([share], [np.interp(share, fm, dm)], marker="D", color="#1f77b4", markersize=3.5,
                  linestyle="none", label=f"this suite (f = {share:.2f})")
        axis.axhline(0, color="0.85", linewidth=0.5, zorder=0)
        axis.set_xlim(0, 1)
        axis.set_xlabel(f"{st.plain_text(metrics.anchor_name(anchor))} share f of the workload")
        axis.set_ylabel("Δ(f) gated − plain (pp)")
        # under the axes, never over a line
        handles, labels = axis.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=3)
    st.stamp(fig, int(data["n_inputs"][0]), tau_text(gated))
    return fig
