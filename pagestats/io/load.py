"""Load and validate schema-v1 logs (docs/SCHEMA.md) through DuckDB into polars.

``LOGS`` may be run directories, individual parquet / jsonl files, or globs:

* a directory holding ``manifest.json`` is a *run*: every ``*.parquet`` / ``*.jsonl`` file
  under its ``inputs/``, ``outcomes/`` and ``topk/`` is read and checked against the
  manifest's ``files[]`` (sha256, row count, listed-but-missing, present-but-unlisted);
* a directory without one but with nested ``*/…/manifest.json`` is a collection of runs;
* a directory without any manifest but with ``inputs/`` / ``outcomes/`` / ``topk/``
  subdirectories is a manifest-less run, read as loose files;
* otherwise a directory contributes the log files directly inside it, as loose files;
* a loose file's table is its parent directory's name when that is ``inputs``,
  ``outcomes`` or ``topk``; else it is told from its columns (``indices`` → topk;
  ``evictor`` or ``budget`` → outcomes; ``agreement``, ``drop`` or ``full_score`` →
  inputs). A loose file inside ``<run>/<table>/`` of a run with a manifest is checked
  against that manifest's entry for it (but the run's other files are not required);
* a path that does not exist but contains glob characters is expanded (``**`` allowed).

Parquet files of a table are read in one DuckDB query (``read_parquet`` of the file list
passed as a parameter, ``union_by_name``), jsonl files with ``read_json``, one per file;
SQL is parameterised and paths are never formatted into it. ``columns="analysis"``
leaves out the heavy text columns (:data:`HEAVY_COLUMNS`). Columns are cast to the
writer's types (ints int64, floats float64, ``agreement``/``pair_jaccard``
list<float32>, ``indices`` list<int32>). In jsonl, a JSON number without a decimal
point is read as an integer, so integer types are also accepted for float columns
there.

Every rule of :mod:`pagestats.io.validation` runs; ``validate_paths`` returns all problems,
``load(strict=True)`` raises :class:`LogError` with all of them, ``load(strict=False)``
returns what could be read and lists the problems in ``Logs.problems``. In lenient mode
files that cannot be read (corrupt, missing or mistyped columns, unreadable schema
version) are left out — and named in ``Logs.problems``; rows with bad values are kept.
Exclusions (``RUN_ID``, ``RUN_ID/TASK``, ``RUN_ID/TASK/INPUT_ID``) are applied to inputs,
outcomes and topk before the row rules run (file-level rules always see every file) and
are reported by :meth:`Logs.exclusion_report`; an exclusion that is malformed or matches
nothing raises :class:`ExclusionError` (a :class:`LogError`) in either mode.

Validation records (:mod:`pagestats.io.record`): when every rule passes over a run (or the
files named together), a record of the files' identities is written to the user cache; a later
:func:`check_paths` / :func:`load` on the same files, unchanged, skips the hashing and the row
rules (``revalidate=True`` runs them anyway), and ``Checked.notes`` / ``Logs.notes`` hold the one
line that says so. ``load`` uses and writes records only without exclusions and with the
analysis columns (the rows every rule saw).

Collection mode (docs/SCHEMA.md ``mode``): the logs are read for one mode at a time,
query-aware by default (the paper's setting; a manifest without ``mode`` is query-aware, and
so are loose files without a manifest). Runs of another mode are left out before their
files are read, so that a query-agnostic run of the same (model, context) never pools with
the query-aware ones; one line in ``Logs.exclusions`` says how many runs and inputs were left
out and how to analyse them. A mode that leaves nothing raises :class:`ExclusionError`.

Schema versions: ``schema_version`` comes from the run's manifest (loose files without
one are taken as the current version). Versions in :data:`pagestats.schema.READABLE_VERSIONS`
are read; an older readable version is upgraded on read by :data:`UPGRADES` (one step per
version, applied to the manifest, to each file's arrow schema before the type check, and
to every table before the row rules). Version 1 is current, so there are no steps yet.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import duckdb
import polars as pl

from pagestats import defaults, schema
from pagestats.io import duck, record
from pagestats.io.duck import MEMORY_LIMIT
from pagestats.io.discovery import (
    _Discovery,
    _one_line,
    _sha256_or_none,
    _Source,
)
from pagestats.io.read import (
    _duck_column,
    _empty,
    _inspect,
    _literal_name,
    _read_table,
    out_of_resources,
    _version,
)
from pagestats.io.upgrades import (
    upgrade_table,
)
from pagestats.io.validation.manifest import RunInfo
from pagestats.io.validation.problems import ExclusionError, LogError, Problem, frame, one
from pagestats.io.validation.tables import check_tables

#: DuckDB's memory limit for the validation queries and those of a :class:`~pagestats.io.LogDB`
#: (beyond it, operators spill to disk).
#: Text columns left out by ``columns="analysis"`` (they can be huge).
HEAVY_COLUMNS = ("prompt", "full_prediction", "prediction", "references")


@dataclass(frozen=True)
class FileRecord:
    """One log file a :class:`Logs` was read from: path, table, sha256 of its bytes, rows."""

    path: str
    table: str
    sha256: str
    rows: int


@dataclass
class Logs:
    """Validated logs: one tidy frame per level (inputs, outcomes, optional topk).

    Attributes
    ----------
    inputs : polars.DataFrame
        :data:`pagestats.schema.INPUTS` columns (heavy text columns only with
        ``columns="all"``) plus ``task_class`` — the run manifest's ``tasks{name: class}``,
        else :func:`pagestats.defaults.default_task_class`.
    outcomes : polars.DataFrame
        :data:`pagestats.schema.OUTCOMES` columns.
    topk : polars.DataFrame or None
        :data:`pagestats.schema.TOPK` rows, ``None`` when no topk files were given.
    manifests : dict
        run_id → parsed manifest.
    files : list of FileRecord
        Every file read, with its sha256 (reports cite these).
    exclusions : list of str
        One human-readable line per explicit exclusion, with the rows it removed, and one
        for the runs of another collection mode, left out (see ``mode``).
    problems : list of Problem
        Problems found (empty after a strict load).
    run_dirs : dict
        run_id → the directory of the run (runs read through a manifest).
    mode : str or None
        The collection mode the logs hold (:data:`pagestats.defaults.MODES`); ``None`` when
        read with every mode (validation only).
    notes : list of str
        Lines for the user about the validation itself (:mod:`pagestats.io.record`): that the
        row rules were skipped because the files are unchanged since they passed, or that a
        validation record could not be read or written.
    """

    inputs: pl.DataFrame
    outcomes: pl.DataFrame
    topk: pl.DataFrame | None
    manifests: dict[str, dict] = field(default_factory=dict)
    files: list[FileRecord] = field(default_factory=list)
    exclusions: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    run_dirs: dict[str, str] = field(default_factory=dict)
    mode: str | None = defaults.MODE
    notes: list[str] = field(default_factory=list)

    def exclusion_report(self) -> list[str]:
        """One line per exclusion, e.g. ``"run r1 task niah_multikey_3: 50 inputs, 1800 outcomes"``."""
        return list(self.exclusions)


# --------------------------------------------------------------------------- exclusions


def _parse_exclusion(spec: str) -> tuple[str, str | None, int | None]:
    if not isinstance(spec, str) or not spec or spec.count("/") > 2:
        raise ExclusionError([Problem("exclude", None, f"exclusion {spec!r} is not RUN_ID, RUN_ID/TASK or RUN_ID/TASK/INPUT_ID")])
    parts = spec.split("/")
    if any(not p for p in parts):
        raise ExclusionError([Problem("exclude", None, f"exclusion {spec!r} has an empty part")])
    input_id = None
    if len(parts) == 3:
        if not re.fullmatch(r"-?[0-9]{1,18}", parts[2]):  # ASCII digits only: int() would read "1_0" as 10
            raise ExclusionError([Problem("exclude", None, f"exclusion {spec!r}: input id {parts[2]!r} is not an integer")])
        input_id = int(parts[2])
    return parts[0], parts[1] if len(parts) > 1 else None, input_id


def _exclusion_mask(frame: pl.DataFrame, run_id, task, input_id) -> pl.Expr:
    expr = pl.col("run_id") == run_id
    if task is not None:
        expr = expr & (pl.col("task") == task)
    if input_id is not None:
        expr = expr & (pl.col("input_id") == input_id)
    return expr


def _apply_exclusions(exclude, inputs, outcomes, topk, run_dirs=None):
    """Drop the rows that ``exclude`` names. RUN is a run_id or the name of a run's directory
    (``run_dirs``: run_id → directory); an exclusion matching nothing raises, listing the runs."""
    parsed = [(spec, *_parse_exclusion(spec)) for spec in exclude]
    ids = set(inputs["run_id"].unique().to_list()) if parsed and inputs.height else set()
    by_dir: dict[str, str] = {}
    for run_id, folder in (run_dirs or {}).items():
        by_dir.setdefault(os.path.basename(os.path.normpath(folder)), run_id)
    lines, unmatched = [], []
    drop_in = drop_oc = drop_tk = pl.lit(False)
    for spec, run_id, task, input_id in parsed:
        if run_id not in ids and run_id in by_dir:
            run_id = by_dir[run_id]
        m = _exclusion_mask(inputs, run_id, task, input_id)
        n_in = inputs.select(m.sum()).item() if inputs.height else 0
        n_oc = outcomes.select(m.sum()).item() if outcomes.height else 0
        n_tk = topk.select(m.sum()).item() if topk is not None and topk.height else 0
        if n_in + n_oc + n_tk == 0:
            unmatched.append(Problem("exclude", None, f"exclusion {spec!r} matches no inputs, outcomes or topk rows"))
            continue
        where = f"run {run_id}" + (f" task {task}" if task is not None else "") + (
            f" input {input_id}" if input_id is not None else ""
        )
        counts = f"{n_in} inputs, {n_oc} outcomes" + (f", {n_tk} topk rows" if topk is not None else "")
        lines.append(f"{where}: {counts}")
        drop_in, drop_oc, drop_tk = drop_in | m, drop_oc | m, drop_tk | m
    if unmatched:
        folder_of = {v: k for k, v in by_dir.items()}
        valid = ", ".join(f"{r} (directory {folder_of[r]})" if r in folder_of else r for r in sorted(ids)) or "none"
        raise ExclusionError([Problem(u.file, u.row, f"{u.message}; the runs are {valid}") for u in unmatched])
    if parsed:
        inputs = inputs.filter(~drop_in)
        outcomes = outcomes.filter(~drop_oc)
        topk = topk.filter(~drop_tk) if topk is not None else None
        if ids and inputs.height == 0:
            raise ExclusionError([Problem("exclude", None, f"the exclusions leave no inputs ({'; '.join(lines)})")])
    return inputs, outcomes, topk, lines


# --------------------------------------------------------------------------- public


def _task_classes(inputs: pl.DataFrame, runs: dict[str, RunInfo]) -> pl.DataFrame:
    pairs = inputs.select("run_id", "task").unique()
    classes = []
    for run_id, task in pairs.iter_rows():
        info = runs.get(run_id)
        if info is not None and info.tasks is not None and task in info.tasks:
            classes.append(info.tasks[task])
        else:
            classes.append(defaults.default_task_class(task))
    mapping = pairs.with_columns(pl.Series("task_class", classes, dtype=pl.String))
    return inputs.join(mapping, on=["run_id", "task"], how="left", maintain_order="left", nulls_equal=True)


def _other_mode(runs, mode: str | None) -> tuple[list, str | None]:
    """The runs (discovered, with a usable manifest) whose collection mode is not ``mode``, and
    the one line that says how many runs and inputs they hold and how to analyse them."""
    if mode is None:
        return [], None
    # a run of no known mode stays in: its manifest problem is reported (exit 1), not hidden by the filter
    other = [run for run in runs if run.info is not None and run.info.mode in defaults.MODES and run.info.mode != mode]
    if not other:
        return [], None
    parts = []
    for kind in sorted({run.info.mode for run in other}):
        some = sorted((run for run in other if run.info.mode == kind), key=lambda r: r.info.run_id)
        n_inputs = sum(int(e["rows"]) for run in some for rel, e in run.info.files.items()
                       if rel.split("/")[0] == "inputs" and isinstance(e.get("rows"), int))
        names = ", ".join(run.info.run_id for run in some[:3]) + (f" and {len(some) - 3} more" if len(some) > 3 else "")
        how = f"pass --mode {kind} to analyse them"
        parts.append(f"{len(some)} {kind} run{'s' if len(some) != 1 else ''} ({names}; {n_inputs} inputs): {how}")
    return other, f"left out, not {mode}: " + "; ".join(parts)


@dataclass
class _Found:
    """What discovery and inspection found: the sources, the runs, the file-level problems."""

    disc: _Discovery
    sources: list[_Source]
    names: list[str]
    runs: dict[str, RunInfo]
    manifests: dict[str, dict]
    problems: list[Problem]
    wanted: dict[str, list[str]]
    skipped: frozenset  # ids of the runs of another collection mode, not read
    left_out: str | None  # the line that says so


def _discover(paths) -> _Discovery:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    disc = _Discovery()
    for p in paths:
        disc.add(p)
    return disc


def _of_mode(disc: _Discovery, mode: str | None) -> tuple[list[_Source], frozenset, str | None]:
    """The sources to read: those of runs of another collection mode than ``mode`` are left out
    unread (:class:`ExclusionError` when that leaves none); the ids of those runs; the line
    that says so."""
    if mode is not None and mode not in defaults.MODES:
        raise ValueError(f"mode must be one of {list(defaults.MODES)}, got {mode!r}")
    other, left_out = _other_mode(disc.runs.values(), mode)
    skipped = frozenset(id(run) for run in other)
    sources = [s for s in disc.sources.values() if s.run is None or id(s.run) not in skipped]
    if left_out and not sources:
        raise ExclusionError([Problem("mode", None, f"no {mode} runs in the logs; {left_out}")])
    return sources, skipped, left_out


def _runs(disc: _Discovery, skipped, problems: list[Problem]) -> tuple[dict[str, RunInfo], dict[str, dict]]:
    """run_id → run info and run_id → manifest of the runs read (not of another mode); a run
    whose run_id an earlier run has is a problem."""
    runs: dict[str, RunInfo] = {}
    manifests: dict[str, dict] = {}
    for run in disc.runs.values():
        if run.info is None or id(run) in skipped:
            continue
        if run.info.run_id in runs:
            problems.append(Problem(run.manifest_path, None, f"run_id {run.info.run_id!r} is also the run_id "
                                                             f"of {runs[run.info.run_id].manifest_path}"))
            continue
        runs[run.info.run_id] = run.info
        manifests[run.info.run_id] = run.manifest
    return runs, manifests


def _record_key(disc: _Discovery, picked) -> tuple[list[str], dict] | None:
    """What a validation record of these logs is keyed by (:mod:`pagestats.io.record`): the real
    paths of the files read and every manifest's digest; ``None`` when discovery found a
    problem (the rules must run to report it)."""
    if disc.problems or not picked[0]:
        return None
    files = [os.path.realpath(s.path) for s in picked[0]]
    manifests = {run.manifest_path: record.manifest_digest(run.manifest) for run in disc.runs.values()}
    return files, manifests


def _record_files(found: _Found, files: list[FileRecord]) -> dict | None:
    """Real path → table, sha256, rows of every file read (``None`` when a file has no record)."""
    out = {os.path.realpath(f.path): {"table": f.table, "sha256": f.sha256, "rows": f.rows} for f in files}
    return out if len(out) == len(found.sources) else None


def _found(disc: _Discovery, picked, con: duckdb.DuckDBPyConnection, columns: str) -> _Found:
    """Inspect every source of ``picked`` (:func:`_of_mode`: schema, table, types) and collect
    the runs of valid manifests."""
    problems = disc.problems
    sources, skipped, left_out = picked
    for i, s in enumerate(sources):
        s.index = i
    for s in sources:
        problems += _inspect(s, con)
    runs, manifests = _runs(disc, skipped, problems)
    for s in sources:
        if s.run is not None and s.run.manifest is None and os.path.exists(s.run.manifest_path):
            s.usable, s.failed = False, True  # manifest unreadable or unknown schema version: reported above
    wanted = {
        t: [c.name for c in cols if columns == "all" or c.name not in HEAVY_COLUMNS]
        for t, cols in schema.TABLES.items()
    }
    return _Found(disc, sources, [s.path for s in sources], runs, manifests, problems, wanted, skipped, left_out)


def _file_level(found: _Found, digests: list[str]):
    """File records, the manifest file checks, the incomplete tables, topk presence, run dirs and file runs."""
    sources = found.sources
    files = [
        FileRecord(s.path, s.table, digest, s.rows)
        for s, digest in zip(sources, digests)
        if not s.failed and s.table is not None and digest is not None and s.rows is not None
    ]
    manifest_problems, missing_tables = _check_against_manifests(found.disc, sources, digests, found.skipped)
    found.problems += manifest_problems
    incomplete = set(missing_tables)
    for s in sources:
        if s.failed:
            incomplete |= {s.table} if s.table else set(schema.TABLES)
    run_dirs = {run.info.run_id: os.path.dirname(run.manifest_path) for run in found.disc.runs.values()
                if run.info is not None and found.runs.get(run.info.run_id) is run.info}
    file_runs = {s.index: s.run.info.run_id for s in sources if s.run is not None and s.run.info is not None}
    return files, frozenset(incomplete), run_dirs, file_runs


def _listed_tasks(found: _Found, incomplete, exclude: Sequence[str] = ()) -> dict[str, frozenset[str]]:
    """run_id → the manifest tasks that must have inputs: of the runs read whole (when no inputs
    file was lost), less the tasks and runs that ``exclude`` leaves out."""
    if "inputs" in incomplete:
        return {}
    parsed = [_parse_exclusion(spec) for spec in exclude]
    out = {}
    for run in found.disc.runs.values():
        info = run.info
        if not run.full or info is None or found.runs.get(info.run_id) is not info or not info.task_names:
            continue
        names = (info.run_id, os.path.basename(os.path.normpath(run.dir)))
        gone = {task for run_id, task, input_id in parsed if run_id in names and input_id is None}
        if None not in gone:
            out[info.run_id] = frozenset(info.task_names) - gone
    return out


def _no_inputs(found: _Found, paths, n_inputs: int) -> None:
    if n_inputs == 0 and not found.problems:
        where = ", ".join(sorted({s.run.manifest_path if s.run is not None else s.path for s in found.sources
                                  if s.table == "inputs"})) or ", ".join(os.fspath(p) for p in paths)
        found.problems.append(Problem(where, None, "the logs have no inputs (every inputs file has zero rows)"))


def connect(memory_limit: str = MEMORY_LIMIT, temp_directory: str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection for the rules, with ``memory_limit`` and a
    ``temp_directory`` to spill to.

    Filter pushdown and statistics propagation are off: parquet min/max statistics leave
    NaN out, so a pushed-down ``isnan(score)`` or ``score > 1`` skips the very row groups
    that hold a NaN (seen with DuckDB 2.0.1), and a rule must see every row.
    """
    con = duck.connect(memory_limit=memory_limit, temp_directory=temp_directory)
    con.execute("SET disabled_optimizers = 'filter_pushdown,statistics_propagation'")
    return con


