"""The capture under bfloat16 and float16 weights (CPU).

* Exactness: the window probabilities are computed in float32 from the low-precision q and k the
  stock kernel receives; they equal a float64 computation from those same q and k to 1e-7, while a
  softmax taken in the weights' dtype misses by far more (so the check can fail).
* Against an fp32 eager reference (the same bf16-/fp16-rounded weights run in float32 with
  ``output_attentions``): stated tolerance = the dtype's machine epsilon (2⁻⁷ for bfloat16, 2⁻¹⁰ for
  float16) in absolute probability. What is left is the rounding of the activations through the
  layers, which no capture can undo.
* The stock sdpa kernel's output is untouched: logits are bit-identical to a stock run in the same dtype.

The tiny model's q and k projections are scaled ×8 so attention is peaked (max window probability
over 5/T on 200 keys) rather than near-uniform, where every error would look small.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from collectors import capture  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
T, W = 200, 32


def sharp_model(make_tiny_model, dtype, attn_impl="sdpa"):
    model = make_tiny_model("llama", attn_impl=attn_impl)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    return model.to(dtype)


@pytest.fixture(scope="module")
def input_ids():
    return torch.randint(3, 512, (1, T), generator=torch.Generator().manual_seed(7))


def kernel_inputs(model, input_ids):
    """Per layer, the (query, key, scaling) the stock sdpa kernel receives, recorded by a pass-through
    attention function registered beside it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    seen = {}
    sdpa = AttentionInterface._global_mapping["sdpa"]

    def record(module, query, key, value, attention_mask, **kwargs):
        assert attention_mask is None or attention_mask.dtype == torch.bool or attention_mask.ndim == 4
        seen[module.layer_idx] = (query.clone(), key.clone(), kwargs["scaling"])
        return sdpa(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("test_record_qk", record)
    AttentionMaskInterface.register("test_record_qk", AttentionMaskInterface._global_mapping["sdpa"])
    model.set_attn_implementation("test_record_qk")
    try:
        with torch.no_grad():
            model(input_ids)
    finally:
        model.set_attn_implementation("sdpa")
    return [seen[i] for i in range(len(seen))]


def window_reference(query, key, scaling, dtype):
    """ā of one layer from q, k in ``dtype``: softmax of the last W rows (causal), averaged; GQA keys repeated."""
    n_heads, n_kv = query.shape[1], key.shape[1]
    q = query[0, :, -W:].to(dtype)
    k = key[0].repeat_interleave(n_heads // n_kv, dim=0).to(dtype)
    s = (q @ k.transpose(1, 2)) * scaling
    rows = torch.arange(T - W, T)[:, None]
    s = s.masked_fill(torch.arange(T)[None, :] > rows, float("-inf"))
    return torch.softmax(s, dim=-1).double().mean(dim=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_window_probabilities_are_float32_from_the_kernels_low_precision_qk(make_tiny_model, input_ids, dtype):
    model = sharp_model(make_tiny_model, DTYPES[dtype])
    got = capture.prefill(model, input_ids, window=W).window_attention
    assert got.dtype == torch.float32
    qk = kernel_inputs(model, input_ids)
    assert all(q.dtype == DTYPES[dtype] for q, _, _ in qk)
    exact = torch.stack([window_reference(q, k, s, torch.float64) for q, k, s in qk])
    low = torch.stack([window_reference(q, k, s, DTYPES[dtype]) for q, k, s in qk])
    error = (got.double() - exact).abs().max().item()
    assert error <= 1e-7
    assert (low - exact).abs().max().item() > 100 * 1e-7  # a softmax in the weights' dtype would fail


@pytest.mark.parametrize("dtype", DTYPES)
def test_low_precision_capture_within_epsilon_of_fp32_eager(make_tiny_model, input_ids, dtype):
    model = sharp_model(make_tiny_model, DTYPES[dtype])
    got = capture.prefill(model, input_ids, window=W).window_attention
    reference_model = sharp_model(make_tiny_model, DTYPES[dtype], attn_impl="eager").float()  # same rounded weights
    with torch.no_grad():
        attentions = reference_model(input_ids, output_attentions=True).attentions
    reference = torch.stack([a[0, :, -W:, :].mean(dim=1) for a in attentions])
    assert reference.max().item() > 5 / T  # peaked, not uniform (1/T)
    tolerance = torch.finfo(DTYPES[dtype]).eps
    assert (got - reference).abs().max().item() <= tolerance


@pytest.mark.parametrize("dtype", DTYPES)
def test_low_precision_logits_identical_to_stock_sdpa(make_tiny_model, input_ids, dtype):
    stock = sharp_model(make_tiny_model, DTYPES[dtype])
    captured = sharp_model(make_tiny_model, DTYPES[dtype])
    with torch.no_grad():
        expected = stock(input_ids).logits
        with capture.capture_attention(captured, window=W, accumulate=True):
            got = captured(input_ids).logits
    assert got.dtype == DTYPES[dtype] and torch.equal(got, expected)
