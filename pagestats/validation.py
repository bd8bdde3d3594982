"""Validation rules of log schema v1 (DESIGN §3, §9), as vectorised checks on frames.

:mod:`pagestats.io` discovers and reads the files; this module holds the rules. Every
check returns a list of :class:`Problem` (never raises, never stops at the first), each
naming the file and, where there is one, the row. Row numbers are 0-based positions
within the file (the index pyarrow / polars would give that row; line ``row + 1`` of a
jsonl file).

The rules, in the order they run:

manifest (:func:`check_manifest`)
    valid JSON object; every key of :data:`pagestats.schema.MANIFEST_KEYS` and of the
    ``model``, ``gate`` and ``protection`` blocks; a readable ``schema_version``; sane
    ``n_layers``/``n_heads``, ``budgets``, ``evictors``, ``tasks``, ``gate.bins``;
    ``files[]`` entries whose paths stay inside the run directory (§9).
frames (:func:`check_frames`)
    nulls in required columns; duplicate inputs / outcome rows / topk rows; ``drop``
    finite; ``full_score`` and ``score`` in [0, 1]; ``budget`` in (0, 1]; ``run_id``,
    ``model``, ``context_length`` and ``task`` agreeing with the run's manifest;
    ``agreement`` length = manifest ``n_layers`` (else consistent within the run);
    ``pair_jaccard`` length = L·H(H−1)/2; profile values in [0, 1]; logged ``drop`` =
    :func:`pagestats.profile.drop_from_agreement` (manifest bins) within 1e-6;
    outcomes without an input and inputs without outcomes; the same budget grid for
    every (input, evictor) and the same evictor set for every input of a run (the
    manifest's, when there is one); the budget-1.0 arm present and equal to the full-KV
    outcome (score = full_score, n_kept = n_tokens); ``n_kept`` in [1, n_tokens]; topk
    layer/head in range, indices in [0, n_tokens) without repeats.

A rule that fires on many rows of one file reports the first :data:`MAX_ROWS_PER_RULE`
rows and then one line with the count of the rest, so that a wholly broken shard yields
a readable report.

References
----------
PAGE paper, §3 (a_ℓ, Eq. 3 drop D), §4 "Setup" (budgets, full-cache audit arm at b = 1),
App. F (deployed bins). DESIGN §3 (schema, reader rules) and §9 (paths validated).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from pagestats import defaults, profile, schema

#: Rows reported per (rule, file) before the rest are summarised in one line.
MAX_ROWS_PER_RULE = 20
#: Tolerance of the logged-vs-recomputed drop check (float32 agreement → float64 D).
DROP_TOLERANCE = 1e-6
#: Tolerance of the budget-1.0 vs full-KV score check.
SCORE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Problem:
    """One validation problem: the file, the 0-based row within it (or ``None``), a message.

    ``str(problem)`` is one line, ``"FILE:row N: message"`` or ``"FILE: message"``, as
    printed by ``pagestats validate``.
    """

    file: str
    row: int | None
    message: str

    def __str__(self) -> str:
        where = self.file if self.row is None else f"{self.file}:row {self.row}"
        return f"{where}: {self.message}"


class LogError(ValueError):
    """Raised by ``load(strict=True)`` (and for bad ``exclude`` arguments); carries every problem."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = [str(p) for p in self.problems]
        head = f"{len(lines)} problem{'s' if len(lines) != 1 else ''} in the logs"
        super().__init__("\n".join([head, *lines]))


