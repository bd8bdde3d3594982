"""collectors.capture against eager ``output_attentions`` (an independent reference path)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from collectors import capture  # noqa: E402


def _eager_attentions(make_tiny_model, family, input_ids):
    """Full (T × T) attention probabilities per layer from a second, eager copy of the model."""
    eager = make_tiny_model(family, attn_impl="eager")
    with torch.no_grad():
        out = eager(input_ids, output_attentions=True)
    return [a[0].float() for a in out.attentions]  # each (H, T, T)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("window", [32, 5])
def test_window_attention_equals_eager_last_rows(make_tiny_model, tiny_input_ids, family, window):
    model = make_tiny_model(family)  # stock kernel: sdpa
    assert model.config._attn_implementation == "sdpa"
    result = capture.prefill(model, tiny_input_ids, window=window)
    reference = torch.stack([a[:, -window:, :].mean(dim=1) for a in _eager_attentions(make_tiny_model, family, tiny_input_ids)])
    assert result.window_attention.shape == (4, 4, tiny_input_ids.shape[1])
    assert result.window_attention.dtype == torch.float32
    assert (result.window_attention - reference).abs().max().item() <= 1e-5
    # each row average is a distribution over the prompt keys
    torch.testing.assert_close(result.window_attention.sum(-1), torch.ones(4, 4), atol=1e-5, rtol=0)
    # the model's attention implementation is restored
    assert model.config._attn_implementation == "sdpa"


def test_short_prompt_uses_all_rows(make_tiny_model):
    ids = torch.arange(3, 13)[None]  # T = 10 < w = 32
    model = make_tiny_model("llama")
    result = capture.prefill(model, ids, window=32)
    reference = torch.stack([a.mean(dim=1) for a in _eager_attentions(make_tiny_model, "llama", ids)])
    assert (result.window_attention - reference).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_logits_identical_to_stock_sdpa(make_tiny_model, tiny_input_ids, family):
    stock = make_tiny_model(family)
    captured = make_tiny_model(family)
    with torch.no_grad():
        expected = stock(tiny_input_ids).logits
        with capture.capture_attention(captured, window=32, accumulate=True, query_chunk=16) as recorder:
            got = captured(tiny_input_ids).logits
            assert captured.config._attn_implementation == capture.CAPTURE_PREFIX + "sdpa"
    assert torch.equal(got, expected)
    assert len(recorder.window_attention) == 4
    # the prefill's cache and last-position logits agree with the stock run
    result = capture.prefill(captured, tiny_input_ids)
    assert result.past_key_values.get_seq_length() == tiny_input_ids.shape[1]
    assert result.last_logits.shape == (captured.config.vocab_size,)
    torch.testing.assert_close(result.last_logits, expected[0, -1], atol=1e-5, rtol=0)


def test_stock_cache_identical(make_tiny_model, tiny_input_ids):
    """The KV cache a capture prefill leaves is the stock one (keys/values bit-identical)."""
    model = make_tiny_model("qwen2")
    result = capture.prefill(model, tiny_input_ids)
    stock_cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(tiny_input_ids, cache=stock_cache, use_cache=True)
    for layer in range(4):
        assert torch.equal(result.past_key_values.layers[layer].keys, stock_cache.layers[layer].keys)
        assert torch.equal(result.past_key_values.layers[layer].values, stock_cache.layers[layer].values)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("query_chunk", [1, 7, 32, 1000])
def test_accumulated_attention_equals_eager_column_sums(make_tiny_model, tiny_input_ids, family, query_chunk):
    model = make_tiny_model(family)
    result = capture.prefill(model, tiny_input_ids, accumulate=True, query_chunk=query_chunk)
    reference = torch.stack([a.sum(dim=1) for a in _eager_attentions(make_tiny_model, family, tiny_input_ids)])
    assert result.accumulated_attention.shape == reference.shape
    assert (result.accumulated_attention - reference).abs().max().item() <= 1e-5
    # every query row contributes a total mass of one
    torch.testing.assert_close(
        result.accumulated_attention.sum(-1), torch.full((4, 4), float(tiny_input_ids.shape[1])), atol=1e-3, rtol=0
    )


def test_accumulation_off_by_default(tiny_llama, tiny_input_ids):
    assert capture.prefill(tiny_llama, tiny_input_ids).accumulated_attention is None


def test_nothing_leaks_between_calls(make_tiny_model, tiny_input_ids):
    """Outside a capture context the registered function is a pass-through and records nothing."""
    model = make_tiny_model("llama")
    name = capture.install("sdpa")
    assert capture.install("sdpa") == name  # idempotent
    model.set_attn_implementation(name)
    stock = make_tiny_model("llama")
    with torch.no_grad():
        assert torch.equal(model(tiny_input_ids).logits, stock(tiny_input_ids).logits)
    first = capture.prefill(model, tiny_input_ids[:, :40])
    second = capture.prefill(model, tiny_input_ids)
    assert first.window_attention.shape[-1] == 40 and second.window_attention.shape[-1] == 80
    assert model.config._attn_implementation == name  # a capture prefill restores what it found


def test_decode_step_not_captured(make_tiny_model, tiny_input_ids):
    """Only each layer's first (prefill) call inside the context is recorded."""
    model = make_tiny_model("llama")
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad(), capture.capture_attention(model, window=8) as recorder:
        model(tiny_input_ids, cache=cache, use_cache=True)
        prefill_window = {k: v.clone() for k, v in recorder.window_attention.items()}
        model(torch.tensor([[7]]), cache=cache, use_cache=True)
    for layer, value in recorder.window_attention.items():
        assert torch.equal(value, prefill_window[layer])


