"""Base evictors: prefill attention scores → the prompt positions an arm keeps.

Every evictor works on one prefill (:class:`collectors.capture.Prefill`, or any object with the same
attributes) and returns the kept prompt positions, sorted ascending. The paper's evictors produce ONE
mask shared by every layer and head (docs/COLLECTION.md); ``snapkv-perlayer`` returns one row per layer, and the
per-head baselines ``snapkv-perhead`` / ``h2o-perhead`` one row per (layer, KV head), the same count in
each row (:data:`PER_LAYER_EVICTORS`, :data:`PER_HEAD_EVICTORS`).

Budget rule (docs/COLLECTION.md; PAGE App. A.2.3, Table 26)
----------------------------------------------------
An arm at budget ``b`` keeps ``n_kept = min(T, max(⌊b·T⌋, floor))`` prompt positions, the floor
``n_sink + n_recent`` (budget floor ``"protected"``) or ``n_sink + n_recent + 4`` = 40, the authors'
runner's ``max(40, ⌊T·b⌋)`` (budget floor ``"page"``; :data:`pagestats.defaults.BUDGET_FLOORS`).
The first ``n_sink`` (attention sinks) and the last ``n_recent`` (the observation window) are always
kept and are counted inside ``n_kept`` — protection overrides the budget (App. A.2.3) and otherwise
the kept size is ≈ b·T (Table 26). The remaining ``n_kept − |protected|`` slots go to the unprotected
positions of highest score; ties go to the lower position, so selection is deterministic.

Evictors (PAGE §4 "Setup", Table 2, App. A.4.7, App. C)
-------------------------------------------------------
snapkv
    The paper's shared-mask SnapKV: score_t = mean over ALL layers ℓ and ALL query heads h of
    ā_{ℓ,h,t}, the window attention (the softmax attention of the last w prompt queries onto key t,
    averaged over those queries), one mask for the whole model. §4 "Setup": "we score each prompt
    position by the average attention from the last w=32 queries across heads and layers". The
    published SnapKV also smooths scores with a 1-D pooling kernel; the paper does not mention it, so
    the default is no pooling (``pool_kernel=1``); an odd ``pool_kernel`` > 1 applies average pooling
    (stride 1, same length, zero-free edge handling via ``count_include_pad=False``) before selection.
h2o
    The paper's shared-mask H2O (§4 "Setup", Table 2; App. A.4.7): score_t = mean over ALL layers ℓ
    and ALL query heads h of the attention accumulated over ALL prompt queries onto key t, one mask
    for the whole model; needs ``prefill.accumulated_attention``. The published Heavy-Hitter Oracle
    keeps heavy hitters per layer and per head: that is ``h2o-perhead``.
streamingllm
    The n_sink sinks plus the most recent ``n_kept − n_sink`` positions (budget-scaled).
streamingllm-fixed
    The paper's variant: the n_sink sinks and the last n_recent positions only, i.e. 36 tokens
    "regardless of budget" (App. A.4.7, discussion of Table 17).
pyramidkv
    The paper's "depth-weighted variant of the published per-layer budget schedule" whose scoring
    "biases toward bottom layers" (App. A.4.7). PyramidKV allocates cache linearly decreasing with
    depth; we carry that schedule into the score as linear depth weights
    ``λ_ℓ = (L − ℓ) / Σ_j (L − j)``, ℓ = 0..L−1 (bottom layer weight L, top layer weight 1), and
    score_t = Σ_ℓ λ_ℓ · mean_h ā_{ℓ,h,t}: one shared mask.
snapkv-perlayer
    Each layer ℓ keeps the top positions of its own head-averaged window attention mean_h ā_{ℓ,h,t},
    the same ``n_kept`` in every layer (uniform cache shape; App. C, Table 32).
snapkv-perhead
    Published SnapKV's granularity: each layer ℓ and KV head j keeps the top positions of
    mean_{h ∈ G(j)} ā_{ℓ,h,t}, the window attention averaged over the query heads G(j) that share KV
    head j (grouped-query attention), the same ``n_kept`` in every (ℓ, j). The window w is the
    recorded ``snapkv_window`` (default :data:`pagestats.defaults.SNAPKV_WINDOW`), pooling as for
    ``snapkv``.
h2o-perhead
    The Heavy-Hitter Oracle's granularity: each layer ℓ and KV head j keeps the top positions of the
    accumulated attention averaged over G(j), the same ``n_kept`` in every (ℓ, j).
random
    The uniform-random scoring control of Table 31 ("SnapKV vs. uniform-random scoring at matched
    budget"): score_t ~ U(0, 1) i.i.d., one shared mask, so the unprotected slots go to a uniformly
    random subset of the unprotected positions. The draw is seeded by the prompt itself (the CRC-32
    of its token ids, plus :data:`RANDOM_SEED`), so an input keeps the same positions in every run and
    at every budget the smaller kept set is inside the larger one; no attention is needed.

The KV heads of the per-head evictors are those of the cache (``prefill.n_kv_heads``). Where the
cache keeps one head per layer (DeepSeek-V3's latent attention in transformers 5.24), a per-head
mask is one mask per layer, and ``snapkv-perhead`` keeps what ``snapkv-perlayer`` keeps (the mean
over all query heads of the layer; docs/COLLECTION.md, "Model families").

The SnapKV family (``snapkv``, ``pyramidkv``, ``snapkv-perlayer``, ``snapkv-perhead``) scores from
``prefill.snapkv_attention`` when the prefill carries one (captured with the eviction window w when it
differs from the gate's window), else from ``prefill.window_attention`` (the two windows are equal).

kvpress:<Press>[:param=value]...
    Any kvpress ``ScorerPress`` scored inside the same prefill, with kvpress's own keep rule, per layer
    and KV head (:mod:`collectors.presses`).

Budget 1.0 (and any budget where ``n_kept == T``) keeps every position for every evictor, including
``streamingllm-fixed``: Table 2's budget 1.0 is the full-cache audit arm (``pagestats.defaults``).
"""

