"""Figures of the method-agnostic matrix: Δ per (model, evictor) cell (Fig. 8) and Δ as a
function of the capacity-bound share of the workload (Fig. 7)."""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.patches import Rectangle

from pagestats import defaults, metrics
from pagestats.columns import MATRIX_CELL, MODEL_CELL
from pagestats.figures import _style as st
from pagestats.figures._frames import cells, present, require, where

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
        return metrics.delta(gated, by=keys).with_columns(pl.lit(0, pl.Int64).alias("n_left_out")).sort(keys)
    rows = present(gated, MODEL_CELL)
    gated, left = metrics.equal_inputs(gated, by=rows)
    return metrics.delta(gated, by=keys).join(left, on=keys, how="left").sort(keys)


def delta_matrix(gated: pl.DataFrame, *, ax=None):
    """Figure 8: the Δ matrix, evictors as columns and (model, context) as rows, as an
    annotated heatmap in percentage points (diverging, centred at 0); a cell the logs do
    not hold reads "n/a".

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
    limit = max(float(np.nanmax(np.abs(grid))), 1.0)
    with st.style():
        fig, (axis,) = st.panels(1, ax, row_height=max(1.2, 0.28 * len(rows) + 0.6))
        image = axis.imshow(grid, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                if np.isfinite(grid[i, j]):
                    dark = abs(grid[i, j]) > 0.6 * limit
                    axis.text(j, i, f"{grid[i, j]:+.1f}", ha="center", va="center", fontsize=6,
                              color="white" if dark else "black")
                else:  # a cell the logs do not hold
                    axis.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="0.93", edgecolor="none"))
                    axis.text(j, i, "n/a", ha="center", va="center", fontsize=6, color="0.45")
        axis.set_xticks(range(len(evictors)), [st.plain_text(e) for e in evictors], rotation=30, ha="right")
        axis.set_yticks(range(len(rows)), [st.cell_label(r) for r in rows])
        axis.tick_params(length=0)
        for spine in axis.spines.values():
            spine.set_visible(False)
        axis.set_xlabel("base evictor")
        bar = fig.colorbar(image, ax=axis, shrink=0.9, pad=0.02)
        bar.set_label("Δ gated − plain (pp)")
        bar.outline.set_visible(False)
        grand = float(np.nanmean(grid))
        left = int(data["n_left_out"].sum())
        note = f"\nsame inputs per row ({left} left out)" if left else ""
        axis.set_title(f"mean over budgets b < 1; grand mean {grand:+.1f} pp{note}")
    return fig


# --------------------------------------------------------------------------- Fig. 7
def delta_of_f_data(gated: pl.DataFrame, *, f=None) -> pl.DataFrame:
    """Δ(f) = f·Δ_capacity + (1 − f)·Δ_rest for every matrix cell and their mean (data of Fig. 7).

    Parameters
    ----------
    gated : polars.DataFrame
        ``replay.gated_outcomes(...)`` with ``task_class``.
    f : array_like, optional
        Capacity-bound shares in [0, 1] (default 0, 0.05, …, 1).

    Returns
    -------
    polars.DataFrame
        Long frame with the cell columns (null on the mean line), ``line`` ("cell" or
        "mean"), ``f`` and ``delta`` (:func:`pagestats.metrics.delta_of_f` of the cell's
        per-class :func:`pagestats.metrics.delta`; cells lacking a class are left out), plus
        ``suite_share`` (the capacity-bound share of the inputs in ``gated``, pooled).

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
    by_class = metrics.delta(gated, by=[*keys, "task_class"])
    wide = by_class.pivot(on="task_class", index=keys or None, values="delta")
    for name in (defaults.CAPACITY_BOUND, defaults.DILUTION_PRONE):
        if name not in wide.columns:
            raise ValueError(f"delta_of_f_data: no {name} inputs; Δ(f) needs both task classes")
    wide = wide.drop_nulls([defaults.CAPACITY_BOUND, defaults.DILUTION_PRONE])
    if wide.height == 0:
        raise ValueError("delta_of_f_data: no cell has inputs of both task classes")
    lines_np = metrics.delta_of_f(wide[defaults.CAPACITY_BOUND].to_numpy()[:, None],
                                  wide[defaults.DILUTION_PRONE].to_numpy()[:, None], grid[None, :])
    lines = wide.select(keys).with_columns(
        pl.Series("f", [grid.tolist()] * wide.height), pl.Series("delta", lines_np.tolist())
    ).explode(["f", "delta"])
    mean = lines.group_by("f").agg(pl.col("delta").mean()).sort("f")
    inputs = gated.select(*present(gated, ("run_id",)), "task", "input_id", "task_class").unique()
    share = float((inputs["task_class"] == defaults.CAPACITY_BOUND).mean())
    cell_rows = lines.select(*keys, "f", "delta").with_columns(pl.lit("cell").alias("line"))
    mean_rows = mean.with_columns(
        *(pl.lit(None, dtype=lines.schema[k]).alias(k) for k in keys), pl.lit("mean").alias("line")
    ).select(cell_rows.columns)
    return pl.concat([cell_rows, mean_rows]).with_columns(pl.lit(share).alias("suite_share")).sort(
        ["line", *keys, "f"], nulls_last=True
    )


def delta_of_f(gated: pl.DataFrame, *, f=None, ax=None):
    """Figure 7: gating Δ against the capacity-bound share f, grey lines per cell, the
    mean in blue, and a dashed marker at the suite's own share.

    Returns
    -------
    matplotlib.figure.Figure

    References
    ----------
    PAGE paper, Figure 7.
    """
    data = delta_of_f_data(gated, f=f)
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
        axis.set_xlabel("capacity-bound share f of the workload")
        axis.set_ylabel("Δ(f) gated − plain (pp)")
        axis.legend(loc="upper left")
    return fig
