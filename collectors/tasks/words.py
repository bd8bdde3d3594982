"""Random needle keys/values and word lists for the RULER-style generators.

Words come from the installed ``wonderwords`` package's bundled lists (nouns, adjectives, verbs),
read as package data; nothing is fetched at run time. Every draw takes an explicit
``numpy.random.Generator`` (``rng``).
"""

from __future__ import annotations

import functools
import re
import uuid
from importlib import resources

import numpy as np

_WORD = re.compile(r"^[a-z]+$")


@functools.lru_cache(maxsize=None)
def _wordlist(name: str) -> tuple[str, ...]:
    text = resources.files("wonderwords.assets").joinpath(name).read_text(encoding="utf-8")
    return tuple(sorted({w.strip() for w in text.splitlines() if _WORD.match(w.strip())}))


@functools.lru_cache(maxsize=None)
def profanity() -> frozenset[str]:
    return frozenset(w.lower() for w in _wordlist("profanitylist.txt"))


@functools.lru_cache(maxsize=None)
def nouns() -> tuple[str, ...]:
    return tuple(w for w in _wordlist("nounlist.txt") if w not in profanity())


@functools.lru_cache(maxsize=None)
def adjectives() -> tuple[str, ...]:
    return tuple(w for w in _wordlist("adjectivelist.txt") if w not in profanity())


@functools.lru_cache(maxsize=None)
def vocabulary() -> tuple[str, ...]:
    """Sorted distinct nouns, adjectives and verbs (RULER's cwe word pool)."""
    verbs = (w for w in _wordlist("verblist.txt") if w not in profanity())
    return tuple(sorted(set(nouns()) | set(adjectives()) | set(verbs)))


def random_number(rng: np.random.Generator, digits: int = 7) -> str:
    """A ``digits``-digit decimal number (RULER's "numbers" needle type)."""
    return str(int(rng.integers(10 ** (digits - 1), 10**digits)))


def random_word(rng: np.random.Generator) -> str:
    """An ``adjective-noun`` key (RULER's "words" needle type)."""
    adj, noun = adjectives(), nouns()
    return f"{adj[int(rng.integers(len(adj)))]}-{noun[int(rng.integers(len(noun)))]}"


def random_uuid(rng: np.random.Generator) -> str:
    """A version-4 UUID from 128 random bits (RULER's "uuids" needle type)."""
    return str(uuid.UUID(int=int.from_bytes(rng.bytes(16), "big"), version=4))


_DRAW = {"numbers": random_number, "words": random_word, "uuids": random_uuid}


def random_needle(kind: str, rng: np.random.Generator) -> str:
    try:
        return _DRAW[kind](rng)
    except KeyError:
        raise ValueError(f"unknown needle type {kind!r}; expected one of {sorted(_DRAW)}") from None


def distinct(kind: str, count: int, rng: np.random.Generator, exclude=()) -> list[str]:
    """``count`` distinct draws of ``kind`` that avoid ``exclude`` (so answers are unambiguous)."""
    seen = set(exclude)
    out: list[str] = []
    while len(out) < count:
        item = random_needle(kind, rng)
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def coded_words(count: int, length: int, rng: np.random.Generator) -> list[str]:
    """``count`` distinct random lowercase strings of ``length`` letters (RULER fwe's coded words)."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < count:
        w = "".join(letters[rng.integers(0, 26, size=length)])
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def uppercase_names(count: int, length: int, rng: np.random.Generator) -> list[str]:
    """``count`` distinct upper-case variable names (RULER vt): :func:`coded_words`, upper-cased."""
    return [w.upper() for w in coded_words(count, length, rng)]
