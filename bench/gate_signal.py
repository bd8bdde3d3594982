"""Benchmark: the gate signal D from captured window attention, vectorised vs per-pair Python sets.

docs/PERFORMANCE.md: "D from captured window attention must not be the bottleneck: vectorised top-k and
pairwise intersections (one-hot matmul or equivalent), not per-pair Python sets."

One real prefill of the embedded default (SmolLM2-135M-Instruct, CPU, fp32) on a 2K-token prompt
gives ā (30 layers × 9 heads × T). Then, on that same tensor, D (k = 32) is computed by

* ``vectorised``: :func:`collectors.signals.agreement_profile` (per-(layer, head) top-k sets as an
  exact-tie mask from one ``numpy.partition``, all pair intersections from one one-hot batched
  matmul) + D;
* ``vectorised_full``: :func:`collectors.signals.gate_signals` as the collector calls it — D plus
  the stored top-128 lists and the ten other prefill signals;
* ``sets_numpy``: per (layer, head) top-k by a stable ``numpy.argsort`` (ties to the lower
  position), then one Python ``set`` intersection per head pair — the loop implementation;
* ``sets_python``: the same with the per-head top-k by Python ``sorted`` on lists (no NumPy).

All four must agree on D. Timings are medians of interleaved repeats (``time.perf_counter``), in
one process; the vectorised paths run single-threaded (as the collector runs them); ratios are
baseline / vectorised. Writes bench/results/gate_signal.json.

Run: ``.venv/bin/python bench/gate_signal.py [--tokens 2048] [--repeats 7]``
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import time

import numpy as np
import torch

from collectors import capture, model, signals
from pagestats.core import profile

from _results import write_result



def long_prompt_ids(tokenizer, n_tokens: int, seed: int = 0) -> torch.LongTensor:
    """A deterministic needle-in-a-haystack style chat prompt, cut to ``n_tokens`` tokens."""
    rng = np.random.default_rng(seed)
    facts = " ".join(
        f"Record {i}: the code of item {int(rng.integers(1000, 9999))} is {int(rng.integers(100000, 999999))}."
        for i in range(n_tokens // 8)
    )
    messages = [{"role": "user", "content": facts + " What is the code of the first item?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) < n_tokens:
        raise ValueError(f"prompt has only {len(ids)} tokens")
    # keep the end (question + generation prompt) so the window rows are the question's
    return torch.tensor([ids[:64] + ids[len(ids) - (n_tokens - 64):]])


def _drop_from_sets(sets_per_layer, k):
    agreement = []
    for sets in sets_per_layer:
        jaccards = []
        for i, j in itertools.combinations(range(len(sets)), 2):
            inter = len(sets[i] & sets[j])
            jaccards.append(inter / (2 * k - inter))
        agreement.append(sum(jaccards) / len(jaccards))
    return float(profile.drop_from_agreement(np.asarray(agreement, dtype=np.float32)))


def drop_sets_numpy(window_attention: np.ndarray, k: int = 32) -> float:
    """Baseline: per-(layer, head) stable argsort top-k, per-pair Python set intersections."""
    n_layers, n_heads, _ = window_attention.shape
    return _drop_from_sets(
        [
            [set(np.argsort(-window_attention[l, h], kind="stable")[:k].tolist()) for h in range(n_heads)]
            for l in range(n_layers)
        ],
        k,
    )


def drop_sets_python(window_attention: list, k: int = 32) -> float:
    """Baseline: pure Python top-k (sorted by (−score, position)) and per-pair set intersections."""
    return _drop_from_sets(
        [
            [set(sorted(range(len(row)), key=lambda t, row=row: (-row[t], t))[:k]) for row in layer]
            for layer in window_attention
        ],
        k,
    )


def drop_vectorised(window_attention: torch.Tensor, k: int = 32) -> float:
    """The collector's vectorised D path (top-k, one-hot matmul intersections, D)."""
    _, agreement, _ = signals.agreement_profile(window_attention, k)
    return float(profile.drop_from_agreement(agreement))


def timed_interleaved(functions: dict, repeats: int):
    """Run each function once per round, rounds interleaved so load drift hits all alike.

    Returns ({name: value}, {name: median ms}, {name: [ms, ...]})."""
    values, times = {}, {name: [] for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            start = time.perf_counter()
            values[name] = fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return values, {name: statistics.median(t) for name, t in times.items()}, times


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    lm, tokenizer, manifest = model.load_model()
    ids = long_prompt_ids(tokenizer, args.tokens)
    pre = capture.prefill(lm, ids)
    att_t = pre.window_attention
    att_np = att_t.numpy()

    att_list = att_t.tolist()
    values, ms, ms_all = timed_interleaved(
        {
            "vectorised": lambda: drop_vectorised(att_t),
            "vectorised_full": lambda: signals.gate_signals(att_t),
            "sets_numpy": lambda: drop_sets_numpy(att_np),
            "sets_python": lambda: drop_sets_python(att_list),
        },
        args.repeats,
    )
    drops = {name: (v.drop if isinstance(v, signals.GateSignals) else v) for name, v in values.items()}
    if not all(np.isclose(d, drops["vectorised"], rtol=0, atol=1e-6) for d in drops.values()):
        raise AssertionError(f"the implementations disagree on D: {drops}")

    result = {
        "benchmark": "gate_signal",
        "what": "D (k=32) from one real prefill's window attention: vectorised (collectors.signals) vs "
        "per-pair Python-set loops; vectorised_full also stores top-128 and computes 10 other signals",
        "load_average_at_start": os.getloadavg()[0],
        "model": manifest["name"],
        "model_sha256": manifest["sha256"],
        "n_tokens": int(ids.shape[1]),
        "shape_LHT": list(att_t.shape),
        "k": 32,
        "repeats": args.repeats,
        "prefill_ms": pre.prefill_ms,
        "ms_median": ms,
        "ms_all": ms_all,
        "speedup_vs_sets_numpy": ms["sets_numpy"] / ms["vectorised"],
        "speedup_vs_sets_python": ms["sets_python"] / ms["vectorised"],
        "speedup_full_vs_sets_numpy": ms["sets_numpy"] / ms["vectorised_full"],
        "speedup_full_vs_sets_python": ms["sets_python"] / ms["vectorised_full"],
        "target_speedup": 50.0,
        "drops": drops,
        "gate_full_ms_over_prefill_ms": ms["vectorised_full"] / pre.prefill_ms,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    write_result("gate_signal", result, {k: v for k, v in result.items() if k != "ms_all"})
    return result


if __name__ == "__main__":
    main()
