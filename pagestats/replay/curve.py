"""The fixed-τ replay at many thresholds in one pass: the threshold-sensitivity curve
(App. A.3.4 "Threshold sensitivity", Fig. 6)."""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats import defaults
from pagestats.replay.gate import _decision_frame, _outcome_rows
from pagestats.replay.spec import ProfileSpec
from pagestats.schema import INPUT_KEY

TAU_CURVE_COLUMNS = ("tau", "n_inputs", "p_open", "delta", "fp_rate", "fn_rate", "kept_kv")


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
