"""The Heavy-Hitter Oracle family: scores from the attention accumulated over all prompt queries
(PAGE §4 "Setup", Table 2; App. A.4.7); needs ``prefill.accumulated_attention`` (capture
``accumulate=True``)."""

from __future__ import annotations

from collectors.evictors.base import Evictor, checked_attention, kv_group_mean

__all__ = ["H2O", "H2OPerHead"]


class H2O(Evictor):
    """The paper's shared-mask H2O: score_t = mean over all layers ℓ and query heads h of the attention
    accumulated over all prompt queries onto key t, one mask for the whole model.

    The published Heavy-Hitter Oracle keeps heavy hitters per layer and per head: :class:`H2OPerHead`.
    """

    name = "h2o"
    accumulated = True

    def score(self, prefill):
        return checked_attention(prefill.accumulated_attention, "accumulated_attention").mean(dim=1).mean(dim=0)


class H2OPerHead(H2O):
    """The Heavy-Hitter Oracle's granularity: each layer ℓ and KV head j keeps the top positions of the
    accumulated attention averaged over the query heads sharing KV head j, the same ``n_kept`` in every
    (ℓ, j)."""

    name = "h2o-perhead"
    granularity = "head"

    def score(self, prefill):
        acc = checked_attention(prefill.accumulated_attention, "accumulated_attention")
        return kv_group_mean(acc, int(prefill.n_kv_heads))
