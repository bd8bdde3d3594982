"""Benchmark: time and peak memory of :func:`pagestats.testing.synthetic_logs` at scale.

Scenarios (each in its own subprocess so its peak RSS is its own):

- ``paper_fast``: the paper's matrix size — the four matrix models (real L, H), RULER 4K, 4
  evictors, 4 tasks (MK3, VT, FWE, QA_1) × 100 inputs, 9 budgets — with text, no top-k;
  then written (2 shards per table).
- ``paper_topk``: the same with top-k_max = 64 index lists drawn and the Jaccards derived
  from them.
- ``million``: 1,000,000 inputs (8 tasks × 125,000, one model L=12, H=4) × 9 budgets × 1
  evictor, fast path, no text; then written.

Ratios against baselines timed in the same run:

- ``per_input_loop``: a naive generator that draws each input's top-k lists in a Python loop
  and calls :func:`pagestats.core.profile.agreement_from_topk` per input (timed on a subset of the
  paper_topk shape, reported per input); ratio = loop time per input / vectorised time per
  input of ``paper_topk``.
- ``uniform_fill``: filling the 1M-input ``pair_jaccard``-sized array with ``rng.random`` (the
  irreducible cost of touching that memory once); ratio = ``million`` generation time / it.

Run: ``.venv/bin/python bench/synthetic_scale.py``; writes ``bench/results/synthetic_scale.json``.
"""

from __future__ import annotations

import json
import pathlib
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from _results import write_result

PAPER_TASKS = ("niah_multikey_3", "vt", "fwe", "qa_1")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _dir_mb(path: pathlib.Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def scenario(name: str) -> dict:
    from pagestats import testing

    rss_import = _rss_mb()
    if name in ("paper_fast", "paper_topk"):
        kwargs = dict(
            models=testing.PAPER_MODELS,
            context_lengths=(4096,),
            tasks=PAPER_TASKS,
            n_inputs=100,
            with_topk=name == "paper_topk",
            k_max=64,
            with_text=True,
            seed=0,
        )
    elif name == "million":
        kwargs = dict(
            models=(testing.ModelSpec("synthetic-12L4H", 12, 4),),
            context_lengths=(4096,),
            evictors=("snapkv",),
            tasks=testing.SYNTHETIC_TASKS,
            n_inputs=125_000,
            with_topk=False,
            with_text=False,
            seed=0,
        )
    else:
        raise ValueError(name)
    t0 = time.perf_counter()
    logs = testing.synthetic_logs(**kwargs)
    gen_s = time.perf_counter() - t0
    rss_gen = _rss_mb()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        runs = logs.write(tmp, n_shards=2)
        write_s = time.perf_counter() - t0
        disk_mb = _dir_mb(pathlib.Path(tmp))
    return {
        "scenario": name,
        "n_runs": len(runs),
        "n_inputs": logs.inputs.height,
        "n_outcomes": logs.outcomes.height,
        "n_topk_rows": 0 if logs.topk is None else logs.topk.height,
        "generate_s": gen_s,
        "write_s": write_s,
        "disk_mb": disk_mb,
        "peak_rss_mb_after_import": rss_import,
        "peak_rss_mb_after_generate": rss_gen,
        "peak_rss_mb": _rss_mb(),
    }


def baseline_per_input_loop(n_inputs: int = 10) -> dict:
    """Naive per-input generation of one model's profiles (Qwen2.5-14B shape, the largest)."""
    from pagestats.core import defaults, profile

    L, H, k_max, T = 48, 40, 64, 4096
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(n_inputs):
        topk = np.stack([np.stack([rng.choice(T, size=k_max, replace=False) for _ in range(H)]) for _ in range(L)])
        agreement, _ = profile.agreement_from_topk(topk, k=defaults.TOP_K, n_positions=T)
        profile.drop_from_agreement(agreement.astype(np.float32))
    per_input = (time.perf_counter() - t0) / n_inputs
    return {"n_inputs_timed": n_inputs, "shape": [L, H, k_max, T], "s_per_input": per_input}


def baseline_uniform_fill() -> dict:
    n, L, P = 1_000_000, 12, 6
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    x = rng.random((n, L * P), dtype=np.float32)
    s = time.perf_counter() - t0
    del x
    return {"shape": [n, L * P], "s": s}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--scenario":
        print(json.dumps(scenario(sys.argv[2])))
        return
    results = {}
    for name in ("paper_fast", "paper_topk", "million"):
        proc = subprocess.run(
            [sys.executable, __file__, "--scenario", name], check=True, capture_output=True, text=True
        )
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(name, json.dumps(results[name]), flush=True)
    loop = baseline_per_input_loop()
    fill = baseline_uniform_fill()
    topk_per_input = results["paper_topk"]["generate_s"] / results["paper_topk"]["n_inputs"]
    # the loop baseline uses only the largest model's shape, so this ratio understates the speed-up
    out = {
        "benchmark": "synthetic_scale",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "scenarios": results,
        "baselines": {"per_input_loop": loop, "uniform_fill": fill},
        "ratios": {
            "per_input_loop_over_vectorised_topk_per_input": loop["s_per_input"] / topk_per_input,
            "million_generate_over_uniform_fill": results["million"]["generate_s"] / fill["s"],
            "paper_topk_over_paper_fast_generate": results["paper_topk"]["generate_s"]
            / results["paper_fast"]["generate_s"],
        },
        "notes": "each scenario runs in its own process; peak_rss_mb is that process's ru_maxrss. "
        "per_input_loop uses the Qwen2.5-14B shape (48 layers, 40 heads), the most expensive of the "
        "four paper models, against the mean vectorised cost over all four.",
    }
    write_result("synthetic_scale", out, out["ratios"])


if __name__ == "__main__":
    main()
