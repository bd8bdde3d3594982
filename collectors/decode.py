"""Decoding the arms of one prefill: evicted caches, batched greedy decode, the stop rule.

An arm's cache is every layer's K and V restricted to its kept positions — one set for the whole
model, one per layer, or one per layer and KV head, each head gathering its own positions with the
same count in every head (:func:`slice_cache`: new tensors, the shared full cache is never
mutated). Eviction happens after the prefill (PAGE Eq. 2), so the first generated token of every
arm is ``argmax(last_logits)`` of the full prefill, and eviction changes tokens 2..n.

Positions (PAGE §4 "Setup", App. F)
-----------------------------------
Decode step s (s = 0 feeds the first generated token) runs with explicit ``position_ids = T + s`` —
continuing from the prompt length T, not from n_kept — so RoPE of the new queries stays aligned with
the keys cached at their original positions (the "attention-mask trick" would silently shift them).
The causal mask is built by transformers from the shortened cache length, which lets the new token
see every cached (kept) key.

Query-agnostic mode
-------------------
With ``question_ids`` the prefill covers the context only; each arm's cache (full or evicted) reads
the Q question tokens at positions T..T+Q−1 in one forward pass and its first token is the argmax
after them, so the first token differs between arms.

Batched arm decoding
--------------------
:func:`decode_arms` decodes a group of arms as one batch. Caches of different lengths are
LEFT-padded to the group's longest kept set; a 2-D attention mask (0 over the padding, 1 over kept
keys and every generated token) hides the padding, and every row uses the same
``position_ids = T + s``. A row that finished (:func:`stop_reason`: EOS / stop string /
max_new_tokens) is dropped from the batch (``Cache.batch_select_indices``); the batch stops when
every row is done.

Grouped-query decode steps
--------------------------
An ``sdpa`` model whose query heads share KV heads decodes through
:func:`collectors.hf.grouped_sdpa_forward` (:func:`collectors.hf.grouped_decode`):
the G query heads of a KV head are the G rows of one SDPA call against that head's keys, instead of
transformers' ``repeat_kv`` copy of the whole (batched, padded) cache for every query head at every
step. Same attention up to float rounding; the manifest records it as ``model.decode_attn_impl``
(:func:`collectors.hf.decode_attn_impl`; part of the run id).

Sliding-window and chunked layers
---------------------------------
A layer whose window (or attention chunk) covers every position the decode feeds (prompt, question
and tokens to generate) attends to every key, as a full layer does; the prefill keeps all its keys
(:func:`collectors.capture.prefill`), and eviction slices it like any other layer. A shorter window
is refused before the decode (:func:`check_decode_windows`; the collector refuses it before
loading, :func:`collectors.model.check_windows`), since the model would then drop keys itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from collectors import hf
from collectors.hf import grouped_decode
from collectors.model import ModelLoadError, check_windows

__all__ = [
    "STOP_REASONS",
    "stop_reason",
    "eos_token_ids",
    "slice_cache",
    "check_decode_windows",
    "decode_arms",
]


#: Why a decode stopped (schema ``stop_reason``): the model's EOS, a stop string of the task, or the
#: task's ``max_new_tokens``. When two hold at the last token, the first in this order is recorded.
STOP_REASONS = ("eos", "stop", "length")


def eos_token_ids(model, tokenizer) -> frozenset[int]:
    """EOS ids: the model's ``generation_config.eos_token_id`` (int or list) ∪ ``tokenizer.eos_token_id``."""
    ids: set[int] = set()
    for source in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                   getattr(tokenizer, "eos_token_id", None)):
        if source is None:
            continue
        ids.update(int(i) for i in ([source] if isinstance(source, int) else source))
    return frozenset(ids)


