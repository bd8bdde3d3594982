"""The family matrix: every model family users run, on a tiny random model built from a config in code.

Each family either runs, and then

* the captured a_ℓ (the observation-window attention ā) equals the model's own eager attention
  (``output_attentions``) to 1e-6,
* the prefill logits under the capture are bit-identical to the stock kernel's,
* the full-KV answer of the sweep equals ``model.generate`` (greedy; the stock cache, sliding-window
  layers included),
* one per-head eviction (``snapkv-perhead``) keeps the positions a brute-force selection over the
  eager attention keeps, and the batched arm decodes what a one-arm loop over
  :func:`collectors.decode.slice_cache` decodes,

or it is refused, before any weights exist, by the one-line error of
:func:`collectors.model.check_architecture`. Nothing is downloaded.

The table of docs/COLLECTION.md ("Model families") is generated from :data:`FAMILIES`
(``python tests/collectors/test_families.py`` prints it) and checked against it here.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

import pytest

#: Prompt tokens, tokens to generate, gate window and SnapKV window of the matrix.
T, N_NEW, WINDOW = 40, 5, 8
POSITIONS = T + N_NEW

BASE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
            pad_token_id=0, tie_word_embeddings=False)

MOE = dict(num_experts=4, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


@dataclass(frozen=True)
class Family:
    """One row of the matrix: a transformers ``model_type``, the config the test builds, and either
    ``refused`` (a substring of the one-line refusal) or None (the family runs)."""

    name: str
    model_type: str
    config: dict = field(default_factory=dict)
    refused: str | None = None
    note: str = ""
    sinks: bool = False  # give the attention sinks trained-size values (gpt-oss)
    drop: tuple[str, ...] = ()  # keys of BASE the family's config does not take


FAMILIES = [
    Family("Llama", "llama"),
    Family("Qwen2", "qwen2"),
    Family("Qwen2 (sliding window)", "qwen2", dict(use_sliding_window=True, sliding_window=POSITIONS,
                                                   max_window_layers=1), note="window covers the run"),
    Family("Qwen3", "qwen3"),
    Family("Mistral", "mistral", dict(sliding_window=None)),
    Family("Mistral (window 4096)", "mistral", dict(sliding_window=4096), note="published window; covers the run"),
    Family("Mistral (window = run)", "mistral", dict(sliding_window=POSITIONS), note="window exactly the run"),
    Family("Mistral (short window)", "mistral", dict(sliding_window=POSITIONS - 1),
           refused="have a sliding window of 44", note="window shorter than prompt + decode"),
    Family("Phi-3", "phi3", dict(sliding_window=2047), note="published window 2047"),
    Family("Gemma", "gemma"),
    Family("Gemma-2", "gemma2", dict(sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
           note="soft-capping (sdpa refused: it cannot soft-cap); window 4096"),
    Family("Gemma-3", "gemma3_text",
           dict(sliding_window=POSITIONS, layer_types=["sliding_attention", "full_attention"]),
           note="window covers the run"),
    Family("Gemma-3 (short window)", "gemma3_text", dict(sliding_window=32,
                                                         layer_types=["sliding_attention", "full_attention"]),
           refused="have a sliding window of 32", note="window 32 < prompt + decode"),
    Family("OLMo", "olmo"),
    Family("OLMo-2", "olmo2"),
    Family("Granite", "granite"),
    Family("Cohere", "cohere"),
    Family("Cohere2", "cohere2", dict(sliding_window=4096, layer_types=["sliding_attention", "full_attention"]),
           note="window 4096"),
    Family("GPT-NeoX", "gpt_neox", dict(rotary_pct=0.5)),
    Family("GPT-2", "gpt2", dict(n_embd=32, n_layer=2, n_head=4, n_positions=256), note="learned positions"),
    Family("Starcoder2", "starcoder2", dict(sliding_window=4096), note="window 4096"),
    Family("SmolLM3", "smollm3"),
    Family("GLM", "glm"),
    Family("Helium", "helium"),
    Family("Seed-OSS", "seed_oss", note="dense attention (was refused for 'ssm' in 'SeedOssMLP')"),
    Family("Phi", "phi", dict(partial_rotary_factor=0.5)),
    Family("Mixtral (MoE)", "mixtral", MOE),
    Family("Qwen3-MoE", "qwen3_moe", MOE),
    Family("gpt-oss (MoE, sinks)", "gpt_oss", dict(MOE, sliding_window=4096), sinks=True,
           note="attention sinks modelled; window 4096"),
    Family("DeepSeek-V3 (MLA, MoE)", "deepseek_v3", dict(MOE, n_routed_experts=4, n_group=1, topk_group=1,
                                                         first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None,
                                                         qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                                         n_shared_experts=1, num_key_value_heads=4),
           note="latent cache geometry recorded; per-head = per-layer where the cache has one head"),
    Family("Llama-4 (text)", "llama4_text", dict(MOE, attention_chunk_size=4096, intermediate_size_mlp=64,
                                                 interleave_moe_layer_step=1, no_rope_layers=[1, 1]),
           note="chunked attention (chunk 4096 covers the run)"),
    Family("Falcon", "falcon", refused="AttentionInterface", drop=("head_dim",)),
    Family("MPT", "mpt", dict(d_model=32, n_heads=4, n_layers=2), refused="AttentionInterface"),
    Family("Bloom", "bloom", dict(n_layer=2, n_head=4), refused="AttentionInterface"),
    Family("StableLM", "stablelm", refused="AttentionInterface"),
    Family("Mamba", "mamba", dict(state_size=4), refused="outside PAGE's scope"),
    Family("Qwen3-Next (hybrid)", "qwen3_next", dict(MOE, layer_types=["linear_attention", "full_attention"]),
           refused="outside PAGE's scope"),
    Family("Jamba (hybrid)", "jamba", dict(MOE, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                                           expert_layer_offset=1, mamba_d_state=4),
           refused="outside PAGE's scope"),
]


def _config(family: Family):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    base = {k: v for k, v in BASE.items() if k not in family.drop}
    return CONFIG_MAPPING[family.model_type](**{**base, **family.config})


def _tokenizer():
    from tinymodels import byte_tokenizer

    return byte_tokenizer()


@pytest.fixture(scope="module")
def tokenizer():
    return _tokenizer()


def _build(family: Family):
    """The tiny model in float32 and eval mode, on its stock kernel (sdpa where its class has one)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = _config(family)
    attn = _kernel(family)
    config._attn_implementation = attn
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        # Random weights of std 0.02 make every attention row nearly uniform; wider ones give the
        # rows (and the per-head selections) structure, and sinks of trained size (gpt-oss).
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim == 2 and ("q_" in name or "k_" in name or "query" in name or "key" in name
                                    or "c_attn" in name or "kv_a" in name or "kv_b" in name):
                    p.normal_(0.0, 0.35)
                if family.sinks and name.endswith("sinks"):
                    p.copy_(torch.linspace(8.0, 24.0, p.numel()))
    finally:
        torch.random.set_rng_state(state)
    if model.config._attn_implementation != attn:
        model.set_attn_implementation(attn)
    return model.eval(), attn


