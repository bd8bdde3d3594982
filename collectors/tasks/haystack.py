"""Haystacks: RULER's repeated "noise" text, a user-supplied essay, and needle insertion.

Granularity is one *word* so that the context-length search (:mod:`collectors.tasks.length`)
can land within 2 % of the target even at short contexts: the noise haystack of ``n`` words is
the first ``n`` words of the endlessly repeated noise sentence group, one group per line (the last
line may be cut short), as RULER joins its noise groups with newlines.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import re

import numpy as np

from collectors.tasks.templates import NOISE

_NOISE_WORDS = tuple(NOISE.split())
#: RULER's 40 insertion depths (percent) for essay haystacks.
DEPTHS = tuple(int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)))


def noise_lines(n_words: int) -> list[str]:
    """The noise haystack of ``n_words`` words as lines of one sentence group each."""
    if n_words < 0:
        raise ValueError(f"n_words must be ≥ 0, got {n_words}")
    per = len(_NOISE_WORDS)
    full, rest = divmod(n_words, per)
    lines = [NOISE] * full
    if rest:
        lines.append(" ".join(_NOISE_WORDS[:rest]))
    return lines


def insert_lines(lines: list[str], items: list[str], rng: np.random.Generator) -> list[str]:
    """Insert ``items`` (in their given order) between ``lines`` at uniformly drawn gaps.

    Gap ``g`` ∈ [0, len(lines)] means "before line g"; gaps are drawn with replacement and sorted,
    so the relative order of ``items`` is kept (RULER vt keeps each chain in order; RULER niah
    shuffles the needles beforehand).
    """
    gaps = np.sort(rng.integers(0, len(lines) + 1, size=len(items)))
    out: list[str] = []
    j = 0
    for g in range(len(lines) + 1):
        while j < len(items) and gaps[j] == g:
            out.append(items[j])
            j += 1
        if g < len(lines):
            out.append(lines[g])
    return out


@functools.lru_cache(maxsize=8)
def _essay_words(path: str, mtime: float) -> tuple[str, ...]:
    text = pathlib.Path(path).read_text(encoding="utf-8")
    words = tuple(re.sub(r"\s+", " ", text).strip().split(" "))
    if not words or words == ("",):
        raise ValueError(f"essay file {path} is empty")
    return words


def essay_words(path) -> tuple[str, ...]:
    """Whitespace-separated words of a user-supplied essay file (RULER uses Paul Graham essays)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"essay file not found: {p}")
    return _essay_words(str(p.resolve()), p.stat().st_mtime)


def file_sha256(path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def essay_with_needles(words: tuple[str, ...], n_words: int, items: list[str], rng: np.random.Generator) -> str:
    """The first ``n_words`` words of the essay (repeated cyclically if needed) with ``items``
    inserted at sentence boundaries at RULER's depths (distinct depths drawn from :data:`DEPTHS`)."""
    reps = -(-n_words // len(words)) if n_words else 0
    text = " ".join((words * max(reps, 1))[:n_words])
    sents = [s for s in _SENTENCE_END.split(text.strip()) if s] if text.strip() else []
    depths = rng.choice(DEPTHS, size=len(items), replace=len(items) > len(DEPTHS))
    cuts = sorted(int(len(sents) * (int(d) / 100)) for d in depths)
    parts: list[str] = []
    prev = 0
    for cut, item in zip(cuts, items):
        if cut > prev:
            parts.append(" ".join(sents[prev:cut]))
        parts.append(item)
        prev = cut
    if prev < len(sents):
        parts.append(" ".join(sents[prev:]))
    return " ".join(parts)
