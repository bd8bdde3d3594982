"""Figures of the gate signal: D per input (Fig. 2), the per-layer agreement profile
behind D (Fig. 5) and the threshold sensitivity of the gate (Fig. 6)."""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from pagestats.core import defaults
from pagestats.core.columns import MODEL_CELL, names_like, with_task_class
from pagestats.figures import _style as st
from pagestats.figures._frames import (cells, n_inputs, present, require, short_task, task_key, task_order, tau_text,
                                       where)
from pagestats.core.profile import bin_layers


# --------------------------------------------------------------------------- Fig. 2
def drop_by_task_data(gate: pl.DataFrame) -> pl.DataFrame:
    """Per-input drop D with its task mean and plotting order (data of Fig. 2).

    Parameters
    ----------
    gate : polars.DataFrame
        One row per input with ``task`` and ``drop`` (e.g. ``replay.gate(...)`` or
        ``Logs.inputs``); ``task_class``, ``model`` and ``context_length`` are used when
        present. Rows of a head-pair replay (``pair_draw``) are averaged per input first.

    Returns
    -------
    polars.DataFrame
        One row per input: the cell columns, ``task``, ``task_class``, ``drop``,
        ``task_mean`` (mean D of the input's task in its cell), ``task_rank`` (position on
        the x axis: the figures' one task order, :func:`pagestats.figures._frames.task_order`,
        capacity-bound tasks first, each class in RULER's order) and ``slot``
        (rank of the input within its task and cell, 0-based, by D; for a deterministic
        horizontal spread).

    References
    ----------
    PAGE paper, §4.1 "Predicting Unsafe Eviction", Figure 2 (D per input by task, bars are
    per-task means, line at τ = 0.07).
    """
    require(gate, ["task", "drop"], "drop_by_task_data")
    frame = with_task_class(gate)
    cell = present(frame, MODEL_CELL)
    if "pair_draw" in frame.columns:
        ident = present(frame, ("run_id", "input_id")) + cell + ["task", "task_class"]
        frame = frame.group_by(ident).agg(pl.col("drop").mean())
    order = task_order(frame)
    rank = names_like(pl.DataFrame({"task": order, "task_rank": list(range(len(order)))}), frame)
    group = cell + ["task"]
    out = (
        frame.select(*cell, "task", "task_class", *present(frame, ("run_id", "input_id")), "drop")
        .join(rank, on="task")
        .with_columns(
            pl.col("drop").mean().over(group).alias("task_mean"),
            (pl.col("drop").rank("ordinal").over(group) - 1).cast(pl.Int64).alias("slot"),
            pl.len().over(group).alias("task_n"),
        )
        .sort([*cell, "task_rank", "slot"])
    )
    return out


