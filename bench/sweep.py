"""Benchmark: the one-prefill sweep vs one prefill per arm (docs/PERFORMANCE.md "Collector").

One input of ~1K tokens on the default model (SmolLM2-135M-Instruct, CPU, fp32, sdpa). Every arm
decodes exactly ``MAX_NEW_TOKENS`` greedy tokens (EOS disabled so every variant does the same work).
Measured in the same run (single runs: the CPU is shared, so read ratios, not seconds):

- ``baseline``: one full-KV prefill (plain forward) + greedy decode of the full arm — one arm's cost.
- ``sweep_batched``: capture.prefill (window + H2O accumulation) → run_sweep over the full-KV arm and
  4 evictors × 8 budgets (33 arms), decoded in batches of ``MAX_BATCH`` — measured end to end.
- ``sweep_unbatched``: the same one prefill, arms decoded one at a time. EXTRAPOLATED: the decodes of
  ``N_TIMED`` arms (full + one per evictor, budgets spread over the grid) are timed one by one;
  their mean × 33 plus the measured capture prefill.
- ``per_arm``: a one-press-per-call pipeline, each arm paying its own prefill with the capture its
  evictor needs. EXTRAPOLATED from measured parts: 9 plain prefills (full, streamingllm),
  16 window-capture prefills (snapkv, pyramidkv), 8 accumulating prefills (h2o), plus 33 single-arm
  decodes at the measured mean.

Run: ``.venv/bin/python bench/sweep.py``; writes ``bench/results/sweep.json``.
"""

from __future__ import annotations

import platform
import statistics
import time
from types import SimpleNamespace

import numpy as np
import torch

from collectors import capture
from collectors.decode import decode_arms
from collectors.evictors import parse, parse_all
from collectors.model import load_model
from collectors.sweep import run_sweep
from pagestats.core import defaults

from _results import write_result

N_TOKENS_TARGET = 1024
MAX_NEW_TOKENS = 16
EVICTORS = ("snapkv", "h2o", "streamingllm", "pyramidkv")
BUDGETS = tuple(b for b in defaults.BUDGETS if b < 1.0)  # 8 budgets
MAX_BATCH = 16
N_TIMED = 5


class NoEosTokenizer:
    """Wraps the tokenizer with EOS hidden so every arm decodes MAX_NEW_TOKENS tokens."""

    eos_token_id = None

    def __init__(self, tokenizer):
        self._tok = tokenizer

    def decode(self, ids, skip_special_tokens=False):
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)


def make_prompt(tokenizer, rng: np.random.Generator) -> torch.Tensor:
    words = ["river", "lamp", "orange", "quiet", "signal", "harbor", "violet", "engine", "cedar", "mosaic"]
    lines, ids = [], []
    while len(ids) < N_TOKENS_TARGET:
        w = words[int(rng.integers(len(words)))]
        lines.append(f"One of the special magic numbers for {w} is: {int(rng.integers(10**6, 10**7))}.")
        ids = tokenizer(" ".join(lines) + " What is the special magic number for cedar?")["input_ids"]
    return torch.tensor([ids[-N_TOKENS_TARGET:]], dtype=torch.long)