def _load(paths, exclude: Sequence[str], columns: str, mode: str | None = defaults.MODE,
          revalidate: bool = False, memory_limit: str = MEMORY_LIMIT,
          temp_directory: str | None = None) -> tuple[Logs, list[Problem]]:
    """Read the tables into polars, apply the exclusions, and run the rules over the frames
    (not when the files' validation record holds, :mod:`pagestats.io.record`; records are used
    and written only for the analysis columns without exclusions, the rows every rule saw)."""
    if columns not in ("analysis", "all"):
        raise ValueError(f"columns must be 'analysis' or 'all', got {columns!r}")
    if isinstance(exclude, str):
        exclude = [exclude]
    disc = _discover(paths)
    if disc.deployments:  # no outcomes to load
        from pagestats.io.deployment import deployment_refusal

        raise deployment_refusal([run.dir for run in disc.deployments.values()])
    picked = _of_mode(disc, mode)
    names = [s.path for s in picked[0]]
    key = _record_key(disc, picked) if columns == "analysis" and not exclude else None
    reused, notes = None, []
    if key is not None and not revalidate:
        reused, note = record.lookup(*key)
        notes += [note] if note else []
    snap = record.snapshot(*key) if key is not None and reused is None else None
    with ThreadPoolExecutor(max_workers=2) as pool:
        hashes = (pool.map(_sha256_or_none, names) if reused is None
                  else [reused.files[os.path.realpath(n)]["sha256"] for n in names])
        con = connect(memory_limit, temp_directory)
        try:
            found = _found(disc, picked, con, columns)
            tables: dict[str, pl.DataFrame] = {}
            for table in schema.TABLES:
                group = [s for s in found.sources if s.table == table and s.usable]
                parts = []
                for version in sorted({_version(s) for s in group}):
                    same = [s for s in group if _version(s) == version]
                    frame, read_problems = _read_table(con, table, same, found.wanted[table])
                    found.problems += read_problems
                    parts.append(upgrade_table(table, frame, version))
                tables[table] = (pl.concat(parts, how="diagonal_relaxed") if parts
                                 else _empty(table, found.wanted[table]))
        finally:
            con.close()
        digests = list(hashes)
    files, incomplete, run_dirs, file_runs = _file_level(found, digests)
    has_topk = any(s.table == "topk" for s in found.sources)
    inputs, outcomes = tables["inputs"], tables["outcomes"]
    _no_inputs(found, paths, inputs.height)
    topk = tables["topk"] if has_topk else None
    inputs, outcomes, topk, lines = _apply_exclusions(list(exclude), inputs, outcomes, topk, run_dirs)

    con = connect(memory_limit, temp_directory)
    try:
        con.register("inputs", inputs)
        con.register("outcomes", outcomes)
        if topk is not None:
            con.register("topk", topk)
        if reused is None:
            found.problems += check_tables(con, files=found.names, runs=found.runs, file_runs=file_runs,
                                           incomplete=incomplete, has_topk=topk is not None,
                                           listed=_listed_tasks(found, incomplete, exclude))
    finally:
        con.close()
    if snap is not None and not found.problems:
        recorded = _record_files(found, files)
        classes = _task_classes(inputs.select("run_id", "task").unique().sort("run_id", "task"), found.runs)
        note = record.store(snap, recorded, [list(r) for r in classes.iter_rows()]) if recorded else None
        notes += [note] if note else []
    if reused is not None:
        notes.append(record.unchanged_line([reused.validated_at], 1))

    inputs = _task_classes(inputs, found.runs)
    logs = Logs(
        inputs=inputs.drop("_file", "_row"),
        outcomes=outcomes.drop("_file", "_row"),
        topk=topk.drop("_file", "_row") if topk is not None else None,
        manifests=found.manifests,
        files=files,
        exclusions=[*lines, *([found.left_out] if found.left_out else [])],
        problems=found.problems,
        run_dirs=run_dirs,
        mode=mode,
        notes=notes,
    )
    return logs, found.problems


