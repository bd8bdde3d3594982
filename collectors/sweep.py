"""One prefill → the full-KV arm and every (evictor, budget) arm, decoded greedily in batches.

Why one prefill serves every arm (docs/COLLECTION.md)
--------------------------------------------
Eviction happens after the prefill (PAGE Eq. 2: "the gate fires once per input, at prefill, before any
decode step"), so the prompt's hidden states, its KV cache and the logits at the last prompt position
are the same for every arm. Hence the first generated token of every arm is ``argmax(last_logits)``
of the full prefill, exactly as in kvpress, where the press compresses each layer's cache after that
layer's prefill forward; eviction changes tokens 2..n. An arm's cache is every layer's K and V
restricted to its kept positions — one set for the whole model, one per layer, or one per layer and
KV head, each head gathering its own positions with the same count in every head
(:func:`slice_cache`: new tensors, the shared full cache is never mutated).

Positions (PAGE §4 "Setup", App. F)
-----------------------------------
Decode step s (s = 0 feeds the first generated token) runs with explicit ``position_ids = T + s`` —
continuing from the prompt length T, not from n_kept — so RoPE of the new queries stays aligned with
the keys cached at their original positions (the "attention-mask trick" would silently shift them).
The causal mask is built by transformers from the shortened cache length, which lets the new token
see every cached (kept) key.

Query-agnostic mode
-------------------
With ``question_ids`` the prefill covers the context only: D and every eviction are computed there,
then each arm's cache (full or evicted) reads the Q question tokens at positions T..T+Q−1 in one
forward pass and its first token is the argmax after them, so the first token differs between arms.

Grouped-query decode steps
--------------------------
An ``sdpa`` model whose query heads share KV heads decodes through
:func:`collectors.capture.grouped_sdpa_forward`: the G query heads of a KV head are the G rows of
one SDPA call against that head's keys, instead of transformers' ``repeat_kv`` copy of the whole
(batched, padded) cache for every query head at every step. Same attention up to float rounding;
the manifest records it as ``model.decode_attn_impl`` (part of the run id).

Sliding-window and chunked layers
---------------------------------
A layer whose window (or attention chunk) covers every position the decode feeds (prompt, question
and tokens to generate) attends to every key, as a full layer does; the prefill keeps all its keys
(:func:`collectors.capture.prefill`), and eviction slices it like any other layer. A shorter window
is refused before the decode (:func:`check_decode_windows`; the collector refuses it before
loading, :func:`collectors.model.check_windows`), since the model would then drop keys itself.

Batched arm decoding
--------------------
Arms are grouped (longest cache first, at most ``max_batch`` per group) and decoded as one batch.
Caches of different lengths are LEFT-padded to the group's longest kept set; a 2-D attention mask
(0 over the padding, 1 over kept keys and every generated token) hides the padding, and every row
uses the same ``position_ids = T + s``. A row that finished (EOS / stop string / max_new_tokens) is
dropped from the batch (``Cache.batch_select_indices``); the batch stops when every row is done.
Arms whose kept set equals another's (e.g. every ``streamingllm-fixed`` budget, or short prompts where
protection dominates) are decoded once. Arms keeping all T positions (budget 1.0, or n_kept ≥ T)
ARE the full-KV arm and are not decoded again unless ``audit=True``, which decodes them through the
eviction path (sliced cache, batch, padding) and warns (:class:`AuditWarning`) on any token mismatch
with the full arm (PAGE App. F "pipeline audit").

``decode_ms`` of an arm is the wall time of the batch that decoded it divided by the number of
distinct decodes in that batch (an amortised share, so the shares add up to the sweep's decode time);
arms that reuse another decode carry that decode's share.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from collectors.capture import grouped_decode
from collectors.evict import EVICTORS, is_evictor, kept_positions
from collectors.model import cache_keyword
from pagestats import defaults

__all__ = [
    "ArmResult",
    "AuditWarning",
    "STOP_REASONS",
    "stop_reason",
    "eos_token_ids",
    "slice_cache",
    "check_decode_windows",
    "decode_arms",
    "run_sweep",
]


class AuditWarning(UserWarning):
    """A budget-1.0 arm decoded through the eviction path differs from the full-KV arm."""


#: Why a decode stopped (schema ``stop_reason``): the model's EOS, a stop string of the task, or the
#: task's ``max_new_tokens``. When two hold at the last token, the first in this order is recorded.
STOP_REASONS = ("eos", "stop", "length")


@dataclass
class ArmResult:
    """Outcome of one arm: its evictor and nominal budget, positions kept, greedy tokens and text,
    and why its decode stopped (:data:`STOP_REASONS`)."""

    evictor: str
    budget: float
    n_kept: int
    token_ids: list[int]
    text: str
    decode_ms: float
    stop_reason: str

    @property
    def n_generated(self) -> int:
        """Tokens the arm generated (its EOS included, as ``generate`` counts them)."""
        return len(self.token_ids)


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
    from collectors.model import ModelLoadError, check_windows

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
    from transformers import DynamicCache

    layers = _full_layers(cache)
    index = _index_per_head(positions.to(torch.long), len(layers), layers[0][0].shape[1])
    data = []
    for (k, v), idx in zip(layers, index):
        idx = idx.to(k.device)[None, :, :, None]  # (1, H_kv, n, 1)
        data.append((torch.gather(k, 2, idx.expand(1, -1, -1, k.shape[-1])),
                     torch.gather(v, 2, idx.expand(1, -1, -1, v.shape[-1]))))
    return DynamicCache(ddp_cache_data=data)


def _batched_cache(layers, kept: Sequence[torch.Tensor | None], n_tokens: int):
    """Left-padded batch cache and its (B, n_max) key mask for a group of arms.

    Each KV head gathers its own kept positions (per-head arms), so row b of head j holds the keys
    and values of arm b's kept set for that head; padding is shared by all heads of a row.
    """
    from transformers import DynamicCache

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
    return DynamicCache(ddp_cache_data=data), key_mask.to(device), all(n == n_max for n in lengths)


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
    :func:`collectors.capture.grouped_sdpa_forward` (recorded as the manifest's
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
        cache_name = cache_keyword(model)
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


def _check_sweep_args(evictors, budgets, max_batch):
    evictors = tuple(evictors)
    budgets = tuple(float(b) for b in budgets)
    for e in evictors:
        if not is_evictor(e):
            raise ValueError(f"unknown evictor {e!r}; choose from {EVICTORS} or kvpress:<Press>")
    for b in budgets:
        if not (0.0 < b <= 1.0):
            raise ValueError(f"budget must lie in (0, 1], got {b!r}")
    if len(set(evictors)) != len(evictors) or len(set(budgets)) != len(budgets):
        raise ValueError("evictors and budgets must not repeat")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
    return evictors, budgets


def run_sweep(
    model,
    tokenizer,
    prefill,
    *,
    evictors: Sequence[str],
    budgets: Sequence[float],
    max_new_tokens: int,
    n_sink: int = defaults.N_SINK,
    n_recent: int = defaults.N_RECENT,
    batch_arms: bool = True,
    max_batch: int = 16,
    stop_strings: Sequence[str] | None = None,
    audit: bool = False,
    pool_kernel: int = 1,
    question_ids: torch.Tensor | None = None,
) -> tuple[ArmResult, list[ArmResult]]:
    """Full-KV arm and one arm per (evictor, budget), all from one prefill.

    Parameters
    ----------
    model, tokenizer
        The causal LM of the prefill and its tokenizer (``decode``, ``eos_token_id``).
    prefill : Prefill
        From :func:`collectors.capture.prefill` (``accumulate=True`` when an evictor of
        :data:`collectors.evict.ACCUMULATED_EVICTORS` is swept).
    evictors : sequence of str
        Names from :data:`collectors.evict.EVICTORS`.
    budgets : sequence of float
        Nominal budgets in (0, 1] (docs/COLLECTION.md: ``pagestats.defaults.BUDGETS``).
    max_new_tokens : int
        Greedy tokens per arm (the task's tokens to generate).
    n_sink, n_recent : int
        Protected first/last positions (4 and 32).
    batch_arms : bool
        Decode arms together (left-padded caches) rather than one at a time.
    max_batch : int
        Most arms per decode batch.
    stop_strings : sequence of str, optional
        Extra stop condition on the decoded text.
    audit : bool
        Decode arms that keep every position through the eviction path and warn on any mismatch with
        the full arm (PAGE App. F).
    pool_kernel : int
        Optional SnapKV-family pooling width (see :mod:`collectors.evict`).
    question_ids : LongTensor (1, Q), optional
        Query-agnostic mode: ``prefill`` covers the context only (T tokens), budgets and evictions
        apply to it, and every arm then reads the question from its evicted cache
        (:func:`decode_arms`). ``n_kept`` then counts the kept context positions plus the Q question
        tokens, the cache an arm decodes from, so the full arm keeps T + Q.

    Returns
    -------
    (ArmResult, list[ArmResult])
        The full-KV arm (evictor ``"full"``, budget 1.0, n_kept T) and the arms in
        ``evictors × budgets`` order (evictor-major).
    """
    evictors, budgets = _check_sweep_args(evictors, budgets, max_batch)
    n_tokens = int(prefill.input_ids.shape[-1])

    # Plan: distinct decodes. Key None = full cache; "audit" = the full set through the eviction path.
    plan_keys: list = [None]
    plan_kept: list[torch.Tensor | None] = [None]
    arms = []  # (evictor, budget, n_kept, plan index)
    key_index: dict = {None: 0}
    for evictor in evictors:
        for budget in budgets:
            pos = kept_positions(evictor, prefill, budget, n_sink=n_sink, n_recent=n_recent,
                                 pool_kernel=pool_kernel)
            count = int(pos.shape[-1])
            if count == n_tokens:
                key = "audit" if audit else None
                if audit:
                    pos = torch.arange(n_tokens)
            else:
                key = (tuple(pos.shape), tuple(pos.reshape(-1).tolist()))
            if key not in key_index:
                key_index[key] = len(plan_kept)
                plan_keys.append(key)
                plan_kept.append(pos)
            arms.append((evictor, budget, count, key_index[key]))

    # Groups: longest caches first, so each batch pads little.
    lengths = [n_tokens if p is None else int(p.shape[-1]) for p in plan_kept]
    order = sorted(range(len(plan_kept)), key=lambda i: (-lengths[i], i))
    size = max_batch if batch_arms else 1
    groups = [order[i : i + size] for i in range(0, len(order), size)]

    eos_ids = eos_token_ids(model, tokenizer)
    plan_tokens: list[list[int] | None] = [None] * len(plan_kept)
    plan_ms = [0.0] * len(plan_kept)
    for group in groups:
        start = time.perf_counter()
        out = decode_arms(model, prefill, [plan_kept[i] for i in group], max_new_tokens=max_new_tokens,
                          eos_ids=eos_ids, tokenizer=tokenizer, stop_strings=stop_strings, question_ids=question_ids)
        share = (time.perf_counter() - start) * 1000.0 / len(group)
        for i, toks in zip(group, out):
            plan_tokens[i], plan_ms[i] = toks, share

    texts: dict[int, str] = {}

    n_question = 0 if question_ids is None else int(torch.as_tensor(question_ids).reshape(-1).shape[0])

    def result(evictor, budget, count, i):
        if i not in texts:
            texts[i] = tokenizer.decode(plan_tokens[i], skip_special_tokens=True)
        reason = stop_reason(plan_tokens[i], max_new_tokens=max_new_tokens, eos_ids=eos_ids, tokenizer=tokenizer,
                             stop_strings=stop_strings)
        return ArmResult(evictor, budget, count + n_question, list(plan_tokens[i]), texts[i], plan_ms[i], reason)

    full = result("full", 1.0, n_tokens, 0)
    if audit and "audit" in key_index and plan_tokens[key_index["audit"]] != full.token_ids:
        warnings.warn(
            f"audit: arm keeping all {n_tokens} positions decoded {plan_tokens[key_index['audit']]} "
            f"but the full-KV arm decoded {full.token_ids}",
            AuditWarning,
            stacklevel=2,
        )
    return full, [result(*arm) for arm in arms]
