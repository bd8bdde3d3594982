"""Offline replay of the PAGE gate from logs: recompute D under any profile spec, apply any
policy, and substitute the full-KV outcome where the gate closes (Eq. 2).

``profile_drop`` (:mod:`pagestats.profile_replay`, re-exported here) recomputes the gate
statistic from the stored profile using only the definitions of :mod:`pagestats.profile`
(the same functions the collector used), so the default :class:`ProfileSpec` reproduces the
logged ``drop`` bit for bit. ``gate`` applies a policy (:mod:`pagestats.policies`),
``gated_outcomes`` expands the decision to every (evictor, budget) arm, and ``tau_curve``
evaluates a whole threshold sweep in one pass.

References
----------
PAGE paper, §3 (Eq. 2 gate rule, Eq. 3 D); App. F (deployed bins); Table 24 (strict thirds);
App. A.3.1 (k); A.3.3 (profile statistics); A.3.4 (calibration, threshold sensitivity,
Fig. 6); A.3.5 (head-pair subsampling, Table 9; layer subsampling, Table 10).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats import defaults
from pagestats.policies import (  # noqa: F401  (re-exported: replay is the policy entry point)
    POLICY_TYPES,
    CustomPolicy,
    FixedTau,
    Midpoint,
    Policy,
    TaskOracle,
    ZScored,
    pilot_mask,
)
from pagestats.profile_replay import (  # noqa: F401  (re-exported: replay is the entry point)
    INPUT_KEY,
    LAYER_SUBSETS,
    STATISTICS,
    ProfileSpec,
    _require,
    pair_subsets,
    profile_drop,
    profile_statistic,
    resolve_layers,
    topk_pair_jaccard,
)

GATE_COLUMNS = (
    "run_id", "task", "input_id", "pair_draw", "model", "context_length", "task_class",
    "n_tokens", "full_score", "drop", "tau", "gate_open",
)  # fmt: skip
GATED_OUTCOME_COLUMNS = (
    "run_id", "task", "input_id", "pair_draw", "model", "context_length", "task_class",
    "evictor", "budget", "n_tokens", "drop", "tau", "gate_open", "score_full", "score_plain",
    "score_gated", "n_kept_plain", "n_kept_gated",
)  # fmt: skip
TAU_CURVE_COLUMNS = ("tau", "n_inputs", "p_open", "delta", "fp_rate", "fn_rate", "kept_kv")


# --------------------------------------------------------------------------- gate


def _input_meta(logs) -> pl.DataFrame:
    inputs = logs.inputs
    _require(inputs, [*INPUT_KEY, "model", "context_length", "n_tokens", "full_score", "agreement"], "inputs")
    if "task_class" not in inputs.columns:  # io adds it from the manifests; plain frames use the defaults
        inputs = inputs.with_columns(
            pl.col("task").map_elements(defaults.default_task_class, return_dtype=pl.String).alias("task_class")
        )
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
        pl.when(pl.col("gate_open")).then(pl.col("score")).otherwise(pl.col("full_score")).alias("score_gated"),
        pl.col("n_kept").alias("n_kept_plain"),
        pl.when(pl.col("gate_open")).then(pl.col("n_kept")).otherwise(pl.col("n_tokens")).alias("n_kept_gated"),
    )
    cols = [c for c in GATED_OUTCOME_COLUMNS if c in rows.columns]
    order = [*INPUT_KEY, *(["pair_draw"] if "pair_draw" in rows.columns else []), "evictor", "budget"]
    return rows.select(cols).sort(order)


# --------------------------------------------------------------------------- τ curve


def tau_curve(
    logs,
    taus,
    profile: ProfileSpec = ProfileSpec(),
    by=("model", "context_length", "evictor"),
) -> pl.DataFrame:
    """Fixed-τ replay at many thresholds in one pass (App. A.3.4 "Threshold sensitivity", Fig. 6).

    Parameters
    ----------
    logs : pagestats.io.Logs
    taus : array_like of float
        Thresholds (any order; ±inf allowed).
    profile : ProfileSpec
    by : sequence of str
        Groups of the curve (columns of the outcome rows: model, context_length, evictor,
        task, task_class, budget, run_id).

    Returns
    -------
    polars.DataFrame
        ``*by, [pair_draw], tau, n_inputs, p_open, delta, fp_rate, fn_rate, kept_kv``, one
        row per group and threshold, taus in the given order within a group.

    Notes
    -----
    Over the rows with b < 1 of a group: Δ(τ) = mean over (input, budget) of
    (1 − open)(A_full − A_plain) = mean(gated − plain); kept_kv(τ) = mean of the gated arm's
    n_kept/n_tokens. Over the group's inputs: p_open = fraction with D ≥ τ; fp_rate = share of
    capacity-bound inputs whose gate opens ("gate fires on capacity-bound MK3"); fn_rate =
    share of dilution-prone inputs whose gate stays closed (App. A.3.4); NaN when the group
    has no input of that class. Algorithm: one join and one group-by give per input the sums
    of (A_full − A_plain), of n_kept/n_tokens and the row count; inputs are sorted by D in
    each group, and for every τ the closed inputs are a prefix (D < τ) found by
    ``searchsorted``, so each metric is a difference of cumulative sums. Equals the
    brute-force loop of :func:`gated_outcomes` over τ up to floating-point summation order.
    """
    taus = np.asarray(taus, dtype=np.float64).ravel()
    if np.isnan(taus).any():
        raise ValueError("taus contain NaN")
    by = list(by)
    rows = _outcome_rows(logs, _decision_frame(logs, profile)).filter(pl.col("budget") < 1.0)
    bad = [c for c in by if c not in rows.columns or c in ("pair_draw", "drop", "score", "n_kept")]
    if bad:
        raise ValueError(f"tau_curve: cannot group by {bad}")
    groups = [*by, *(["pair_draw"] if "pair_draw" in rows.columns else [])]
    units = (
        rows.group_by([*groups, *(c for c in INPUT_KEY if c not in groups)])
        .agg(
            pl.col("drop").first(),
            (pl.col("task_class").first() == defaults.CAPACITY_BOUND).cast(pl.Float64).alias("_cap"),
            (pl.col("task_class").first() == defaults.DILUTION_PRONE).cast(pl.Float64).alias("_dil"),
            (pl.col("full_score") - pl.col("score")).sum().alias("_gain"),
            (pl.col("n_kept") / pl.col("n_tokens")).sum().alias("_kept"),
            pl.len().cast(pl.Float64).alias("_rows"),
        )
        .sort([*groups, "drop"])
    )
    keys = units.select(groups)
    if units.height == 0:
        raise ValueError("tau_curve: no outcome rows with budget < 1 to replay")
    run = keys.select(pl.struct(groups).rle_id()).to_series().to_numpy()
    starts = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
    ends = np.r_[starts[1:], units.height]
    drop = units["drop"].to_numpy()
    sums = ("_cap", "_dil", "_gain", "_kept", "_rows")
    cums = {c: np.concatenate([[0.0], np.cumsum(units[c].to_numpy())]) for c in sums}
    n_groups, n_taus = len(starts), len(taus)
    metrics = {c: np.empty((n_groups, n_taus)) for c in TAU_CURVE_COLUMNS if c != "tau"}
    with np.errstate(invalid="ignore", divide="ignore"):
        for g, (s, e) in enumerate(zip(starts, ends)):
            closed = np.searchsorted(drop[s:e], taus, side="left")  # inputs with D < τ
            tot = {c: v[e] - v[s] for c, v in cums.items()}
            part = {c: v[s + closed] - v[s] for c, v in cums.items()}
            n = e - s
            metrics["n_inputs"][g] = n
            metrics["p_open"][g] = 1.0 - closed / n
            metrics["delta"][g] = part["_gain"] / tot["_rows"]
            metrics["kept_kv"][g] = (tot["_kept"] - part["_kept"] + part["_rows"]) / tot["_rows"]
            metrics["fp_rate"][g] = (tot["_cap"] - part["_cap"]) / tot["_cap"] if tot["_cap"] else np.nan
            metrics["fn_rate"][g] = part["_dil"] / tot["_dil"] if tot["_dil"] else np.nan
    out = keys[starts].select(pl.all().repeat_by(n_taus).explode())
    cols = {"tau": np.tile(taus, n_groups)}
    cols.update({c: m.ravel() for c, m in metrics.items()})
    out = out.with_columns(
        *(pl.Series(c, cols[c]).cast(pl.Int64 if c == "n_inputs" else pl.Float64) for c in TAU_CURVE_COLUMNS)
    )
    return out