@dataclass
class Checked:
    """What streaming validation (:func:`check_paths`) returns: the problems, and for valid
    logs what a database of views over them needs."""

    problems: list[Problem]
    manifests: dict[str, dict]
    files: list[FileRecord]
    task_classes: pl.DataFrame
    left_out: list[str]  # the line saying which runs of another collection mode were left out
    reused: list[str] = field(default_factory=list)  # when the reused records' rules passed (none: checked now)
    notes: list[str] = field(default_factory=list)  # stderr lines about the validation itself


def check_paths(paths, *, mode: str | None = None, memory_limit: str = MEMORY_LIMIT,
                temp_directory: str | None = None, revalidate: bool = False) -> Checked:
    """Every rule over the logs at ``paths`` without holding their rows: the tables are DuckDB
    views over the parquet files (jsonl files, and parquet files whose names hold glob
    characters, are read into memory), the files are hashed while the rules run, and a
    file that turns out unreadable is reported and left out, and the rules run again. Runs
    of another collection mode than ``mode`` are left out unread (``None``: every mode).

    When every rule passes, a validation record is written (:mod:`pagestats.io.record`); a
    later call on the same files, unchanged, reads it instead of hashing the files and running
    the rules (``Checked.reused`` says when they passed), unless ``revalidate``.
    """
    disc = _discover(paths)
    picked = _of_mode(disc, mode)
    key = _record_key(disc, picked)
    notes: list[str] = []
    if key is not None and not revalidate:
        found, note = record.lookup(*key)
        notes += [note] if note else []
        if found is not None:
            return _from_record(disc, picked, found, notes)
    snap = record.snapshot(*key) if key is not None else None
    names = [s.path for s in picked[0]]
    with ThreadPoolExecutor(max_workers=1) as pool:
        hashes = pool.map(_sha256_or_none, names)
        con = connect(memory_limit, temp_directory)
        try:
            found = _found(disc, picked, con, "analysis")
            digests = list(hashes)
            while True:
                before = list(found.problems)
                try:  # a footer DuckDB cannot parse fails the view itself: the same recovery as a failed rule
                    n_inputs = _views(con, found)
                    files, incomplete, _, file_runs = _file_level(found, digests)
                    _no_inputs(found, paths, n_inputs)
                    found.problems += check_tables(con, files=found.names, runs=found.runs, file_runs=file_runs,
                                                   incomplete=incomplete,
                                                   has_topk=any(s.table == "topk" for s in found.sources),
                                                   listed=_listed_tasks(found, incomplete))
                    break
                except duckdb.Error as err:
                    if out_of_resources(err):
                        raise
                    found.problems = before
                    if not _unreadable(con, found):
                        raise
            classes = frame(con, "SELECT DISTINCT run_id, task FROM inputs ORDER BY ALL")
        finally:
            con.close()
    task_classes = _task_classes(classes, found.runs)
    if snap is not None and not found.problems:
        recorded = _record_files(found, files)
        note = record.store(snap, recorded, [list(r) for r in task_classes.iter_rows()]) if recorded else None
        notes += [note] if note else []
    return Checked(found.problems, found.manifests, files, task_classes,
                   [found.left_out] if found.left_out else [], [], notes)