# --------------------------------------------------------------------------- manifest


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
    model_name: str | None = None
    context_length: int | None = None
    files: dict[str, dict] = field(default_factory=dict)  # normalised relative path → entry


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
    if convention not in ("deployed", "strict"):
        raise ValueError(f"gate.bins convention {convention!r} is not 'deployed' or 'strict'")
    if not 0 < fraction <= 0.5:
        raise ValueError(f"gate.bins fraction {fraction} is not in (0, 1/2]")
    return fraction, convention


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def safe_relative_path(run_dir: str | os.PathLike, rel) -> str | None:
    """The normalised form of manifest path ``rel`` if it stays inside ``run_dir``, else ``None``.

    Rejects non-strings, absolute paths, ``..`` components and paths whose real location
    (symbolic links resolved) lies outside the run directory (DESIGN §9).
    """
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        return None
    if os.path.isabs(rel) or rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        return None
    norm = os.path.normpath(rel).replace("\\", "/")
    if norm == "." or norm.split("/")[0] == "..":
        return None
    root = os.path.realpath(run_dir)
    real = os.path.realpath(os.path.join(root, norm))
    if os.path.commonpath([root, real]) != root:
        return None
    return norm


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

    model = manifest.get("model") if isinstance(manifest.get("model"), Mapping) else {}
    n_layers = model.get("n_layers")
    if "n_layers" in model and not (_is_int(n_layers) and n_layers >= 2):
        bad(f"model.n_layers {n_layers!r} is not an integer ≥ 2")
        n_layers = None
    n_heads = model.get("n_heads")
    if "n_heads" in model and not (_is_int(n_heads) and n_heads >= 2):
        bad(f"model.n_heads {n_heads!r} is not an integer ≥ 2")
        n_heads = None
    model_name = model.get("name") if isinstance(model.get("name"), str) else None

    gate = manifest.get("gate") if isinstance(manifest.get("gate"), Mapping) else {}
    fraction, convention = defaults.BIN_FRACTION, defaults.BIN_CONVENTION
    if "bins" in gate:
        try:
            fraction, convention = parse_bins(gate["bins"])
        except (ValueError, TypeError) as err:
            bad(str(err))

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
    if isinstance(tasks, Mapping):
        classes = (defaults.CAPACITY_BOUND, defaults.DILUTION_PRONE)
        wrong = {t: c for t, c in tasks.items() if c not in classes}
        if wrong:
            bad(f"manifest tasks {wrong} have classes other than {list(classes)}")
        tasks = {str(t): c for t, c in tasks.items() if c in classes}
    elif tasks is not None and not (isinstance(tasks, list) and all(isinstance(t, str) for t in tasks)):
        bad(f"manifest tasks {tasks!r} is neither a {{name: class}} object nor a list of names")
        tasks = None
    else:
        tasks = None  # a plain list of names: classes come from the defaults
    context_length = manifest.get("context_length")
    context_length = context_length if _is_int(context_length) else None

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
        if rel.split("/")[0] not in schema.TABLES:
            bad(f"files[{i}].path {rel!r} is not under {'/, '.join(schema.TABLES)}/")
            continue
        if rel in files:
            bad(f"files[{i}].path {rel!r} is listed twice")
            continue
        files[rel] = {**entry, "index": i}

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
        model_name=model_name,
        context_length=context_length,
        files=files,
    )
    return info, problems


# --------------------------------------------------------------------------- helpers


def _fmt_key(values) -> str:
    return "(" + ", ".join(repr(v) if isinstance(v, str) else str(v) for v in values) + ")"


def emit(bad: pl.DataFrame, files: list[str], rule: str, detail=None) -> list[Problem]:
    """Problems for the rows of ``bad`` (which has ``_file`` and ``_row``), at most
    :data:`MAX_ROWS_PER_RULE` per file, then one line counting the rest.

    ``detail`` is ``None``, the name of a column of per-row text, or a callable taking the
    row as a dict and returning text (called for the reported rows only).
    """
    if bad.height == 0:
        return []
    out: list[Problem] = []
    bad = bad.sort("_file", "_row")
    for (file_idx,), group in bad.group_by("_file", maintain_order=True):
        name = files[int(file_idx)]
        head = group.head(MAX_ROWS_PER_RULE)
        for rec in head.iter_rows(named=True):
            if detail is None:
                msg = rule
            elif callable(detail):
                msg = f"{rule}: {detail(rec)}"
            else:
                msg = f"{rule}: {rec[detail]}"
            out.append(Problem(name, int(rec["_row"]), msg))
        rest = group.height - head.height
        if rest:
            out.append(Problem(name, None, f"{rest} more rows with: {rule}"))
    return out


def _nulls(frame: pl.DataFrame, table: str, files: list[str]) -> list[Problem]:
    out = []
    for col in schema.columns(table):
        if col.required and col.name in frame.columns and frame[col.name].null_count():
            out += emit(frame.filter(pl.col(col.name).is_null()), files, f"{table} column {col.name!r} is null")
    return out


