"""Manifest rules of the log schema: :func:`check_manifest` and the :class:`RunInfo` it yields.

A run's ``manifest.json`` must be a JSON object with every key of
:data:`pagestats.core.schema.MANIFEST_KEYS` and of the ``model``, ``gate`` and ``protection``
blocks; a readable ``schema_version``; sane ``n_layers``/``n_heads``, ``budgets``,
``evictors``, ``tasks`` and ``gate.bins`` (:func:`parse_bins`); and ``files[]`` entries
whose paths stay inside the run directory (:func:`safe_relative_path`). The row checks
use the extracted :class:`RunInfo` (as a frame, :func:`_run_frame`).

References
----------
PAGE paper, App. F (deployed bins). docs/SCHEMA.md (manifest schema, reader rules, safety)
(manifest paths validated: relative, no ``..``, no symbolic link out of the run).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import polars as pl

from pagestats.core import defaults, schema
from pagestats.io.validation.problems import Problem


@dataclass(frozen=True)
class RunInfo:
    """What the row checks need from one run's manifest (fields ``None`` when unusable)."""

    run_id: str
    manifest_path: str
    schema_version: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    bin_fraction: float = defaults.BIN_FRACTION
    convention: str = defaults.BIN_CONVENTION
    budgets: tuple[float, ...] | None = None
    evictors: tuple[str, ...] | None = None
    tasks: Mapping[str, str] | None = None
    task_names: tuple[str, ...] | None = None  # the manifest's tasks (object keys or list), each must have inputs
    model_name: str | None = None
    context_length: int | None = None
    k_max_stored: int | None = None
    draw: int | None = None
    n_per_task: int | None = None  # inputs asked per task (and draw); no task of the run holds more
    imported: bool = False  # an ``imported`` block: the columns of schema.IMPORTED_NULLABLE may be null
    arms: tuple[tuple[str, float], ...] | None = None  # imported.arms: (evictor, budget) pairs, when not a product
    mode: str = defaults.MODE  # "mode" of the manifest; a manifest without one is query-aware (the paper's setting)
    files: dict[str, dict] = field(default_factory=dict)  # normalised relative path → entry



def listed_files(manifest: Mapping, run_dir: str, bad, tables=schema.TABLES, where: str = "") -> dict[str, dict]:
    """The manifest's ``files[]`` by relative path, each entry with its ``index``; every entry that is
    not an object with a path inside the run under one of ``tables``, is listed twice, or lacks a
    row count or a sha256 is reported through ``bad`` (one line each; ``where`` says why only those
    tables). Shared by collection and deployment runs, so that both read ``files[]`` by one rule."""
    files: dict[str, dict] = {}
    entries = manifest.get("files", [])
    if not isinstance(entries, list):
        bad("manifest files is not a list")
        entries = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or "path" not in entry:
            bad(f"files[{i}] is not an object with a path")
            continue
        rel = safe_relative_path(run_dir, entry["path"])
        if rel is None:
            bad(f"files[{i}].path {entry['path']!r} escapes the run directory (or is not a relative path)")
            continue
        if rel.split("/")[0] not in tables:
            bad(f"files[{i}].path {rel!r} is not under {'/, '.join(tables)}/{where}")
            continue
        if rel in files:
            bad(f"files[{i}].path {rel!r} is listed twice")
            continue
        rows, digest = entry.get("rows"), entry.get("sha256")
        if not (_is_int(rows) and rows >= 0):
            bad(f"files[{i}] ({rel}) has rows {_short(rows) if 'rows' in entry else 'missing'}, not a row count")
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            bad(f"files[{i}] ({rel}) has sha256 {_short(digest) if 'sha256' in entry else 'missing'}, not 64 "
                "lowercase hexadecimal digits")
        files[rel] = {**entry, "index": i}
    return files

