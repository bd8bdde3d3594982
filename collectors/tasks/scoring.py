"""RULER's scoring (RULER ``scripts/eval``; docs/COLLECTION.md).

A prediction is post-processed as RULER does — stripped, every control character (U+0000–U+001F)
replaced by a newline, stripped again — and each reference is looked for as a case-insensitive
substring. ``string_match_all`` is the fraction of references found (all tasks but qa);
``string_match_part`` is 1 if any reference is found (qa). Scores are in [0, 1] (RULER reports
them ×100).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """RULER's post-processing of a generation."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def _found(prediction: str, references: Sequence[str]) -> list[bool]:
    if isinstance(references, str) or not len(references):
        raise ValueError(f"references must be a non-empty list of strings, got {references!r}")
    text = postprocess(prediction).lower()
    return [r.lower() in text for r in references]


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Fraction of ``references`` contained in ``prediction`` (case-insensitive)."""
    found = _found(prediction, references)
    return sum(found) / len(found)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """1.0 if any of ``references`` is contained in ``prediction`` (case-insensitive), else 0.0."""
    return 1.0 if any(_found(prediction, references)) else 0.0


def metric_name(task: str) -> str:
    return "string_match_part" if task.startswith("qa") else "string_match_all"


def score(task: str, prediction: str, references: Sequence[str]) -> float:
    """A(b, x) of one generation: RULER's metric for ``task`` (qa: part, else all)."""
    fn = string_match_part if task.startswith("qa") else string_match_all
    return fn(prediction, references)