def _full_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"expected a transformers Cache with .layers, got {type(cache).__name__}")
    if any(getattr(layer, "is_sliding", False) for layer in layers):
        raise ValueError("the prefill cache has sliding-window layers, which drop keys by themselves; build it with "
                         "collectors.capture.prefill (full layers, windows that cover the run)")
    out = []
    for i, layer in enumerate(layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if (keys is None or values is None or keys.ndim != 4 or values.ndim != 4 or keys.shape[0] != 1
                or keys.shape[:3] != values.shape[:3]):
            raise ValueError(f"cache layer {i} must hold (1, H_kv, T, d_k) keys and (1, H_kv, T, d_v) values")
        out.append((keys, values))
    return out


def check_decode_windows(model, n_positions: int) -> None:
    """Refuse a decode that would feed more positions than a sliding window or attention chunk of the
    model holds (:func:`collectors.model.check_windows`, which the collector runs before loading).

    Parameters
    ----------
    model : transformers.PreTrainedModel
    n_positions : int
        Prompt tokens, question tokens and tokens to generate.

    Raises
    ------
    ValueError
    """
    try:
        check_windows(model.config, n_positions)
    except ModelLoadError as err:
        raise ValueError(str(err)) from None


def _index_per_head(positions: torch.Tensor, n_layers: int, n_kv_heads: int) -> torch.Tensor:
    """(n,) shared, (L, n) per-layer or (L, H_kv, n) per-head positions → (L, H_kv, n)."""
    if positions.ndim == 1:
        return positions.expand(n_layers, n_kv_heads, -1)
    if positions.ndim == 2 and positions.shape[0] == n_layers:
        return positions.unsqueeze(1).expand(-1, n_kv_heads, -1)
    if positions.ndim == 3 and tuple(positions.shape[:2]) == (n_layers, n_kv_heads):
        return positions
    raise ValueError(
        f"positions must be (n,), ({n_layers}, n) or ({n_layers}, {n_kv_heads}, n), got {tuple(positions.shape)}"
    )


def slice_cache(cache, positions: torch.Tensor):
    """A new DynamicCache holding every layer's K, V at ``positions`` only.

    Parameters
    ----------
    cache : transformers.DynamicCache
        Full prompt cache, batch 1 (not modified).
    positions : torch.LongTensor
        (n,) shared, (L, n) per-layer or (L, H_kv, n) per-layer-and-KV-head prompt positions; every
        KV head of every layer keeps the same number n.

    K and V may differ in width (multi-head latent attention caches a latent K and a rotary part of
    other widths); each is gathered at its own width.
    """
    layers = _full_layers(cache)
    index = _index_per_head(positions.to(torch.long), len(layers), layers[0][0].shape[1])
    data = []
    for (k, v), idx in zip(layers, index):
        idx = idx.to(k.device)[None, :, :, None]  # (1, H_kv, n, 1)
        data.append((torch.gather(k, 2, idx.expand(1, -1, -1, k.shape[-1])),
                     torch.gather(v, 2, idx.expand(1, -1, -1, v.shape[-1]))))
    return hf.dynamic_cache(data)


def _batched_cache(layers, kept: Sequence[torch.Tensor | None], n_tokens: int):
    """Left-padded batch cache and its (B, n_max) key mask for a group of arms.

    Each KV head gathers its own kept positions (per-head arms), so row b of head j holds the keys
    and values of arm b's kept set for that head; padding is shared by all heads of a row.
    """
    n_layers, n_kv = len(layers), layers[0][0].shape[1]
    device = layers[0][0].device
    lengths = [n_tokens if p is None else int(p.shape[-1]) for p in kept]
    n_max = max(lengths)
    index = torch.zeros((n_layers, n_kv, len(kept), n_max), dtype=torch.long)
    key_mask = torch.zeros((len(kept), n_max), dtype=torch.long)
    for row, (p, n) in enumerate(zip(kept, lengths)):
        p = torch.arange(n_tokens) if p is None else p.to(torch.long).cpu()
        index[:, :, row, n_max - n :] = _index_per_head(p, n_layers, n_kv)
        key_mask[row, n_max - n :] = 1
    index = index.to(device)
    heads = torch.arange(n_kv, device=device)[:, None, None]
    data = []
    for (k, v), idx in zip(layers, index):
        # k: (1, H_kv, T, d) → (H_kv, B, n_max, d) → (B, H_kv, n_max, d)
        data.append((k[0][heads, idx].transpose(0, 1).contiguous(), v[0][heads, idx].transpose(0, 1).contiguous()))
    return hf.dynamic_cache(data), key_mask.to(device), all(n == n_max for n in lengths)


def stop_reason(token_ids: Sequence[int], *, max_new_tokens: int, eos_ids=frozenset(), tokenizer=None,
                stop_strings: Sequence[str] | None = None) -> str | None:
    """Why a decode that produced ``token_ids`` stops now, or None while it goes on.

    The one rule :func:`decode_arms` stops a row by, in :data:`STOP_REASONS` order: ``"eos"`` when the
    last token is an EOS id, ``"stop"`` when the decoded text contains a stop string, ``"length"``
    when ``max_new_tokens`` tokens are out.
    """
    if token_ids and token_ids[-1] in eos_ids:
        return "eos"
    if stop_strings:
        text = tokenizer.decode(list(token_ids), skip_special_tokens=True)
        if any(s in text for s in stop_strings):
            return "stop"
    if len(token_ids) >= max_new_tokens:
        return "length"
    return None


@torch.no_grad()
def decode_arms(
    model,
    prefill,
    kept: Sequence[torch.Tensor | None],
    *,
    max_new_tokens: int,
    eos_ids: frozenset[int] | set[int] = frozenset(),
    tokenizer=None,
    stop_strings: Sequence[str] | None = None,
    return_step_logits: bool = False,
    question_ids: torch.Tensor | None = None,
):
    """Greedy decode of several arms together from one prefill.

    Parameters
    ----------
    model : transformers PreTrainedModel
        The causal LM the prefill came from.
    prefill : Prefill
        ``input_ids`` (1, T), ``past_key_values`` (full DynamicCache), ``last_logits`` (vocab,).
    kept : sequence of LongTensor or None
        Per arm, its kept positions ((n,) shared, (L, n) per layer or (L, H_kv, n) per layer and KV
        head); None = the full cache.
    max_new_tokens : int
        Tokens to generate per arm (the first comes from ``last_logits``, or from the question step).
    eos_ids : set of int
        A row stops after emitting one of these (the EOS is kept in its token ids, as generate does).
    tokenizer, stop_strings
        Optional: a row also stops once its decoded text contains a stop string.
    return_step_logits : bool
        Also return, per arm, the float32 logits of each forward step (step s predicts token s+1;
        with ``question_ids`` the first entry is the question step's, which predicts token 0).
    question_ids : LongTensor (1, Q), optional
        Query-agnostic mode: the prefill holds the context only; each arm's (evicted) cache first
        reads these Q tokens at positions T..T+Q−1, and its first token is the argmax after them.

    Returns
    -------
    list[list[int]] or (list[list[int]], list[list[torch.Tensor]])
        Each arm's tokens; a row stops by :func:`stop_reason`, which also tells afterwards why.

    Notes
    -----
    An ``sdpa`` model with grouped-query attention decodes through
    :func:`collectors.hf.grouped_sdpa_forward` (recorded as the manifest's
    ``model.decode_attn_impl``): the same attention without transformers' per-step copy of the
    cache for every query head, which was most of the decode time at 1,024 tokens on a CPU.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings need a tokenizer")
    with grouped_decode(model):
        n_arms = len(kept)
        if n_arms == 0:
            return ([], []) if return_step_logits else []
        n_tokens = int(prefill.input_ids.shape[-1])
        n_question = 0 if question_ids is None else int(torch.as_tensor(question_ids).numel())
        check_decode_windows(model, n_tokens + n_question + max_new_tokens)
        layers = _full_layers(prefill.past_key_values)
        device = layers[0][0].device

        step_logits: list[list[torch.Tensor]] = [[] for _ in range(n_arms)]
        if question_ids is None:
            first = int(torch.argmax(prefill.last_logits))
            tokens = [[first] for _ in range(n_arms)]
            if stop_reason([first], max_new_tokens=max_new_tokens, eos_ids=eos_ids, tokenizer=tokenizer,
                           stop_strings=stop_strings):
                return (tokens, step_logits) if return_step_logits else tokens
            pending = None
        else:
            question_ids = torch.as_tensor(question_ids, dtype=torch.long).reshape(1, -1).to(device)
            if question_ids.shape[1] < 1:
                raise ValueError("question_ids must hold at least one token")
            tokens = [[] for _ in range(n_arms)]
            pending = question_ids

        cache, key_mask, uniform = _batched_cache(layers, kept, n_tokens)
        if n_arms == 1 or uniform:
            key_mask = None  # no padding: let the kernel use its plain (unmasked) path
        cache_name = hf.cache_keyword(model)
        rows = list(range(n_arms))  # arm index of each active batch row
        position = n_tokens  # position of the next token fed
        while rows:
            batch = len(rows)
            if pending is not None:  # the question, read by every arm's own cache
                input_ids = pending.expand(batch, -1)
                pending = None
            else:
                input_ids = torch.tensor([[tokens[a][-1]] for a in rows], dtype=torch.long, device=device)
            width = input_ids.shape[1]
            position_ids = torch.arange(position, position + width, device=device).expand(batch, -1)
            attention_mask = None
            if key_mask is not None:
                key_mask = torch.cat([key_mask, key_mask.new_ones((batch, width))], dim=1)
                attention_mask = key_mask
            out = model(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=attention_mask,
                **{cache_name: cache},
                use_cache=True,
                logits_to_keep=1,
            )
            cache = getattr(out, cache_name)
            position += width
            logits = out.logits[:, -1, :].float()
            next_ids = torch.argmax(logits, dim=-1).tolist()
            keep_rows = []
            for r, a in enumerate(rows):
                if return_step_logits:
                    step_logits[a].append(logits[r].detach().cpu())
                tokens[a].append(int(next_ids[r]))
                if not stop_reason(tokens[a], max_new_tokens=max_new_tokens, eos_ids=eos_ids, tokenizer=tokenizer,
                                   stop_strings=stop_strings):
                    keep_rows.append(r)
            if len(keep_rows) < batch and keep_rows:
                sel = torch.tensor(keep_rows, dtype=torch.long, device=device)
                cache.batch_select_indices(sel)
                if key_mask is not None:
                    key_mask = key_mask[sel]
            rows = [rows[r] for r in keep_rows]
        return (tokens, step_logits) if return_step_logits else tokens
