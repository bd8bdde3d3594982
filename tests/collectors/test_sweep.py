"""One-prefill sweep on tiny random Llama / Qwen2 (GQA, fp32, CPU) against independent references.

References: ``model.generate(do_sample=False)`` for the full arm; for an evicted arm, the full
cache with the evicted positions hidden by a 2-D padding mask (no slicing) and the new token at its
original position T — and, on a one-layer model, a re-run of the model over only the kept tokens at
their original position ids (there the kept keys/values are exactly those of the full prefill).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from collectors import capture, decode, hf
from collectors.decode import decode_arms, eos_token_ids, slice_cache
from collectors.evictors import parse, parse_all
from collectors.sweep import ArmResult, run_sweep

EVICTORS = ("snapkv", "h2o", "streamingllm", "streamingllm-fixed", "pyramidkv", "snapkv-perlayer")
BUDGETS = (0.0625, 0.25, 0.5, 0.875, 1.0)
SMALL = dict(n_sink=4, n_recent=8)  # so budgets give distinct kept sets on short prompts


class FakeTokenizer:
    """Tokenizer-free path: ids in, space-joined ids out; special ids are 0, 1, 2."""

    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i in (0, 1, 2)))


def make_ids(n, seed=7, vocab=512):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, n), generator=gen)


@pytest.fixture(params=["llama", "qwen2"])
def family(request):
    return request.param


def test_full_and_budget_one_arms_equal_generate(make_tiny_model, family):
    model = make_tiny_model(family)
    ids = make_ids(90)
    pf = capture.prefill(model, ids, accumulate=True)
    full, arms = run_sweep(model, FakeTokenizer(), pf, evictors=parse_all(("snapkv", "h2o")), budgets=(0.25, 1.0),
                           max_new_tokens=12, **SMALL)
    with torch.no_grad():
        ref = model.generate(ids, do_sample=False, max_new_tokens=12, min_new_tokens=0)[0, 90:].tolist()
    assert full.token_ids == ref
    assert full.evictor == "full" and full.n_kept == 90
    for arm in arms:
        if arm.budget == 1.0:
            assert arm.token_ids == ref and arm.n_kept == 90
    # the audit decodes budget 1.0 through the sliced, batched path and must agree silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, audited = run_sweep(model, FakeTokenizer(), pf, evictors=parse_all(("snapkv", "streamingllm-fixed")),
                               budgets=(0.25, 1.0), max_new_tokens=12, audit=True, **SMALL)
    assert [a.token_ids for a in audited if a.budget == 1.0] == [ref, ref]
    assert full.text == FakeTokenizer().decode(ref, skip_special_tokens=True)


@pytest.mark.parametrize("evictor", ["snapkv", "h2o", "streamingllm", "pyramidkv"])
def test_evicted_first_step_logits_match_masked_full_cache(make_tiny_model, family, evictor):
    model = make_tiny_model(family)
    T = 120
    ids = make_ids(T, seed=11)
    pf = capture.prefill(model, ids, accumulate=True)
    kept = [parse(evictor).kept(pf, b, **SMALL) for b in (0.125, 0.5)]
    _, step_logits = decode_arms(model, pf, kept, max_new_tokens=2, return_step_logits=True)
    first = int(pf.last_logits.argmax())
    for positions, logits in zip(kept, step_logits):
        # reference: untouched full cache, evicted positions masked as padding, token at position T
        full_copy = slice_cache(pf.past_key_values, torch.arange(T))
        mask = torch.zeros((1, T + 1), dtype=torch.long)
        mask[0, positions] = 1
        mask[0, T] = 1
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([[first]]), position_ids=torch.tensor([[T]]),
                        attention_mask=mask, cache=full_copy, use_cache=True).logits[0, -1]
        assert torch.allclose(logits[0], ref, atol=1e-5, rtol=0)
    # the shared full cache was not modified by slicing/decoding
    assert pf.past_key_values.get_seq_length() == T


def test_evicted_first_step_logits_match_rerun_on_kept_tokens(make_tiny_model, family):
    model = make_tiny_model(family, num_hidden_layers=1)
    T = 100
    ids = make_ids(T, seed=13)
    pf = capture.prefill(model, ids)
    positions = parse("snapkv").kept(pf, 0.25, **SMALL)
    _, step_logits = decode_arms(model, pf, [positions], max_new_tokens=2, return_step_logits=True)
    first = int(pf.last_logits.argmax())
    with torch.no_grad():
        # re-run only the kept tokens at their original position ids, then the new token at T
        rerun = model(input_ids=ids[:, positions], position_ids=positions[None], use_cache=True)
        ref = model(input_ids=torch.tensor([[first]]), position_ids=torch.tensor([[T]]),
                    cache=rerun.cache, use_cache=True).logits[0, -1]
    assert torch.allclose(step_logits[0][0], ref, atol=1e-5, rtol=0)


def test_slice_cache_per_layer_matches_indexing(tiny_llama):
    pf = capture.prefill(tiny_llama, make_ids(60))
    positions = parse("snapkv-perlayer").kept(pf, 0.25, **SMALL)
    sliced = slice_cache(pf.past_key_values, positions)
    for layer, (orig, new) in enumerate(zip(pf.past_key_values.layers, sliced.layers)):
        for j, t in enumerate(positions[layer].tolist()):
            assert torch.equal(new.keys[0, :, j], orig.keys[0, :, t])
            assert torch.equal(new.values[0, :, j], orig.values[0, :, t])


def test_per_layer_arm_with_identical_rows_equals_shared_arm(tiny_qwen2):
    pf = capture.prefill(tiny_qwen2, make_ids(100, seed=3))
    shared = parse("snapkv").kept(pf, 0.25, **SMALL)
    stacked = shared.unsqueeze(0).expand(len(pf.past_key_values.layers), -1)
    _, (a, b) = decode_arms(tiny_qwen2, pf, [shared, stacked], max_new_tokens=3, return_step_logits=True)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, atol=1e-6, rtol=0)


def test_batched_equals_per_arm_decoding(make_tiny_model, family):
    model = make_tiny_model(family)
    T = 150
    pf = capture.prefill(model, make_ids(T, seed=21), accumulate=True)
    kw = dict(evictors=parse_all(EVICTORS), budgets=BUDGETS, max_new_tokens=10, **SMALL)
    full_b, arms_b = run_sweep(model, FakeTokenizer(), pf, batch_arms=True, max_batch=8, **kw)
    full_u, arms_u = run_sweep(model, FakeTokenizer(), pf, batch_arms=False, **kw)
    assert full_b.token_ids == full_u.token_ids
    assert [(a.evictor, a.budget, a.n_kept) for a in arms_b] == [(a.evictor, a.budget, a.n_kept) for a in arms_u]
    assert [a.token_ids for a in arms_b] == [a.token_ids for a in arms_u]
    assert len(arms_b) == len(EVICTORS) * len(BUDGETS)
    # eviction actually changed some continuation (the test is not vacuous)
    assert any(a.token_ids != full_b.token_ids for a in arms_b)
    # and per-step logits agree closely between a padded batch and single-arm decodes
    kept = [parse(e).kept(pf, b, **SMALL) for e in ("snapkv", "streamingllm") for b in (0.0625, 0.5)]
    _, batched = decode_arms(model, pf, kept, max_new_tokens=5, return_step_logits=True)
    for positions, logits in zip(kept, batched):
        _, (single,) = decode_arms(model, pf, [positions], max_new_tokens=5, return_step_logits=True)
        assert len(single) == len(logits)
        for x, y in zip(logits, single):
            assert torch.allclose(x, y, atol=1e-5, rtol=0)


def test_eos_and_stop_strings_stop_rows(tiny_llama):
    pf = capture.prefill(tiny_llama, make_ids(80, seed=2))
    full, _ = run_sweep(tiny_llama, FakeTokenizer(), pf, evictors=(), budgets=(), max_new_tokens=8)
    toks = full.token_ids
    assert len(toks) == 8 or toks[-1] == 2
    # make the third generated token an EOS: every arm must stop right after it
    tok = FakeTokenizer()
    tok.eos_token_id = toks[2]
    tiny_llama.generation_config.eos_token_id = None
    full2, arms2 = run_sweep(tiny_llama, tok, pf, evictors=parse_all(("streamingllm",)), budgets=(1.0,),
                             max_new_tokens=8)
    first_eos = toks.index(toks[2]) + 1
    assert full2.token_ids == toks[:first_eos] and arms2[0].token_ids == toks[:first_eos]
    # stop strings: stop as soon as the decoded text contains the second token's text
    full3, _ = run_sweep(tiny_llama, FakeTokenizer(), pf, evictors=(), budgets=(), max_new_tokens=8,
                         stop_strings=[str(toks[1])])
    assert full3.token_ids == toks[: len(full3.token_ids)] and str(toks[1]) in full3.text
    assert len(full3.token_ids) <= 2


def test_eos_ids_union():
    class Gen:
        eos_token_id = [5, 6]

    model = type("M", (), {"generation_config": Gen()})()
    assert eos_token_ids(model, FakeTokenizer()) == {2, 5, 6}


def test_bad_arguments(tiny_llama):
    pf = capture.prefill(tiny_llama, make_ids(40))
    with pytest.raises(ValueError, match="evictor"):
        run_sweep(tiny_llama, FakeTokenizer(), pf, evictors=parse_all(("nope",)), budgets=(0.5,), max_new_tokens=2)
    with pytest.raises(ValueError, match="budget"):
        run_sweep(tiny_llama, FakeTokenizer(), pf, evictors=parse_all(("snapkv",)), budgets=(0.0,), max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        run_sweep(tiny_llama, FakeTokenizer(), pf, evictors=parse_all(("snapkv",)), budgets=(0.5,), max_new_tokens=0)
    with pytest.raises(ValueError, match="accumulated_attention"):
        run_sweep(tiny_llama, FakeTokenizer(), pf, evictors=parse_all(("h2o",)), budgets=(0.5,), max_new_tokens=2)


def test_arm_result_is_a_dataclass():
    r = ArmResult("snapkv", 0.5, 10, [1, 2], "x", 1.0, "length")
    assert r.n_kept == 10 and r.token_ids == [1, 2] and r.n_generated == 2 and r.stop_reason == "length"


@pytest.mark.parametrize("masked", [True, False])
def test_grouped_sdpa_equals_transformers_sdpa_on_one_query(masked):
    """One new token per row: the grouped call (G query heads as G rows against their KV head)
    equals transformers' stock ``sdpa`` (``repeat_kv`` + SDPA) up to float rounding, with a
    left-padding key mask or none; more than one query per row is the stock kernel itself."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    class Attn(torch.nn.Module):
        num_key_value_groups, is_causal = 3, True

    gen = torch.Generator().manual_seed(5)
    b, h_kv, n, d = 4, 2, 37, 16
    q, k, v = (torch.randn(b, h, m, d, generator=gen) for h, m in ((6, 1), (h_kv, n), (h_kv, n)))
    mask = torch.ones(b, 1, 1, n, dtype=torch.bool)
    for row, pad in enumerate((0, 5, 11, 30)):
        mask[row, :, :, :pad] = False
    mask = mask if masked else None
    module = Attn().eval()
    stock, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    grouped, _ = hf.grouped_sdpa_forward(module, q, k, v, mask, scaling=0.25)
    assert grouped.shape == stock.shape == (b, 1, 6, d)
    assert torch.allclose(grouped, stock, atol=1e-6, rtol=0)
    # a query-major check by hand: query head 4 reads KV head 1 (repeat_kv's order j·G + g)
    ref = torch.softmax((q[:, 4] @ k[:, 1].transpose(-1, -2)) * 0.25 + (0 if mask is None else
                        torch.where(mask[:, 0], 0.0, float("-inf"))), dim=-1) @ v[:, 1]
    assert torch.allclose(grouped[:, 0, 4], ref[:, 0], atol=1e-6, rtol=0)
    wide = torch.randn(b, 6, 3, d, generator=gen)  # three queries per row: the stock kernel, bit for bit
    causal = None if mask is None else mask.expand(b, 1, 3, n)
    assert torch.equal(hf.grouped_sdpa_forward(module, wide, k, v, causal, scaling=0.25)[0],
                       sdpa_attention_forward(module, wide, k, v, causal, scaling=0.25)[0])


