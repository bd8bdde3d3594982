"""Benchmark: extra peak memory of the window capture vs ``output_attentions=True`` (eager).

docs/COLLECTION.md: the capture computes "only the last-w rows' probabilities (w×T per head, never T×T)".
This measures what that buys on the embedded default (SmolLM2-135M-Instruct, CPU, fp32) at 2K
tokens, against the usual way of getting attention maps out of ``transformers`` (eager attention
with ``output_attentions=True``, which materialises and returns every T × T map).

How memory is measured
----------------------
Each mode runs in its own fresh subprocess (so allocator state never carries over), with glibc's
mmap threshold fixed at 128 KiB and its trim threshold at 128 KiB (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``), so freed tensors return to the OS and resident memory tracks live memory:

1. load the model (dequantised once by the parent, saved as safetensors in a temporary
   directory, so the children load quickly), run the mode's forward once as a warm-up and free it;
2. read the resident set size (``VmRSS`` in ``/proc/self/status``), reset the peak counter by
   writing ``5`` to ``/proc/self/clear_refs`` (Linux ≥ 4.0), run the forward again, keep its
   outputs alive, and read the peak (``VmHWM``);
3. the mode's peak increment is VmHWM − VmRSS-before.

Modes: ``plain`` (stock sdpa prefill: KV cache + last logits), ``capture``
(:func:`collectors.capture.prefill`, sdpa stock kernel, w = 32; also with H2O accumulation,
``capture_h2o``), ``eager_attentions`` (eager kernel, ``output_attentions=True``). The extra memory
of a mode is its increment minus the plain increment; the result is the ratio
eager extra / capture extra (target ≥ 20×); the conservative ratio floors the capture's extra at
1 MiB, since a few MiB of capture buffers can fit under the plain forward's own transient peak. Writes bench/results/capture_memory.json.

Run: ``.venv/bin/python bench/capture_memory.py [--tokens 2048] [--repeats 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile

from _results import write_result

#: Floor of the capture's extra memory in the conservative ratio (measurement resolution).
FLOOR_MIB = 1.0
MODES = ("plain", "capture", "capture_h2o", "eager_attentions")


def _status_kib(field: str) -> int:
    text = pathlib.Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE).group(1))


def child(mode: str, model_dir: str, ids_path: str) -> dict:
    """Measure one mode in this (fresh) process; returns kib figures."""
    import gc

    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from collectors import capture

    ids = torch.tensor([json.loads(pathlib.Path(ids_path).read_text())])
    attn = "eager" if mode == "eager_attentions" else "sdpa"
    from safetensors.torch import load_model as load_weights
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    config._attn_implementation = attn
    lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    load_weights(lm, os.path.join(model_dir, "model.safetensors"))
    lm = lm.eval()

    def forward():
        with torch.no_grad():
            if mode == "plain":
                cache = DynamicCache(config=lm.config)
                return lm(ids, cache=cache, use_cache=True, logits_to_keep=1), cache
            if mode == "capture":
                return capture.prefill(lm, ids, window=32)
            if mode == "capture_h2o":
                return capture.prefill(lm, ids, window=32, accumulate=True, query_chunk=256)
            cache = DynamicCache(config=lm.config)
            return lm(ids, cache=cache, use_cache=True, logits_to_keep=1, output_attentions=True), cache

    out = forward()
    del out
    gc.collect()
    rss_before = _status_kib("VmRSS")
    pathlib.Path("/proc/self/clear_refs").write_text("5")
    hwm_reset = _status_kib("VmHWM")
    out = forward()
    hwm = _status_kib("VmHWM")
    del out
    return {"mode": mode, "rss_before_kib": rss_before, "hwm_after_reset_kib": hwm_reset, "hwm_kib": hwm,
            "increment_kib": hwm - rss_before}


def _run_child(mode, model_dir, ids_path) -> dict:
    # A fixed glibc mmap threshold (which also turns off its dynamic growth) and a low trim
    # threshold make freed tensor memory go back to the OS, so resident memory tracks live memory
    # and the warm-up's freed blocks cannot hide the measured forward's allocations.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", mode, model_dir, ids_path],
        capture_output=True, text=True, check=False, env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _prepare(workdir: str, n_tokens: int) -> dict:
    """Dequantise the default model once into ``workdir`` (config, weights, prompt ids, manifest)."""
    done = pathlib.Path(workdir, "manifest.json")
    if done.exists():
        manifest = json.loads(done.read_text())
        if manifest.get("n_tokens_prompt") == n_tokens:
            return manifest
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from gate_signal import long_prompt_ids
    from safetensors.torch import save_model

    from collectors import model

    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    lm, tokenizer, manifest = model.load_model()
    ids = long_prompt_ids(tokenizer, n_tokens)[0].tolist()
    pathlib.Path(workdir, "ids.json").write_text(json.dumps(ids))
    # GGUF-loaded models refuse save_pretrained: save the dequantised weights and config directly.
    config = lm.config.to_dict()
    config.pop("quantization_config", None)
    pathlib.Path(workdir, "config.json").write_text(json.dumps(config))
    save_model(lm, os.path.join(workdir, "model.safetensors"))
    manifest["n_tokens_prompt"] = n_tokens
    done.write_text(json.dumps(manifest))
    return manifest


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2, help="subprocesses per mode (eager: once)")
    parser.add_argument("--workdir", help="keep/reuse the dequantised weights and prompt here (default: a temp dir)")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "MODEL_DIR", "IDS_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return {}

    with tempfile.TemporaryDirectory(prefix="pagestats-bench-") as tmp:
        workdir = args.workdir or tmp
        manifest = _prepare(workdir, args.tokens)
        ids = json.loads(pathlib.Path(workdir, "ids.json").read_text())
        runs = {mode: [] for mode in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                if mode == "eager_attentions" and runs[mode]:
                    continue
                runs[mode].append(_run_child(mode, workdir, os.path.join(workdir, "ids.json")))

    increment_mib = {m: statistics.median(r["increment_kib"] for r in rs) / 1024 for m, rs in runs.items()}
    extra = {m: increment_mib[m] - increment_mib["plain"] for m in MODES if m != "plain"}
    n_layers, n_heads = manifest["n_layers"], manifest["n_heads"]
    t = len(ids)
    result = {
        "benchmark": "capture_memory",
        "what": "extra peak RSS over a plain sdpa prefill: window capture vs eager output_attentions=True",
        "method": "fresh subprocess per mode, MALLOC_MMAP_THRESHOLD_=MALLOC_TRIM_THRESHOLD_=128KiB; warm-up forward; VmHWM reset via /proc/self/clear_refs; "
        "increment = VmHWM - VmRSS before the measured forward; extra = increment - plain increment",
        "model": manifest["name"],
        "model_sha256": manifest["sha256"],
        "n_tokens": t,
        "window": 32,
        "increment_mib": increment_mib,
        "extra_over_plain_mib": extra,
        # The capture's own extra can sit inside the plain forward's transient peak (then it is
        # ~0 and the raw ratio explodes); the conservative ratio floors the denominator at 1 MiB.
        "ratio_eager_over_capture": extra["eager_attentions"] / max(extra["capture"], 1e-9),
        "ratio_eager_over_capture_conservative": extra["eager_attentions"] / max(extra["capture"], FLOOR_MIB),
        "ratio_eager_over_capture_h2o_conservative": extra["eager_attentions"] / max(extra["capture_h2o"], FLOOR_MIB),
        "denominator_floor_mib": FLOOR_MIB,
        "target_ratio": 20.0,
        "expected_eager_attention_maps_mib": n_layers * n_heads * t * t * 4 / 2**20,
        "expected_window_block_per_layer_mib": n_heads * 32 * t * 4 / 2**20,
        "runs": runs,
        "load_average_at_end": os.getloadavg()[0],
        "python": platform.python_version(),
    }
    write_result("capture_memory", result, {k: v for k, v in result.items() if k != "runs"})
    return result


if __name__ == "__main__":
    main()
