"""Validation rules of log schema v1 (docs/SCHEMA.md), as vectorised checks on frames.

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
    ``files[]`` entries whose paths stay inside the run directory (docs/SCHEMA.md, "Safety").
frames (:func:`check_frames`)
    nulls in required columns and null elements inside list columns; duplicate inputs / outcome rows / topk rows; ``drop``
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

This module runs :func:`check_frames` (plus the run_id-per-file rule); the rules live in
the sibling modules of each table.

References
----------
PAGE paper, §3 (a_ℓ, Eq. 3 drop D), §4 "Setup" (budgets, full-cache audit arm at b = 1),
App. F (deployed bins). docs/SCHEMA.md (schema, reader rules, safety).
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from pagestats import schema
from pagestats.io.validation.inputs import (
    _check_inputs,
)
from pagestats.io.validation.manifest import (
    RunInfo,
)
from pagestats.io.validation.outcomes import (
    _check_outcomes,
)
from pagestats.io.validation.problems import (
    Problem,
    _duplicates,
    _nulls,
    emit,
)
from pagestats.io.validation.topk import _check_topk

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

