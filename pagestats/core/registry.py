"""The gate policies by short name: the one table that ``--policy``, calibrate and the gate file read.

It imports nothing: the gate file is read where neither polars nor DuckDB is installed, and the
command line routes a policy without importing its class (``deploy.risk`` costs about 1.2 s).
"""

from __future__ import annotations

import importlib
from typing import NamedTuple


class Entry(NamedTuple):
    """One registered policy: its class (``module:Class``), and where it applies."""

    path: str
    #: ``whatif`` and ``report`` replay it: it reads D and the inputs' task classes, no outcome.
    replay: bool
    #: A gate file holds it: one τ per model (:mod:`pagestats.deploy.calibrate`).
    gate: bool
    #: Its τ is certified on harm labels at one (evictor, budget) (Table 27; the class reads ``harmed``):
    #: ``calibrate`` takes ``--alpha``, ``--delta``, ``--budget``, ``--evictor`` and labels the pilot first.
    harm_labels: bool = False


POLICIES: dict[str, Entry] = {
    "fixed": Entry("pagestats.replay.policies:FixedTau", replay=True, gate=True),
    "z": Entry("pagestats.replay.policies:ZScored", replay=True, gate=True),
    "midpoint": Entry("pagestats.replay.policies:Midpoint", replay=True, gate=True),
    "oracle": Entry("pagestats.replay.policies:TaskOracle", replay=True, gate=False),
    "risk": Entry("pagestats.deploy.risk:RiskControlled", replay=False, gate=True, harm_labels=True),
}


def replayed() -> list[str]:
    """The short names ``whatif`` and ``report`` take."""
    return [name for name, entry in POLICIES.items() if entry.replay]


def deployable() -> list[str]:
    """The short names a gate file holds (``calibrate`` takes)."""
    return [name for name, entry in POLICIES.items() if entry.gate]


def labelled() -> list[str]:
    """The short names whose τ is certified on harm labels (``calibrate``'s harm options)."""
    return [name for name, entry in POLICIES.items() if entry.harm_labels]


def policy_class(name: str) -> type:
    """The class registered as ``name`` (``ValueError`` naming the known ones otherwise)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICIES)}")
    module, cls = POLICIES[name].path.split(":")
    return getattr(importlib.import_module(module), cls)


def short_name(cls: type) -> str | None:
    """The short name ``cls`` is registered under, or None (a policy of the library alone)."""
    path = f"{cls.__module__}:{cls.__qualname__}"
    return next((name for name, entry in POLICIES.items() if entry.path == path), None)