def drop_by_task(gate: pl.DataFrame, *, tau: float | None = defaults.TAU, ax=None):
    """Figure 2: D per input by task (dots), per-task mean (bars) and the threshold τ.

    One panel per (model, context_length) cell present in ``gate``.

    Parameters
    ----------
    gate : polars.DataFrame
        See :func:`drop_by_task_data`.
    tau : float or None
        Threshold drawn as a horizontal line (default the fixed τ = 0.07; ``None`` draws
        none — e.g. under a z-scored policy, where τ differs per model).
    ax : Axes or sequence of Axes, optional
        One per cell; a new figure when omitted.

    Returns
    -------
    matplotlib.figure.Figure

    References
    ----------
    PAGE paper, Figure 2; §3 "Head-Agreement Drop D", Eq. 3.
    """
    data = drop_by_task_data(gate)
    groups = cells(data, MODEL_CELL)
    tasks = data.select("task", "task_rank", "task_class").unique().sort("task_rank")
    with st.style():
        fig, axes = st.panels(len(groups), ax, ncols=min(len(groups), 2), sharey=True,
                              row_height=1.6)
        for i, (axis, cell) in enumerate(zip(axes, groups)):
            sub = where(data, cell)
            # only the tasks this cell holds, in the global order
            shown = sub.select("task", "task_rank").unique().sort("task_rank")
            pos = pl.DataFrame({"task": shown["task"], "x": list(range(shown.height))})
            sub = sub.join(pos, on="task", maintain_order="left")
            x = sub["x"].to_numpy().astype(float)
            slot = sub["slot"].to_numpy()
            n = sub["task_n"].to_numpy()
            jitter = np.where(n > 1, (slot / np.maximum(n - 1, 1) - 0.5) * 0.5, 0.0)
            colors = [st.class_color(c) for c in sub["task_class"].to_list()]
            means = sub.group_by("x", "task_class").agg(pl.col("task_mean").first()).sort("x")
            axis.bar(means["x"].to_numpy(), means["task_mean"].to_numpy(), width=0.7,
                     color=[st.class_color(c) for c in means["task_class"].to_list()], alpha=0.22,
                     edgecolor="none", zorder=1)
            axis.scatter(x + jitter, sub["drop"].to_numpy(), s=3, c=colors, alpha=0.6, linewidths=0,
                         zorder=2, rasterized=st.many_markers(len(x)))
            if tau is not None:
                axis.axhline(tau, color=st.TAU_COLOR, linestyle="--", linewidth=0.8, zorder=3)
            axis.axhline(0.0, color="0.8", linewidth=0.5, zorder=0)
            axis.set_xticks(range(shown.height), [short_task(t) for t in shown["task"].to_list()],
                            rotation=45, ha="right")
            axis.set_xlim(-0.6, shown.height - 0.4)
            if len(groups) > 1 or cell:
                axis.set_title(st.cell_label(cell), fontsize=6)
            if i % 2 == 0:
                axis.set_ylabel("head-agreement drop D")
        legend = _class_legend(fig, data["task_class"].unique().sort().to_list(), tau)
        st.add_task_key(fig, task_key(tasks["task"].to_list()), legend=legend)
    gate_tau = tau_text(tau=tau) if tau is not None else (tau_text(gate) + ", not drawn" if "tau" in gate.columns
                                                          else "no τ drawn")
    st.stamp(fig, n_inputs(gate), gate_tau)
    return fig


def _class_legend(fig, classes, tau):
    handles = [Line2D([], [], marker="o", linestyle="none", color=st.class_color(c), label=c) for c in classes]
    if tau is not None:
        handles.append(Line2D([], [], color=st.TAU_COLOR, linestyle="--", linewidth=0.8, label=f"τ = {tau:g}"))
    return fig.legend(handles=handles, loc="outside lower center", ncols=len(handles))




# --------------------------------------------------------------------------- Fig. 5
def agreement_profile_data(
    inputs: pl.DataFrame,
    *,
    bin_fraction: float = defaults.BIN_FRACTION,
    convention: str = defaults.BIN_CONVENTION,
) -> pl.DataFrame:
    """Per-layer agreement a_ℓ averaged over the inputs of each task (data of Fig. 5).

    Parameters
    ----------
    inputs : polars.DataFrame
        ``Logs.inputs``: ``task``, ``agreement`` (list of a_ℓ, length L), optionally
        ``task_class``, ``model``, ``context_length``.
    bin_fraction, convention
        Early/late bins (:func:`pagestats.core.profile.bin_layers`) used to label layers.

    Returns
    -------
    polars.DataFrame
        One row per (cell, task, layer): ``task_class``, ``layer`` (0-based ℓ),
        ``n_layers`` (L), ``agreement`` (mean a_ℓ over the inputs), ``n_inputs``, and
        ``bin`` ("early", "late" or "middle").

    References
    ----------
    PAGE paper, App. A.3.3 "The per-layer profile behind D", Figure 5; Eq. 3 (bins);
    App. F (deployed equal-size bins).
    """
    require(inputs, ["task", "agreement"], "agreement_profile_data")
    inputs = with_task_class(inputs)
    cell = present(inputs, MODEL_CELL)
    keys = cell + ["task", "task_class"]
    lengths = inputs.select(pl.col("agreement").list.len()).to_series()
    if lengths.min() < 2:
        raise ValueError("agreement profiles need at least 2 layers")
    long = (
        inputs.select(*keys, "agreement")
        .with_columns(pl.col("agreement").list.len().alias("n_layers"),
                      pl.int_ranges(pl.col("agreement").list.len()).alias("layer"))
        .explode(["agreement", "layer"])
    )
    out = (
        long.group_by(*keys, "n_layers", "layer")
        .agg(pl.col("agreement").cast(pl.Float64).mean(), pl.len().alias("n_inputs"))
        .sort([*keys, "layer"])
    )
    labels = []
    for n_layers in out["n_layers"].unique().to_list():
        early, late = bin_layers(int(n_layers), bin_fraction, convention)
        for layer in range(int(n_layers)):
            labels.append((n_layers, layer, "early" if layer in early else "late" if layer in late else "middle"))
    bins = pl.DataFrame(labels, schema={"n_layers": pl.Int64, "layer": pl.Int64, "bin": pl.String}, orient="row")
    out = out.with_columns(pl.col("n_layers").cast(pl.Int64), pl.col("layer").cast(pl.Int64))
    return out.join(bins, on=["n_layers", "layer"], how="left").sort([*keys, "layer"])


