"""One prepared GPU check: what D and the one-prefill sweep cost on real model shapes.

Random-weight models are built from configs in code (no download), shaped like Qwen2.5-1.5B,
Mistral-7B-v0.3 and an 8-layer slice of Llama-3.1-70B, in bfloat16 with the stock sdpa kernel.
The script measures, in one run on one GPU (< 8 minutes on an H200), writing one JSON file:

1. **D's cost** at 4K, 16K and 32K prompt tokens: the window capture's extra prefill time
   (:func:`collectors.capture.prefill` minus a stock prefill, medians of ``--repeats``) plus the gate
   signals (:func:`collectors.signals.gate_signals`: top-k sets, a_ℓ, D). The paper's gate costs
   17 ms on Qwen2.5-1.5B and 89 ms on Mistral-7B at 4K on an A100 (§5 cost model, Table 26).
2. **Extra GPU memory** of the capture against eager ``output_attentions=True`` at the same sizes:
   peak allocated memory of each forward minus that of the stock prefill. Eager runs only where its
   predicted output (L·H·T² bf16 probabilities) fits in free memory; elsewhere the prediction is
   recorded (the paper calls a 70B probe at 32K "not viable", App. A.6.5).
3. **The 33-arm sweep** (4 evictors × 8 budgets + full KV, :func:`collectors.sweep.run_sweep`)
   at 4K, 128 decode steps (Table 26's setting), as a multiple of one full-KV prefill plus decode
   (target ≤ 1.5× on a GPU), with the CLI's ``max_batch`` of 16 and with all 33 arms in one batch.

EOS is disabled, so every arm decodes exactly 128 tokens. An out-of-memory error in the eager or
sweep measurements is recorded in place of the number; the JSON is rewritten after every model, so a
run cut short keeps what it measured (``"finished": false``). Only torch, transformers, numpy and the
collector's capture, signals and sweep are imported (the GPU image has no duckdb or polars).

Run: ``python bench/gpu.py`` (writes bench/results/gpu.json) or ``python bench/gpu.py --smoke``
(tiny float32 shapes on the CPU in seconds; writes bench/tmp/gpu-smoke.json; part of ``make test``).
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import platform
import statistics
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository's collectors, also when run as a script

from collectors import capture, signals  # noqa: E402
from collectors.evictors import parse_all  # noqa: E402
from collectors.hf import cache_keyword  # noqa: E402
from collectors.sweep import run_sweep  # noqa: E402
from pagestats.core import defaults# noqa: E402

#: The paper's gate cost at 4K on an A100 (§5 cost model, Table 26), milliseconds.
PAPER_GATE_MS_4K = {"qwen2.5-1.5b": 17.0, "mistral-7b": 89.0}
EVICTORS = ("snapkv", "h2o", "streamingllm", "pyramidkv")
BUDGETS = tuple(b for b in defaults.BUDGETS if b < 1.0)

#: Model shapes (public configs) and the prompt lengths each is measured at.
MODELS = {
    "qwen2.5-1.5b": ("qwen2", dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                                   rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "mistral-7b": ("mistral", dict(vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
                                   rope_theta=1e6, rms_norm_eps=1e-5, sliding_window=None)),
    "llama-3.1-70b-8layers": ("llama", dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                                            num_hidden_layers=8, num_attention_heads=64, num_key_value_heads=8,
                                            max_position_embeddings=131072, rope_theta=5e5, rms_norm_eps=1e-5)),
}
FULL = dict(tokens=(4096, 16384, 32768), sweep_tokens=4096, sweep_models=("qwen2.5-1.5b", "mistral-7b"),
            max_new_tokens=128, repeats=3, dtype="bfloat16")
#: --smoke: the same three families, tiny, in float32 on the CPU (CPU bfloat16 kernels are slow).
SMOKE_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=4096)
SMOKE = dict(tokens=(64, 128), sweep_tokens=128, sweep_models=("qwen2.5-1.5b",), max_new_tokens=4, repeats=1,
             dtype="float32")


class NoEosTokenizer:
    """The sweep's tokenizer interface without a vocabulary: no EOS, text = the token ids."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


