"""Cost of deploying the gate (issue 24): ``model.generate`` under GatedPress, under its base press
alone, and with no press, on SmolLM2 (collectors.model's embedded model) on the CPU.

Each of the three runs in its own process (so ``ru_maxrss`` is its own peak): load the model, build a
niah_single_1 prompt of ``--tokens`` tokens, warm up, then time one greedy ``generate`` of
``MAX_NEW_TOKENS`` tokens and read the peak RSS before and after it. GatedPress runs at τ = −1 (the
gate opens), its most expensive case: every layer's compressed K/V is held beside the full cache
until the last layer's decision (collectors.deploy), plus the capture's w × T window attention per
layer and D. Writes ``bench/results/deploy.json`` (an earlier result is kept under ``earlier_runs``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

N_TOKENS = 2048
MAX_NEW_TOKENS = 16
RATIO = 0.5
ARMS = ("none", "base", "gated")


def _arm(arm: str, n_tokens: int) -> dict:
    import torch
    from kvpress import SnapKVPress

    from collectors import tasks as T
    from collectors.deploy import GatedPress
    from collectors.model import load_model

    model, tokenizer, manifest = load_model()
    model.generation_config.eos_token_id = None  # every arm decodes MAX_NEW_TOKENS tokens
    task_input = T.make_input("niah_single_1", tokenizer=tokenizer, context_length=n_tokens, input_id=0, draw=0)
    ids = torch.tensor([T.tokenize_prompt(tokenizer, task_input.prompt)])
    press = {"none": None, "base": SnapKVPress(compression_ratio=RATIO),
             "gated": GatedPress(SnapKVPress(compression_ratio=RATIO), tau=-1.0)}[arm]
    with torch.no_grad():
        model.generate(ids[:, :64], do_sample=False, max_new_tokens=2)  # warm-up
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        if press is None:
            out = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS)
        else:
            with press(model):
                out = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS)
        seconds = time.perf_counter() - start
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {"arm": arm, "seconds": seconds, "peak_rss_mib_before": rss_before / 1024,
              "peak_rss_mib_after": rss_after / 1024, "peak_rss_increase_mib": (rss_after - rss_before) / 1024,
              "n_tokens": int(ids.shape[1]), "tokens": out[0, ids.shape[1]:].tolist(), "model": manifest["name"],
              "torch_threads": torch.get_num_threads()}
    if arm == "gated":
        result["drop"] = press.last.drop
        result["realized_compression_ratio"] = press.realized_compression_ratio
    return result


def main(n_tokens: int = N_TOKENS) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    from _results import RESULTS, earlier_runs, write_result

    started_at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_before = list(os.getloadavg())
    arms = {}
    for arm in ARMS:
        out = subprocess.run([sys.executable, __file__, "--arm", arm, "--tokens", str(n_tokens)], check=True,
                             capture_output=True, text=True).stdout
        arms[arm] = json.loads(out.strip().splitlines()[-1])
    t = {a: arms[a]["seconds"] for a in ARMS}
    m = {a: arms[a]["peak_rss_mib_after"] for a in ARMS}
    result = {
        "started_at": started_at, "loadavg_before": load_before, "loadavg_after": list(os.getloadavg()),
        "model": arms["none"]["model"], "device": "cpu", "n_tokens": arms["none"]["n_tokens"],
        "max_new_tokens": MAX_NEW_TOKENS, "base_press": f"SnapKVPress(compression_ratio={RATIO})", "gate": "tau=-1 (open)",
        "arms": arms,
        "ratios": {"time_gated_over_base": t["gated"] / t["base"], "time_gated_over_none": t["gated"] / t["none"],
                   "time_base_over_none": t["base"] / t["none"],
                   "peak_rss_gated_over_base": m["gated"] / m["base"], "peak_rss_gated_over_none": m["gated"] / m["none"]},
        "gated_tokens_equal_base": arms["gated"]["tokens"] == arms["base"]["tokens"],
    }
    earlier = RESULTS / "deploy.json"
    if earlier.exists():
        result["earlier_runs"] = earlier_runs(json.loads(earlier.read_text()))
    write_result("deploy", result, shown={k: result[k] for k in ("n_tokens", "ratios", "gated_tokens_equal_base")})
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=N_TOKENS, help=f"prompt length (default {N_TOKENS})")
    parser.add_argument("--arm", choices=ARMS, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm is not None:
        print(json.dumps(_arm(args.arm, args.tokens)))
    else:
        main(args.tokens)