def agreement_profile(
    inputs: pl.DataFrame,
    *,
    bin_fraction: float = defaults.BIN_FRACTION,
    convention: str = defaults.BIN_CONVENTION,
    ax=None,
):
    """Figure 5: per-layer head agreement a_ℓ averaged over inputs, per task, with the
    early and late bins that define D shaded. One panel per (model, context_length).

    Returns
    -------
    matplotlib.figure.Figure

    References
    ----------
    PAGE paper, App. A.3.3, Figure 5.
    """
    data = agreement_profile_data(inputs, bin_fraction=bin_fraction, convention=convention)
    groups = cells(data, MODEL_CELL)
    order = task_order(data)
    palette = _task_palette(data, order)
    with st.style():
        fig, axes = st.panels(len(groups), ax, ncols=min(len(groups), 2), row_height=1.8)
        for i, (axis, cell) in enumerate(zip(axes, groups)):
            sub = where(data, cell)
            n_layers = int(sub["n_layers"].max())
            for name, color in ((("early", st.EARLY_COLOR), ("late", st.LATE_COLOR))):
                layers = sub.filter(pl.col("bin") == name)["layer"].unique().sort().to_numpy()
                if layers.size:
                    axis.axvspan(layers.min() - 0.5, layers.max() + 0.5, color=color, alpha=0.10, lw=0)
                    axis.text((layers.min() + layers.max()) / 2, 1.0, name, transform=axis.get_xaxis_transform(),
                              ha="center", va="top", fontsize=5.5, color=color)
            for task in order:
                t = sub.filter(pl.col("task") == task)
                if t.height == 0:
                    continue
                capacity = "task_class" in t.columns and t["task_class"][0] == "capacity-bound"
                axis.plot(t["layer"].to_numpy(), t["agreement"].to_numpy(), **palette[task],
                          linewidth=1.5 if capacity else 0.9, label=short_task(task))
            axis.set_xlim(-0.5, n_layers - 0.5)
            axis.set_xlabel(r"layer $\ell$")
            if i % 2 == 0:
                axis.set_ylabel(r"mean agreement $a_\ell$")
            if len(groups) > 1 or cell:
                axis.set_title(st.cell_label(cell), fontsize=6)
        handles, labels = axes[0].get_legend_handles_labels()
        legend = fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 5))
        st.add_task_key(fig, task_key(order), legend=legend)
    st.stamp(fig, n_inputs(inputs), "no τ (the profile a_ℓ behind D; no gate decision drawn)")
    return fig


def _task_palette(data: pl.DataFrame, order: list[str]) -> dict:
    """One colour and line style per task (:func:`pagestats.figures._style.task_styles`):
    capacity-bound tasks in warm hues, dilution-prone in the others, no two tasks alike."""
    capacity = set(data.filter(pl.col("task_class") == defaults.CAPACITY_BOUND)["task"].to_list()) \
        if "task_class" in data.columns else set()
    return st.task_styles(order, capacity)


