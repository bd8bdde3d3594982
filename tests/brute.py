"""Brute-force references written in plain Python loops, shared by the what-if tests
(tests/replay/test_whatif.py, tests/io/test_logdb.py) so that no test file imports another."""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats.replay import ProfileSpec, gated_outcomes


def brute_whatif(logs, policy, profile=ProfileSpec()):
    """Row-by-row Python loop over gated outcomes; averages over head-pair draws."""
    out = gated_outcomes(logs, policy, profile)
    if "pair_draw" not in out.columns:
        out = out.with_columns(pl.lit(0).alias("pair_draw"))
    acc = {}
    for r in out.iter_rows(named=True):
        cell = (r["model"], r["context_length"], r["evictor"], r["task"], r["budget"])
        d = acc.setdefault(cell, {}).setdefault(r["pair_draw"], [])
        d.append(r)
    table = []
    for cell in sorted(acc):
        per_draw = []
        for rows in acc[cell].values():
            n = len(rows)
            full = sum(r["score_full"] for r in rows) / n
            plain = sum(r["score_plain"] for r in rows) / n
            gated = sum(r["score_gated"] for r in rows) / n
            per_draw.append([
                n, full, plain, gated, gated - plain,
                sum(r["score_plain"] < r["score_full"] for r in rows) / n,
                sum(r["score_gated"] < r["score_full"] for r in rows) / n,
                sum(r["gate_open"] for r in rows) / n,
                sum(r["n_kept_gated"] / r["n_tokens"] for r in rows) / n,
            ])  # fmt: skip
        table.append((*cell, *np.mean(per_draw, axis=0)))
    return table


def brute_ltt_tau(drops, harmed, harm_bound, delta):
    """Learn then Test's fixed-sequence threshold by loops (issue 43): candidates from the highest D down;
    reject while scipy's one-sided exact p-value of "harm > A" is at most δ; the last rejected τ, or None."""
    from scipy.stats import binomtest

    n, last = len(drops), None
    for tau in sorted(set(drops), reverse=True):
        x = sum(1 for d, h in zip(drops, harmed) if d >= tau and h)
        if binomtest(x, n, harm_bound, alternative="less").pvalue > delta:
            break
        last = tau
    return last