def _from_record(disc: _Discovery, picked, found: record.Record, notes: list[str]) -> Checked:
    """:class:`Checked` of logs whose validation record holds: nothing is read but the manifests."""
    sources, skipped, left_out = picked
    problems: list[Problem] = []
    _, manifests = _runs(disc, skipped, problems)
    if problems:  # cannot be: the rules passed over these very manifests
        raise AssertionError(f"a validation record holds for logs with problems: {problems}")
    files = []
    for s in sources:
        entry = found.files[os.path.realpath(s.path)]
        files.append(FileRecord(s.path, entry["table"], entry["sha256"], entry["rows"]))
    classes = pl.DataFrame(found.task_classes, schema={"run_id": pl.String, "task": pl.String,
                                                       "task_class": pl.String}, orient="row")
    return Checked([], manifests, files, classes, [left_out] if left_out else [], [found.validated_at], notes)


def _parquet_query(sources: list[_Source], cols: list[str], table: str) -> str:
    """SQL reading a table's literal-named parquet files in canonical types, with ``_file`` and
    ``_row``; paths are quoted SQL literals (the DDL of a view cannot take parameters)."""
    paths = "[" + ", ".join("'" + s.path.replace("'", "''") + "'" for s in sources) + "]"
    index = "[" + ", ".join(str(s.index) for s in sources) + "]"
    return (f"SELECT {', '.join(cols)}, {index}[list_position({paths}, filename)]::INTEGER AS _file, "
            f"file_row_number::INTEGER AS _row FROM read_parquet({paths}, union_by_name = true, filename = true, "
            "file_row_number = true)")