def parse_bins(bins) -> tuple[float, str]:
    """Interpret the manifest's ``gate.bins``: a bin fraction, a convention name, or both.

    Accepted forms: a number ``f`` (deployed convention), ``"deployed"`` / ``"strict"``
    (f = 1/3), or a mapping with ``fraction`` (or ``bin_fraction``) and/or ``convention``.
    Raises ``ValueError`` for anything else.
    """
    fraction, convention = defaults.BIN_FRACTION, defaults.BIN_CONVENTION
    if isinstance(bins, bool):
        raise ValueError(f"gate.bins {bins!r} is not a fraction or a convention")
    if isinstance(bins, (int, float)):
        fraction = float(bins)
    elif isinstance(bins, str):
        convention = bins
    elif isinstance(bins, Mapping):
        fraction = float(bins.get("fraction", bins.get("bin_fraction", fraction)))
        convention = str(bins.get("convention", convention))
    else:
        raise ValueError(f"gate.bins {bins!r} is not a fraction or a convention")
    if convention not in BIN_CONVENTIONS:
        raise ValueError(f"gate.bins convention {convention!r} is not 'deployed' or 'strict'")
    if not 0 < fraction <= 0.5:
        raise ValueError(f"gate.bins fraction {fraction} is not in (0, 1/2]")
    return fraction, convention


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: Manifest fields that must be integers, with their smallest value (docs/SCHEMA.md).
_INT_FIELDS = (
    ("schema_version", 0), ("context_length", 1), ("seed", 0), ("draw", 0),
    ("model.n_layers", 2), ("model.n_heads", 2), ("model.n_kv_heads", 1), ("model.head_dim", 1),
    ("gate.w", 1), ("gate.k", 1), ("gate.k_max_stored", 0),
    ("protection.n_sink", 0), ("protection.n_recent", 0),
)
#: Manifest fields that must be strings (``device`` and ``model.attn_impl`` are only recorded; the
#: values of ``created_at`` and ``model.dtype`` are interpreted and checked by :func:`_check_interpreted`).
_STRING_FIELDS = ("run_id", "created_at", "device", "model.name", "model.dtype", "model.attn_impl")
#: Architecture fields bounded by :data:`pagestats.core.schema.MODEL_SIZE_MAX`.
_MODEL_SIZE_FIELDS = ("model.n_layers", "model.n_heads", "model.n_kv_heads", "model.head_dim")
#: Layer-bin conventions (``gate.bins`` / ``gate.convention``; App. F deployed, Table 24 strict).
BIN_CONVENTIONS = ("deployed", "strict")


def _check_interpreted(manifest: Mapping, fields: dict, bad) -> None:
    """Values that the analysis interprets, beyond their type: ``model.dtype`` (bytes per KV
    element, :data:`pagestats.core.schema.MODEL_DTYPE_BYTES`), ``n_kv_heads`` (grouped-query attention:
    it divides ``n_heads``) and ``created_at`` (ISO 8601, compared with a pre-registration)."""
    dtype = fields["model.dtype"]
    if dtype is not None and dtype not in schema.MODEL_DTYPE_BYTES:
        bad(f"manifest model.dtype {_short(dtype)} is not one of {list(schema.MODEL_DTYPE_BYTES)}")
    n_heads, n_kv_heads = fields["model.n_heads"], fields["model.n_kv_heads"]
    if n_heads is not None and n_kv_heads is not None and n_heads % n_kv_heads:
        bad(f"manifest model.n_kv_heads {n_kv_heads} does not divide model.n_heads {n_heads}")
    created = fields["created_at"]
    if created is not None:
        try:
            schema.utc_time(created)
        except ValueError:
            bad(f"manifest created_at {_short(created)} is not an ISO 8601 time stamp")


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _plain_name(name) -> bool:
    """A run_id or task name that an exclusion ``RUN_ID/TASK/INPUT_ID`` can name: a
    non-empty string without ``/``."""
    return isinstance(name, str) and bool(name) and "/" not in name


def _typed(manifest: Mapping, where: str, ok, kind: str, bad):
    """The value at dotted path ``where`` if present and ``ok``; else report it and return None."""
    block, _, key = where.rpartition(".")
    holder = manifest.get(block) if block else manifest
    if not isinstance(holder, Mapping) or key not in holder:
        return None  # a missing key or block is reported once, above
    value = holder[key]
    if not ok(value):
        bad(f"manifest {where} {_short(value)} is not {kind}")
        return None
    return value


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def safe_relative_path(run_dir: str | os.PathLike, rel) -> str | None:
    """The normalised form of manifest path ``rel`` if it stays inside ``run_dir``, else ``None``.

    Rejects non-strings, absolute paths, ``..`` components and paths whose real location
    (symbolic links resolved) lies outside the run directory (docs/SCHEMA.md).
    """
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        return None
    if os.path.isabs(rel) or rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        return None
    norm = os.path.normpath(rel).replace(os.sep, "/")  # a backslash is part of a POSIX name
    if norm == "." or norm.split("/")[0] == "..":
        return None
    root = os.path.realpath(run_dir)
    real = os.path.realpath(os.path.join(root, norm))
    if os.path.commonpath([root, real]) != root:
        return None
    return norm


