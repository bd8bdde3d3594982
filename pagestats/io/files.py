"""The file-level stage that loading and streaming validation share: the logs discovered and
inspected, the file rules against the manifests (sha256, row counts, listed-but-missing and
present-but-unlisted files), the keys of validation records and the task classes of the inputs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import polars as pl

from pagestats.core import defaults, schema
from pagestats.io import duck, record
from pagestats.io.discovery import _Discovery, _Source
from pagestats.io.duck import MEMORY_LIMIT
from pagestats.io.exclusions import _parse_exclusion
from pagestats.io.logs import HEAVY_COLUMNS, FileRecord
from pagestats.io.read import _inspect, _literal_name
from pagestats.io.validation.manifest import RunInfo
from pagestats.io.validation.problems import Problem


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
    """The runs and files that ``paths`` (run directories, log files, globs; one path or several) name."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    disc = _Discovery()
    for p in paths:
        disc.add(p)
    return disc


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


def _runs(disc: _Discovery, skipped, problems: list[Problem]) -> tuple[dict[str, RunInfo], dict[str, dict]]:
    """run_id → run info and run_id → manifest of the runs read (not of another mode); a run
    whose run_id an earlier run has is a problem."""
    runs: dict[str, RunInfo] = {}
    manifests: dict[str, dict] = {}
    seen: dict[str, str] = {}
    for run in disc.runs.values():
        if run.info is None or id(run) in skipped:
            continue
        dup = _same_run_id(run, seen)
        if dup is not None:
            problems.append(dup)
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
    """Inspect every source of ``picked`` (:func:`pagestats.io.exclusions._of_mode`: schema, table, types) and collect
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