# --------------------------------------------------------------------------- Fig. 6
def tau_sensitivity_data(
    curve: pl.DataFrame,
    *,
    tau0: float = defaults.TAU,
    delta_tolerance: float = defaults.PLATEAU_DELTA_TOLERANCE,
    error_budget: float = defaults.PLATEAU_ERROR_BUDGET,
) -> pl.DataFrame:
    """Mark the operational plateau of a τ curve (data of Fig. 6).

    Parameters
    ----------
    curve : polars.DataFrame
        ``replay.tau_curve(...)``: one row per (group, threshold) with ``tau``, ``delta``
        (mean gated − plain over the group's (input, budget < 1) rows), ``fp_rate``
        (share of capacity-bound inputs on which the gate opens) and ``fn_rate`` (share of
        dilution-prone inputs on which it stays closed). Every other non-value column is
        a group key (model, context_length, evictor, ...); the plateau is found per group.
    tau0 : float
        The deployed threshold; Δ_τ0 is the curve's Δ at τ0 (linear interpolation when τ0
        is not on the grid).
    delta_tolerance, error_budget
        Plateau criteria |Δ − Δ_τ0| ≤ ``delta_tolerance`` and FP + FN ≤ ``error_budget``.

    Returns
    -------
    polars.DataFrame
        ``curve`` sorted by group and τ with ``delta_tau0``, ``in_plateau`` (both criteria hold) and
        ``in_band`` (the contiguous run of plateau thresholds that contains the grid point
        nearest τ0; all False when that point is outside the plateau).

    References
    ----------
    PAGE paper, App. A.3.4 "Threshold sensitivity", Figure 6 (band: |Δ − Δ_τ=0.07| ≤ 1 pp
    and FP + FN ≤ 0.10).
    """
    require(curve, ["tau", "delta", "fp_rate", "fn_rate"], "tau_sensitivity_data")
    keys = _curve_keys(curve)
    parts = []
    for cell in cells(curve, keys) if keys else [{}]:
        sub = where(curve, cell).sort("tau")
        tau = sub["tau"].to_numpy()
        delta = sub["delta"].to_numpy()
        delta0 = float(np.interp(tau0, tau, delta))
        with np.errstate(invalid="ignore"):
            ok = (np.abs(delta - delta0) <= delta_tolerance + 1e-12) & (
                sub["fp_rate"].to_numpy() + sub["fn_rate"].to_numpy() <= error_budget + 1e-12
            )
        band = np.zeros_like(ok)
        start = int(np.argmin(np.abs(tau - tau0)))
        if ok[start]:
            lo = start
            while lo > 0 and ok[lo - 1]:
                lo -= 1
            hi = start
            while hi < len(ok) - 1 and ok[hi + 1]:
                hi += 1
            band[lo : hi + 1] = True
        parts.append(sub.with_columns(
            pl.lit(delta0).alias("delta_tau0"), pl.Series("in_plateau", ok), pl.Series("in_band", band)
        ))
    return pl.concat(parts)


#: Fill of the operational plateau of Fig. 6.
PLATEAU_COLOR = "#f2c14e"


def _two_line_label(cell: dict) -> str:
    """A panel title on two lines: the model, then the context and the rest of the cell."""
    model = cell.get("model")
    rest = st.cell_label({k: v for k, v in cell.items() if k != "model"})
    return f"{st.plain_text(str(model))}\n{rest}" if model is not None and rest else st.cell_label(cell)


_CURVE_VALUES = {"tau", "n_inputs", "p_open", "delta", "fp_rate", "fn_rate", "kept_kv"}


def _curve_keys(curve: pl.DataFrame) -> list[str]:
    """Group columns of a ``replay.tau_curve`` frame (everything that is not a value)."""
    return [c for c in curve.columns if c not in _CURVE_VALUES]