def _arms(imported, bad) -> tuple[tuple[str, float], ...] | None:
    """An imported run's ``imported.arms``: the (evictor, budget) pairs every input holds, where the
    evictors' budget grids differ (the release's Qwen2.5-14B SnapKV file has 9 budgets, its H2O file 4)."""
    if not isinstance(imported, Mapping) or "arms" not in imported:
        return None
    arms = imported["arms"]
    if not (isinstance(arms, list) and arms and all(
            isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) and _is_number(a[1]) and 0 < a[1] <= 1
            for a in arms)):
        bad(f"manifest imported.arms {_short(arms)} is not a list of [evictor, budget in (0, 1]] pairs")
        return None
    return tuple(sorted((a[0], float(a[1])) for a in arms))


def check_manifest(run_dir: str | os.PathLike, manifest, manifest_path: str) -> tuple[RunInfo | None, list[Problem]]:
    """Check one parsed ``manifest.json`` and extract the :class:`RunInfo` the row checks use.

    Returns ``(None, problems)`` when the manifest is unusable (not an object, no
    ``run_id``, or an unreadable ``schema_version``).
    """
    problems: list[Problem] = []

    def bad(message: str) -> None:
        problems.append(Problem(manifest_path, None, message))

    if not isinstance(manifest, Mapping):
        bad(f"manifest is a JSON {type(manifest).__name__}, not an object")
        return None, problems
    missing = [k for k in schema.MANIFEST_KEYS if k not in manifest]
    if missing:
        bad(f"manifest is missing keys {missing}")
    for block, keys in (
        ("model", schema.MANIFEST_MODEL_KEYS),
        ("gate", schema.MANIFEST_GATE_KEYS),
        ("protection", schema.MANIFEST_PROTECTION_KEYS),
    ):
        value = manifest.get(block)
        if block in manifest and not isinstance(value, Mapping):
            bad(f"manifest {block!r} is not an object")
        elif isinstance(value, Mapping):
            sub_missing = [k for k in keys if k not in value]
            if sub_missing:
                bad(f"manifest {block!r} is missing keys {sub_missing}")

    run_id = manifest.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        bad(f"manifest run_id {run_id!r} is not a non-empty string")
        return None, problems
    version = manifest.get("schema_version")
    if version not in schema.READABLE_VERSIONS or not _is_int(version):
        bad(f"unknown schema_version {version!r}; this reader reads versions {list(schema.READABLE_VERSIONS)}")
        return None, problems

    fields = {}
    for where, minimum in _INT_FIELDS:
        maximum = schema.MODEL_SIZE_MAX if where in _MODEL_SIZE_FIELDS else None
        fields[where] = _typed(manifest, where, lambda v, lo=minimum, hi=maximum: _is_int(v) and v >= lo
                               and (hi is None or v <= hi),
                               f"an integer ≥ {minimum}" + (f" and ≤ {maximum}" if maximum else ""), bad)
    for where in _STRING_FIELDS:
        fields[where] = _typed(manifest, where, lambda v: isinstance(v, str), "a string", bad)
    _check_interpreted(manifest, fields, bad)
    if "software" in manifest and not isinstance(manifest["software"], Mapping):
        bad(f"manifest software {_short(manifest['software'])} is not an object")
    if not _plain_name(run_id):
        bad(f"manifest run_id {_short(run_id)} contains '/' (it could not be named in --exclude)")
    n_layers, n_heads = fields["model.n_layers"], fields["model.n_heads"]
    model_name, context_length = fields["model.name"], fields["context_length"]
    k_max_stored = fields["gate.k_max_stored"]
    if k_max_stored and fields["gate.k"] is not None and fields["gate.k"] > k_max_stored:
        # the stored lists are the gate's own top-k sets: shorter ones could not have given its D
        bad(f"manifest gate.k {fields['gate.k']} is larger than gate.k_max_stored {k_max_stored}")
    n_per_task = manifest.get("n_per_task")
    if "n_per_task" in manifest and not (_is_int(n_per_task) and n_per_task >= 1):
        bad(f"manifest n_per_task {_short(n_per_task)} is not an integer ≥ 1")
        n_per_task = None

    gate = manifest.get("gate") if isinstance(manifest.get("gate"), Mapping) else {}
    fraction, convention = defaults.BIN_FRACTION, defaults.BIN_CONVENTION
    if "bins" in gate:
        try:
            fraction, convention = parse_bins(gate["bins"])
        except (ValueError, TypeError) as err:
            bad(str(err))
    if "convention" in gate:  # the collector writes the convention beside a numeric bins
        if gate["convention"] not in BIN_CONVENTIONS:
            bad(f"manifest gate.convention {_short(gate['convention'])} is not one of {list(BIN_CONVENTIONS)}")
        elif isinstance(gate.get("bins"), (str, Mapping)) and gate["convention"] != convention:
            bad(f"manifest gate.convention {gate['convention']!r} contradicts gate.bins {_short(gate['bins'])}")
        else:
            convention = gate["convention"]

    budgets = manifest.get("budgets")
    if budgets is not None:
        if not (isinstance(budgets, list) and budgets and all(_is_number(b) and 0 < b <= 1 for b in budgets)):
            bad(f"manifest budgets {budgets!r} is not a non-empty list of numbers in (0, 1]")
            budgets = None
        else:
            budgets = tuple(sorted(float(b) for b in budgets))
    evictors = manifest.get("evictors")
    if evictors is not None:
        if not (isinstance(evictors, list) and evictors and all(isinstance(e, str) for e in evictors)):
            bad(f"manifest evictors {evictors!r} is not a non-empty list of names")
            evictors = None
        else:
            evictors = tuple(sorted(evictors))
    tasks = manifest.get("tasks")
    task_names = None
    if isinstance(tasks, Mapping):
        classes = (defaults.CAPACITY_BOUND, defaults.DILUTION_PRONE)
        wrong = {t: c for t, c in tasks.items() if c not in classes}
        if wrong:
            bad(f"manifest tasks {_short(wrong)} have classes other than {list(classes)}")
        odd = [t for t in tasks if not _plain_name(t)]
        if odd:
            bad(f"manifest task names {_short(odd)} contain '/' (they could not be named in --exclude)")
        tasks = {str(t): c for t, c in tasks.items() if c in classes and _plain_name(t)}
        task_names = tuple(tasks)
    elif tasks is not None and not (isinstance(tasks, list) and all(isinstance(t, str) and _plain_name(t)
                                                                     for t in tasks)):
        bad(f"manifest tasks {tasks!r} is neither a {{name: class}} object nor a list of names")
        tasks = None
    else:
        task_names = tuple(tasks) if tasks is not None else None
        tasks = None  # a plain list of names: classes come from the defaults
    if manifest.get("kind", schema.COLLECTION_KIND) != schema.COLLECTION_KIND:  # deployment runs are set apart before
        bad(f"manifest kind {_short(manifest['kind'])} is not one of {list(schema.RUN_KINDS)}")
    mode = manifest.get("mode", defaults.MODE)
    if mode not in defaults.MODES:
        bad(f"manifest mode {_short(mode)} is not one of {list(defaults.MODES)}")
        mode = str(mode)  # a run of no known mode: no --mode selects it
    files = listed_files(manifest, run_dir, bad)

    info = RunInfo(
        run_id=run_id,
        manifest_path=manifest_path,
        schema_version=version,
        n_layers=n_layers,
        n_heads=n_heads,
        bin_fraction=fraction,
        convention=convention,
        budgets=budgets,
        evictors=evictors,
        tasks=tasks,
        task_names=task_names,
        model_name=model_name,
        context_length=context_length,
        k_max_stored=k_max_stored,
        draw=fields["draw"],
        n_per_task=n_per_task,
        mode=mode,
        imported=isinstance(manifest.get("imported"), Mapping),
        arms=_arms(manifest.get("imported"), bad),
        files=files,
    )
    return info, problems


def _run_frame(runs: Mapping[str, RunInfo]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "run_id": [r.run_id for r in runs.values()],
            "_n_layers": [r.n_layers for r in runs.values()],
            "_n_heads": [r.n_heads for r in runs.values()],
            "_model": [r.model_name for r in runs.values()],
            "_context_length": [r.context_length for r in runs.values()],
            "_k_max_stored": [r.k_max_stored for r in runs.values()],
            "_draw": [r.draw for r in runs.values()],
        },
        schema={"run_id": pl.String, "_n_layers": pl.Int64, "_n_heads": pl.Int64, "_model": pl.String,
                "_context_length": pl.Int64, "_k_max_stored": pl.Int64, "_draw": pl.Int64},
    )
