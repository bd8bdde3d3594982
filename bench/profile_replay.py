"""Benchmark: profile replays from stored logs (App. A.3.1, A.3.5; docs/DEFINITIONS.md, docs/PERFORMANCE.md).

1. Head-pair subsampling (Table 9): 10 fractions × 20 draws over 10,000 inputs
   (one 28-layer, 12-head model, 66 pairs/layer), via ``profile_drop`` with
   ``ProfileSpec(pairs_fraction=f, pair_draws=20)``. Baseline in the same run: a per-input,
   per-draw NumPy loop (mean of the kept pairs, then D) timed on ``N_BASE_PAIRS`` inputs and
   extrapolated linearly.
2. k-sweep (App. A.3.1): k ∈ {8, 16, 32, 64, 128} over 1,000 inputs from stored top-128
   lists, via ``ProfileSpec(k=k)``. Baseline: the collector's per-input call
   :func:`pagestats.core.profile.agreement_from_topk` (one-hot over the T positions) timed on
   ``N_BASE_K`` inputs per k and extrapolated.

Reports seconds, rows/s (input × draw rows of D per second; for k, inputs/s and pair
Jaccards/s, each input being 28 layers × 66 pairs of |A∩B| of two k-sets) and the speed-up over
the baseline; checks the vectorised results equal the baseline's. Writes
bench/results/profile_replay.json.

Run: ``.venv/bin/python bench/profile_replay.py``
"""

from __future__ import annotations

import platform
import time

import numpy as np
import polars as pl

from pagestats.core.profile import agreement_from_topk, drop_from_agreement
from pagestats.replay import ProfileSpec, pair_subsets, profile_drop
from pagestats.testing import ModelSpec, synthetic_logs

from _results import write_result

MODEL = ModelSpec("synthetic-28L12H", 28, 12)
FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
DRAWS = 20
KS = (8, 16, 32, 64, 128)
N_BASE_PAIRS = 200
N_BASE_K = 20
KEY = ["run_id", "task", "input_id"]


def _logs(n_per_task: int, with_topk: bool, k_max: int = 128):
    s = synthetic_logs(
        models=[MODEL],
        context_lengths=(4096,),
        tasks=("niah_multikey_3", "vt", "fwe", "niah_single_1"),
        n_inputs=n_per_task,
        with_topk=with_topk,
        k_max=k_max,
        with_text=False,
        seed=1,
    )
    return s  # a pagestats.io.Logs


def bench_pairs() -> dict:
    t0 = time.perf_counter()
    logs = _logs(2500, with_topk=False)
    gen_s = time.perf_counter() - t0
    n = logs.inputs.height
    t0 = time.perf_counter()
    results = {f: profile_drop(logs, ProfileSpec(pairs_fraction=f, pair_draws=DRAWS, seed=0)) for f in FRACTIONS}
    fast_s = time.perf_counter() - t0
    rows = sum(r.height for r in results.values())

    # baseline: per input, per draw, NumPy on that input's stored pair Jaccards
    sub = logs.inputs.sort(KEY).head(N_BASE_PAIRS)
    n_layers = MODEL.n_layers
    t0 = time.perf_counter()
    base = {}
    for f in FRACTIONS:
        subsets = pair_subsets(66, ProfileSpec(pairs_fraction=f, pair_draws=DRAWS), MODEL.name)
        vals = []
        for pj in sub["pair_jaccard"].to_list():
            jac = np.asarray(pj, dtype=np.float64).reshape(n_layers, -1)
            vals.extend(float(drop_from_agreement(jac[:, chosen].mean(axis=1))) for chosen in subsets)
        base[f] = np.array(vals)
    base_s = (time.perf_counter() - t0) * n / N_BASE_PAIRS
    err = max(
        float(np.max(np.abs(results[f].head(N_BASE_PAIRS * DRAWS)["drop"].to_numpy() - base[f]))) for f in FRACTIONS
    )
    return {
        "inputs": n,
        "fractions": list(FRACTIONS),
        "draws": DRAWS,
        "rows": rows,
        "seconds": round(fast_s, 3),
        "rows_per_s": round(rows / fast_s),
        "baseline_seconds_extrapolated": round(base_s, 2),
        "baseline_timed_inputs": N_BASE_PAIRS,
        "speedup": round(base_s / fast_s, 1),
        "max_abs_diff_vs_baseline": err,
        "generate_logs_seconds": round(gen_s, 2),
    }


def bench_k() -> dict:
    t0 = time.perf_counter()
    logs = _logs(250, with_topk=True)
    gen_s = time.perf_counter() - t0
    n = logs.inputs.height
    out = {"inputs": n, "ks": list(KS), "per_k": {}, "generate_logs_seconds": round(gen_s, 2)}
    topk = logs.topk.sort([*KEY, "layer", "head"])
    first = topk.head(N_BASE_K * MODEL.n_layers * MODEL.n_heads)
    arrays = first["indices"].list.to_array(128).to_numpy().reshape(N_BASE_K, MODEL.n_layers, MODEL.n_heads, 128)
    n_tokens = logs.inputs.sort(KEY).head(N_BASE_K)["n_tokens"].to_numpy()
    total_fast = total_base = 0.0
    for k in KS:
        t0 = time.perf_counter()
        fast = profile_drop(logs, ProfileSpec(k=k))
        fast_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        base = [
            float(drop_from_agreement(agreement_from_topk(a, k, n_positions=int(t))[0].astype(np.float32)))
            for a, t in zip(arrays, n_tokens)
        ]
        base_s = (time.perf_counter() - t0) * n / N_BASE_K
        same = bool(np.array_equal(fast.head(N_BASE_K)["drop"].to_numpy(), np.array(base)))
        total_fast += fast_s
        total_base += base_s
        out["per_k"][str(k)] = {
            "seconds": round(fast_s, 3),
            "inputs_per_s": round(n / fast_s),
            "pair_jaccards_per_s": round(n * MODEL.n_layers * 66 / fast_s),
            "baseline_seconds_extrapolated": round(base_s, 2),
            "speedup": round(base_s / fast_s, 1),
            "bit_exact_vs_baseline": same,
        }
    out.update(seconds=round(total_fast, 3), baseline_seconds_extrapolated=round(total_base, 2),
               speedup=round(total_base / total_fast, 1), baseline_timed_inputs=N_BASE_K)  # fmt: skip
    return out


def main() -> dict:
    result = {
        "benchmark": "profile_replay",
        "pairs": bench_pairs(),
        "k_sweep": bench_k(),
        "notes": "baselines are per-input NumPy loops timed on a prefix of the inputs and extrapolated linearly",
        "machine": {"python": platform.python_version(), "polars": pl.__version__, "numpy": np.__version__},
    }
    write_result("profile_replay", result)
    return result


if __name__ == "__main__":
    main()
