"""Validation rules of the log schema (docs/SCHEMA.md), as DuckDB queries over the tables.

:mod:`pagestats.io` discovers the files and exposes them to a DuckDB connection as the
relations ``inputs``, ``outcomes`` and ``topk`` (views over the files when validating, so
that no rule holds all rows in memory; the frames of :func:`pagestats.io.load` when
loading); this module runs the rules on them. Every
check returns a list of :class:`Problem` (never raises, never stops at the first), each
naming the file and, where there is one, the row. Row numbers are 0-based positions
within the file (the index pyarrow / polars would give that row; line ``row + 1`` of a
jsonl file).

The rules, in the order they run:

manifest (:func:`check_manifest`)
    valid JSON object; every key of :data:`pagestats.core.schema.MANIFEST_KEYS` and of the
    ``model``, ``gate`` and ``protection`` blocks; a readable ``schema_version``; sane
    ``n_layers``/``n_heads``, ``budgets``, ``evictors``, ``tasks``, ``gate.bins``;
    ``files[]`` entries whose paths stay inside the run directory (docs/SCHEMA.md, "Safety").
tables (:func:`check_tables`)
    nulls in required columns and null elements inside list columns; duplicate inputs / outcome rows / topk rows; ``drop``
    finite; ``full_score`` and ``score`` in [0, 1]; ``budget`` in (0, 1]; ``run_id``,
    ``model``, ``context_length`` and ``task`` agreeing with the run's manifest;
    ``agreement`` length = manifest ``n_layers`` (else consistent within the run);
    ``pair_jaccard`` length = L·H(H−1)/2; profile values in [0, 1]; logged ``drop`` =
    :func:`pagestats.core.profile.drop_from_agreement` (manifest bins) within 1e-6;
    outcomes without an input and inputs without outcomes; the same budget grid for
    every (input, evictor) and the same evictor set for every input of a run (the
    manifest's, when there is one); the budget-1.0 arm present and equal to the full-KV
    outcome (score = full_score, n_kept = n_tokens); ``n_kept`` in [1, n_tokens]; topk
    layer/head in range, indices in [0, n_tokens) without repeats.

A rule that fires on many rows of one file reports the first :data:`MAX_ROWS_PER_RULE`
rows and then one line with the count of the rest, so that a wholly broken shard yields
a readable report.

This module runs :func:`check_tables` (plus the run_id-per-file rule); the rules live in
the sibling modules of each table.

References
----------
PAGE paper, §3 (a_ℓ, Eq. 3 drop D), §4 "Setup" (budgets, full-cache audit arm at b = 1),
App. F (deployed bins). docs/SCHEMA.md (schema, reader rules, safety).
"""

from __future__ import annotations

from collections.abc import Mapping

import duckdb

from pagestats.core import schema
from pagestats.io.validation.inputs import _check_inputs
from pagestats.io.validation.manifest import RunInfo
from pagestats.io.validation.outcomes import _check_outcomes
from pagestats.io.validation.problems import Problem, duplicate_rules, emit, null_checks, null_rules, one
from pagestats.io.validation.topk import _check_topk


def check_tables(
    con: duckdb.DuckDBPyConnection,
    *,
    files: list[str],
    runs: Mapping[str, RunInfo],
    file_runs: Mapping[int, str],
    incomplete: frozenset[str] = frozenset(),
    has_topk: bool = False,
    listed: Mapping[str, frozenset[str]] | None = None,
) -> list[Problem]:
    """Row-level rules on the relations ``inputs``, ``outcomes`` (and ``topk``) of ``con``.

    Parameters
    ----------
    con : duckdb.DuckDBPyConnection
        A connection whose relations ``inputs``, ``outcomes`` and, with ``has_topk``,
        ``topk`` hold the tables in canonical types plus ``_file`` (index into ``files``)
        and ``_row``. The rules create temporary tables and views whose names start with
        ``_`` (and ``inp``, ``tk``).
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
    has_topk : bool
        Whether there is a ``topk`` relation.
    listed : mapping run_id → tasks
        The manifest tasks that must have inputs (runs read whole, less the excluded tasks).

    Notes
    -----
    For valid logs the cost is a few scans of each table: an aggregate of every rule's
    count (inputs grouped per run and list length; outcomes grouped per input, joined with
    the inputs), one distinct-hash count per key for duplicates, and the profile lists
    streamed once through NumPy. Rows are fetched only for rules that fire, at most
    :data:`~pagestats.io.validation.problems.MAX_ROWS_PER_RULE` per file.
    """
    tables = ["inputs", "outcomes", *(["topk"] if has_topk else [])]
    problems: list[Problem] = []
    for table in tables:
        problems += _check_file_runs(con, table, files, file_runs)

    p, dups = duplicate_rules(con, "inputs", schema.INPUT_KEY, files, "input")
    _without_later(con, "inputs", "inp", dups)
    try:
        imported = tuple(r.run_id for r in runs.values() if r.imported)
        nulls = null_checks("inputs", _columns(con, "inputs"), imported)
        if dups:  # the null rules see every row, the others the inputs without later duplicates
            problems += null_rules(con, "inputs", _columns(con, "inputs"), files, imported) + p
            nulls = []
        problems += _check_inputs(con, files, runs, nulls, listed)
        problems += _check_outcomes(con, files, runs, incomplete, null_checks("outcomes", _columns(con, "outcomes"), imported))
        if has_topk:
            problems += null_rules(con, "topk", _columns(con, "topk"), files)
            p, dups = duplicate_rules(con, "topk", schema.TOPK_KEY, files, "topk row")
            problems += p
            _without_later(con, "topk", "tk", dups)
            problems += _check_topk(con, files, runs, incomplete)
    finally:
        for name in ("inp", "tk"):
            con.execute(f"DROP VIEW IF EXISTS {name}")
        for name in ("_later_inputs", "_dups_inputs", "_later_topk", "_dups_topk"):
            con.execute(f"DROP TABLE IF EXISTS {name}")
    return problems


def _columns(con, table: str) -> list[str]:
    return con.sql(f"SELECT * FROM {table}").columns


def _without_later(con, table: str, name: str, dups: bool) -> None:
    """View ``name``: ``table`` without the later occurrences of a duplicated key."""
    if dups:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {table} ANTI JOIN _later_{table} "
                    "USING (_file, _row)")
    else:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {table}")


def _check_file_runs(con, table: str, files: list[str], file_runs: Mapping[int, str]) -> list[Problem]:
    """Rows of a run directory's files carry that run's run_id."""
    if not any(i is not None for i in file_runs):
        return []
    expected = [file_runs.get(i) for i in range(len(files))]
    cond = "$run[_file + 1] IS NOT NULL AND run_id != $run[_file + 1]"
    if not one(con, f"SELECT count(*) FROM {table} WHERE {cond}", {"run": expected})[0]:
        return []
    return emit(con, f"SELECT _file, _row, run_id, $run[_file + 1] AS _run FROM {table} WHERE {cond}", files,
                f"{table} row from another run",
                lambda r: f"run_id {r['run_id']} but the run's manifest says {r['_run']}", {"run": expected})
