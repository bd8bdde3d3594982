"""The gate rule applied to logs: D under a profile spec (:mod:`pagestats.replay.spec`), τ from a
policy (:mod:`pagestats.replay.policies`), and the full-KV outcome substituted where the gate
closes (Eq. 2).

``gate`` gives the decision per input; ``gated_outcomes`` expands it to every (evictor,
budget) arm.

References
----------
PAGE paper, §3 (Eq. 2 gate rule, Eq. 3 D).
"""

from __future__ import annotations

import polars as pl

from pagestats.columns import input_key, with_task_class
from pagestats.formulas import N_KEPT_GATED, SCORE_GATED
from pagestats.replay.policies import POLICY_TYPES, FixedTau, Policy
from pagestats.replay.spec import ProfileSpec, _require, profile_drop
from pagestats.schema import INPUT_KEY

GATE_COLUMNS = (
    "run_id", "task", "input_id", "pair_draw", "model", "context_length", "task_class",
    "n_tokens", "full_score", "drop", "tau", "gate_open",
)  # fmt: skip
GATED_OUTCOME_COLUMNS = (
    "run_id", "task", "input_id", "pair_draw", "model", "context_length", "task_class",
    "evictor", "budget", "n_tokens", "drop", "tau", "gate_open", "score_full", "score_plain",
    "score_gated", "n_kept_plain", "n_kept_gated",
)  # fmt: skip



def _input_meta(logs) -> pl.DataFrame:
    inputs = logs.inputs
    _require(inputs, [*INPUT_KEY, "model", "context_length", "n_tokens", "full_score", "agreement"], "inputs")
    inputs = with_task_class(inputs)  # io adds it from the manifests; plain frames use the defaults
    return inputs.select(
        *INPUT_KEY, "model", "context_length", "task_class", "n_tokens", "full_score", "agreement"
    )


def _decision_frame(logs, profile: ProfileSpec) -> pl.DataFrame:
    prof = profile_drop(logs, profile)
    return prof.join(_input_meta(logs), on=INPUT_KEY, how="left", maintain_order="left")


def gate(logs, policy: Policy = FixedTau(), profile: ProfileSpec = ProfileSpec()) -> pl.DataFrame:
    """Gate decision per input under ``policy``: open (evict) iff D ≥ τ (§3, Eq. 2).

    Returns
    -------
    polars.DataFrame
        ``run_id, task, input_id, [pair_draw], model, context_length, task_class, n_tokens,
        full_score, drop, tau, gate_open``; ``tau`` is null for threshold-free policies.
    """
    if not hasattr(policy, "decide"):
        raise TypeError(f"policy must be one of {[t.__name__ for t in POLICY_TYPES]}, got {policy!r}")
    frame = _decision_frame(logs, profile)
    decided = policy.decide(frame)
    if decided.height != frame.height or "gate_open" not in decided.columns or "tau" not in decided.columns:
        raise ValueError(f"policy {policy!r} must return the frame with tau and gate_open added")
    decided = decided.with_columns(pl.col("tau").cast(pl.Float64), pl.col("gate_open").cast(pl.Boolean))
    if decided["gate_open"].null_count():
        raise ValueError(f"policy {getattr(policy, 'name', policy)!r} left gate_open undecided for some inputs")
    return decided.select([c for c in GATE_COLUMNS if c in decided.columns])


def _outcome_rows(logs, decisions: pl.DataFrame) -> pl.DataFrame:
    outcomes = logs.outcomes
    _require(outcomes, [*INPUT_KEY, "evictor", "budget", "n_kept", "score"], "outcomes")
    rows = outcomes.select(*INPUT_KEY, "evictor", "budget", "n_kept", "score").join(
        decisions, on=INPUT_KEY, how="left"
    )
    orphans = rows.filter(pl.col("model").is_null())
    if orphans.height:
        raise ValueError(
            f"{orphans.height} outcome row(s) have no input row, e.g. {orphans.select(INPUT_KEY).row(0)}"
        )
    return rows


def gated_outcomes(logs, policy: Policy = FixedTau(), profile: ProfileSpec = ProfileSpec()) -> pl.DataFrame:
    """Per (input, evictor, budget): plain, full and gated outcomes under ``policy`` (Eq. 2).

    The gated outcome is the plain outcome where the gate opens, else the full-KV outcome
    (``full_score``) with ``n_kept_gated = n_tokens``.

    Returns
    -------
    polars.DataFrame
        Columns :data:`GATED_OUTCOME_COLUMNS` (``pair_draw`` only with head-pair draws),
        sorted by input key, [pair_draw], evictor, budget.
    """
    decisions = gate(logs, policy, profile)
    rows = _outcome_rows(logs, decisions).with_columns(
        pl.col("full_score").alias("score_full"),
        pl.col("score").alias("score_plain"),
        pl.sql_expr(SCORE_GATED).alias("score_gated"),
        pl.col("n_kept").alias("n_kept_plain"),
        pl.sql_expr(N_KEPT_GATED).alias("n_kept_gated"),
    )
    cols = [c for c in GATED_OUTCOME_COLUMNS if c in rows.columns]
    order = [*input_key(rows), "evictor", "budget"]
    return rows.select(cols).sort(order)