def _views(con, found: _Found) -> int:
    """Views ``inputs``, ``outcomes`` (``topk``) over the usable sources, in canonical types
    (parquet files of the current schema version are read where they lie; the others are
    read into memory and upgraded); returns the number of input rows."""
    for table in schema.TABLES:
        group = [s for s in found.sources if s.table == table and s.usable and not s.failed]
        wanted = found.wanted[table]
        present = set().union(*(s.arrow_schema.names for s in group)) if group else set()
        cols = [_duck_column(c, c.name in present) for c in schema.columns(table)
                if c.name in wanted and (c.name in present or c.required)]
        literal = [s for s in group if s.fmt == "parquet" and _literal_name(s.path)
                   and _version(s) == schema.SCHEMA_VERSION]
        others = [s for s in group if s not in literal]
        parts = [_parquet_query(literal, cols, table)] if literal else []
        con.execute(f"DROP VIEW IF EXISTS {table}")
        if others:  # jsonl, names with glob characters, older schema versions: read (and upgraded) in memory
            frames = []
            for version in sorted({_version(s) for s in others}):
                frame_, read_problems = _read_table(con, table, [s for s in others if _version(s) == version], wanted)
                found.problems += read_problems
                frames.append(upgrade_table(table, frame_, version))
            con.register(f"_memory_{table}", pl.concat(frames, how="diagonal_relaxed"))
            parts.append(f"SELECT * FROM _memory_{table}")
        if not parts:
            parts.append(f"SELECT {', '.join(cols)}, NULL::INTEGER AS _file, NULL::INTEGER AS _row WHERE FALSE")
        con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS " + " UNION ALL BY NAME ".join(parts))
    return one(con, "SELECT count(*) FROM inputs")[0]


