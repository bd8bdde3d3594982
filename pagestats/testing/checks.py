"""Argument checks and run metadata of :func:`pagestats.testing.synthetic_logs`.

Validation of models, context lengths, draws, names, task classes, reference counts and
budgets, plus the per-run metadata: run id, the manifest dict and the CRC used to derive
per-cell random streams.

References
----------
docs/SCHEMA.md (the full-KV audit arm: budgets contain 1.0); PAGE paper App. A.7.3 (input-draw
replicates, recorded in the manifest's ``draw``).
"""

from __future__ import annotations

import platform
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict

import numpy as np

from pagestats import __version__
from pagestats.core import defaults, schema
from pagestats.testing.params import DEFAULT_N_REFERENCES, ModelSpec


def _manifest(run_id, spec, ctx, draw, classes, evictors, budgets, k_max, seed, effect, nref, created_at) -> dict:
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "run_id": run_id,
        "created_at": created_at,
        "model": spec.manifest(),
        "device": "synthetic",
        "context_length": int(ctx),
        "tasks": dict(classes),
        "evictors": list(evictors),
        "budgets": list(budgets),
        "gate": {
            "w": defaults.WINDOW,
            "k": min(defaults.TOP_K, int(k_max)) if k_max else defaults.TOP_K,  # the collector's k ≤ k_max
            "k_max_stored": int(k_max),
            "bins": defaults.BIN_FRACTION,
            "convention": defaults.BIN_CONVENTION,
        },
        "protection": {"n_sink": defaults.N_SINK, "n_recent": defaults.N_RECENT},
        "seed": int(seed),
        "draw": int(draw),
        "software": {
            "python": platform.python_version(),
            "torch": None,
            "transformers": None,
            "pagestats": __version__,
            "numpy": np.__version__,
        },
        "synthetic": {
            "generator": "pagestats.testing.synthetic_logs",
            "effect": effect.to_dict(),
            "n_references": dict(nref),
        },
    }


def _run_id(model: str, ctx: int, draw: int) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"syn-{model}-{ctx}-d{draw}")


def _crc(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


def _model_specs(models) -> list[ModelSpec]:
    if isinstance(models, ModelSpec):
        models = [models]
    if isinstance(models, Mapping):
        specs = []
        for name, value in models.items():
            if isinstance(value, ModelSpec):
                specs.append(value if value.name == name else ModelSpec(**{**asdict(value), "name": name}))
            elif isinstance(value, Mapping):
                specs.append(ModelSpec(name=name, **value))
            elif isinstance(value, Sequence) and len(value) == 2:
                specs.append(ModelSpec(name, int(value[0]), int(value[1])))
            else:
                raise ValueError(f"model {name!r}: expected a ModelSpec, a dict or (n_layers, n_heads), got {value!r}")
    else:
        specs = list(models)
    if not specs or not all(isinstance(s, ModelSpec) for s in specs):
        raise ValueError("models must be a non-empty sequence of ModelSpec (or a mapping name → shape)")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate model names in {names}")
    for s in specs:
        if s.n_layers < 2 or s.n_heads < 2:
            raise ValueError(f"model {s.name!r}: need n_layers ≥ 2 and n_heads ≥ 2, got {s.n_layers}, {s.n_heads}")
    return specs


def _int_list(values, name: str, minimum: int) -> list[int]:
    out = list(values)
    if not out or not all(isinstance(v, (int, np.integer)) and v >= minimum for v in out):
        raise ValueError(f"{name} must be a non-empty sequence of integers ≥ {minimum}, got {values!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"{name} has duplicates: {values!r}")
    return [int(v) for v in out]


def _str_list(values, name: str) -> list[str]:
    if isinstance(values, str):
        raise ValueError(f"{name} must be a sequence of names, not the string {values!r}")
    out = list(values)
    if not out or not all(isinstance(v, str) and v for v in out) or len(set(out)) != len(out):
        raise ValueError(f"{name} must be a non-empty sequence of distinct names, got {values!r}")
    return out


def _task_classes(tasks, task_classes) -> dict[str, str]:
    allowed = (defaults.CAPACITY_BOUND, defaults.DILUTION_PRONE)
    if task_classes is None:
        return {t: defaults.default_task_class(t) for t in tasks}
    missing = [t for t in tasks if t not in task_classes]
    if missing:
        raise ValueError(f"task_classes has no class for {missing}")
    bad = {t: task_classes[t] for t in tasks if task_classes[t] not in allowed}
    if bad:
        raise ValueError(f"task_classes values must be one of {allowed}, got {bad}")
    return {t: task_classes[t] for t in tasks}


def _n_references(tasks, n_references) -> dict[str, int]:
    given = dict(DEFAULT_N_REFERENCES if n_references is None else n_references)
    out = {t: int(given.get(t, 1)) for t in tasks}
    bad = {t: m for t, m in out.items() if m < 1}
    if bad:
        raise ValueError(f"n_references must be ≥ 1, got {bad}")
    return out


def _check_budgets(budgets) -> list[float]:
    b = [float(x) for x in budgets]
    if not b or any(not 0.0 < x <= 1.0 for x in b) or len(set(b)) != len(b):
        raise ValueError(f"budgets must be distinct values in (0, 1], got {budgets!r}")
    if 1.0 not in b:
        raise ValueError("budgets must contain 1.0 (the full-KV audit arm, docs/SCHEMA.md)")
    return sorted(b)