def build(name: str, device: torch.device, dtype: torch.dtype, smoke: bool):
    """A random-weight causal LM of the named shape, built on ``device`` (no download)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    family, shape = MODELS[name]
    config = AutoConfig.for_model(family, **(SMOKE_SHAPE if smoke else shape))
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.generation_config.eos_token_id = None
    return model.eval()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats):
    """(median seconds, last result) of ``repeats`` calls after one warm-up call."""
    fn()
    times, out = [], None
    for _ in range(repeats):
        del out
        gc.collect()
        sync(device)
        start = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def stock_prefill(model, ids):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    return model(input_ids=ids, **{cache_keyword(model): cache}, use_cache=True, logits_to_keep=1)


def peak_extra(fn, device):
    """Peak allocated CUDA memory of ``fn()`` above what was allocated before, MiB (None on the CPU)."""
    if device.type != "cuda":
        fn()
        return None
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    peak = torch.cuda.max_memory_allocated(device)
    del out
    return (peak - before) / 2**20


def eager_attentions(model, ids):
    model.set_attn_implementation("eager")
    try:
        return model(input_ids=ids, output_attentions=True, use_cache=True, logits_to_keep=1)
    finally:
        model.set_attn_implementation("sdpa")


@torch.no_grad()
def measure_model(name, model, device, plan, deadline):
    config = model.config
    n_layers, n_heads = config.num_hidden_layers, config.num_attention_heads
    rows = []
    for n_tokens in plan["tokens"]:
        if time.perf_counter() > deadline:
            rows.append({"tokens": n_tokens, "skipped": "time budget spent"})
            continue
        ids = torch.randint(10, config.vocab_size, (1, n_tokens), generator=torch.Generator().manual_seed(n_tokens))
        ids = ids.to(device)
        t_stock, _ = timed(lambda: stock_prefill(model, ids), device, plan["repeats"])
        t_capture, pre = timed(lambda: capture.prefill(model, ids), device, plan["repeats"])
        window = pre.window_attention
        del pre  # its KV cache
        t_gate, gate = timed(lambda: signals.gate_signals(window), torch.device("cpu"), plan["repeats"])
        row = {
            "tokens": n_tokens,
            "stock_prefill_ms": 1e3 * t_stock,
            "capture_prefill_ms": 1e3 * t_capture,
            "capture_extra_ms": 1e3 * (t_capture - t_stock),
            "gate_signals_ms": 1e3 * t_gate,
            "d_cost_ms": 1e3 * (t_capture - t_stock + t_gate),
            "drop": float(gate.drop),
        }
        # memory: stock, capture, eager output_attentions (only where its output is predicted to fit)
        eager_bytes = n_layers * n_heads * n_tokens**2 * 2
        row["eager_attentions_predicted_gib"] = eager_bytes / 2**30
        row["capture_window_predicted_mib"] = n_layers * n_heads * n_tokens * 4 / 2**20  # ā kept: L·H·T float32
        stock_mib = peak_extra(lambda: stock_prefill(model, ids), device)
        capture_mib = peak_extra(lambda: capture.prefill(model, ids), device)
        row["stock_prefill_peak_mib"] = stock_mib
        row["capture_extra_mib"] = None if stock_mib is None else capture_mib - stock_mib
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
        if free is not None and eager_bytes > 0.8 * free:
            row["eager_extra_mib"] = None
            row["eager_skipped"] = (f"predicted {eager_bytes / 2**30:.1f} GiB of attention maps > 80% of "
                                    f"{free / 2**30:.1f} GiB free")
        else:
            try:
                eager_mib = peak_extra(lambda: eager_attentions(model, ids), device)
                row["eager_extra_mib"] = None if stock_mib is None else eager_mib - stock_mib
            except torch.cuda.OutOfMemoryError as err:
                model.set_attn_implementation("sdpa")
                row["eager_extra_mib"] = None
                row["eager_out_of_memory"] = str(err).splitlines()[0]
        if row["capture_extra_mib"] and row["eager_extra_mib"]:
            row["eager_over_capture_memory"] = row["eager_extra_mib"] / row["capture_extra_mib"]
        rows.append(row)
        print(f"{name} T={n_tokens}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                     for k, v in row.items() if k != "tokens"), flush=True)
    return rows


@torch.no_grad()
def measure_sweep(model, device, plan):
    """33-arm sweep (capture with H2O accumulation + gate + every arm) / (stock prefill + full-KV decode)."""
    from collectors.decode import decode_arms

    n_tokens, steps = plan["sweep_tokens"], plan["max_new_tokens"]
    ids = torch.randint(10, model.config.vocab_size, (1, n_tokens), generator=torch.Generator().manual_seed(1)).to(device)
    tok = NoEosTokenizer()

    def baseline():
        out = stock_prefill(model, ids)
        plain = capture.Prefill(input_ids=ids, past_key_values=getattr(out, cache_keyword(model)),
                                last_logits=out.logits[0, -1].float(), window_attention=None,
                                accumulated_attention=None, prefill_ms=0.0)
        return decode_arms(model, plain, [None], max_new_tokens=steps)

    def sweep(max_batch):
        pre = capture.prefill(model, ids, accumulate=True)
        signals.gate_signals(pre.window_attention)
        return run_sweep(model, tok, pre, evictors=parse_all(EVICTORS), budgets=BUDGETS, max_new_tokens=steps,
                         max_batch=max_batch)

    t_base, base_tokens = timed(baseline, device, 1)
    result = {"tokens": n_tokens, "decode_steps": steps, "baseline_s": t_base}
    for max_batch in (16, 1 + len(EVICTORS) * len(BUDGETS)):
        try:
            t_sweep, (full, arms) = timed(lambda: sweep(max_batch), device, 1)
        except torch.cuda.OutOfMemoryError as err:
            result[f"max_batch_{max_batch}"] = {"out_of_memory": str(err).splitlines()[0]}
            continue
        result[f"max_batch_{max_batch}"] = {
            "n_arms": 1 + len(arms), "sweep_s": t_sweep, "over_baseline": t_sweep / t_base,
            # every arm decodes the same number of steps (EOS disabled), so the ratio compares like with like
            "every_arm_decoded_all_steps": all(len(a.token_ids) == steps for a in [full, *arms]),
            # bf16 kernels may pick other tiles for a batch than for one row: recorded, not required
            "full_arm_equals_baseline_tokens": full.token_ids == base_tokens[0],
        }
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU in seconds (a test of the script)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda; cpu with --smoke)")
    parser.add_argument("--out", default=None, help="output JSON (default bench/results/gpu.json; "
                        "bench/tmp/gpu-smoke.json with --smoke)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="measurements still pending after this many "
                        "seconds are skipped and marked so (default 420)")
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else FULL
    device = torch.device(args.device or ("cpu" if args.smoke else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"error: {device} asked for, but torch {torch.__version__} sees no CUDA device (use --smoke on a CPU)",
              file=sys.stderr)
        return 2
    out = pathlib.Path(args.out or (HERE / ("tmp/gpu-smoke.json" if args.smoke else "results/gpu.json")))
    import transformers

    start = time.perf_counter()
    deadline = start + args.budget_s
    result = {
        "smoke": bool(args.smoke),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "dtype": plan["dtype"], "kernel": "sdpa",
        "paper_gate_ms_4k_a100": PAPER_GATE_MS_4K,
        "models": {},
    }
    for name in MODELS:
        if time.perf_counter() > deadline:
            result["models"][name] = {"skipped": "time budget spent"}
            continue
        t0 = time.perf_counter()
        model = build(name, device, getattr(torch, plan["dtype"]), args.smoke)
        entry = {"n_layers": model.config.num_hidden_layers, "n_heads": model.config.num_attention_heads,
                 "n_kv_heads": model.config.num_key_value_heads, "build_s": time.perf_counter() - t0}
        entry["gate"] = measure_model(name, model, device, plan, deadline)
        if name in plan["sweep_models"]:
            entry["sweep"] = (measure_sweep(model, device, plan) if time.perf_counter() < deadline
                              else {"skipped": "time budget spent"})
            print(f"{name} sweep: {json.dumps(entry['sweep'])}", flush=True)
        result["models"][name] = entry
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        write(result, out, start, finished=False)
    write(result, out, start, finished=True)
    print(f"wrote {out} in {result['wall_s']:.1f} s")
    return 0


def write(result: dict, out: pathlib.Path, start: float, *, finished: bool) -> None:
    """Write the results so far (after every model, so a run cut short keeps what it measured)."""
    result["wall_s"] = time.perf_counter() - start
    result["finished"] = finished
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)


if __name__ == "__main__":
    raise SystemExit(main())
