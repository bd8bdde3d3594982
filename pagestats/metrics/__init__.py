"""The paper's metrics as pure functions of the replay frames.

Inputs are the frames of :mod:`pagestats.replay`: ``gated_outcomes`` (one row per input,
evictor and budget, columns ``run_id, task, input_id, [pair_draw], model, context_length,
task_class, evictor, budget, n_tokens, drop, tau, gate_open, score_full, score_plain,
score_gated, n_kept_plain, n_kept_gated``) or the per-input ``gate`` frame. Functions
over many groups return polars frames sorted by their ``by`` columns; interval
arithmetic is delegated to :mod:`pagestats.stats`. The scaling relation (Table 25, Fig. 9,
Table 21) lives in :mod:`~pagestats.metrics.scaling`; rates (ρ, harm, r(x), p_open, AUC) in
:mod:`~pagestats.metrics.rates`; Δ, Δ(f) and the oracle gap in :mod:`~pagestats.metrics.delta`;
kept-KV, compression and batching in :mod:`~pagestats.metrics.memory`; the two sides a table
contrasts (the capacity-bound anchor, NIAH-MK3, and the dilution-prone tasks) in
:mod:`~pagestats.metrics.sides`; evictors whose outcomes are identical in :mod:`~pagestats.metrics.identity`. The conventions below
hold for all of them.

Conventions (one place, used by every function below)
-----------------------------------------------------
* ``A(1, x)``, the full-cache accuracy, is ``score_full`` (the budget-1.0 audit arm; the
  paper checks ``A_gated(1,x) = A_plain(1,x)`` on every row, App. A.7.1).
* Budget sweeps ``max_b`` and means over budgets use the rows with ``budget < 1`` (the
  eviction budgets); rows at ``budget == 1.0``, if logged, are the audit arm.
* A *unit* is one input under one evictor: ``(run_id, task, input_id, [pair_draw], evictor)``.
  Rates count units, so pooling over evictors (``evictor`` not in ``by``) counts each
  (input, evictor) pair once.
* A frame with several head-pair draws (``pair_draw``) must have ``pair_draw`` in ``by``;
  otherwise one input would be counted once per draw.
* An empty frame (or an empty selection) gives an empty result with the same columns.
"""

from __future__ import annotations

from pagestats.metrics.delta import (
    accuracy,
    delta,
    delta_bootstrap,
    delta_of_f,
    equal_inputs,
    same_inputs,
    oracle_gap,
    task_oracle,
)
from pagestats.metrics.identity import identical_evictors
from pagestats.metrics.matched import frontier_accuracy, matched_memory
from pagestats.metrics.memory import compression, full_cache_gib, kept_kv, kv_bytes_per_token, static_batching
from pagestats.metrics.rates import (
    auc_by_signal,
    harm_rate,
    p_open,
    recovery_indicator,
    recovery_rate,
)
from pagestats.metrics.scaling import DILUTION_RULES, in_fit, predict_band, scaling_fit, scaling_rows
from pagestats.metrics.sides import anchor_name, capacity_side, dilution_side

__all__ = [
    "frontier_accuracy", "matched_memory",
    "accuracy",
    "equal_inputs",
    "same_inputs",
    "recovery_rate",
    "harm_rate",
    "recovery_indicator",
    "delta",
    "delta_bootstrap",
    "p_open",
    "kept_kv",
    "compression",
    "static_batching",
    "kv_bytes_per_token",
    "full_cache_gib",
    "delta_of_f",
    "oracle_gap",
    "task_oracle",
    "auc_by_signal",
    "scaling_rows",
    "scaling_fit",
    "in_fit",
    "DILUTION_RULES",
    "predict_band",
    "identical_evictors",
    "capacity_side",
    "dilution_side",
    "anchor_name",
]