def _duplicates(
    frame: pl.DataFrame, key: tuple[str, ...], files: list[str], what: str, candidates: pl.Expr | None = None
) -> tuple[list[Problem], pl.DataFrame]:
    """Problems for later occurrences of a repeated ``key``, and the frame without them.

    ``candidates`` (a cheap boolean expression, e.g. a duplicated hash) narrows the exact
    comparison of ``key`` to the rows that can be duplicates.
    """
    sub = frame.filter(candidates) if candidates is not None else frame
    if sub.height == 0:
        return [], frame
    later = ~pl.struct(list(key)).is_first_distinct()
    dups = sub.filter(later)
    if dups.height == 0:
        return [], frame
    first = sub.filter(~later).select(*key, pl.col("_file").alias("_f0"), pl.col("_row").alias("_r0"))
    dups = dups.join(first, on=list(key), how="left", nulls_equal=True)

    def detail(rec):
        values = _fmt_key(rec[k] for k in key)
        return f"{_fmt_key(key)} = {values}, first at {files[int(rec['_f0'])]}:row {rec['_r0']}".replace("'", "")

    kept = frame.join(dups.select("_file", "_row"), on=["_file", "_row"], how="anti", maintain_order="left")
    return emit(dups, files, f"duplicate {what}", detail), kept


def _out_of_range(frame, col, lo, hi, files, rule, lo_open=False):
    x = pl.col(col)
    low = (x <= lo) if lo_open else (x < lo)
    bad = frame.filter(x.is_not_null() & (x.is_nan() | low | (x > hi)))
    bad = bad.with_columns(pl.format(f"{col} = {{}}", x).alias("_detail"))
    return emit(bad, files, rule, "_detail")


def _mode_per_run(frame: pl.DataFrame, value: str) -> pl.DataFrame:
    """Most common ``value`` per run_id (ties → smallest), columns run_id, ``value``."""
    counts = frame.group_by("run_id", value).len()
    return counts.sort(["run_id", "len", value], descending=[False, True, False]).unique(
        "run_id", keep="first", maintain_order=True
    ).drop("len")


# --------------------------------------------------------------------------- frames


#: Hash of an input's identity (run_id, task, input_id). Grouping and joining 36M outcome
#: rows on three columns (two of them strings) is the slow part of validation, so the
#: rules group on this u64 and confirm every hit on the real columns; if two distinct
#: inputs ever shared a hash, the rules fall back to the real columns throughout.
INPUT_HASH = pl.struct(list(schema.INPUT_KEY)).hash().alias("_ih")


def check_frames(
    inputs: pl.DataFrame,
    outcomes: pl.DataFrame,
    topk: pl.DataFrame | None,
    *,
    files: list[str],
    runs: Mapping[str, RunInfo],
    file_runs: Mapping[int, str],
    incomplete: frozenset[str] = frozenset(),
) -> list[Problem]:
    """Row-level rules on the loaded tables (each with ``_file`` and ``_row`` columns).

    Parameters
    ----------
    inputs, outcomes, topk : polars.DataFrame
        Tables in canonical types plus ``_file`` (index into ``files``) and ``_row``.
    files : list of str
        File names, indexed by ``_file``.
    runs : mapping run_id → RunInfo
        Parsed manifests (runs without one are checked for internal consistency only).
    file_runs : mapping file index → run_id
        The manifest run a file lies in, for the run_id-consistency check.
    incomplete : set of table names
        Tables of which some file could not be read (already reported): the rules that
        look for rows missing from them (inputs without outcomes, outcomes or topk rows
        without an input) are skipped rather than blaming every row of the lost file.

    Notes
    -----
    Cost is linear in the rows: per-row range checks, one group-by of the outcomes per
    input (row count, sum of 32-bit hashes of the (evictor, budget) cells, n_kept
    extremes) compared with the run's reference signature, and exact per-row checks
    only on the inputs whose signature differs.
    """
    problems: list[Problem] = []
    problems += _check_file_runs(inputs, "inputs", files, file_runs)
    problems += _check_file_runs(outcomes, "outcomes", files, file_runs)
    if topk is not None:
        problems += _check_file_runs(topk, "topk", files, file_runs)

    problems += _nulls(inputs, "inputs", files)
    inputs = inputs.with_columns(INPUT_HASH)
    p, inp = _duplicates(inputs, schema.INPUT_KEY, files, "input", pl.col("_ih").is_duplicated())
    problems += p
    problems += _check_inputs(inp, files, runs)
    key = ["_ih"] if inp["_ih"].n_unique() == inp.height else list(schema.INPUT_KEY)

    problems += _nulls(outcomes, "outcomes", files)
    problems += _check_outcomes(inp, outcomes.with_columns(INPUT_HASH), files, runs, incomplete, key)

    if topk is not None:
        problems += _nulls(topk, "topk", files)
        tk = topk.with_columns(INPUT_HASH)
        cand = pl.struct("_ih", "layer", "head").hash().is_duplicated()
        p, tk = _duplicates(tk, schema.TOPK_KEY, files, "topk row", cand)
        problems += p
        problems += _check_topk(inp, tk, files, runs, incomplete, key)
    return problems