def _brute_force_perhead(attentions, n_kv: int, count: int, n_sink: int, n_recent: int):
    """Kept positions per (layer, KV head) by a plain sort of the eager window attention."""
    kept = []
    for layer in attentions:
        window = layer[0, :, -WINDOW:, :].double().mean(dim=1)  # (H, T)
        group = window.shape[0] // n_kv
        rows = []
        for j in range(n_kv):
            score = window[j * group:(j + 1) * group].mean(dim=0).tolist()
            protected = set(range(n_sink)) | set(range(T - n_recent, T))
            rest = sorted((p for p in range(T) if p not in protected), key=lambda p: (-score[p], p))
            rows.append(sorted(protected | set(rest[:count - len(protected)])))
        kept.append(rows)
    return kept


def _one_arm_decode(model, prefill, kept, n_new: int) -> list[int]:
    """Greedy decode of one arm, one token at a time, from ``slice_cache`` (no batch, no padding)."""
    import torch

    from collectors.decode import slice_cache
    from collectors.hf import cache_keyword

    cache = slice_cache(prefill.past_key_values, kept)
    tokens = [int(torch.argmax(prefill.last_logits))]
    name = cache_keyword(model)
    for s in range(n_new - 1):
        out = model(input_ids=torch.tensor([[tokens[-1]]]), position_ids=torch.tensor([[T + s]]),
                    **{name: cache}, use_cache=True)
        cache = getattr(out, name)
        tokens.append(int(torch.argmax(out.logits[0, -1])))
    return tokens


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_family(family, tokenizer):
    import torch

    from collectors import capture, sweep
    from collectors.evictors import parse, parse_all
    from collectors.model import (ModelLoadError, UnsupportedModelError, cache_geometry, check_architecture,
                                  check_supported, describe_architecture)

    config = _config(family)
    if family.refused is not None:
        with pytest.raises((ModelLoadError, UnsupportedModelError)) as err:
            check_architecture(config, positions=POSITIONS)
        message = str(err.value)
        assert family.refused in message and "\n" not in message
        return
    check_architecture(config, positions=POSITIONS)
    model, attn = _build(family)
    check_supported(model)
    ids = torch.randint(3, 128, (1, T), generator=torch.Generator().manual_seed(7))

    with torch.no_grad():
        stock = model(input_ids=ids, use_cache=True, logits_to_keep=1).logits[0, -1].float()
        pre = capture.prefill(model, ids, window=WINDOW, snapkv_window=WINDOW, accumulate=True)
        # logits under the capture: bit for bit those of the stock kernel
        assert torch.equal(pre.last_logits, stock)
        # a_ℓ against the model's own eager attention
        model.set_attn_implementation("eager")
        eager = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
        model.set_attn_implementation(attn)
    assert len(eager) == config.num_hidden_layers
    reference = torch.stack([a[0, :, -WINDOW:, :].float().mean(dim=1) for a in eager])
    assert torch.allclose(pre.window_attention, reference, atol=1e-6, rtol=0), \
        float((pre.window_attention - reference).abs().max())
    accumulated = torch.stack([a[0].float().sum(dim=1) for a in eager])
    assert torch.allclose(pre.accumulated_attention, accumulated, atol=1e-5, rtol=0)

    # the full-KV answer equals model.generate (stock cache: sliding layers stay sliding there)
    full, arms = sweep.run_sweep(model, tokenizer, pre, evictors=parse_all(["snapkv-perhead"]), budgets=[0.5],
                                 max_new_tokens=N_NEW, n_sink=2, n_recent=4)
    generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW, do_sample=False,
                               pad_token_id=0)[0, T:].tolist()
    assert full.token_ids == generated

    # one per-head eviction: the selection is a brute-force one, and the batched arm decodes as one arm alone
    kept = parse("snapkv-perhead").kept(pre, 0.5, n_sink=2, n_recent=4)
    geometry = cache_geometry(model)
    assert kept.shape == (config.num_hidden_layers, geometry[0]["k_heads"], T // 2)
    assert kept.tolist() == _brute_force_perhead(eager, geometry[0]["k_heads"], T // 2, 2, 4)
    assert arms[0].token_ids == _one_arm_decode(model, pre, kept, N_NEW)[:len(arms[0].token_ids)]
    assert arms[0].n_kept == T // 2

    # the manifest's geometry is the cache's
    cache = pre.past_key_values.layers
    described = describe_architecture(model.config, geometry, "float32")
    elements = sum(layer.keys.shape[1] * layer.keys.shape[-1] + layer.values.shape[1] * layer.values.shape[-1]
                   for layer in cache)
    assert described["kv_bytes_per_token"] == 4 * elements
    assert 2 * described["n_layers"] * described["n_kv_heads"] * described["head_dim"] == elements


def test_sinks_change_the_capture():
    """gpt-oss's sinks matter: with trained-size sinks, ā modelled without them is far from the eager one
    (the test above passes only because the capture models them)."""
    import torch

    from collectors import capture

    from collectors import signals

    family = next(f for f in FAMILIES if f.sinks)
    model, _ = _build(family)
    ids = torch.randint(3, 128, (1, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        pre = capture.prefill(model, ids, window=WINDOW)
        for m in model.modules():
            if hasattr(m, "sinks"):
                m.sinks.fill_(-1e4)  # a sink of zero mass: the softmax without sinks
        without = capture.prefill(model, ids, window=WINDOW)
        model.set_attn_implementation("eager")
        for m in model.modules():
            if hasattr(m, "sinks"):
                m.sinks.copy_(torch.linspace(8.0, 24.0, m.sinks.numel()))
        eager = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    row_mass = pre.window_attention.sum(dim=-1)
    assert float(row_mass.min()) < 0.2  # the sinks take most of some rows
    assert float((without.window_attention.sum(dim=-1) - 1).abs().max()) < 1e-5
    # D (k = 8 of 40 positions) from the capture is D from the model's own eager attention
    reference = torch.stack([a[0, :, -WINDOW:, :].float().mean(dim=1) for a in eager])
    drop = signals.gate_signals(pre.window_attention, k=8, k_max=8).drop
    assert abs(drop - signals.gate_signals(reference, k=8, k_max=8).drop) < 1e-9


@pytest.mark.parametrize("name, refused", [
    ("SeedOssMLP", False), ("SeedOssModel", False), ("GPT2Attention", False), ("Conv1D", False),
    ("Qwen2MoeSparseMoeBlock", False), ("MambaMixer", True), ("Mamba2Mixer", True), ("Qwen3NextGatedDeltaNet", True),
    ("Lfm2ShortConv", True), ("RwkvSelfAttention", True), ("MiniMaxLightningAttention", True),
])
def test_scope_reads_whole_words(name, refused):
    """The scope check matches whole CamelCase words: 'SeedOssMLP' holds no 'SSM'."""
    from collectors.model.checks import _non_softmax_name

    assert _non_softmax_name(name) is refused


def _outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)[0]
    except (ValueError, TypeError, RuntimeError) as err:
        return type(err), str(err)


@pytest.mark.parametrize("keyword", ["softcap", "s_aux", "position_bias"])
def test_grouped_decode_keeps_attention_keywords(keyword):
    """A grouped decode step that carries softcap, s_aux or position_bias does what the stock sdpa kernel
    does with it (uses it, ignores it or refuses it), instead of dropping it; without one it is the
    grouped SDPA, equal to the stock kernel up to rounding."""
    import torch
    from transformers import AttentionInterface

    from collectors.hf import STOCK_ATTENTION_KEYWORDS, grouped_sdpa_forward

    class Attention(torch.nn.Module):
        num_key_value_groups = 2
        is_causal = True

    stock = AttentionInterface._global_mapping["sdpa"]
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(*shape, generator=gen) for shape in ((1, 4, 1, 8), (1, 2, 6, 8), (1, 2, 6, 8)))
    module = Attention().eval()
    value = {"softcap": 0.5, "s_aux": torch.randn(4, generator=gen),
             "position_bias": 3 * torch.randn(1, 4, 1, 6, generator=gen)}[keyword]
    assert keyword in STOCK_ATTENTION_KEYWORDS
    plain = grouped_sdpa_forward(module, q, k, v, None, scaling=0.3)[0]
    assert torch.allclose(plain, stock(module, q, k, v, None, scaling=0.3)[0], atol=1e-6)
    got = _outcome(grouped_sdpa_forward, module, q, k, v, None, scaling=0.3, **{keyword: value})
    want = _outcome(stock, module, q, k, v, None, scaling=0.3, **{keyword: value})
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want)
    else:
        assert got == want


def test_refusals_come_before_loading(model_dir, tmp_path, monkeypatch, capsys):
    """A sliding window shorter than the run and a missing QA file stop pagestats-collect with one line
    (exit 2) before any weights are read."""
    import json

    import transformers

    from collectors.cli import main

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    config = json.loads((model_dir / "config.json").read_text())
    short = tmp_path / "short-window"
    short.mkdir()
    for f in model_dir.iterdir():
        (short / f.name).write_bytes(f.read_bytes())
    (short / "config.json").write_text(json.dumps({**config, "model_type": "mistral", "sliding_window": 100,
                                                   "architectures": ["MistralForCausalLM"]}))
    common = ["--context-length", "256", "--n", "1", "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(["--model", str(short), "--tasks", "niah_single_1", *common]) == 2
    err = capsys.readouterr().err.strip()
    assert "sliding window of 100" in err and "lower the context length" in err and "\n" not in err
    assert main(["--model", str(model_dir), "--tasks", "qa_1", *common]) == 2
    err = capsys.readouterr().err.strip()
    assert "qa_1 needs a squad json file" in err.lower() and "\n" not in err


def _kernel(family: Family) -> str:
    """The stock kernel the matrix runs a family on: sdpa where the collector accepts it, else eager."""
    from collectors.model import ModelLoadError, check_kernel_support

    try:
        check_kernel_support(_config(family), "sdpa")
        return "sdpa"
    except ModelLoadError:  # no sdpa kernel for this class, or soft-capping (Gemma-2)
        return "eager"


def family_table() -> str:
    """The Markdown table of docs/COLLECTION.md ("Model families"), from :data:`FAMILIES`."""
    lines = ["| family | transformers `model_type` | outcome | kernel | notes |", "|---|---|---|---|---|"]
    for f in FAMILIES:
        if f.refused is None:
            outcome, kernel, why = "runs", _kernel(f), f.note
        else:
            outcome, kernel = "refused before loading", "–"
            why = {"AttentionInterface": "computes attention itself (`_supports_attention_backend` is False)",
                   "outside PAGE's scope": "state-space / linear-attention layers (§6 scope)"}.get(f.refused, f.note)
        lines.append(f"| {f.name} | `{f.model_type}` | {outcome} | {kernel} | {why} |")
    return "\n".join(lines)


def test_docs_table_is_the_matrix():
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "COLLECTION.md").read_text()
    assert family_table() in text, "docs/COLLECTION.md's family table is stale: python tests/collectors/test_families.py"


if __name__ == "__main__":
    print(family_table())