def _unreadable(con, found: _Found) -> bool:
    """Read every literal-named parquet file through once (in record batches) and mark the
    ones that fail, as :func:`pagestats.io.read._read_table` reports them; whether any did."""
    any_failed = False
    for s in found.sources:
        if s.fmt != "parquet" or not s.usable or s.failed or not _literal_name(s.path):
            continue
        try:
            reader = con.sql(_parquet_query([s], [f'"{c}"' for c in found.wanted[s.table]
                                                      if c in s.arrow_schema.names], s.table)).to_arrow_reader()
            for _ in reader:
                pass
        except duckdb.Error as err:
            if out_of_resources(err):
                raise
            s.failed, any_failed = True, True
            found.problems.append(Problem(s.path, None, f"cannot read parquet file (corrupt or truncated?): "
                                                        f"{_one_line(err)}"))
    return any_failed


def _check_against_manifests(disc: _Discovery, sources: list[_Source], digests: list[str], skipped=frozenset()):
    """sha256 and row counts against ``files[]``; listed-but-missing and present-but-unlisted files.

    Returns the problems and the set of tables with a listed file missing.
    """
    problems: list[Problem] = []
    missing_tables: set[str] = set()
    seen: dict[str, set[str]] = {}
    for s, digest in zip(sources, digests):
        if s.run is None or s.run.info is None:
            continue
        seen.setdefault(s.run.dir, set()).add(s.rel)
        entry = s.run.info.files.get(s.rel)
        if entry is None:
            problems.append(Problem(s.path, None, f"not listed in {s.run.manifest_path} files"))
            continue
        if entry.get("sha256") != digest:
            problems.append(Problem(s.path, None, f"sha256 {digest} does not match the manifest's "
                                                  f"{entry.get('sha256')!r} (files[{entry['index']}])"))
        if "rows" in entry and s.rows is not None and entry.get("rows") != s.rows:
            problems.append(Problem(s.path, None, f"{s.rows} rows but the manifest says {entry.get('rows')!r} "
                                                  f"(files[{entry['index']}])"))
    for run in disc.runs.values():
        if not run.full or run.info is None or id(run) in skipped:  # skipped: a run of another mode, not read
            continue
        present = seen.get(run.dir, set())
        for rel, entry in run.info.files.items():
            if rel not in present and rel not in disc.aliases.get(run.dir, ()):
                missing_tables.add(rel.split("/")[0])
                problems.append(Problem(run.manifest_path, None, f"files[{entry['index']}] {rel!r} is listed but "
                                                                 "missing (or unreadable)"))
        for table in schema.REQUIRED_TABLES:
            if not any(r.split("/")[0] == table for r in present):
                problems.append(Problem(run.manifest_path, None, f"run has no {table} files"))
        if run.info.k_max_stored and not any(r.split("/")[0] == "topk" for r in present):
            problems.append(Problem(run.manifest_path, None, f"gate.k_max_stored is {run.info.k_max_stored} but "
                                                             "the run has no topk files"))
    return problems, missing_tables