from __future__ import annotations

import math

import torch

from pagestats import defaults

EVICTORS = ("snapkv", "h2o", "streamingllm", "streamingllm-fixed", "pyramidkv", "snapkv-perlayer",
            "snapkv-perhead", "h2o-perhead", "random")
#: Seed offset of the uniform-random control (``random``), added to the CRC-32 of the prompt's token ids.
RANDOM_SEED = 31
#: Evictors whose kept positions differ per layer: kept_positions returns (L, n_kept).
PER_LAYER_EVICTORS = ("snapkv-perlayer",)
#: Evictors whose kept positions differ per layer and KV head: kept_positions returns (L, H_kv, n_kept).
PER_HEAD_EVICTORS = ("snapkv-perhead", "h2o-perhead")
#: Evictors scored from the attention accumulated over all prompt queries (capture ``accumulate=True``).
ACCUMULATED_EVICTORS = ("h2o", "h2o-perhead")

__all__ = [
    "EVICTORS",
    "PER_LAYER_EVICTORS",
    "PER_HEAD_EVICTORS",
    "ACCUMULATED_EVICTORS",
    "kv_group_mean",
    "is_evictor",
    "n_kept",
    "scores",
    "random_scores",
    "pyramid_weights",
    "select_top",
    "kept_positions",
]


def is_evictor(name: str) -> bool:
    """Whether ``name`` is a built-in evictor (:data:`EVICTORS`) or a kvpress press (``kvpress:...``)."""
    from collectors.presses import is_press

    return name in EVICTORS or is_press(name)