def test_grouped_decode_keeps_tokens_and_restores_the_model(make_tiny_model, family, monkeypatch):
    """Decoding padded batches of evicted arms through the grouped path gives the stock path's
    tokens and step logits (to 1e-5); the model's implementation is put back, and a model that is
    not ``sdpa`` is left alone."""
    import contextlib

    model = make_tiny_model(family)
    pf = capture.prefill(model, make_ids(140, seed=33), accumulate=True)
    kept = [parse(e).kept(pf, b, **SMALL) for e in ("snapkv", "h2o", "streamingllm") for b in (0.0625, 0.25, 0.5)]
    toks, logits = decode_arms(model, pf, kept, max_new_tokens=8, return_step_logits=True)
    assert model.config._attn_implementation == "sdpa"
    monkeypatch.setattr(decode, "grouped_decode", lambda m: contextlib.nullcontext())
    ref_toks, ref_logits = decode_arms(model, pf, kept, max_new_tokens=8, return_step_logits=True)
    assert toks == ref_toks
    for got, ref in zip(logits, ref_logits):
        assert len(got) == len(ref) and all(torch.allclose(x, y, atol=1e-5, rtol=0) for x, y in zip(got, ref))
    eager = make_tiny_model(family, attn_impl="eager")
    with hf.grouped_decode(eager):
        assert eager.config._attn_implementation == "eager"
    with hf.grouped_decode(model):
        assert model.config._attn_implementation == hf.GROUPED_SDPA
    assert model.config._attn_implementation == "sdpa"
    assert hf.decode_attn_impl("sdpa", 4, 2) == hf.GROUPED_SDPA
    assert hf.decode_attn_impl("sdpa", 4, 4) == "sdpa" and hf.decode_attn_impl("eager", 4, 2) == "eager"
