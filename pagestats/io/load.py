"""Load and validate logs (docs/SCHEMA.md) through DuckDB into polars: :func:`load`, a :class:`~pagestats.io.Logs`.

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

SQL is parameterised and paths are never formatted into it. Columns are cast to the writer's
types (ints int64, floats float64, ``agreement``/``pair_jaccard`` list<float32>, ``indices``
list<int32>). In jsonl, a JSON number without a decimal point is read as an integer, so integer
types are also accepted for float columns there.

``load(strict=True)`` raises :class:`LogError` with every problem; ``load(strict=False)``
returns what could be read and lists the problems in ``Logs.problems``: files that cannot be
read (corrupt, missing or mistyped columns, unreadable schema version) are left out and named
there, rows with bad values are kept. Explicit exclusions and the runs of another collection
mode are left out and listed in ``Logs.exclusions``. Validation records are used and written
only without exclusions and with the analysis columns (the rows every rule saw); when one
holds, the row rules are skipped and ``Logs.notes`` says so.

Schema versions: ``schema_version`` comes from the run's manifest (loose files without one are
taken as the current version). An older readable version
(:data:`pagestats.core.schema.READABLE_VERSIONS`) is upgraded on read, one step per version, to the
manifest, each file's arrow schema before the type check, and every table before the row rules.
Version 2 is current; the one step, v1 → v2, adds the stop reasons and generated-token counts
(unknown in v1).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import polars as pl

from pagestats.core import defaults, schema
from pagestats.io import record
from pagestats.io.deployment import deployment_refusal
from pagestats.io.discovery import _sha256_or_none
from pagestats.io.duck import MEMORY_LIMIT
from pagestats.io.exclusions import _apply_exclusions, _of_mode
from pagestats.io.files import (
    _discover,
    _file_level,
    _found,
    _listed_tasks,
    _no_inputs,
    _record_files,
    _record_key,
    _task_classes,
    connect,
)
from pagestats.io.logs import Logs
from pagestats.io.read import _empty, _read_table, _version
from pagestats.io.upgrades import upgrade_table
from pagestats.io.validation.problems import LogError, Problem
from pagestats.io.validation.tables import check_tables


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
