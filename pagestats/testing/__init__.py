"""Seeded, schema-v1-valid synthetic PAGE logs with a planted task partition, for tests,
benchmarks and what-if demos without a GPU: :func:`synthetic_logs` writes runs that look like
a collector's output.
"""

from pagestats.testing.draw import SIGMA_BITS, profile_shape
from pagestats.testing.params import (
    DEFAULT_MODELS,
    PAPER_MODELS,
    PAPER_SCALE,
    SIGNAL_NAMES,
    SYNTHETIC_TASKS,
    ClassEffect,
    ModelSpec,
    PlantedEffect,
)
from pagestats.testing.synthetic import SyntheticLogs, planted_rates, synthetic_logs

__all__ = [
    "DEFAULT_MODELS",
    "PAPER_MODELS",
    "PAPER_SCALE",
    "SIGMA_BITS",
    "SIGNAL_NAMES",
    "SYNTHETIC_TASKS",
    "ClassEffect",
    "ModelSpec",
    "PlantedEffect",
    "SyntheticLogs",
    "planted_rates",
    "profile_shape",
    "synthetic_logs",
]
