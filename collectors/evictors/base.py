"""The evictor base class: the keep rule written once, each evictor writing only its score.

An evictor turns one prefill (:class:`collectors.capture.Prefill`, or any object with the same
attributes) into the prompt positions an arm keeps, sorted ascending: one row shared by every layer
and head, one row per layer, or one row per (layer, KV head), the same count in each row.

Budget rule (docs/COLLECTION.md; PAGE App. A.2.3, Table 26)
-----------------------------------------------------------
An arm at budget ``b`` keeps ``n_kept = min(T, max(⌊b·T⌋, floor))`` prompt positions, the floor
``n_sink + n_recent`` (budget floor ``"protected"``) or ``n_sink + n_recent + 4`` = 40, the authors'
runner's ``max(40, ⌊T·b⌋)`` (budget floor ``"page"``; :data:`pagestats.core.defaults.BUDGET_FLOORS`).
The first ``n_sink`` (attention sinks) and the last ``n_recent`` (the observation window) are always
kept and are counted inside ``n_kept`` — protection overrides the budget (App. A.2.3) and otherwise
the kept size is ≈ b·T (Table 26). The remaining ``n_kept − |protected|`` slots go to the unprotected
positions of highest score; ties go to the lower position, so selection is deterministic. Budget 1.0
(and any budget where ``n_kept == T``) keeps every position: Table 2's full-cache audit arm.
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar

import torch

from pagestats.core import defaults

__all__ = ["Evictor", "n_kept", "select_top", "checked_attention", "kv_group_mean"]


def _check_protection(n_sink: int, n_recent: int) -> None:
    for name, value in (("n_sink", n_sink), ("n_recent", n_recent)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def n_kept(
    n_tokens: int, budget: float, n_sink: int = defaults.N_SINK, n_recent: int = defaults.N_RECENT,
    budget_floor: str = "protected",
) -> int:
    """Number of prompt positions an arm at ``budget`` keeps: ``min(T, max(⌊b·T⌋, floor))``.

    Parameters
    ----------
    n_tokens : int
        Prompt length T (≥ 1).
    budget : float
        Nominal budget b ∈ (0, 1].
    n_sink, n_recent : int
        Protected first and last positions, counted inside the result.
    budget_floor : {"protected", "page"}
        The least count: ``n_sink + n_recent``, or that plus :data:`pagestats.core.defaults.PAGE_FLOOR_EXTRA`
        (the authors' runner: ``max(40, ⌊T·b⌋)`` with 4 sinks and a 32-position window).

    References
    ----------
    PAGE App. A.2.3 (protection overrides the budget), Table 26 (kept size ≈ b·T); docs/COLLECTION.md.
    """
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise ValueError(f"n_tokens must be a positive int, got {n_tokens!r}")
    budget = float(budget)
    if not (0.0 < budget <= 1.0):
        raise ValueError(f"budget must lie in (0, 1], got {budget!r}")
    _check_protection(n_sink, n_recent)
    if budget_floor not in defaults.BUDGET_FLOORS:
        raise ValueError(f"budget_floor must be one of {', '.join(defaults.BUDGET_FLOORS)}, got {budget_floor!r}")
    floor = n_sink + n_recent + (defaults.PAGE_FLOOR_EXTRA if budget_floor == "page" else 0)
    return min(n_tokens, max(math.floor(budget * n_tokens), floor))


def checked_attention(attention: torch.Tensor | None, name: str) -> torch.Tensor:
    """``prefill.<name>`` as float32 (L, H, T), refused in one line when absent, misshapen or non-finite."""
    if attention is None:
        raise ValueError(
            f"prefill.{name} is None; the evictor needs it "
            + ("(call capture.prefill(..., accumulate=True))" if name == "accumulated_attention" else "")
        )
    if attention.ndim != 3:
        raise ValueError(f"prefill.{name} must have shape (L, H, T), got {tuple(attention.shape)}")
    if not torch.isfinite(attention).all():
        raise ValueError(f"prefill.{name} contains non-finite values")
    return attention.to(torch.float32)


def kv_group_mean(attention: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Per-query-head scores (L, H, T) → per-KV-head scores (L, H_kv, T), the mean over each group.

    Query head h shares KV head h // (H / H_kv) (the order of transformers' ``repeat_kv``), so the
    H / H_kv consecutive query heads of a group are averaged.
    """
    n_layers, n_heads, n_tokens = attention.shape
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} query heads cannot be grouped over {n_kv_heads} KV heads")
    return attention.reshape(n_layers, n_kv_heads, n_heads // n_kv_heads, n_tokens).mean(dim=2)


def _avg_pool(score: torch.Tensor, kernel: int) -> torch.Tensor:
    if kernel == 1:
        return score
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"pool_kernel must be a positive odd int, got {kernel}")
    x = score.reshape(-1, 1, score.shape[-1])
    pooled = torch.nn.functional.avg_pool1d(
        x, kernel_size=kernel, stride=1, padding=kernel // 2, count_include_pad=False
    )
    return pooled.reshape(score.shape)