def _check_file_runs(frame, table, files, file_runs) -> list[Problem]:
    """Rows of a run directory's files carry that run's run_id (compared by hash, then exactly)."""
    idx = [i for i in file_runs if i is not None]
    if not idx or frame.height == 0:
        return []
    expected = pl.Series([file_runs[i] for i in idx], dtype=pl.String)
    exp_hash = expected.hash()
    file_idx = pl.Series(idx, dtype=frame.schema["_file"])
    bad = frame.select("_file", "_row", "run_id").filter(pl.col("_file").is_in(file_idx.implode()))
    bad = bad.filter(pl.col("run_id").hash() != pl.col("_file").replace_strict(file_idx, exp_hash))
    if bad.height == 0:
        return []
    bad = bad.with_columns(pl.col("_file").replace_strict(file_idx, expected).alias("_run"))
    bad = bad.filter(pl.col("run_id") != pl.col("_run"))
    bad = bad.with_columns(pl.format("run_id {} but the run's manifest says {}", "run_id", "_run").alias("_detail"))
    return emit(bad, files, f"{table} row from another run", "_detail")


def _run_frame(runs: Mapping[str, RunInfo]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "run_id": [r.run_id for r in runs.values()],
            "_n_layers": [r.n_layers for r in runs.values()],
            "_n_heads": [r.n_heads for r in runs.values()],
            "_model": [r.model_name for r in runs.values()],
            "_context_length": [r.context_length for r in runs.values()],
        },
        schema={"run_id": pl.String, "_n_layers": pl.Int64, "_n_heads": pl.Int64, "_model": pl.String,
                "_context_length": pl.Int64},
    )