def clock(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


@torch.no_grad()
def main() -> dict:
    torch.manual_seed(0)
    model, tokenizer, manifest = load_model()
    model.generation_config.eos_token_id = None
    tok = NoEosTokenizer(tokenizer)
    ids = make_prompt(tokenizer, np.random.default_rng(0))
    T = int(ids.shape[1])
    clock(lambda: model(input_ids=ids[:, :64]))  # warm-up

    # baseline: plain prefill + full-arm decode
    t_plain, out = clock(lambda: model(input_ids=ids, use_cache=True))
    plain = SimpleNamespace(input_ids=ids, past_key_values=out.cache, last_logits=out.logits[0, -1].float())
    t_full_decode, (base_tokens,) = clock(lambda: decode_arms(model, plain, [None], max_new_tokens=MAX_NEW_TOKENS))
    t_base = t_plain + t_full_decode

    # capture prefills of the per-arm pipeline
    t_window, _ = clock(lambda: capture.prefill(model, ids))
    t_acc, pf = clock(lambda: capture.prefill(model, ids, accumulate=True))

    # one-prefill sweep, batched, end to end
    def sweep():
        p = capture.prefill(model, ids, accumulate=True)
        return run_sweep(model, tok, p, evictors=parse_all(EVICTORS), budgets=BUDGETS,
                         max_new_tokens=MAX_NEW_TOKENS, batch_arms=True, max_batch=MAX_BATCH)

    t_batched, (full_b, arms_b) = clock(sweep)
    n_arms = 1 + len(arms_b)
    assert full_b.token_ids == base_tokens, "sweep full arm differs from plain prefill + decode"

    # single-arm decodes (unbatched sweep and per-arm pipeline)
    timed_arms = [("snapkv", 0.0625), ("h2o", 0.375), ("streamingllm", 0.625), ("pyramidkv", 0.875)]
    single_times = [t_full_decode]
    same_tokens = True
    for evictor, budget in timed_arms[: N_TIMED - 1]:
        kept = parse(evictor).kept(pf, budget)
        t, (tokens,) = clock(lambda: decode_arms(model, pf, [kept], max_new_tokens=MAX_NEW_TOKENS))
        single_times.append(t)
        batched = next(a for a in arms_b if (a.evictor, a.budget) == (evictor, budget))
        same_tokens &= batched.token_ids == tokens
    mean_single = statistics.mean(single_times)
    t_unbatched = t_acc + n_arms * mean_single
    n_plain = 1 + len(BUDGETS)  # full + streamingllm (no attention capture needed)
    n_window = 2 * len(BUDGETS)  # snapkv, pyramidkv
    n_acc = len(BUDGETS)  # h2o
    t_per_arm = n_plain * t_plain + n_window * t_window + n_acc * t_acc + n_arms * mean_single

    result = {
        "model": manifest["name"],
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "n_tokens": T,
        "max_new_tokens": MAX_NEW_TOKENS,
        "evictors": list(EVICTORS),
        "budgets": list(BUDGETS),
        "n_arms": n_arms,
        "max_batch": MAX_BATCH,
        "seconds": {
            "baseline_prefill_plus_decode": t_base,
            "plain_prefill": t_plain,
            "window_capture_prefill": t_window,
            "accumulating_capture_prefill": t_acc,
            "full_arm_decode": t_full_decode,
            "single_arm_decode_mean": mean_single,
            "single_arm_decodes": single_times,
            "sweep_batched_measured": t_batched,
            "sweep_unbatched_extrapolated": t_unbatched,
            "per_arm_pipeline_extrapolated": t_per_arm,
        },
        "ratios": {
            "per_arm_over_sweep_batched": t_per_arm / t_batched,
            "per_arm_over_sweep_unbatched": t_per_arm / t_unbatched,
            "sweep_batched_over_baseline": t_batched / t_base,
            "sweep_unbatched_over_baseline": t_unbatched / t_base,
        },
        "batched_equals_single_arm_tokens": bool(same_tokens),
        "notes": (
            f"single runs on a shared 2-core CPU (absolute seconds are noisy; ratios come from one run). "
            f"sweep_batched is measured end to end; sweep_unbatched and per_arm are extrapolated from "
            f"{len(single_times)} timed single-arm decodes (full, "
            + ", ".join(f"{e}@{b}" for e, b in timed_arms[: N_TIMED - 1])
            + f") and the measured prefills: per_arm = {n_plain} plain + {n_window} window-capture + "
            f"{n_acc} accumulating prefills + {n_arms} single-arm decodes."
        ),
    }
    write_result("sweep", result)
    return result


if __name__ == "__main__":
    main()
