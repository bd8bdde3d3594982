"""Streaming validation: every rule over the logs at some paths, without holding their rows.

:func:`validate_paths` returns every :class:`~pagestats.io.Problem` as one line each;
:func:`check_paths` and :func:`checked_runs` return a :class:`Checked`, what a database of views over
valid logs needs (:mod:`pagestats.io.database`). The tables are DuckDB views over the parquet files
where they lie (jsonl files, parquet files whose names hold glob characters, and files of an older
schema version are read into memory and upgraded, :mod:`pagestats.io.upgrades`); the files are hashed
while the rules run, and a file that turns out unreadable is reported and left out, and the rules
run again. Several whole run directories are checked one run at a time (no rule relates the rows of
two runs); only their run_ids are compared across them.

Validation records (:mod:`pagestats.io.record`): when every rule passes over a run (or the
files named together), a record of the files' identities is written to the user cache; a later
:func:`check_paths` (or :func:`pagestats.io.load`) on the same files, unchanged, skips the hashing
and the row rules (``revalidate=True`` runs them anyway), and ``Checked.notes`` holds the one line
that says so.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import duckdb
import polars as pl

from pagestats.core import schema
from pagestats.io import record
from pagestats.io.discovery import _Discovery, _one_line, _sha256_or_none, _Source
from pagestats.io.duck import MEMORY_LIMIT
from pagestats.io.exclusions import _of_mode, _other_mode
from pagestats.io.files import (
    _discover,
    _file_level,
    _Found,
    _found,
    _listed_tasks,
    _no_inputs,
    _record_files,
    _record_key,
    _runs,
    _same_run_id,
    _task_classes,
    connect,
)
from pagestats.io.logs import FileRecord
from pagestats.io.read import _duck_column, _literal_name, _read_table, _version, out_of_resources
from pagestats.io.upgrades import upgrade_table
from pagestats.io.validation.problems import ExclusionError, Problem, frame, one, unreadable_parquet
from pagestats.io.validation.tables import check_tables
from pagestats.io.deployment import check_deployment, deployment_refusal, split_deployments

#: The columns of :attr:`Checked.task_classes`.
_TASK_CLASSES = {"run_id": pl.String, "task": pl.String, "task_class": pl.String}

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
    classes = pl.DataFrame(found.task_classes, schema=_TASK_CLASSES, orient="row")
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
            found.problems.append(unreadable_parquet(s.path, _one_line(err)))
    return any_failed



def _runs_apart(paths) -> list | None:
    """The runs named by ``paths``, sorted by directory, when there are several and every file
    lies in one of them, named whole (else ``None``).

    No rule relates the rows of two runs (every key starts with run_id, and a row carrying
    another run's run_id is reported in its own file), so such runs can be validated one at
    a time, in the memory of the largest; only the run_ids must be compared across them.
    """
    disc = _discover(paths)
    runs = list(disc.runs.values())
    apart = (
        not disc.problems and len(runs) > 1 and all(r.full and r.info is not None for r in runs)
        and all(src.run is not None and src.run.full for src in disc.sources.values())
    )
    return sorted(runs, key=lambda r: r.dir) if apart else None



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

    if deployments not in ("check", "refuse"):
        raise ValueError(f"deployments must be 'check' or 'refuse', got {deployments!r}")
    kept, dirs = split_deployments(paths)
    if dirs and deployments == "refuse":
        raise deployment_refusal(dirs)
    checked = Checked([], {}, [], pl.DataFrame(schema=_TASK_CLASSES), [])
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
    total = Checked(list(deployed.problems), {}, [], pl.DataFrame(schema=_TASK_CLASSES), left_out, [],
                    list(deployed.notes))
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
