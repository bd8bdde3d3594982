"""The sweeps of D's own parameters, each with the gate at τ recalibrated alongside it
(App. A.3.1): the k sweep (App. A.3.1), head-pair subsampling (Table 9) and layer subsampling
(Table 10) — does the ordering margin of D (the anchor NIAH-MK3 below the other tasks) survive a
cheaper D?

These tables recompute D from the logs (:mod:`pagestats.replay`) under several profile
specs, so they take :class:`pagestats.io.Logs` first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import polars as pl

from pagestats import metrics, replay
from pagestats.core import defaults
from pagestats.core.columns import MODEL_CELL
from pagestats.replay.policies import FixedTau
from pagestats.replay.spec import resolve_layers
from pagestats.tables._common import decision_blocks, gate_at, ordering_margin

__all__ = ["k_sweep_table", "head_pair_table", "layer_subset_table"]


def k_sweep_table(logs, *, ks=defaults.K_SWEEP, recalibrate: str = "z", tau: float = defaults.TAU,
                  pilot_n: int = defaults.PILOT_N, profile: replay.ProfileSpec = replay.ProfileSpec(),
                  anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> pl.DataFrame:
    """The k sweep of App. A.3.1: D recomputed from the stored top-k indices at each k ≤ k_max,
    its separation margin (the anchor NIAH-MK3 below the dilution-prone tasks, as Tables 5–6: "k = 32
    maximises both the separation margin and the per-input AUC"; ``anchor=None`` reads the
    capacity-bound class), and — because "any sweep of a parameter that rescales D must
    recalibrate τ alongside it" — the gate-open fraction at the recalibrated τ with a
    ``degenerate`` flag ("we report gate-open fractions beside every Δ in the sweep").

    Returns
    -------
    polars.DataFrame
        ``k, model, context_length``, :func:`~pagestats.tables._common.ordering_margin`
        columns (``capacity_max, dilution_min, margin, ordered``), ``tau_gate``, ``p_open``,
        ``degenerate`` and ``recalibration`` (``recalibrate="none"`` keeps the fixed τ).
    """
    k_max = int(logs.topk["indices"].list.len().min())
    parts = []
    for k in (k for k in ks if k <= k_max):
        spec = replay.ProfileSpec(**{**profile.__dict__, "k": int(k)})
        means = metrics.on_frame(metrics.task_means, replay.gate(logs, FixedTau(), spec), "drop", sd=False)
        margins = ordering_margin(means, anchor=anchor)
        parts.append(margins.join(gate_at(logs, spec, recalibrate, tau, pilot_n), on=list(MODEL_CELL), how="left")
                     .with_columns(pl.lit(int(k), pl.Int64).alias("k")))
    if not parts:
        raise ValueError(f"k_sweep_table: no k of {list(ks)} is ≤ the logged k_max {k_max}")
    return pl.concat(parts).select("k", *MODEL_CELL, "capacity_max", "dilution_min", "margin", "ordered", "tau_gate",
                                   "p_open", "degenerate", "recalibration").sort(["k", *MODEL_CELL])



def _pairs_per_layer(logs) -> pl.DataFrame:
    inputs = logs.inputs
    return inputs.group_by("model").agg(
        (pl.col("pair_jaccard").list.len().first() // pl.col("agreement").list.len().first()).cast(pl.Int64).alias("n_pairs"))


def head_pair_table(logs, *, fractions: Sequence[float] = defaults.PAIR_FRACTIONS, pair_draws: int = defaults.PAIR_DRAWS, seed: int = 0,
                    profile: replay.ProfileSpec = replay.ProfileSpec(), recalibrate: str = "z", tau: float = defaults.TAU,
                    pilot_n: int = defaults.PILOT_N, anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> pl.DataFrame:
    """Table 9: head-pair subsampling — margin over ``pair_draws`` random pair subsets per fraction.

    Returns
    -------
    polars.DataFrame
        ``model, context_length, pairs_fraction, n_pairs`` (P per layer), ``n_pairs_kept``
        (m = max(1, round(f·P)), as :func:`pagestats.replay.pair_subsets`), ``n_draws``,
        ``margin_mean``, ``margin_min``, ``margin_max`` and ``n_ordered`` (draws whose margin
        stayed positive: Table 9's "ordering"), margin as
        :func:`~pagestats.tables._common.ordering_margin` (Table 9: "the gap between mean D on NIAH-MK3 and
        the smallest mean D among the dilution-prone tasks"; ``anchor=None`` reads the capacity-bound class),
        and the gate at τ recalibrated to each subsample (App. A.3.1, :func:`pagestats.replay.recalibrate`;
        ``recalibrate="none"`` keeps the fixed τ): ``tau_gate`` (mean over draws), ``p_open``
        (over inputs and draws), ``degenerate`` (opens on none or all) and ``recalibration``.

    References
    ----------
    PAGE App. A.3.5 "How many head pairs does D need?", Table 9 (20 draws per fraction).
    """
    pairs = _pairs_per_layer(logs)
    parts = []
    for f in fractions:
        spec = replay.ProfileSpec(**{**profile.__dict__, "pairs_fraction": float(f), "pair_draws": int(pair_draws), "seed": int(seed)})
        by = [*MODEL_CELL, "pair_draw"]  # a block of draws' decisions at a time: its margins per cell and draw
        margins = pl.concat([ordering_margin(logs.typed_names(metrics.task_means(block, "drop", by=by, sd=False)), by=by, anchor=anchor)
                             for block in decision_blocks(logs, FixedTau(), spec)]).sort(by)
        parts.append(margins.group_by(list(MODEL_CELL)).agg(
            pl.len().cast(pl.Int64).alias("n_draws"), pl.col("margin").mean().alias("margin_mean"),
            pl.col("margin").min().alias("margin_min"), pl.col("margin").max().alias("margin_max"),
            pl.col("ordered").sum().cast(pl.Int64).alias("n_ordered"),
        ).join(gate_at(logs, spec, recalibrate, tau, pilot_n), on=list(MODEL_CELL), how="left")
            .with_columns(pl.lit(float(f)).alias("pairs_fraction")))
    out = pl.concat(parts).join(pairs, on="model", how="left")
    out = out.with_columns(pl.max_horizontal(pl.lit(1), (pl.col("pairs_fraction") * pl.col("n_pairs") + 0.5).floor()
                                             .cast(pl.Int64)).alias("n_pairs_kept"))
    return out.select(*MODEL_CELL, "pairs_fraction", "n_pairs", "n_pairs_kept", "n_draws", "margin_mean",
                      "margin_min", "margin_max", "n_ordered", "tau_gate", "p_open", "degenerate",
                      "recalibration").sort([*MODEL_CELL, "pairs_fraction"])


def layer_subset_table(logs, *, subsets: Sequence = replay.LAYER_SUBSETS,
                       profile: replay.ProfileSpec = replay.ProfileSpec(), recalibrate: str = "z",
                       tau: float = defaults.TAU, pilot_n: int = defaults.PILOT_N,
                       anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> pl.DataFrame:
    """Table 10: layer subsampling — the ordering margin of D recomputed on layer subsets: "the gap
    between mean D on NIAH-MK3 and the smallest mean D among the other tasks" (``anchor``, default
    NIAH-MK3; ``None`` reads the capacity-bound class).

    Returns
    -------
    polars.DataFrame
        ``layers`` (subset name), ``model, context_length, n_layers`` (kept), ``margin``,
        ``ordered`` (a separating threshold still exists), ``capacity_max``,
        ``dilution_min`` and ``note`` (why a subset could not be computed for a model, e.g.
        it keeps fewer than 2 layers; its numbers are then null), and the gate at τ
        recalibrated to the subset (App. A.3.1; ``recalibrate="none"`` keeps the fixed τ):
        ``tau_gate``, ``p_open``, ``degenerate`` (opens on none or all) and ``recalibration``.

    References
    ----------
    PAGE App. A.3.5 "How many layers does D need?", Table 10.
    """
    inputs = logs.inputs
    widths = inputs.group_by("model").agg(pl.col("agreement").list.len().first().alias("L"))
    cells = inputs.select(*MODEL_CELL).unique()
    parts = []
    for s in subsets:
        name = s if isinstance(s, str) else ",".join(map(str, s))
        for model, n_layers in widths.sort("model").iter_rows():
            spec = replay.ProfileSpec(**{**profile.__dict__, "layers": s})
            cell = cells.filter(pl.col("model") == model)
            try:
                kept = len(resolve_layers(spec, n_layers))
            except ValueError as err:  # a subset this model cannot form: fewer than 2 layers, an index past its last
                part = cell.with_columns(pl.lit(None, pl.Int64).alias("n_layers"), pl.lit(str(err)).alias("note"),
                                         *(pl.lit(None, pl.Float64).alias(c) for c in ("capacity_max", "dilution_min", "margin")),
                                         pl.lit(None, pl.Boolean).alias("ordered"),
                                         pl.lit(None, pl.Float64).alias("tau_gate"), pl.lit(None, pl.Float64).alias("p_open"),
                                         pl.lit(None, pl.Boolean).alias("degenerate"), pl.lit(None, pl.String).alias("recalibration"))
            else:
                sub = dataclasses.replace(logs, inputs=inputs.filter(pl.col("model") == model))
                means = pl.concat([sub.typed_names(metrics.task_means(block, "drop", sd=False))  # one block: no pair draws
                                   for block in decision_blocks(sub, FixedTau(), spec)])
                margins = ordering_margin(means, anchor=anchor, others="other")
                part = margins.with_columns(pl.lit(kept, pl.Int64).alias("n_layers"), pl.lit(None, pl.String).alias("note"))
                part = part.join(gate_at(sub, spec, recalibrate, tau, pilot_n), on=list(MODEL_CELL), how="left")
            parts.append(part.with_columns(pl.lit(name).alias("layers")).select(
                "layers", *MODEL_CELL, "n_layers", "margin", "ordered", "capacity_max", "dilution_min", "note",
                "tau_gate", "p_open", "degenerate", "recalibration"))
    return pl.concat(parts, how="vertical_relaxed")

