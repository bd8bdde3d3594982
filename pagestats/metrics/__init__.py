"""The paper's metrics, each written once as SQL over a relation of gated outcomes.

A metric takes a DuckDB relation with the columns of the replay's ``gated`` relation
(:meth:`pagestats.replay.Replay.gated_relation`: one row per input, evictor and budget, ``run_id, task,
input_id, [pair_draw], model, context_length, task_class, evictor, budget, n_tokens, drop, tau,
gate_open, score_full, score_plain, score_gated, n_kept_plain, n_kept_gated``), or some of them,
and returns a polars frame (:mod:`~pagestats.metrics.engine`; :func:`relation` puts a polars frame
on the engine, :func:`on_frame` runs a metric over one). The aggregates are the formulas of
:mod:`pagestats.core.formulas`, the ones ``pagestats whatif`` reads; intervals and resampling are
NumPy's (:mod:`pagestats.stats`). Functions over many groups return frames sorted by their ``by``
columns. The scaling relation (Table 25, Fig. 9, Table 21) lives in :mod:`~pagestats.metrics.scaling`;
rates (ρ, harm, r(x), p_open, AUC) in :mod:`~pagestats.metrics.rates`; the task means of D in
:mod:`~pagestats.metrics.signal`; accuracy, Δ, Δ(f), the oracle
gap and Δ's bootstrap in :mod:`~pagestats.metrics.delta`; kept-KV, compression and batching in
:mod:`~pagestats.metrics.memory`; Δ at matched memory in :mod:`~pagestats.metrics.matched`; the two
sides a table contrasts (the capacity-bound anchor, NIAH-MK3, and the dilution-prone tasks) in
:mod:`~pagestats.metrics.sides`; evictors whose outcomes are identical in
:mod:`~pagestats.metrics.identity`. The conventions below hold for all of them.

Conventions (one place, used by every function below)
-----------------------------------------------------
* ``A(1, x)``, the full-cache accuracy, is ``score_full`` (the budget-1.0 audit arm; the
  paper checks ``A_gated(1,x) = A_plain(1,x)`` on every row, App. A.7.1).
* Budget sweeps ``max_b`` and means over budgets use the rows with ``budget < 1`` (the
  eviction budgets); rows at ``budget == 1.0``, if logged, are the audit arm.
* A *unit* is one input under one evictor: ``(run_id, task, input_id, [pair_draw], evictor)``.
  Rates count units, so pooling over evictors (``evictor`` not in ``by``) counts each
  (input, evictor) pair once.
* A relation with several head-pair draws (``pair_draw``) must have ``pair_draw`` in ``by``;
  otherwise one input would be counted once per draw.
* An empty relation (or an empty selection) gives an empty result with the same columns.
* Text columns come back from SQL as :class:`polars.String`.
"""

from __future__ import annotations

from pagestats.metrics.delta import (
    accuracy,
    delta,
    deltas,
    delta_bootstrap,
    delta_of_f,
    equal_inputs,
    evicted_on_equal_inputs,
    full_accuracy,
    same_inputs,
    oracle_gap,
    task_oracle,
)
from pagestats.metrics.engine import on_frame, on_rows, relation
from pagestats.metrics.identity import identical_evictors
from pagestats.metrics.matched import MatchedCells, frontier_accuracy, matched_cells, matched_memory
from pagestats.metrics.memory import compression, full_cache_gib, kept_kv, kv_bytes_per_token, static_batching
from pagestats.metrics.rates import (
    auc_by_signal,
    harm_rate,
    p_open,
    recovery_indicator,
    recovery_rate,
)
from pagestats.metrics.scaling import DILUTION_RULES, in_fit, predict_band, scaling_fit, scaling_rows
from pagestats.metrics.sides import anchor_name, capacity_side, capacity_sql, dilution_side
from pagestats.metrics.signal import task_means

__all__ = [
    "relation",
    "on_frame",
    "on_rows",
    "MatchedCells", "frontier_accuracy", "matched_cells", "matched_memory",
    "accuracy",
    "full_accuracy",
    "equal_inputs",
    "evicted_on_equal_inputs",
    "same_inputs",
    "recovery_rate",
    "harm_rate",
    "recovery_indicator",
    "delta",
    "deltas",
    "delta_bootstrap",
    "p_open",
    "task_means",
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
    "capacity_sql",
    "dilution_side",
    "anchor_name",
]
