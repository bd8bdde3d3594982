"""kvpress presses as base evictors, against kvpress itself (runs where the kvpress extra is installed:
``make test`` runs this file in .venv-kvpress).

Reference: kvpress's own hooks (``with press(model): model(...)``) compress the cache of a plain
forward pass at ``compression_ratio = 1 − b``; the positions it kept are recovered by matching each
kept key vector to the uncompressed cache. The collector's arm at budget b must keep the same
positions in every layer and KV head, from its ONE prefill (one scoring for all budgets).
"""

from __future__ import annotations

import json

import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from collectors import capture, cli  # noqa: E402
from collectors.evictors import parse  # noqa: E402
from collectors.evictors.presses import version  # noqa: E402
from collectors.hf import cache_keyword  # noqa: E402
from collectors.sweep import run_sweep  # noqa: E402

PRESSES = {
    "kvpress:SnapKVPress:window_size=16": "SnapKVPress",
    "kvpress:ObservedAttentionPress": "ObservedAttentionPress",
    "kvpress:KnormPress": "KnormPress",
    "kvpress:TOVAPress": "TOVAPress",
    "kvpress:ExpectedAttentionPress": "ExpectedAttentionPress",
}
BUDGETS = (0.25, 0.5, 0.875)
PEAKED = dict(initializer_range=0.2)  # peaked attention, so heads and layers keep different sets


def ids_of(n, seed):
    return torch.randint(3, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def _forward(model, ids, cache):
    name = cache_keyword(model)
    with torch.no_grad():
        return getattr(model(input_ids=ids, use_cache=True, **{name: cache}), name)


def kvpress_kept(model, ids, spec, budget):
    """Per layer, a (H_kv, n) list of the positions kvpress's own compression keeps."""
    from transformers import DynamicCache

    full = _forward(model, ids, DynamicCache(config=model.config))
    press = parse(spec).make(budget)
    with press(model):
        compressed = _forward(model, ids, DynamicCache(config=model.config))
    out = []
    for full_layer, kept_layer in zip(full.layers, compressed.layers):
        heads = []
        for j in range(full_layer.keys.shape[1]):
            k_full, k_kept = full_layer.keys[0, j], kept_layer.keys[0, j]  # (T, d), (n, d)
            match = (k_kept[:, None, :] == k_full[None, :, :]).all(-1)  # (n, T)
            assert (match.sum(-1) == 1).all(), "every kept key matches exactly one cached position"
            heads.append(sorted(match.float().argmax(-1).tolist()))
        out.append(heads)
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("spec", list(PRESSES))
def test_kept_sets_equal_kvpress_compress(make_tiny_model, family, spec):
    # eager, as kvpress requires for ObservedAttentionPress; GQA: 4 query heads over 2 KV heads
    model = make_tiny_model(family, attn_impl="eager", **PEAKED)
    ids = ids_of(80, 17)
    pf = capture.prefill(model, ids, presses=[parse(spec)])  # one scoring, every budget below
    differs = False
    for budget in BUDGETS:
        ours = parse(spec).kept(pf, budget)
        n = parse(spec).count(80, budget)
        assert tuple(ours.shape) == (4, 2, n) and n == int(80 * budget)
        reference = kvpress_kept(model, ids, spec, budget)
        assert ours.tolist() == reference, (spec, budget)
        differs |= any(ours[l, 0].tolist() != ours[l, 1].tolist() for l in range(4))
        differs |= any(ours[0].tolist() != ours[l].tolist() for l in range(1, 4))
    assert differs or spec == "kvpress:TOVAPress"  # TOVA averages all heads: one set per layer


def test_observed_attention_under_sdpa_uses_the_captured_softmax(make_tiny_model):
    """sdpa returns no attention weights; the press then scores the capture's own softmax, which
    equals eager's weights to float32 rounding."""
    spec = "kvpress:ObservedAttentionPress"
    ids = ids_of(80, 5)
    eager = capture.prefill(make_tiny_model("qwen2", attn_impl="eager", **PEAKED), ids, presses=[parse(spec)])
    sdpa = capture.prefill(make_tiny_model("qwen2", **PEAKED), ids, presses=[parse(spec)])
    for a, b in zip(eager.press_scores[spec], sdpa.press_scores[spec]):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


class Tok:
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


@pytest.mark.parametrize("spec", ["kvpress:SnapKVPress:window_size=16", "kvpress:KnormPress"])
def test_query_agnostic_press_arm_equals_kvpress_compress_then_generate(make_tiny_model, spec):
    """The arm's outcome is kvpress's: context compressed by the press's own hooks, then the question
    and greedy decoding from the compressed cache at positions continuing from the context length."""
    from transformers import DynamicCache

    model = make_tiny_model("qwen2", attn_impl="eager", **PEAKED)
    context, question = ids_of(80, 21), ids_of(12, 22)
    pf = capture.prefill(model, context, presses=[parse(spec)])
    _, arms = run_sweep(model, Tok(), pf, evictors=(parse(spec),), budgets=(0.25, 0.5), max_new_tokens=6,
                        question_ids=question)
    name = cache_keyword(model)
    for arm in arms:
        with parse(spec).make(arm.budget)(model):
            cache = _forward(model, context, DynamicCache(config=model.config))
        n = cache.get_seq_length()
        placeholder = torch.full((1, n), 3, dtype=torch.long)
        position_ids = torch.cat([torch.zeros(n, dtype=torch.long), torch.arange(80, 92)])[None]
        with torch.no_grad():
            out = model.generate(torch.cat([placeholder, question], dim=1), do_sample=False, max_new_tokens=6,
                                 min_new_tokens=0, position_ids=position_ids, **{name: cache})
        assert arm.token_ids == out[0, n + 12:].tolist(), arm.budget
        assert arm.n_kept == parse(spec).count(80, arm.budget) + 12


def test_collect_records_press_parameters_and_version(model_dir, tmp_path):
    from pagestats.cli import main as pagestats_main

    out = tmp_path / "run"
    evictors = "kvpress:SnapKVPress:window_size=16:kernel_size=1,kvpress:KnormPress,snapkv"
    args = ["--model", str(model_dir), "--out", str(out), "--tasks", "niah_single_1", "--context-length", "640",
            "--n", "1", "--budgets", "0.25,1.0", "--max-new-tokens", "4", "--allow-cut-answers", "--no-progress", "--k", "8",
            "--k-max", "16", "--evictors", evictors]
    assert cli.main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    recorded = manifest["evictor_parameters"]["kvpress"]
    installed = version()
    assert recorded == {
        "kvpress:SnapKVPress:window_size=16:kernel_size=1": {
            "press": "SnapKVPress", "params": {"window_size": 16, "kernel_size": 1}, "kvpress_version": installed},
        "kvpress:KnormPress": {"press": "KnormPress", "params": {}, "kvpress_version": installed},
    }
    assert manifest["software"]["kvpress"] == installed
    assert pagestats_main(["validate", str(out)]) == 0


@pytest.mark.parametrize("bad,message", [
    ("kvpress:NoSuchPress", "not a kvpress ScorerPress"),
    ("kvpress:SnapKVPress:compression_ratio=0.5", "compression_ratio"),
    ("kvpress:SnapKVPress:windowsize=3", "windowsize"),
    ("kvpress:SnapKVPress:32", "name=value"),
])
def test_bad_press_exits_2_with_one_line(model_dir, tmp_path, capsys, bad, message):
    args = ["--model", str(model_dir), "--out", str(tmp_path / "x"), "--tasks", "niah_single_1",
            "--context-length", "640", "--n", "1", "--evictors", bad]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
