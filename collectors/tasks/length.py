"""Meeting a context-length target by search over haystack size (docs/COLLECTION.md).

The prompt is counted with the model's own tokenizer *after* its chat template and the answer
prefix, so ``n_tokens`` is exactly the number of prompt positions the model prefills. The search
finds the largest haystack that keeps ``n_tokens ≤ context_length``; a secant guess from two probes
brackets the answer (±3 %) and a binary search closes it, so a 128k-token prompt needs about 15
tokenisations rather than a scan. Coarse haystacks then add a partial unit (``m`` filler words),
also by binary search, to land within 2 % below the target.

Notes
-----
RULER counts ``prompt + tokens_to_generate ≤ max_seq_length``; here the *prompt* is fitted to
``context_length`` (the paper reports context as prompt length), and generation comes on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from collectors.tasks.generators import Body, Generator

#: The prompt must land in ``[(1 − TOLERANCE)·context_length, context_length]`` tokens.
TOLERANCE = 0.02


@dataclass(frozen=True)
class Fit:
    n: int
    m: int
    body: Body
    prompt: str
    n_tokens: int
    evaluations: int


def fit_length(gen: Generator, render: Callable[[Body], str], count: Callable[[str], int], context_length: int) -> Fit:
    """Largest ``(n, m)`` whose rendered prompt has at most ``context_length`` tokens.

    Raises ``ValueError`` when even the smallest haystack (``gen.n_min``, no filler) is too long.
    Invariant of both searches: ``lo`` fits, ``hi`` does not, so the result always fits even
    where the token count is not perfectly monotone in the haystack size.
    """
    cache: dict[tuple[int, int], tuple[int, Body, str]] = {}

    def tokens(n: int, m: int = 0) -> int:
        if (n, m) not in cache:
            body = gen.build(n, m)
            prompt = render(body)
            cache[(n, m)] = (count(prompt), body, prompt)
        return cache[(n, m)][0]

    L = int(context_length)
    t0 = tokens(gen.n_min)
    if t0 > L:
        raise ValueError(
            f"context_length {L} is too short: the prompt with the smallest haystack already has {t0} tokens"
        )
    probe = gen.n_min + 64
    t1 = tokens(probe)
    lo, hi = gen.n_min, None
    if t1 <= L:
        lo = probe
        slope = max((t1 - t0) / 64, 1e-3)
        guess = probe + int((L - t1) / slope)
        a, b = max(lo, int(guess * 0.97)), max(lo + 1, int(guess * 1.03) + 1)
        if tokens(a) > L:
            hi = a
        else:
            lo = a
            if tokens(b) > L:
                hi = b
            else:
                lo = b
    else:
        hi = probe
    while hi is None:  # gallop up when the guess was short
        nxt = max(lo * 2, lo + 64)
        if tokens(nxt) <= L:
            lo = nxt
        else:
            hi = nxt
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tokens(mid) <= L:
            lo = mid
        else:
            hi = mid
    n, m = lo, 0
    if gen.partial_max > 0 and tokens(n) < L:
        if tokens(n, gen.partial_max) <= L:
            m = gen.partial_max
        else:
            mlo, mhi = 0, gen.partial_max
            while mhi - mlo > 1:
                mid = (mlo + mhi) // 2
                if tokens(n, mid) <= L:
                    mlo = mid
                else:
                    mhi = mid
            m = mlo
    n_tokens, body, prompt = cache[(n, m)]
    return Fit(n, m, body, prompt, n_tokens, len(cache))