def tau_sensitivity(curve: pl.DataFrame, *, tau0: float = defaults.TAU, delta_tolerance: float = defaults.PLATEAU_DELTA_TOLERANCE,
                    error_budget: float = defaults.PLATEAU_ERROR_BUDGET, ax=None):
    """Figure 6: Δ, false-positive and false-negative rates against τ, with the operational
    plateau shaded and the deployed τ marked.

    Parameters
    ----------
    curve : polars.DataFrame
        ``replay.tau_curve(logs, taus, by=...)``; see :func:`tau_sensitivity_data`.
    ax : Axes or sequence of Axes, optional
        One per group.

    Returns
    -------
    matplotlib.figure.Figure
        One panel per group of ``curve``; the rates are on a twin axis of each panel.

    References
    ----------
    PAGE paper, App. A.3.4, Figure 6.
    """
    data = tau_sensitivity_data(curve, tau0=tau0, delta_tolerance=delta_tolerance, error_budget=error_budget)
    keys = _curve_keys(data.drop("delta_tau0", "in_plateau", "in_band"))
    groups = cells(data, keys) if keys else [{}]
    with st.style():
        fig, axes = st.panels(len(groups), ax, ncols=min(len(groups), 2), row_height=1.7)
        for i, (axis, cell) in enumerate(zip(axes, groups)):
            sub = where(data, cell)
            tau = sub["tau"].to_numpy()
            finite = np.isfinite(tau)
            band = sub["in_band"].to_numpy()
            if band.any():
                axis.axvspan(tau[band].min(), tau[band].max(), color=PLATEAU_COLOR, alpha=0.45, lw=0, zorder=0)
            note = None
            if not band.any():
                note = ("no τ meets both plateau criteria" if not sub["in_plateau"].any()
                        else f"the plateau does not reach τ = {tau0:g}")
            axis.axvline(tau0, color=st.TAU_COLOR, linestyle=":", linewidth=0.8)
            line_d, = axis.plot(tau[finite], sub["delta"].to_numpy()[finite] * 100, color="black",
                                label="Δ gated − plain (left)")
            axis.set_xlabel("threshold τ")
            if i % 2 == 0:
                axis.set_ylabel("Δ accuracy (pp)")
            twin = axis.twinx()
            twin.spines["right"].set_visible(True)
            line_fp, = twin.plot(tau[finite], sub["fp_rate"].to_numpy()[finite],
                                 color=st.CLASS_COLOR["capacity-bound"], linestyle="--",
                                 label="FP: open on cap.-bound (right)")
            line_fn, = twin.plot(tau[finite], sub["fn_rate"].to_numpy()[finite],
                                 color=st.CLASS_COLOR["dilution-prone"], linestyle="-.",
                                 label="FN: closed on dil.-prone (right)")
            twin.set_ylim(-0.03, 1.03)
            st.percent_axis(twin)
            if i % 2 == 1 or len(groups) == 1:
                twin.set_ylabel("error rate")
            if cell:
                axis.set_title(_two_line_label(cell) + (f"\n{note}" if note else ""), fontsize=6)
            elif note:
                axis.set_title(note, fontsize=6)
        handles = [line_d, line_fp, line_fn]
        if data["in_band"].any():
            handles.append(Patch(color=PLATEAU_COLOR, alpha=0.45, label="plateau"))
        handles.append(Line2D([], [], color=st.TAU_COLOR, linestyle=":", linewidth=0.8, label=f"τ0 = {tau0:g}"))
        fig.legend(handles=handles, loc="outside lower center", ncols=2)
    swept = data.filter(pl.col("tau").is_finite())["tau"]
    tau_said = f"τ swept {swept.min():g} to {swept.max():g}, τ0 = {tau0:g}"
    if "n_inputs" in data.columns:  # the curve's inputs: per group, the most any of its points counts
        per = data.group_by(keys).agg(pl.col("n_inputs").max()) if keys else data.select(pl.col("n_inputs").max())
        st.stamp(fig, int(per["n_inputs"].sum()), tau_said)
    else:
        fig.suptitle(tau_said, fontsize=5, color="0.35")
    return fig
