"""The evictors by CLI name, and the one parser of an evictor's name (``--evictors``)."""

from __future__ import annotations

from collections.abc import Iterable

from collectors.evictors.base import Evictor
from collectors.evictors.control import RandomControl
from collectors.evictors.h2o import H2O, H2OPerHead
from collectors.evictors.presses import KVPress
from collectors.evictors.snapkv import PyramidKV, SnapKV, SnapKVPerHead, SnapKVPerLayer
from collectors.evictors.streamingllm import StreamingLLM, StreamingLLMFixed

__all__ = ["EVICTORS", "parse", "parse_all", "capture_options"]

#: CLI name → evictor class; ``kvpress`` names the family ``kvpress:<Press>[:param=value]...``.
EVICTORS: dict[str, type[Evictor]] = {
    **{cls.name: cls for cls in (SnapKV, H2O, StreamingLLM, StreamingLLMFixed, PyramidKV, SnapKVPerLayer,
                                 SnapKVPerHead, H2OPerHead, RandomControl)},
    "kvpress": KVPress,
}


def parse(text: str) -> Evictor:
    """The evictor ``text`` names: a key of :data:`EVICTORS`, then ``:``-separated parameters where the
    evictor takes them (kvpress presses). Raises ValueError in one line for any other text."""
    cls = EVICTORS.get(text.partition(":")[0]) if isinstance(text, str) else None
    if cls is None:
        raise ValueError(f"unknown evictor {text!r}; choose from {', '.join(c.usage for c in EVICTORS.values())}")
    return cls.from_name(text)


def parse_all(texts: Iterable[str]) -> tuple[Evictor, ...]:
    """:func:`parse` of each name; a name given twice is refused."""
    texts = tuple(texts)
    if len(set(texts)) != len(texts):
        raise ValueError(f"evictors must not repeat, got {list(texts)}")
    return tuple(parse(text) for text in texts)


def capture_options(evictors: Iterable[Evictor]) -> dict:
    """What the evictors need of :func:`collectors.capture.prefill`: the accumulated attention (H2O)
    and the kvpress presses to score inside the prefill."""
    evictors = tuple(evictors)
    return {"accumulate": any(e.accumulated for e in evictors), "presses": [e for e in evictors if e.in_prefill]}
