"""Benchmark: a 1,000-threshold τ curve in one pass vs independent replays (docs/PERFORMANCE.md).

Paper-scale synthetic logs: 16 cells (4 models × 4 evictors, one context) × 400 inputs per
(model, context) × 9 budgets, from :func:`pagestats.testing.synthetic_logs`. Three timings
in one run, each the best of ``REPEATS``:

- ``curve``: :func:`pagestats.replay.tau_curve` at 1,000 thresholds;
- ``single``: one independent fixed-τ replay of the same metrics (``gated_outcomes`` +
  group-by of Δ, p_open, kept-KV over b < 1), the baseline unit;
- ``loop``: ``N_LOOP`` independent replays timed and extrapolated linearly to 1,000
  (the loop is that many identical single replays, so the extrapolation is exact up to noise).

Targets: curve ≥ 100× faster than 1,000 replays, and ≤ 3× one replay. Also checks that the
curve equals the loop's numbers at the looped thresholds. Writes bench/results/tau_curve.json.

Run: ``.venv/bin/python bench/tau_curve.py``
"""

from __future__ import annotations

import platform
import time

import numpy as np
import polars as pl

from pagestats.replay import FixedTau, ProfileSpec, gated_outcomes, tau_curve
from pagestats.testing import PAPER_SCALE, synthetic_logs

from _results import write_result

N_TAUS = 1000
N_LOOP = 50
REPEATS = 3
BY = ["model", "context_length", "evictor"]


def paper_scale_logs():
    return synthetic_logs(**PAPER_SCALE, with_topk=False, with_text=False)  # a pagestats.io.Logs


def single_replay(logs, tau: float) -> pl.DataFrame:
    out = gated_outcomes(logs, FixedTau(tau)).filter(pl.col("budget") < 1)
    return out.group_by(BY).agg(
        (pl.col("score_gated") - pl.col("score_plain")).mean().alias("delta"),
        (pl.col("n_kept_gated") / pl.col("n_tokens")).mean().alias("kept_kv"),
        pl.col("gate_open").mean().alias("p_open"),
    )


def best_of(fn, repeats=REPEATS):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def main() -> dict:
    t0 = time.perf_counter()
    logs = paper_scale_logs()
    gen_s = time.perf_counter() - t0
    drops = logs.inputs["drop"].to_numpy()
    taus = np.linspace(drops.min() - 0.01, drops.max() + 0.01, N_TAUS)
    cells = logs.outcomes.join(logs.inputs.select("run_id", "model"), on="run_id").select("model", "evictor").n_unique()

    curve_s, curve = best_of(lambda: tau_curve(logs, taus, profile=ProfileSpec(), by=BY))
    single_s, _ = best_of(lambda: single_replay(logs, float(taus[N_TAUS // 2])))
    idx = np.linspace(0, N_TAUS - 1, N_LOOP).astype(int)
    t0 = time.perf_counter()
    loop = [single_replay(logs, float(taus[i])).with_columns(pl.lit(float(taus[i])).alias("tau")) for i in idx]
    loop_s = (time.perf_counter() - t0) * N_TAUS / N_LOOP

    ref = pl.concat(loop).sort([*BY, "tau"])
    got = curve.filter(pl.col("tau").is_in(taus[idx].tolist())).sort([*BY, "tau"])
    max_err = max(float(np.max(np.abs(got[c].to_numpy() - ref[c].to_numpy()))) for c in ("delta", "kept_kv", "p_open"))

    result = {
        "benchmark": "tau_curve",
        "scale": {
            "cells": cells,
            "inputs": logs.inputs.height,
            "outcome_rows": logs.outcomes.height,
            "budgets": logs.outcomes["budget"].n_unique(),
            "thresholds": N_TAUS,
        },
        "seconds": {
            "generate_logs": round(gen_s, 3),
            "curve_1000": round(curve_s, 4),
            "single_replay": round(single_s, 4),
            "loop_1000_extrapolated": round(loop_s, 2),
            "loop_timed_replays": N_LOOP,
        },
        "ratios": {
            "speedup_vs_1000_replays": round(loop_s / curve_s, 1),
            "speedup_vs_1000_x_best_single": round(N_TAUS * single_s / curve_s, 1),
            "curve_over_single_replay": round(curve_s / single_s, 2),
        },
        "targets": {"speedup_vs_1000_replays": ">= 100", "curve_over_single_replay": "<= 3"},
        "met": {
            "speedup": min(loop_s, N_TAUS * single_s) / curve_s >= 100,
            "single": curve_s / single_s <= 3,
        },
        "max_abs_diff_curve_vs_loop": max_err,
        "notes": f"loop time = {N_LOOP} timed independent replays × {N_TAUS}/{N_LOOP}; best of {REPEATS} for curve/single",
        "machine": {"python": platform.python_version(), "polars": pl.__version__, "numpy": np.__version__},
    }
    write_result("tau_curve", result)
    return result


if __name__ == "__main__":
    main()
