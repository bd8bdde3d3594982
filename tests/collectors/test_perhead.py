"""Per-head baselines (``snapkv-perhead``, ``h2o-perhead``) on tiny random multi-layer GQA models.

References written here, independent of the collector's capture and cache gathering:

* kept sets: the model re-run with ``eager`` attention and ``output_attentions=True``; the window
  mean and the accumulated sum are taken from those full attention matrices, averaged over the query
  heads of each KV group, and the top positions are picked by a plain Python sort;
* decoding: the untouched full cache, with every evicted (layer, KV head, position) hidden by an
  additive −inf mask inside an eager attention function registered for the test, against decoding
  from the per-head gathered cache of :mod:`collectors.decode`.
"""

from __future__ import annotations

import sys

import pytest
import torch

from collectors import capture
from collectors.evictors import n_kept, parse, parse_all
from collectors.decode import decode_arms, slice_cache
from collectors.hf import cache_keyword
from collectors.sweep import run_sweep

SMALL = dict(n_sink=4, n_recent=8)
WINDOW = 32
#: Larger random weights than the fixtures' default, so that attention is peaked and differs between
#: heads (at 0.02 every head of a random model attends almost uniformly and keeps the same set).
PEAKED = dict(initializer_range=0.2)


def make_ids(n, seed, vocab=512):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, n), generator=gen)


def brute_select(score, n_tokens, count, n_sink, n_recent):
    """Protected positions + best unprotected (score desc, position asc); also the margin between
    the last kept and the first dropped unprotected score."""
    protected = {t for t in range(n_tokens) if t < n_sink or t >= n_tokens - n_recent}
    free = sorted((t for t in range(n_tokens) if t not in protected), key=lambda t: (-score[t], t))
    n_free = count - len(protected)
    margin = score[free[n_free - 1]] - score[free[n_free]] if 0 < n_free < len(free) else float("inf")
    return sorted(protected | set(free[:n_free])), margin


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_perhead_kept_sets_equal_brute_force_on_eager_attentions(make_tiny_model, family):
    T = 120
    ids = make_ids(T, seed=31)
    model = make_tiny_model(family, **PEAKED)  # sdpa, captured by the collector
    pf = capture.prefill(model, ids, window=WINDOW, accumulate=True)
    eager = make_tiny_model(family, attn_impl="eager", **PEAKED)  # same seed → same weights
    with torch.no_grad():
        attentions = eager(input_ids=ids, output_attentions=True).attentions  # L × (1, H, T, T)
    n_layers = len(attentions)
    n_heads = attentions[0].shape[1]
    n_kv = model.config.num_key_value_heads
    group = n_heads // n_kv
    assert n_layers == 4 and n_kv == 2 and group == 2
    for budget in (0.125, 0.25, 0.5):
        count = n_kept(T, budget, **SMALL)
        for evictor in ("snapkv-perhead", "h2o-perhead"):
            kept = parse(evictor).kept(pf, budget, **SMALL)
            collector_scores = parse(evictor).score(pf).double()
            assert tuple(kept.shape) == (n_layers, n_kv, count)
            for layer in range(n_layers):
                a = attentions[layer][0].double()  # (H, T, T)
                per_head = a[:, T - WINDOW :, :].mean(dim=1) if evictor == "snapkv-perhead" else a.sum(dim=1)
                for j in range(n_kv):
                    heads = range(j * group, (j + 1) * group)
                    score = [sum(float(per_head[h, t]) for h in heads) / group for t in range(T)]
                    expected, margin = brute_select(score, T, count, **SMALL)
                    # float32 capture vs float64-summed eager attention: when the boundary gap exceeds
                    # twice the largest score difference, both must select the same set
                    error = float((collector_scores[layer, j] - torch.tensor(score, dtype=torch.float64)).abs().max())
                    assert error < 1e-4 and margin > 2 * error, (evictor, budget, layer, j, margin, error)
                    assert kept[layer, j].tolist() == expected, (evictor, budget, layer, j)
            # the heads really choose differently (otherwise a shared mask would pass too)
            assert any(not torch.equal(kept[l, 0], kept[l, 1]) for l in range(n_layers))
            assert any(not torch.equal(kept[0, j], kept[l, j]) for l in range(1, n_layers) for j in range(n_kv))


_REF_NAME = "pagestats_test_perhead_mask"
_HIDDEN: dict[int, torch.Tensor] = {}  # layer → (H_q, T) bool, True = evicted for that query head


