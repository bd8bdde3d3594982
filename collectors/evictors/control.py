"""The uniform-random scoring control of Table 31 ("SnapKV vs. uniform-random scoring at matched
budget"; App. B)."""

from __future__ import annotations

import zlib

import torch

from collectors.evictors.base import Evictor

__all__ = ["RANDOM_SEED", "RandomControl", "random_scores"]

#: Seed offset of the uniform-random control, added to the CRC-32 of the prompt's token ids.
RANDOM_SEED = 31


def random_scores(input_ids) -> torch.Tensor:
    """i.i.d. U(0, 1) scores, one per prompt position, from a generator seeded by the CRC-32 of the
    token ids (int64 bytes) plus :data:`RANDOM_SEED`."""
    ids = torch.as_tensor(input_ids).reshape(-1).to(torch.int64)
    seed = (zlib.crc32(ids.numpy().tobytes()) + RANDOM_SEED) % (2**63)
    return torch.rand(ids.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


class RandomControl(Evictor):
    """score_t ~ U(0, 1) i.i.d., one shared mask, so the unprotected slots go to a uniformly random
    subset of the unprotected positions.

    The draw is seeded by the prompt itself, so an input keeps the same positions in every run, and at
    every budget the smaller kept set lies inside the larger one; no attention is read. Run it beside
    ``snapkv`` (``--evictors snapkv,random``) to compare an informed scorer with chance on the same inputs.
    """

    name = "random"

    def score(self, prefill):
        return random_scores(prefill.input_ids)
