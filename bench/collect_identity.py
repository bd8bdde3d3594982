"""Issue 44 §3: the collector's rows of one code tree, to compare with another tree's (the collector's
counterpart of ``bench/outputs_identity.sh``).

    python bench/collect_identity.py collect TREE OUT [--kvpress]   # TREE's collectors, tiny random Llama
    python bench/collect_identity.py compare OUT_BEFORE OUT_AFTER    # exit 1 on any difference

``collect`` runs ``pagestats-collect`` of TREE on a tiny random Llama (``TREE/tests/tinymodels.py``, saved
to one temporary folder, which the manifests name) over every built-in evictor (three runs: all of them; the SnapKV family with another
window, pooling and the protected floor; query-agnostic), or with ``--kvpress`` (in the kvpress
environment) over kvpress presses, then ``gated_generate`` for every evictor at two budgets, gate open
and closed. ``compare`` compares every row of inputs, outcomes and topk (timings left out), the
manifests (created_at, software and the files' hashes left out: the timings change them) and the
generated tokens, texts, D and kept positions.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile

TIMING = {"prefill_ms", "gate_ms", "decode_ms"}
ALL = "snapkv,h2o,streamingllm,streamingllm-fixed,pyramidkv,snapkv-perlayer,snapkv-perhead,h2o-perhead,random"
RUNS = {
    "all": ["--evictors", ALL],
    "pooled": ["--evictors", "snapkv,pyramidkv,snapkv-perhead,snapkv-perlayer,random", "--snapkv-window", "16",
               "--snapkv-pool", "3", "--budget-floor", "protected"],
    "agnostic": ["--evictors", "snapkv,h2o-perhead,streamingllm-fixed", "--mode", "query-agnostic"],
}
KVPRESS_RUNS = {
    "presses": ["--evictors", "snapkv,kvpress:SnapKVPress:window_size=16,kvpress:KnormPress,"
                "kvpress:ObservedAttentionPress,kvpress:ExpectedAttentionPress", "--attn-impl", "eager"],
    "presses_agnostic": ["--evictors", "kvpress:TOVAPress,h2o", "--mode", "query-agnostic"],
}


def collect(tree: str, out: str, kvpress: bool) -> None:
    sys.path[:0] = [tree, os.path.join(tree, "tests")]
    import torch

    torch.set_num_threads(1)
    from tinymodels import byte_tokenizer, make_tiny_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from collectors import cli
    from collectors.deploy import gated_generate

    model_dir = os.path.join(tempfile.gettempdir(), "collect_identity_model")
    tok = byte_tokenizer()
    tok.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                         "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
    make_tiny_model("llama", vocab_size=512).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    base = ["--model", model_dir, "--tasks", "niah_single_1,niah_multikey_1", "--context-length", "1000", "--n", "2",
            "--budgets", "0.1,0.25,0.5,1.0", "--max-new-tokens", "6", "--allow-cut-answers", "--no-progress",
            "--k", "8", "--k-max", "16", "--part-size", "2"]
    for name, extra in (KVPRESS_RUNS if kvpress else RUNS).items():
        if cli.main([*base, "--out", os.path.join(out, name), *extra]) != 0:
            raise SystemExit(f"collect {name} failed")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = "The quick brown fox jumps over the lazy dog. " * 8 + "What jumps?"
    generated = {}
    for evictor in (["kvpress:KnormPress", "kvpress:SnapKVPress:window_size=16"] if kvpress else ALL.split(",")):
        for budget in (0.3, 0.6):
            for tau in (-1.0, 5.0):
                r = gated_generate(model, tokenizer, prompt, evictor=evictor, budget=budget, tau=tau, max_new_tokens=5)
                generated[f"{evictor}@{budget}@{tau}"] = {
                    "tokens": r.token_ids, "text": r.text, "open": r.decision.gate_open, "drop": r.decision.drop,
                    "n_kept": r.decision.n_kept, "kept": None if r.kept is None else r.kept.tolist()}
    with open(os.path.join(out, "generate.json"), "w") as f:
        json.dump(generated, f, indent=0, sort_keys=True)


def _rows(run: str, table: str) -> list:
    import pyarrow.parquet as pq

    rows = [{k: v for k, v in r.items() if k not in TIMING}
            for f in sorted(glob.glob(f"{run}/{table}/*.parquet")) for r in pq.read_table(f).to_pylist()]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def _manifest(run: str) -> dict:
    with open(f"{run}/manifest.json") as f:
        manifest = json.load(f)
    return {k: v for k, v in manifest.items() if k not in ("created_at", "software", "files")}


def compare(before: str, after: str) -> int:
    n_rows, differences = 0, []
    for run in sorted(d for d in os.listdir(before) if os.path.isfile(f"{before}/{d}/manifest.json")):
        for table in ("inputs", "outcomes", "topk"):
            rows = _rows(f"{before}/{run}", table)
            n_rows += len(rows)
            if rows != _rows(f"{after}/{run}", table):
                differences.append(f"{run}/{table}")
        if _manifest(f"{before}/{run}") != _manifest(f"{after}/{run}"):
            differences.append(f"{run}/manifest.json")
    with open(f"{before}/generate.json") as a, open(f"{after}/generate.json") as b:
        generated = json.load(a)
        if generated != json.load(b):
            differences.append("generate.json")
    print(f"{n_rows} rows and {len(generated)} gated_generate calls compared; differences: {differences or 'none'}")
    return 1 if differences else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["collect"] and len(sys.argv) in (4, 5):
        collect(sys.argv[2], sys.argv[3], kvpress=sys.argv[4:] == ["--kvpress"])
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        raise SystemExit(compare(sys.argv[2], sys.argv[3]))
    else:
        raise SystemExit(__doc__)
