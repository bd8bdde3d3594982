"""Benchmark: kvpress-scored arms in the one-prefill sweep vs kvpress's pipeline once per ratio.

Runs in the kvpress environment (``make kvpress-env``; ``.venv-kvpress/bin/python bench/kvpress_sweep.py``)
on the default model (SmolLM2-135M-Instruct, CPU, fp32, sdpa), query-agnostic as kvpress is: one
RULER niah_single_1 input of ``--tokens`` tokens (default ``N_TOKENS``) split at its question. Every arm decodes exactly
``MAX_NEW_TOKENS`` greedy tokens (EOS disabled in both paths so they do the same work). Measured in the
same run (single runs on a shared CPU: read the ratio, not the seconds):

- ``kvpress_pipeline``: kvpress's ``KVPressTextGenerationPipeline`` forward (context prefilled under the
  press, then the question and greedy decoding), once per budget with ``compression_ratio = 1 − b``,
  plus once without a press for the full arm — what a user runs to get the same arms.
- ``one_prefill_sweep``: ``capture.prefill`` (window capture + the press's ``score()`` per layer) and
  ``run_sweep`` over the full arm and the same budgets, decoded in batches.

Both paths see the same token ids; the JSON also records how many arms decoded the same tokens.
Writes ``bench/results/kvpress_sweep.json`` (with the load average before and after; an earlier result
is kept, whole, under ``earlier_runs``, newest first).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

from collectors import capture
from collectors.evictors import parse
from collectors.evictors.presses import version
from collectors import tasks as T
from collectors.model import load_model
from collectors.sweep import run_sweep
from pagestats.core import defaults

from _results import RESULTS, earlier_runs, write_result
from sweep import NoEosTokenizer, clock

N_TOKENS = 2048
MAX_NEW_TOKENS = 16
SPEC = "kvpress:SnapKVPress:window_size=32"
BUDGETS = tuple(b for b in defaults.BUDGETS if b < 1.0)  # 8 budgets


@torch.no_grad()
def main(n_tokens: int = N_TOKENS) -> dict:
    from transformers import pipeline

    started_at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_before = list(os.getloadavg())
    model, tokenizer, manifest = load_model()
    model.generation_config.eos_token_id = None
    task_input = T.make_input("niah_single_1", tokenizer=tokenizer, context_length=n_tokens, input_id=0, draw=0)
    ids, n_context = T.split_prompt(tokenizer, task_input)
    context = torch.tensor([ids[:n_context]])
    question = torch.tensor([ids[n_context:]])
    spec = parse(SPEC)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    model(input_ids=context[:, :64])  # warm-up

    def kvpress_arm(budget):
        press = None if budget == 1.0 else spec.make(budget)
        (text,) = pipe._forward({"context_ids": context, "questions_ids": [question]},
                                max_new_tokens=MAX_NEW_TOKENS, press=press)
        return text

    kvpress_seconds, kvpress_texts = {}, {}
    for budget in (1.0, *BUDGETS):
        kvpress_seconds[budget], kvpress_texts[budget] = clock(lambda: kvpress_arm(budget))

    def sweep():
        pf = capture.prefill(model, context, presses=[spec])
        return run_sweep(model, NoEosTokenizer(tokenizer), pf, evictors=(spec,), budgets=BUDGETS,
                         max_new_tokens=MAX_NEW_TOKENS, question_ids=question)

    t_sweep, (full, arms) = clock(sweep)
    ours = {1.0: full.text, **{arm.budget: arm.text for arm in arms}}
    same = sum(ours[b] == kvpress_texts[b] for b in ours)
    t_kvpress = sum(kvpress_seconds.values())
    result = {
        "started_at": started_at,
        "loadavg_before": load_before,
        "loadavg_after": list(os.getloadavg()),
        "model": manifest["name"],
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "versions": {"kvpress": version(), "transformers": __import__("transformers").__version__,
                     "torch": torch.__version__},
        "evictor": SPEC,
        "n_tokens": len(ids),
        "n_context": n_context,
        "max_new_tokens": MAX_NEW_TOKENS,
        "budgets": [1.0, *BUDGETS],
        "seconds": {
            "kvpress_pipeline_total": t_kvpress,
            "kvpress_pipeline_per_arm": {str(b): s for b, s in kvpress_seconds.items()},
            "one_prefill_sweep_total": t_sweep,
        },
        "speedup_one_prefill_vs_kvpress_per_ratio": t_kvpress / t_sweep,
        "arms_with_same_text_as_kvpress": f"{same}/{len(ours)}",
    }
    earlier = RESULTS / "kvpress_sweep.json"
    if earlier.exists():  # keep every earlier measurement, whole
        result["earlier_runs"] = earlier_runs(json.loads(earlier.read_text()))
    write_result("kvpress_sweep", result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=N_TOKENS, help=f"prompt length (default {N_TOKENS})")
    main(parser.parse_args().tokens)
