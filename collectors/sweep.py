"""One prefill → the full-KV arm and every (evictor, budget) arm (docs/COLLECTION.md).

Why one prefill serves every arm
--------------------------------
Eviction happens after the prefill (PAGE Eq. 2: "the gate fires once per input, at prefill, before any
decode step"), so the prompt's hidden states, its KV cache and the logits at the last prompt position
are the same for every arm. Hence the first generated token of every arm is ``argmax(last_logits)``
of the full prefill, exactly as in kvpress, where the press compresses each layer's cache after that
layer's prefill forward; eviction changes tokens 2..n. Each arm's kept positions come from
:meth:`collectors.evictors.Evictor.kept`, and the arms are decoded by
:func:`collectors.decode.decode_arms` (evicted caches, positions, the query-agnostic mode, batches).

The plan of decodes
-------------------
Arms are grouped (longest cache first, at most ``max_batch`` per group) and each group decoded as one
batch. Arms whose kept set equals another's (e.g. every ``streamingllm-fixed`` budget, or short
prompts where protection dominates) are decoded once. Arms keeping all T positions (budget 1.0, or
n_kept ≥ T) ARE the full-KV arm and are not decoded again unless ``audit=True``, which decodes them
through the eviction path (sliced cache, batch, padding) and warns (:class:`AuditWarning`) on any
token mismatch with the full arm (PAGE App. F "pipeline audit").

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

from collectors.decode import decode_arms, eos_token_ids, stop_reason
from collectors.evictors import Evictor
from pagestats.core import defaults

__all__ = ["ArmResult", "AuditWarning", "run_sweep"]


class AuditWarning(UserWarning):
    """A budget-1.0 arm decoded through the eviction path differs from the full-KV arm."""


@dataclass
class ArmResult:
    """Outcome of one arm: its evictor and nominal budget, positions kept, greedy tokens and text,
    and why its decode stopped (:data:`collectors.decode.STOP_REASONS`)."""

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


def _check_sweep_args(evictors, budgets, max_batch):
    evictors = tuple(evictors)
    budgets = tuple(float(b) for b in budgets)
    for e in evictors:
        if not isinstance(e, Evictor):
            raise ValueError(f"evictors are collectors.evictors.Evictor objects (collectors.evictors.parse), got {e!r}")
    for b in budgets:
        if not (0.0 < b <= 1.0):
            raise ValueError(f"budget must lie in (0, 1], got {b!r}")
    if len({e.name for e in evictors}) != len(evictors) or len(set(budgets)) != len(budgets):
        raise ValueError("evictors and budgets must not repeat")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
    return evictors, budgets


def run_sweep(
    model,
    tokenizer,
    prefill,
    *,
    evictors: Sequence[Evictor],
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
    budget_floor: str = "protected",
) -> tuple[ArmResult, list[ArmResult]]:
    """Full-KV arm and one arm per (evictor, budget), all from one prefill.

    Parameters
    ----------
    model, tokenizer
        The causal LM of the prefill and its tokenizer (``decode``, ``eos_token_id``).
    prefill : Prefill
        From :func:`collectors.capture.prefill` with the evictors' needs
        (:func:`collectors.evictors.capture_options`).
    evictors : sequence of Evictor
        From :func:`collectors.evictors.parse_all`.
    budgets : sequence of float
        Nominal budgets in (0, 1] (docs/COLLECTION.md: ``pagestats.core.defaults.BUDGETS``).
    max_new_tokens : int
        Greedy tokens per arm (the task's tokens to generate).
    n_sink, n_recent : int
        Protected first/last positions (4 and 32).
    budget_floor : {"protected", "page"}
        The least kept count of the built-in evictors (:func:`collectors.evictors.n_kept`).
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
        Optional SnapKV-family pooling width (:mod:`collectors.evictors.snapkv`).
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
            pos = evictor.kept(prefill, budget, n_sink=n_sink, n_recent=n_recent, pool_kernel=pool_kernel,
                               budget_floor=budget_floor)
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
            arms.append((evictor.name, budget, count, key_index[key]))

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
