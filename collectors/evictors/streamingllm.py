"""StreamingLLM: the attention sinks and the most recent positions, no attention read (PAGE §4, Table 2)."""

from __future__ import annotations

import torch

from collectors.evictors.base import Evictor

__all__ = ["StreamingLLM", "StreamingLLMFixed"]


class StreamingLLM(Evictor):
    """The n_sink sinks plus the most recent ``n_kept − n_sink`` positions (budget-scaled): the score
    of a position is the position itself."""

    name = "streamingllm"

    def score(self, prefill):
        return torch.arange(int(prefill.input_ids.shape[-1]), dtype=torch.float32)


class StreamingLLMFixed(StreamingLLM):
    """The paper's variant: the n_sink sinks and the last n_recent positions only, i.e. 36 tokens
    "regardless of budget" (App. A.4.7, discussion of Table 17); a budget that keeps all T keeps all T."""

    name = "streamingllm-fixed"

    def count(self, n_tokens, budget, n_sink, n_recent, budget_floor):
        count = super().count(n_tokens, budget, n_sink, n_recent, budget_floor)
        return count if count == n_tokens else min(n_tokens, n_sink + n_recent)