def _check_protection(n_sink: int, n_recent: int) -> None:
    for name, value in (("n_sink", n_sink), ("n_recent", n_recent)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def n_kept(
    n_tokens: int, budget: float, n_sink: int = defaults.N_SINK, n_recent: int = defaults.N_RECENT,
    budget_floor: str = "protected",
) -> int:
    """Number of prompt positions an arm at ``budget`` keeps.

    Parameters
    ----------
    n_tokens : int
        Prompt length T (≥ 1).
    budget : float
        Nominal budget b ∈ (0, 1], the fraction of prompt positions the evictor may retain.
    n_sink, n_recent : int
        Protected first and last positions, counted inside the result.
    budget_floor : {"protected", "page"}
        The least count: ``n_sink + n_recent``, or that plus :data:`pagestats.defaults.PAGE_FLOOR_EXTRA`
        (the authors' runner: ``max(40, ⌊T·b⌋)`` with 4 sinks and a 32-position window).

    Returns
    -------
    int
        ``min(T, max(⌊b·T⌋, floor))``.

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


def pyramid_weights(n_layers: int) -> torch.Tensor:
    """Linear depth weights λ_ℓ ∝ (L − ℓ), summing to 1 (bottom layer heaviest).

    See the module docstring (``pyramidkv``; PAGE App. A.4.7).
    """
    if n_layers < 1:
        raise ValueError(f"n_layers must be ≥ 1, got {n_layers}")
    w = torch.arange(n_layers, 0, -1, dtype=torch.float64)
    return (w / w.sum()).to(torch.float32)


def _checked(attention: torch.Tensor | None, name: str) -> torch.Tensor:
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


def _head_mean(attention: torch.Tensor | None, name: str) -> torch.Tensor:
    return _checked(attention, name).mean(dim=1)  # (L, T)


def kv_group_mean(attention: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Per-query-head scores (L, H, T) → per-KV-head scores (L, H_kv, T), the mean over each group.

    Query head h shares KV head h // (H / H_kv) (the order of transformers' ``repeat_kv``), so the
    H / H_kv consecutive query heads of a group are averaged.
    """
    n_layers, n_heads, n_tokens = attention.shape
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} query heads cannot be grouped over {n_kv_heads} KV heads")
    return attention.reshape(n_layers, n_kv_heads, n_heads // n_kv_heads, n_tokens).mean(dim=2)


def _snapkv_attention(prefill):
    att = getattr(prefill, "snapkv_attention", None)
    return (att, "snapkv_attention") if att is not None else (prefill.window_attention, "window_attention")


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


def scores(evictor: str, prefill, *, pool_kernel: int = 1) -> torch.Tensor | None:
    """Per-position retention score of an attention-scored evictor.

    Parameters
    ----------
    evictor : str
        One of :data:`EVICTORS`.
    prefill : Prefill
        Needs ``window_attention`` (L, H, T), and ``accumulated_attention`` for ``h2o``.
    pool_kernel : int
        Odd average-pooling width applied to SnapKV-family scores (1 = none, the default).

    Returns
    -------
    torch.Tensor or None
        (T,) float32 for shared-mask evictors, (L, T) for ``snapkv-perlayer``, (L, H_kv, T) for the
        per-head evictors (``prefill.n_kv_heads`` KV heads), None for the position-only StreamingLLM
        evictors.
    """
    if evictor not in EVICTORS:
        raise ValueError(f"unknown evictor {evictor!r}; choose from {EVICTORS}")
    if evictor in ("streamingllm", "streamingllm-fixed"):
        return None
    if evictor == "random":
        return random_scores(prefill.input_ids)
    if evictor == "h2o":
        return _head_mean(prefill.accumulated_attention, "accumulated_attention").mean(dim=0)
    if evictor == "h2o-perhead":
        acc = _checked(prefill.accumulated_attention, "accumulated_attention")
        return kv_group_mean(acc, int(prefill.n_kv_heads))
    if evictor == "snapkv-perhead":
        att = _checked(*_snapkv_attention(prefill))
        return _avg_pool(kv_group_mean(att, int(prefill.n_kv_heads)), pool_kernel)
    per_layer = _head_mean(*_snapkv_attention(prefill))  # (L, T)
    if evictor == "snapkv":
        return _avg_pool(per_layer.mean(dim=0), pool_kernel)
    if evictor == "pyramidkv":
        lam = pyramid_weights(per_layer.shape[0])
        return _avg_pool(lam @ per_layer, pool_kernel)
    return _avg_pool(per_layer, pool_kernel)  # snapkv-perlayer


def random_scores(input_ids) -> torch.Tensor:
    """i.i.d. U(0, 1) scores, one per prompt position, seeded by the prompt (the ``random`` control,
    Table 31): the CRC-32 of the token ids (int64 bytes) plus :data:`RANDOM_SEED`."""
    import zlib

    ids = torch.as_tensor(input_ids).reshape(-1).to(torch.int64)
    seed = (zlib.crc32(ids.numpy().tobytes()) + RANDOM_SEED) % (2**63)
    return torch.rand(ids.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


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
    n_free = count - n_prot
    s = score.to(torch.float32)
    # protected positions first (score +inf), then unprotected by score; stable → ties to lower index.
    key = torch.where(protected, torch.tensor(math.inf), s)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    return torch.sort(order[..., : n_prot + n_free], dim=-1).values


def kept_positions(
    evictor: str,
    prefill,
    budget: float,
    *,
    n_sink: int = defaults.N_SINK,
    n_recent: int = defaults.N_RECENT,
    pool_kernel: int = 1,
    budget_floor: str = "protected",
) -> torch.LongTensor:
    """Prompt positions an evictor keeps at ``budget``.

    Parameters
    ----------
    evictor : str
        One of :data:`EVICTORS` (see the module docstring for each definition).
    prefill : Prefill
        ``input_ids`` (1, T) and the captured attention (``window_attention``, or ``snapkv_attention``
        when present; ``accumulated_attention`` for ``h2o`` / ``h2o-perhead``; ``n_kv_heads`` for the
        per-head evictors).
    budget : float
        Nominal budget b ∈ (0, 1].
    n_sink, n_recent : int
        Protected first/last positions (PAGE §3 "Algorithm", App. F: 4 and 32).
    pool_kernel : int
        Optional SnapKV pooling width (1 = none; see module docstring).
    budget_floor : {"protected", "page"}
        The least kept count (:func:`n_kept`); kvpress presses keep kvpress's own count.

    Returns
    -------
    torch.LongTensor
        Sorted unique positions, shape (n_kept,), (L, n_kept) for ``snapkv-perlayer`` or
        (L, H_kv, n_kept) for the per-head evictors.
    """
    from collectors import presses

    if presses.is_press(evictor):
        scored = getattr(prefill, "press_scores", None) or {}
        if evictor not in scored:
            raise ValueError(f"{evictor} was not scored in this prefill (capture.prefill(..., presses=...))")
        return presses.kept_positions(scored[evictor], budget)
    if evictor not in EVICTORS:
        raise ValueError(f"unknown evictor {evictor!r}; choose from {EVICTORS} or kvpress:<Press>")
    n_tokens = int(prefill.input_ids.shape[-1])
    count = n_kept(n_tokens, budget, n_sink, n_recent, budget_floor)
    if evictor == "streamingllm-fixed" and count < n_tokens:
        count = min(n_tokens, n_sink + n_recent)
    protected = _protected(n_tokens, n_sink, n_recent)
    score = scores(evictor, prefill, pool_kernel=pool_kernel)
    if score is None:  # StreamingLLM: sinks + the most recent positions
        score = torch.arange(n_tokens, dtype=torch.float32)
    elif score.shape[-1] != n_tokens:
        raise ValueError(f"attention covers {score.shape[-1]} positions but the prompt has {n_tokens}")
    return select_top(score, count, protected)