def _protected(n_tokens: int, n_sink: int, n_recent: int) -> torch.Tensor:
    mask = torch.zeros(n_tokens, dtype=torch.bool)
    mask[: min(n_sink, n_tokens)] = True
    if n_recent > 0:
        mask[max(0, n_tokens - n_recent) :] = True
    return mask


def select_top(score: torch.Tensor, count: int, protected: torch.Tensor) -> torch.Tensor:
    """Protected positions plus the ``count − |protected|`` best unprotected ones, sorted.

    ``score`` is (T,), (L, T) or (L, H_kv, T); ties in score go to the lower position (stable
    descending sort). Returns (count,), (L, count) or (L, H_kv, count) int64.
    """
    n_prot = int(protected.sum())
    if count < n_prot:
        raise ValueError(f"count {count} is smaller than the {n_prot} protected positions")
    s = score.to(torch.float32)
    # protected positions first (score +inf), then unprotected by score; stable → ties to lower index.
    key = torch.where(protected, torch.tensor(math.inf), s)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    return torch.sort(order[..., :count], dim=-1).values


class Evictor(abc.ABC):
    """A base evictor: :meth:`kept` is written once here; a subclass writes :meth:`score`.

    Class attributes
    ----------------
    name : str
        The CLI name (``--evictors``), the key of :data:`collectors.evictors.EVICTORS`.
    granularity : {"shared", "layer", "head"}
        What a row of kept positions covers: the whole model, a layer, or a (layer, KV head).
    accumulated : bool
        Scored from the attention accumulated over all prompt queries (capture ``accumulate=True``).
    pooled : bool
        Takes the SnapKV pooling width (``pool_kernel``) of :meth:`kept`; the others ignore it.
    in_prefill : bool
        Scored by hooks inside the prefill (kvpress presses: ``capture.prefill(..., presses=...)``).
    """

    name: ClassVar[str]
    granularity: ClassVar[str] = "shared"
    accumulated: ClassVar[bool] = False
    pooled: ClassVar[bool] = False
    in_prefill: ClassVar[bool] = False
    #: How the CLI's help and errors name the evictor.
    usage: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__ and "usage" not in cls.__dict__:
            cls.usage = cls.name

    @classmethod
    def from_name(cls, text: str) -> Evictor:
        """The evictor named ``text`` (its :attr:`name`; a built-in evictor takes no parameters)."""
        if text != cls.name:
            raise ValueError(f"evictor {text!r}: {cls.name} takes no parameters")
        return cls()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @abc.abstractmethod
    def score(self, prefill) -> torch.Tensor:
        """Per-position retention score: (T,), (L, T) or (L, H_kv, T) by :attr:`granularity`."""

    def count(self, n_tokens: int, budget: float, n_sink: int, n_recent: int, budget_floor: str) -> int:
        """Positions kept per row at ``budget``: the budget rule (:func:`n_kept`)."""
        return n_kept(n_tokens, budget, n_sink, n_recent, budget_floor)

    def kept(self, prefill, budget: float, *, n_sink: int = defaults.N_SINK, n_recent: int = defaults.N_RECENT,
             pool_kernel: int = 1, budget_floor: str = "protected") -> torch.LongTensor:
        """Prompt positions kept at ``budget``: the protected ones and the top unprotected scores.

        Parameters
        ----------
        prefill : Prefill
            ``input_ids`` (1, T) and what :meth:`score` reads.
        budget : float
            Nominal budget b ∈ (0, 1].
        n_sink, n_recent : int
            Protected first/last positions (PAGE §3 "Algorithm", App. F: 4 and 32).
        pool_kernel : int
            Odd average-pooling width of the SnapKV-family scores (1 = none; :attr:`pooled`).
        budget_floor : {"protected", "page"}
            The least kept count (:func:`n_kept`).

        Returns
        -------
        torch.LongTensor
            Sorted unique positions, (n_kept,), (L, n_kept) or (L, H_kv, n_kept) by :attr:`granularity`.
        """
        n_tokens = int(prefill.input_ids.shape[-1])
        count = self.count(n_tokens, budget, n_sink, n_recent, budget_floor)
        score = self.score(prefill)
        if self.pooled:
            score = _avg_pool(score, pool_kernel)
        if score.shape[-1] != n_tokens:
            raise ValueError(f"attention covers {score.shape[-1]} positions but the prompt has {n_tokens}")
        return select_top(score, count, _protected(n_tokens, n_sink, n_recent))