def _runs_apart(paths) -> list | None:
    """The runs named by ``paths``, sorted by directory, when there are several and every file
    lies in one of them, named whole (else ``None``).

    No rule relates the rows of two runs (every key starts with run_id, and a row carrying
    another run's run_id is reported in its own file), so such runs can be validated one at
    a time, in the memory of the largest; only the run_ids must be compared across them.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    disc = _Discovery()
    for p in paths:
        disc.add(p)
    runs = list(disc.runs.values())
    apart = (
        not disc.problems and len(runs) > 1 and all(r.full and r.info is not None for r in runs)
        and all(src.run is not None and src.run.full for src in disc.sources.values())
    )
    return sorted(runs, key=lambda r: r.dir) if apart else None


def only_parquet(paths) -> bool:
    """Whether the logs at ``paths`` are all parquet files whose names DuckDB reads literally
    (so that they can be viewed in place: a name with glob characters would be read as a pattern)."""
    sources = _discover(paths).sources.values()
    return bool(sources) and all(s.fmt == "parquet" and _literal_name(s.path) for s in sources)


def _same_run_id(run, seen: dict[str, str]) -> Problem | None:
    """The problem of a run whose run_id an earlier run already has (and record it otherwise)."""
    other = seen.setdefault(run.info.run_id, run.manifest_path)
    if other == run.manifest_path:
        return None
    return Problem(run.manifest_path, None, f"run_id {run.info.run_id!r} is also the run_id of {other}")


def validate_paths(paths: Sequence[str], *, revalidate: bool = False) -> list[Problem]:
    """Every problem of the logs at ``paths`` (run directories, parquet/jsonl files, globs).

    Runs every rule of :mod:`pagestats.io.validation` as DuckDB queries over the files
    (:func:`check_paths`), never holding their rows, and never stops at the first problem.
    Returns an empty list when the logs are valid. Several whole run directories are checked
    one run at a time (:func:`_runs_apart`); the problems are then listed run by run. Files
    unchanged since they passed every rule are not checked again unless ``revalidate``
    (:func:`checked_runs`, whose ``notes`` say so).
    """
    return checked_runs(paths, revalidate=revalidate).problems


def _deployments_apart(paths, deployments: str):
    """The paths that name collection logs, and the :class:`Checked` of the deployment runs the paths
    name (:mod:`pagestats.io.deployment`: their own rules, and a note naming each valid one);
    ``deployments="refuse"`` raises :class:`~pagestats.io.deployment.DeploymentRunError` instead."""
    from pagestats.io.deployment import check_deployment, deployment_refusal, split_deployments

    if deployments not in ("check", "refuse"):
        raise ValueError(f"deployments must be 'check' or 'refuse', got {deployments!r}")
    kept, dirs = split_deployments(paths)
    if dirs and deployments == "refuse":
        raise deployment_refusal(dirs)
    checked = Checked([], {}, [], pl.DataFrame(schema={"run_id": pl.String, "task": pl.String,
                                                      "task_class": pl.String}), [])
    for run_dir in dirs:
        found, problems = check_deployment(run_dir)
        checked.problems += problems
        checked.notes += [found.summary()] if found is not None else []
    return kept, checked


def checked_runs(paths, *, mode: str | None = None, revalidate: bool = False, deployments: str = "check",
                 **settings) -> Checked:
    """:func:`check_paths`, one run at a time when ``paths`` are several whole run
    directories (:func:`_runs_apart`; run_ids are compared across them; runs of another
    collection mode than ``mode`` are left out, :class:`ExclusionError` when none is left),
    else at once.

    A run (or file set) whose validation record holds (:mod:`pagestats.io.record`) is not
    checked again unless ``revalidate``; ``Checked.notes`` then holds one line saying so (and
    a line per record that could not be read or written).

    Deployment runs (:mod:`pagestats.io.deployment`, docs/SCHEMA.md "Deployment runs") are checked
    by their own rules, their problems listed first and a note line naming each valid one
    (``deployments="check"``, as ``pagestats validate`` reads them), or refused with
    :class:`~pagestats.io.deployment.DeploymentRunError` (``"refuse"``: the analysis reads outcomes).
    """
    paths, deployed = _deployments_apart(paths, deployments)
    if not paths:
        return deployed
    runs = _runs_apart(paths)
    left_out: list[str] = []
    if runs is not None:
        other, line = _other_mode(runs, mode)
        runs = [r for r in runs if r not in other]
        left_out = [line] if line else []
        if not runs:
            raise ExclusionError([Problem("mode", None, f"no {mode} runs in the logs; {line}")])
    groups = [(r, [r.dir]) for r in runs] if runs is not None else [(None, paths)]
    total = Checked(list(deployed.problems), {}, [], pl.DataFrame(schema={"run_id": pl.String, "task": pl.String,
                                                    "task_class": pl.String}), left_out, [], list(deployed.notes))
    seen: dict[str, str] = {}
    classes = [total.task_classes]
    for run, group in groups:
        dup = _same_run_id(run, seen) if run is not None else None
        if dup is not None:
            total.problems.append(dup)
            continue
        checked = check_paths(group, mode=mode, revalidate=revalidate, **settings)
        total.problems += checked.problems
        total.manifests.update(checked.manifests)
        total.files += checked.files
        total.left_out += [line for line in checked.left_out if run is None]
        total.reused += checked.reused
        total.notes += checked.notes
        classes.append(checked.task_classes)
    total.task_classes = pl.concat(classes).unique().sort("run_id", "task")
    line = record.unchanged_line(total.reused, len(groups))
    total.notes += [line] if line else []
    return total


def load(paths, *, exclude: Sequence[str] = (), columns: str = "analysis", strict: bool = True,
         mode: str = defaults.MODE, revalidate: bool = False, memory_limit: str = MEMORY_LIMIT,
         temp_directory: str | None = None) -> Logs:
    """Load and validate logs into a :class:`Logs` (docs/SCHEMA.md).

    Parameters
    ----------
    paths : str or sequence of str
        Run directories, parquet / jsonl files, or globs (see the module docstring).
    exclude : sequence of str
        Explicit exclusions ``RUN``, ``RUN/TASK`` or ``RUN/TASK/INPUT_ID`` (RUN a run_id or
        the name of the run's directory), applied
        to inputs, outcomes and topk and reported by :meth:`Logs.exclusion_report`. One that
        is malformed or matches nothing, or exclusions that leave no inputs, raise
        :class:`ExclusionError`.
    columns : {"analysis", "all"}
        ``"analysis"`` leaves out :data:`HEAVY_COLUMNS`; ``"all"`` keeps them.
    strict : bool
        ``True``: raise :class:`LogError` listing every problem. ``False``: return what
        could be read, with the problems in ``Logs.problems``.
    mode : {"query-aware", "query-agnostic"}
        The collection mode to read (manifest ``mode``; none means query-aware). Runs of the
        other mode are left out, with one line in ``Logs.exclusions``; when that leaves no
        run, :class:`ExclusionError` is raised. Query-aware and query-agnostic runs of the
        same (model, context) are never pooled into one cell.
    revalidate : bool
        Run every rule even when the files are unchanged since they passed
        (:mod:`pagestats.io.record`; otherwise the row rules are skipped then, and
        ``Logs.notes`` says so).
    memory_limit, temp_directory : str
        DuckDB's memory limit and spill folder of the reading and validating connections
        (``--memory-limit``, ``--temp-dir``).

    Returns
    -------
    Logs
    """
    logs, problems = _load(paths, exclude, columns, mode, revalidate, memory_limit, temp_directory)
    if strict and problems:
        raise LogError(problems)
    return logs
