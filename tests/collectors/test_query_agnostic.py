"""Query-agnostic mode: the context is prefilled and evicted alone, the question comes afterwards.

Reference, independent of the sweep's batching and cache gathering: the context is prefilled with a
plain forward pass, its cache is pruned by hand (each layer's K and V indexed at the kept positions),
and ``model.generate`` runs on the question from that cache, with explicit position ids continuing
from the context length so that RoPE stays aligned.
"""

from __future__ import annotations

import pytest
import torch

from collectors import capture
from collectors.evictors import n_kept, parse, parse_all
from collectors.hf import cache_keyword
from collectors.sweep import run_sweep

SMALL = dict(n_sink=4, n_recent=8)
PEAKED = dict(initializer_range=0.2)  # peaked attention: evictions matter and heads differ


class Tok:
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i in (0, 1, 2)))


def ids_of(n, seed):
    return torch.randint(3, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def prune_by_hand(model, context, positions):
    """Plain prefill of ``context``; a DynamicCache holding, per layer (and KV head), the kept K, V."""
    from transformers import DynamicCache

    name = cache_keyword(model)
    with torch.no_grad():
        out = model(input_ids=context, use_cache=True, **{name: DynamicCache(config=model.config)})
    full = getattr(out, name)
    data = []
    for layer, cached in enumerate(full.layers):
        keys, values = cached.keys, cached.values  # (1, H_kv, T, d)
        if positions.ndim == 1:
            data.append((keys[:, :, positions], values[:, :, positions]))
        else:  # per KV head: head j keeps positions[layer, j]
            idx = positions[layer]
            data.append((torch.stack([keys[0, j, idx[j]] for j in range(idx.shape[0])])[None],
                         torch.stack([values[0, j, idx[j]] for j in range(idx.shape[0])])[None]))
    return DynamicCache(ddp_cache_data=data)


def generate_after_pruning(model, context, question, positions, max_new_tokens):
    T, Q = context.shape[1], question.shape[1]
    cache = prune_by_hand(model, context, positions)
    kept_count = positions.shape[-1]
    # generate reads the tokens beyond the cache length: the kept context ids stand for the cached part
    placeholder = torch.full((1, kept_count), 3, dtype=torch.long)
    position_ids = torch.cat([torch.zeros(kept_count, dtype=torch.long), torch.arange(T, T + Q)])[None]
    with torch.no_grad():
        out = model.generate(torch.cat([placeholder, question], dim=1), do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=0, position_ids=position_ids,
                             **{cache_keyword(model): cache})
    return out[0, kept_count + Q:].tolist()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_query_agnostic_arms_equal_generate_on_a_hand_pruned_cache(make_tiny_model, family):
    model = make_tiny_model(family, **PEAKED)
    T, Q, new = 96, 14, 8
    context, question = ids_of(T, 3), ids_of(Q, 4)
    pf = capture.prefill(model, context, accumulate=True)
    evictors = ("snapkv", "h2o", "streamingllm", "snapkv-perhead")
    budgets = (0.125, 0.5, 1.0)
    full, arms = run_sweep(model, Tok(), pf, evictors=parse_all(evictors), budgets=budgets, max_new_tokens=new,
                           question_ids=question, **SMALL)
    # the full arm: the whole prompt, context then question, generated normally
    with torch.no_grad():
        reference_full = model.generate(torch.cat([context, question], dim=1), do_sample=False,
                                        max_new_tokens=new, min_new_tokens=0)[0, T + Q:].tolist()
    assert full.token_ids == reference_full and full.n_kept == T + Q
    differs = 0
    for arm in arms:
        positions = parse(arm.evictor).kept(pf, arm.budget, **SMALL)
        assert arm.n_kept == n_kept(T, arm.budget, **SMALL) + Q
        expected = generate_after_pruning(model, context, question, positions, new)
        assert arm.token_ids == expected, (arm.evictor, arm.budget)
        differs += arm.token_ids != full.token_ids
    assert differs > 0  # eviction changed some continuation: the comparison is not vacuous


def test_query_agnostic_differs_from_query_aware(make_tiny_model):
    """The same prompt split at the question: query-aware eviction scores with the question in the
    window, query-agnostic without it, so the kept sets differ."""
    model = make_tiny_model("llama", **PEAKED)
    context, question = ids_of(90, 8), ids_of(20, 9)
    aware = capture.prefill(model, torch.cat([context, question], dim=1))
    agnostic = capture.prefill(model, context)
    a = set(parse("snapkv").kept(aware, 0.25, **SMALL).tolist()) - set(range(90, 110))
    b = set(parse("snapkv").kept(agnostic, 0.25, **SMALL).tolist())
    assert a != b


def test_question_must_not_be_empty(make_tiny_model):
    model = make_tiny_model("llama")
    pf = capture.prefill(model, ids_of(50, 1))
    with pytest.raises(ValueError, match="question_ids"):
        run_sweep(model, Tok(), pf, evictors=parse_all(("snapkv",)), budgets=(0.5,), max_new_tokens=2,
                  question_ids=torch.zeros((1, 0), dtype=torch.long))