def test_bad_input_shapes(tiny_llama):
    with pytest.raises(ValueError, match="shape"):
        capture.prefill(tiny_llama, torch.ones(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="window"):
        capture.prefill(tiny_llama, torch.ones(1, 5, dtype=torch.long), window=0)
    with pytest.raises(ValueError, match="unknown stock attention"):
        capture.install("no_such_kernel")


def test_eager_stock_kernel_wrapped_unchanged(make_tiny_model, tiny_input_ids):
    """With eager as the stock kernel, the wrapper delegates to the model's own eager function."""
    model = make_tiny_model("llama", attn_impl="eager")
    stock = make_tiny_model("llama", attn_impl="eager")
    with torch.no_grad():
        expected = stock(tiny_input_ids, output_attentions=True)
        with capture.capture_attention(model, window=32) as recorder:
            got = model(tiny_input_ids).logits
    assert torch.equal(got, expected.logits)
    reference = torch.stack([a[0, :, -32:].mean(dim=1) for a in expected.attentions])
    assert (recorder.stacked("window_attention") - reference).abs().max().item() <= 1e-5


def test_sliding_window_mask_is_respected(make_tiny_model, tiny_input_ids):
    """Sliding-window layers: the probabilities use the mask the stock kernel receives."""
    overrides = dict(use_sliding_window=True, sliding_window=16, max_window_layers=2)
    model = make_tiny_model("qwen2", **overrides)
    eager = make_tiny_model("qwen2", attn_impl="eager", **overrides)
    assert "sliding_attention" in model.config.layer_types
    result = capture.prefill(model, tiny_input_ids, window=32, accumulate=True, query_chunk=9)
    with torch.no_grad():
        expected = eager(tiny_input_ids, output_attentions=True)
    reference = torch.stack([a[0, :, -32:].mean(dim=1) for a in expected.attentions])
    assert (result.window_attention - reference).abs().max().item() <= 1e-5
    columns = torch.stack([a[0].sum(dim=1) for a in expected.attentions])
    assert (result.accumulated_attention - columns).abs().max().item() <= 1e-5
    with torch.no_grad():
        assert torch.equal(model(tiny_input_ids).logits, make_tiny_model("qwen2", **overrides)(tiny_input_ids).logits)
