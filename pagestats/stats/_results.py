"""Shared plumbing of the result dataclasses of :mod:`pagestats.stats` and :mod:`pagestats.stats.bootstrap`."""

from __future__ import annotations

from dataclasses import fields

import numpy as np


def _plain(value):
    """A field value as plain Python (0-d → scalar, arrays → lists) for ``to_dict``."""
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


class _Result:
    def to_dict(self) -> dict:
        """Fields as plain Python values (arrays become lists); ``None`` fields are left out."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None}


def _check_level(confidence_level: float) -> float:
    level = float(confidence_level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level!r}")
    return level


def _scalar_or_array(x: np.ndarray):
    return x.item() if x.ndim == 0 else x
