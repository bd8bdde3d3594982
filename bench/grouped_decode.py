"""Grouped-query decode steps against transformers' stock ``sdpa`` kernel, in one run.

One decode step of a padded batch of arms, per layer: the stock kernel
(``transformers.integrations.sdpa_attention.sdpa_attention_forward``, which copies every KV
head's cache once per query head with ``repeat_kv`` whenever it gets a mask) against
:func:`collectors.hf.grouped_sdpa_forward` (the G query heads of a KV head as G rows of
one SDPA call), at SmolLM2-135M's shapes (9 query heads, 3 KV heads, head_dim 64), batch 16 and
the cache lengths of the shipped runs. Both on one thread, interleaved, the median of
``--repeats`` timings of ``--calls`` calls each; the largest difference of their outputs is
recorded beside the ratio.

With ``--real``, also end to end on the embedded SmolLM2-135M (no download): one prefill of a
1,024-token random prompt, then 16 evicted arms (snapkv and h2o at 8 budgets) decoded for 12
tokens by :func:`collectors.decode.decode_arms`, grouped, stock, grouped again; the CPU time of
each and whether the three give the same tokens.

Usage: ``python bench/grouped_decode.py [--repeats 5] [--calls 20] [--real]``; writes
``bench/results/grouped_decode.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _results import write_result  # noqa: E402

from collectors.hf import grouped_sdpa_forward  # noqa: E402


class _Attention(torch.nn.Module):
    num_key_value_groups, is_causal = 3, True


def _time(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    from transformers import __version__ as transformers_version
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--real", action="store_true", help="also decode_arms on the embedded SmolLM2 at 1,024 tokens")
    args = ap.parse_args()
    torch.set_num_threads(1)
    module = _Attention().eval()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n_keys in (512 + 16, 1024 + 16):  # the prompt plus a few generated tokens
        b, h, h_kv, d = 16, 9, 3, 64
        q = torch.randn(b, h, 1, d, generator=gen)
        k, v = torch.randn(b, h_kv, n_keys, d, generator=gen), torch.randn(b, h_kv, n_keys, d, generator=gen)
        mask = torch.ones(b, 1, 1, n_keys, dtype=torch.bool)
        for row in range(b):  # left padding: the arms of a batch keep different counts
            mask[row, :, :, : row * n_keys // (2 * b)] = False

        def stock():
            return sdpa_attention_forward(module, q, k, v, mask, scaling=d**-0.5)[0]

        def grouped():
            return grouped_sdpa_forward(module, q, k, v, mask, scaling=d**-0.5)[0]

        with torch.no_grad():
            diff = float((stock() - grouped()).abs().max())
            times = {"stock": [], "grouped": []}
            for _ in range(args.repeats):
                times["stock"].append(_time(stock, args.calls))
                times["grouped"].append(_time(grouped, args.calls))
        med = {k: statistics.median(t) for k, t in times.items()}
        rows.append({"batch": b, "query_heads": h, "kv_heads": h_kv, "head_dim": d, "cached_tokens": n_keys,
                     "stock_ms_per_layer_step": round(med["stock"], 3),
                     "grouped_ms_per_layer_step": round(med["grouped"], 3),
                     "stock_over_grouped": round(med["stock"] / med["grouped"], 2), "max_abs_diff": diff})
    result = {"benchmark": "grouped_decode", "torch": torch.__version__, "transformers": transformers_version,
              "threads": 1, "loadavg": list(os.getloadavg()), "repeats": args.repeats, "calls": args.calls,
              "rows": rows}
    if args.real:
        result["smollm2_decode_arms"] = _real()
    write_result("grouped_decode", result)


def _real() -> dict:
    """decode_arms on SmolLM2 at 1,024 tokens: grouped, stock (grouped_decode switched off), grouped."""
    import contextlib

    from collectors import capture, decode
    from collectors.evictors import parse
    from collectors.model import load_model

    model, _, info = load_model(None)
    ids = torch.randint(100, 20000, (1, 1024), generator=torch.Generator().manual_seed(0))
    pf = capture.prefill(model, ids, accumulate=True)
    kept = [parse(e).kept(pf, b, n_sink=4, n_recent=32) for e in ("snapkv", "h2o")
            for b in (0.0625, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875)]
    out = {"model": info["name"], "decode_attn_impl": info["decode_attn_impl"], "prompt_tokens": 1024,
           "arms": len(kept), "new_tokens": 12}
    tokens, grouped = {}, decode.grouped_decode
    for label in ("grouped", "stock", "grouped_again"):
        decode.grouped_decode = (lambda m: contextlib.nullcontext()) if label == "stock" else grouped
        try:
            wall, cpu = time.perf_counter(), time.process_time()
            tokens[label] = decode.decode_arms(model, pf, kept, max_new_tokens=12)
            out[f"{label}_cpu_s"] = round(time.process_time() - cpu, 2)
            out[f"{label}_wall_s"] = round(time.perf_counter() - wall, 2)
        finally:
            decode.grouped_decode = grouped
    out["same_tokens"] = tokens["grouped"] == tokens["stock"] == tokens["grouped_again"]
    out["stock_over_grouped_cpu"] = round(out["stock_cpu_s"] / out["grouped_cpu_s"], 2)
    return out


if __name__ == "__main__":
    main()