def _check_inputs(inp: pl.DataFrame, files, runs) -> list[Problem]:
    problems: list[Problem] = []
    problems += _out_of_range(inp, "full_score", 0.0, 1.0, files, "full_score outside [0, 1] or NaN")
    bad = inp.filter(pl.col("drop").is_not_null() & ~pl.col("drop").is_finite())
    problems += emit(bad.with_columns(pl.format("drop = {}", "drop").alias("_d")), files, "drop is NaN or infinite", "_d")
    bad = inp.filter(pl.col("n_tokens") < 1)
    problems += emit(bad.with_columns(pl.format("n_tokens = {}", "n_tokens").alias("_d")), files, "n_tokens < 1", "_d")

    frame = inp.select(
        "_file", "_row", "run_id", "task", "model", "context_length", "drop",
        pl.col("agreement").list.len().alias("_L"),
        pl.col("pair_jaccard").list.len().alias("_P"),
    ).join(_run_frame(runs), on="run_id", how="left")

    # model / context length / task against the manifest
    bad = frame.filter(pl.col("_model").is_not_null() & (pl.col("model") != pl.col("_model")))
    problems += emit(bad.with_columns(pl.format("model {} but the manifest says {}", "model", "_model").alias("_d")),
                     files, "model differs from the manifest", "_d")
    bad = frame.filter(pl.col("_context_length").is_not_null() & (pl.col("context_length") != pl.col("_context_length")))
    problems += emit(bad.with_columns(pl.format("context_length {} but the manifest says {}", "context_length",
                                                "_context_length").alias("_d")),
                     files, "context_length differs from the manifest", "_d")
    for run_id, info in runs.items():
        if info.tasks is None:
            continue
        unknown = (
            frame.filter((pl.col("run_id") == run_id) & ~pl.col("task").is_in(list(info.tasks)))
            .group_by("task").agg(pl.col("_file").first(), pl.col("_row").first(), pl.len())
        )
        unknown = unknown.with_columns(pl.format("task {} ({} inputs)", "task", "len").alias("_d"))
        problems += emit(unknown, files, f"task not in the manifest tasks of run {run_id!r}", "_d")

    # agreement length: manifest n_layers, else the run's most common length
    ref = _mode_per_run(frame, "_L").rename({"_L": "_L_ref"})
    frame = frame.join(ref, on="run_id", how="left").with_columns(
        pl.coalesce("_n_layers", "_L_ref").alias("_L_exp"),
        pl.when(pl.col("_n_layers").is_not_null()).then(pl.lit("manifest model.n_layers"))
        .otherwise(pl.lit("the run's other inputs have")).alias("_L_src"),
    )
    bad = frame.filter(pl.col("_L") != pl.col("_L_exp"))
    problems += emit(bad.with_columns(pl.format("{} layers; {} {}", "_L", "_L_src", "_L_exp").alias("_d")),
                     files, "agreement length differs from the number of layers", "_d")
    bad = frame.filter(pl.col("_L") < 2)
    problems += emit(bad, files, "agreement has fewer than 2 layers")

    # pair_jaccard length: L·H(H−1)/2 (H from the manifest, else consistent and triangular)
    with_h = frame.filter(pl.col("_n_heads").is_not_null())
    expected = pl.col("_L_exp") * pl.col("_n_heads") * (pl.col("_n_heads") - 1) // 2
    bad = with_h.filter(pl.col("_P") != expected).with_columns(expected.alias("_P_exp"))
    problems += emit(bad.with_columns(pl.format("length {}; expected L·H(H−1)/2 = {} (L = {}, H = {})", "_P", "_P_exp",
                                                "_L_exp", "_n_heads").alias("_d")),
                     files, "pair_jaccard length differs from L·H(H−1)/2", "_d")
    without_h = frame.filter(pl.col("_n_heads").is_null())
    if without_h.height:
        pref = _mode_per_run(without_h, "_P").rename({"_P": "_P_ref"})
        w = without_h.join(pref, on="run_id", how="left")
        bad = w.filter(pl.col("_P") != pl.col("_P_ref"))
        problems += emit(bad.with_columns(pl.format("length {}; the run's other inputs have {}", "_P", "_P_ref").alias("_d")),
                         files, "pair_jaccard length inconsistent within the run", "_d")
        for rec in pref.join(ref, on="run_id").iter_rows(named=True):
            L, P = rec["_L_ref"], rec["_P_ref"]
            if L and (P % L or not _triangular(P // L)):
                first = w.filter((pl.col("run_id") == rec["run_id"]) & (pl.col("_P") == P)).head(1)
                problems += emit(first, files, f"pair_jaccard length {P} is not L·H(H−1)/2 for L = {L} and any H")

    # profile values are Jaccards: finite and in [0, 1]
    for col in ("agreement", "pair_jaccard"):
        x = pl.col(col)
        bad = inp.filter(x.list.len() > 0).filter(~x.list.sum().is_finite() | (x.list.min() < 0) | (x.list.max() > 1))
        problems += emit(bad, files, f"{col} has values outside [0, 1] or NaN")

    problems += _check_drop(inp, frame, files, runs)
    return problems


def _triangular(p: int) -> bool:
    h = int(round((1 + math.sqrt(1 + 8 * p)) / 2))
    return h >= 2 and h * (h - 1) // 2 == p


def _check_drop(inp: pl.DataFrame, frame: pl.DataFrame, files, runs) -> list[Problem]:
    """Logged ``drop`` against :func:`pagestats.profile.drop_from_agreement` (Eq. 3), per bins setting."""
    problems: list[Problem] = []
    base = inp.select("_file", "_row", "run_id", "drop", "agreement").with_columns(
        pl.col("agreement").list.len().alias("_L")
    ).filter(pl.col("drop").is_finite() & (pl.col("_L") >= 2))
    settings: dict[tuple[float, str], list[str]] = {}
    for run_id in base["run_id"].unique().to_list():
        info = runs.get(run_id)
        key = (info.bin_fraction, info.convention) if info else (defaults.BIN_FRACTION, defaults.BIN_CONVENTION)
        settings.setdefault(key, []).append(run_id)
    for (fraction, convention), run_ids in settings.items():
        sub = base.filter(pl.col("run_id").is_in(run_ids))
        for (n_layers,), group in sub.group_by("_L"):
            arr = group["agreement"].list.to_array(int(n_layers)).to_numpy()
            try:
                recomputed = profile.drop_from_agreement(arr, fraction, convention)
            except ValueError as err:
                problems += emit(group.head(1), files, f"cannot compute drop: {err}")
                continue
            diff = np.abs(recomputed - group["drop"].to_numpy())
            mask = diff > DROP_TOLERANCE  # NaN agreement is reported by the range check
            if mask.any():
                bad = group.filter(pl.Series(mask)).with_columns(pl.Series("_re", recomputed[mask]))
                bad = bad.with_columns(pl.format("logged {} but agreement gives {}", "drop", "_re").alias("_d"))
                problems += emit(bad, files, f"drop disagrees with drop_from_agreement(agreement, bins={fraction:.6g}, "
                                             f"{convention}) by more than {DROP_TOLERANCE:g}", "_d")
    return problems


#: 32-bit hash of one (evictor, budget) arm; an input's arms are summarised by their count
#: and the sum of these (a set signature: equal sets give equal sums).
CELL_HASH = (pl.struct("evictor", "budget").hash() & 0xFFFFFFFF).alias("_cell")


def _cell_signature(evictors, budgets) -> tuple[int, int]:
    cells = pl.DataFrame(
        {"evictor": list(evictors), "budget": [float(b) for b in budgets]},
        schema={"evictor": pl.String, "budget": pl.Float64},
    )
    h = cells.select(CELL_HASH)["_cell"]
    return cells.height, int(h.sum())


def _check_outcomes(inp: pl.DataFrame, oc: pl.DataFrame, files, runs, incomplete, key) -> list[Problem]:
    problems: list[Problem] = []
    problems += _out_of_range(oc, "score", 0.0, 1.0, files, "score outside [0, 1] or NaN")
    problems += _out_of_range(oc, "budget", 0.0, 1.0, files, "budget outside (0, 1] or NaN", lo_open=True)

    ikey = list(schema.INPUT_KEY)
    # one numeric group-by over all outcome rows; identities are attached afterwards from
    # inputs (or, for the rare outcomes without an input, from their own first row)
    # (lazy with an explicit projection: the eager group-by is several times slower here)
    per_input = (
        oc.lazy()
        .select(*key, "_file", "_row", "n_kept", "evictor", "budget")
        .group_by(key)
        .agg(
            pl.col("_file").first(), pl.col("_row").first(), pl.len().alias("_n"),
            pl.col("n_kept").min().alias("_kmin"), pl.col("n_kept").max().alias("_kmax"),
            CELL_HASH.cast(pl.UInt64).sum().alias("_sig"),
        )
        .collect()
    )
    if key != ikey:
        known = per_input.join(inp.select(*key, *ikey), on=key, how="inner")
        unknown = per_input.join(inp.select(key), on=key, how="anti")
        if unknown.height:
            ids = oc.join(unknown.select("_file", "_row"), on=["_file", "_row"], how="semi").select("_file", "_row", *ikey)
            unknown = unknown.join(ids, on=["_file", "_row"], how="left")
            per_input = pl.concat([known, unknown.select(known.columns)])
        else:
            per_input = known

    # orphans both ways
    if "inputs" not in incomplete:
        orphans = per_input.join(inp.select(key), on=key, how="anti")
        orphans = orphans.with_columns(pl.format("input ({}, {}, {}) has {} outcome rows", *ikey, "_n").alias("_d"))
        problems += emit(orphans, files, "outcomes whose input is missing from inputs", "_d")
    if "outcomes" not in incomplete:
        lonely = inp.join(per_input.select(key), on=key, how="anti")
        problems += emit(lonely, files, "input with no outcomes")

    # n_kept in [1, n_tokens]: inputs whose extremes fall outside, then their rows
    sizes = inp.select(*key, "n_tokens", "full_score")
    cand = per_input.join(sizes, on=key, how="inner").filter(
        (pl.col("_kmin") < 1) | (pl.col("_kmax") > pl.col("n_tokens"))
    )
    if cand.height:
        rows = oc.join(cand.select(*key, "n_tokens"), on=key, how="inner")
        bad = rows.filter((pl.col("n_kept") < 1) | (pl.col("n_kept") > pl.col("n_tokens")))
        problems += emit(bad.with_columns(pl.format("n_kept = {}, n_tokens = {}", "n_kept", "n_tokens").alias("_d")),
                         files, "n_kept outside [1, n_tokens]", "_d")

    # the budget-1.0 arm reproduces the full-KV outcome (§4 "Setup": full-cache audit)
    full = (
        oc.lazy()
        .filter(pl.col("budget") == 1.0)
        .select("_file", "_row", *{*key, *ikey}, "evictor", "n_kept", "score")
        .join(sizes.lazy(), on=key, how="inner")
        .collect()
    )
    bad = full.filter(((pl.col("score") - pl.col("full_score")).abs() > SCORE_TOLERANCE)
                      | (pl.col("score").is_nan() != pl.col("full_score").is_nan())
                      | (pl.col("n_kept") != pl.col("n_tokens")))
    bad = bad.with_columns(pl.format("evictor {}: score {} vs full_score {}, n_kept {} vs n_tokens {}", "evictor",
                                     "score", "full_score", "n_kept", "n_tokens").alias("_d"))
    problems += emit(bad, files, "budget 1.0 outcome differs from the full-KV outcome", "_d")

    problems += _check_grid(oc, per_input, files, runs, key)
    return problems


def _check_grid(oc: pl.DataFrame, per_input: pl.DataFrame, files, runs, key) -> list[Problem]:
    """Every (input, evictor) of a run has the same budget grid and every input the same
    evictor set (and no outcome row twice): the manifest's evictors × budgets when it
    lists them, else the run's most common set of arms."""
    problems: list[Problem] = []
    for run_id in sorted(per_input["run_id"].unique().drop_nulls().to_list()):
        sub = per_input.filter(pl.col("run_id") == run_id)
        usual_n, usual_sig = sub.group_by("_n", "_sig").len().sort(["len", "_n"], descending=[True, False]).row(0)[:2]
        one = sub.filter((pl.col("_n") == usual_n) & (pl.col("_sig") == usual_sig)).select(key).head(1)
        usual = oc.join(one, on=key, how="semi").select("evictor", "budget").unique()
        usual_cells = sorted(usual.iter_rows())
        info = runs.get(run_id)
        first = sub.sort("_file", "_row").head(1)
        if info is not None and info.evictors is not None and info.budgets is not None:
            manifest_cells = sorted((e, b) for e in info.evictors for b in info.budgets)
            if set(manifest_cells) != set(usual_cells):
                # reported once for the run; inputs are then compared with the run's usual arms
                problems += emit(first, files, f"the usual arms of run {run_id!r} differ from the manifest's evictors × "
                                               f"budgets", lambda rec: _cells_diff(usual_cells, manifest_cells))
                reference, source = usual_cells, "the run's usual"
            else:
                reference, source = manifest_cells, "the manifest's"
        else:
            reference, source = usual_cells, "the run's usual"
        ref_n, ref_sig = _cell_signature(*zip(*reference)) if reference else (0, 0)
        odd = sub.filter((pl.col("_n") != ref_n) | (pl.col("_sig") != ref_sig))
        if odd.height:
            rows = oc.join(odd.select(key), on=key, how="semi")
            p, rows = _duplicates(rows, schema.OUTCOME_KEY, files, "outcome row")
            problems += p
            problems += _exact_grid(rows, reference, source, run_id, files)
        if reference and 1.0 not in {b for _, b in reference}:
            problems += emit(first, files, f"run {run_id!r} has no budget 1.0 (full-cache audit) arm")
    return problems


def _cells_diff(got, reference) -> str:
    missing = sorted(set(reference) - set(got))
    extra = sorted(set(got) - set(reference))
    text = f"{len(got)} arms vs {len(reference)}"
    if missing:
        text += f"; missing {missing[:10]}" + (" …" if len(missing) > 10 else "")
    if extra:
        text += f"; extra {extra[:10]}" + (" …" if len(extra) > 10 else "")
    return text


def _exact_grid(rows: pl.DataFrame, reference, source, run_id, files) -> list[Problem]:
    """Exact evictor-set and budget-grid comparison for the (few) inputs whose signature differs."""
    problems: list[Problem] = []
    ikey = list(schema.INPUT_KEY)
    ref_evictors = sorted({e for e, _ in reference})
    ref_budgets = {e: sorted(b for e2, b in reference if e2 == e) for e in ref_evictors}
    per_input = rows.group_by(ikey).agg(
        pl.col("_file").first(), pl.col("_row").first(), pl.col("evictor").unique().sort().alias("_evictors")
    )
    bad = per_input.filter(pl.col("_evictors") != pl.lit(pl.Series([ref_evictors], dtype=pl.List(pl.String))))

    def evictor_detail(rec):
        got = list(rec["_evictors"])
        missing, extra = sorted(set(ref_evictors) - set(got)), sorted(set(got) - set(ref_evictors))
        return (f"input ({rec['run_id']}, {rec['task']}, {rec['input_id']}) has {got}; {source} evictor set is "
                f"{ref_evictors}" + (f"; missing {missing}" if missing else "") + (f"; extra {extra}" if extra else ""))

    problems += emit(bad, files, f"evictor set differs between inputs of run {run_id!r}", evictor_detail)
    grids = rows.filter(pl.col("evictor").is_in(ref_evictors)).group_by(*ikey, "evictor").agg(
        pl.col("_file").first(), pl.col("_row").first(), pl.col("budget").sort().alias("_grid")
    )
    grids = grids.with_columns(
        pl.col("evictor").replace_strict(
            ref_evictors, [ref_budgets[e] for e in ref_evictors], return_dtype=pl.List(pl.Float64)
        ).alias("_ref")
    )
    bad = grids.filter(pl.col("_grid") != pl.col("_ref"))

    def grid_detail(rec):
        got, ref = list(rec["_grid"]), list(rec["_ref"])
        missing, extra = sorted(set(ref) - set(got)), sorted(set(got) - set(ref))
        return (f"evictor {rec['evictor']!r} of input ({rec['run_id']}, {rec['task']}, {rec['input_id']}) has {got}; "
                f"{source} budget grid is {ref}" + (f"; missing {missing}" if missing else "")
                + (f"; extra {extra}" if extra else ""))

    problems += emit(bad, files, f"budget grid differs between arms of run {run_id!r}", grid_detail)
    return problems


def _check_topk(inp: pl.DataFrame, tk: pl.DataFrame, files, runs, incomplete, key) -> list[Problem]:
    problems: list[Problem] = []
    ikey = list(schema.INPUT_KEY)
    cols = ["_file", "_row", *ikey, "layer", "head", "indices"] + (["_ih"] if "_ih" in key else [])
    joined = tk.select(cols).join(
        inp.select(*key, "n_tokens", pl.col("agreement").list.len().alias("_L")), on=key, how="left"
    ).join(_run_frame(runs).select("run_id", "_n_heads"), on="run_id", how="left")
    if "inputs" not in incomplete:
        missing = joined.filter(pl.col("n_tokens").is_null())
        missing = missing.group_by(ikey).agg(pl.col("_file").first(), pl.col("_row").first(), pl.len().alias("_n"))
        missing = missing.with_columns(pl.format("input ({}, {}, {}) has {} topk rows", *ikey, "_n").alias("_d"))
        problems += emit(missing, files, "topk rows whose input is missing from inputs", "_d")
    j = joined.filter(pl.col("n_tokens").is_not_null())
    bad = j.filter((pl.col("layer") < 0) | (pl.col("layer") >= pl.col("_L")))
    problems += emit(bad.with_columns(pl.format("layer {} with L = {}", "layer", "_L").alias("_d")),
                     files, "topk layer out of range", "_d")
    bad = j.filter((pl.col("head") < 0) | (pl.col("_n_heads").is_not_null() & (pl.col("head") >= pl.col("_n_heads"))))
    problems += emit(bad.with_columns(pl.format("head {} with H = {}", "head", "_n_heads").alias("_d")),
                     files, "topk head out of range", "_d")
    idx = pl.col("indices")
    bad = j.filter((idx.list.len() > 0) & ((idx.list.min() < 0) | (idx.list.max() >= pl.col("n_tokens"))))
    bad = bad.with_columns(pl.format("min {}, max {}, n_tokens {}", idx.list.min(), idx.list.max(), "n_tokens").alias("_d"))
    problems += emit(bad, files, "topk indices outside [0, n_tokens)", "_d")
    bad = j.filter(idx.list.n_unique() != idx.list.len())
    bad = bad.with_columns(pl.format("{} indices, {} distinct", idx.list.len(), idx.list.n_unique()).alias("_d"))
    problems += emit(bad, files, "topk indices repeat", "_d")
    return problems


__all__ = ["Problem", "LogError", "RunInfo", "check_manifest", "check_frames", "parse_bins",
           "safe_relative_path", "MAX_ROWS_PER_RULE"]
