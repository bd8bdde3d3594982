"""The SnapKV family: scores from the window attention of the last w prompt queries (PAGE §4, App. C).

Every member scores from ``prefill.snapkv_attention`` when the prefill carries one (captured with
the eviction window w when it differs from the gate's window), else from ``prefill.window_attention``
(the two windows are equal). The published SnapKV also smooths scores with a 1-D pooling kernel; the
paper does not mention it, so the default is no pooling (``pool_kernel=1``); an odd ``pool_kernel``
> 1 applies average pooling (stride 1, same length, ``count_include_pad=False``) before selection.
"""

from __future__ import annotations

import torch

from collectors.evictors.base import Evictor, checked_attention, kv_group_mean

__all__ = ["SnapKV", "PyramidKV", "SnapKVPerLayer", "SnapKVPerHead", "pyramid_weights"]


def _window(prefill) -> torch.Tensor:
    """(L, H, T): the SnapKV window's attention, or the gate's when the two windows are equal."""
    att = getattr(prefill, "snapkv_attention", None)
    if att is not None:
        return checked_attention(att, "snapkv_attention")
    return checked_attention(prefill.window_attention, "window_attention")


def pyramid_weights(n_layers: int) -> torch.Tensor:
    """Linear depth weights λ_ℓ ∝ (L − ℓ), summing to 1 (bottom layer heaviest; :class:`PyramidKV`)."""
    if n_layers < 1:
        raise ValueError(f"n_layers must be ≥ 1, got {n_layers}")
    w = torch.arange(n_layers, 0, -1, dtype=torch.float64)
    return (w / w.sum()).to(torch.float32)


class SnapKV(Evictor):
    """The paper's shared-mask SnapKV: score_t = mean over all layers ℓ and query heads h of ā_{ℓ,h,t}.

    §4 "Setup": "we score each prompt position by the average attention from the last w=32 queries
    across heads and layers"; one mask for the whole model.
    """

    name = "snapkv"
    pooled = True

    def score(self, prefill):
        return _window(prefill).mean(dim=1).mean(dim=0)


class PyramidKV(SnapKV):
    """The paper's "depth-weighted variant of the published per-layer budget schedule", whose scoring
    "biases toward bottom layers" (App. A.4.7).

    PyramidKV allocates cache linearly decreasing with depth; that schedule is carried into the score
    as linear depth weights λ_ℓ = (L − ℓ) / Σ_j (L − j), ℓ = 0..L−1, and score_t = Σ_ℓ λ_ℓ ·
    mean_h ā_{ℓ,h,t}: one shared mask.
    """

    name = "pyramidkv"

    def score(self, prefill):
        per_layer = _window(prefill).mean(dim=1)
        return pyramid_weights(per_layer.shape[0]) @ per_layer


class SnapKVPerLayer(SnapKV):
    """Each layer ℓ keeps the top positions of its own head-averaged window attention mean_h ā_{ℓ,h,t},
    the same ``n_kept`` in every layer (uniform cache shape; App. C, Table 32)."""

    name = "snapkv-perlayer"
    granularity = "layer"

    def score(self, prefill):
        return _window(prefill).mean(dim=1)


class SnapKVPerHead(SnapKV):
    """Published SnapKV's granularity: each layer ℓ and KV head j keeps the top positions of
    mean_{h ∈ G(j)} ā_{ℓ,h,t}, over the query heads G(j) that share KV head j (grouped-query attention).

    The same ``n_kept`` in every (ℓ, j). The KV heads are those of the cache (``prefill.n_kv_heads``):
    where the cache keeps one head per layer (DeepSeek-V3's latent attention), this keeps what
    :class:`SnapKVPerLayer` keeps (docs/COLLECTION.md, "Model families").
    """

    name = "snapkv-perhead"
    granularity = "head"

    def score(self, prefill):
        return kv_group_mean(_window(prefill), int(prefill.n_kv_heads))