def _masked_eager(module, query, key, value, attention_mask, *args, **kwargs):
    """The model's own eager attention with the test's per-(layer, head) eviction mask added."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    hidden = _HIDDEN[module.layer_idx]  # (H, T)
    q_len, k_len = query.shape[2], key.shape[2]
    extra = torch.zeros((1, hidden.shape[0], q_len, k_len), dtype=query.dtype)
    extra[..., : hidden.shape[1]] = torch.where(hidden, float("-inf"), 0.0)[:, None, :]
    mask = extra if attention_mask is None else attention_mask + extra
    return eager(module, query, key, value, mask, *args, **kwargs)


def _register_reference():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if _REF_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(_REF_NAME, _masked_eager)
        AttentionMaskInterface.register(_REF_NAME, AttentionMaskInterface._global_mapping["eager"])


def _reference_decode(model, pf, positions, n_heads, steps):
    """Greedy decode from the FULL cache with the evicted (layer, KV head, position) masked out."""
    T = pf.n_tokens
    n_layers, n_kv, _ = positions.shape
    group = n_heads // n_kv
    _HIDDEN.clear()
    for layer in range(n_layers):
        kept_kv = torch.zeros((n_kv, T), dtype=torch.bool)
        kept_kv.scatter_(1, positions[layer], True)
        _HIDDEN[layer] = ~kept_kv.repeat_interleave(group, dim=0)  # query head h → KV head h // group
    cache = slice_cache(pf.past_key_values, torch.arange(T))  # a copy of the full cache
    token = int(pf.last_logits.argmax())
    tokens, logits = [token], []
    with torch.no_grad():
        for step in range(steps - 1):
            out = model(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[T + step]]),
                        use_cache=True, **{cache_keyword(model): cache})
            cache = getattr(out, cache_keyword(model))
            logits.append(out.logits[0, -1].float())
            token = int(logits[-1].argmax())
            tokens.append(token)
    return tokens, logits


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_perhead_gathered_cache_decodes_like_full_cache_with_perhead_mask(make_tiny_model, family):
    T, steps = 110, 6
    model = make_tiny_model(family, **PEAKED)
    pf = capture.prefill(model, make_ids(T, seed=41), accumulate=True)
    arms = [parse("snapkv-perhead").kept(pf, 0.25, **SMALL), parse("h2o-perhead").kept(pf, 0.5, **SMALL),
            parse("snapkv-perhead").kept(pf, 0.125, **SMALL)]
    assert all(p.ndim == 3 for p in arms)
    # batched (left-padded, three different lengths) decode of the per-head gathered caches
    tokens, step_logits = decode_arms(model, pf, arms, max_new_tokens=steps, return_step_logits=True)
    _register_reference()
    reference = make_tiny_model(family, attn_impl=_REF_NAME, **PEAKED)
    n_heads = model.config.num_attention_heads
    for positions, toks, logits in zip(arms, tokens, step_logits):
        ref_tokens, ref_logits = _reference_decode(reference, pf, positions, n_heads, steps)
        assert toks == ref_tokens
        for x, y in zip(logits, ref_logits):
            assert torch.allclose(x, y, atol=1e-4, rtol=0), float((x - y).abs().max())
    # eviction changed the logits (so the masks were not vacuous)
    full_tokens, full_logits = decode_arms(model, pf, [None], max_new_tokens=steps, return_step_logits=True)
    assert not all(torch.allclose(x, y, atol=1e-3) for x, y in zip(step_logits[0], full_logits[0]))


def test_perhead_arms_in_the_sweep(make_tiny_model):
    """run_sweep decodes per-head arms from the one prefill like a single-arm decode of each."""

    class Tok:
        eos_token_id = 2

        def decode(self, ids, skip_special_tokens=False):
            return " ".join(map(str, ids))

    model = make_tiny_model("qwen2", **PEAKED)
    pf = capture.prefill(model, make_ids(100, seed=5), accumulate=True)
    budgets = (0.125, 0.5, 1.0)
    full, arms = run_sweep(model, Tok(), pf, evictors=parse_all(("snapkv-perhead", "h2o-perhead", "snapkv")),
                           budgets=budgets, max_new_tokens=6, **SMALL)
    for arm in arms:
        if arm.budget == 1.0:
            assert arm.token_ids == full.token_ids
            continue
        (single,) = decode_arms(model, pf, [parse(arm.evictor).kept(pf, arm.budget, **SMALL)], max_new_tokens=6)
        assert arm.token_ids == single and arm.n_kept == n_kept(100, arm.budget, **SMALL)
