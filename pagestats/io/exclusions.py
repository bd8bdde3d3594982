"""What loading leaves out, and why: the explicit exclusions and the runs of another collection mode.

Exclusions (``RUN``, ``RUN/TASK``, ``RUN/TASK/INPUT_ID``; RUN a run_id or the name of the run's
directory) are applied to inputs, outcomes and topk before the row rules run (file-level rules
always see every file) and are reported by :meth:`pagestats.io.Logs.exclusion_report`, one line
each with the rows they removed; an exclusion that is malformed or matches nothing, or
exclusions that leave no inputs, raise :class:`ExclusionError` (a :class:`LogError`) in either
mode. Nothing is dropped silently (docs/SCHEMA.md, "What the reader guarantees").

Collection mode (docs/SCHEMA.md ``mode``): the logs are read for one mode at a time,
query-aware by default (the paper's setting; a manifest without ``mode`` is query-aware, and
so are loose files without a manifest). Runs of another mode are left out before their
files are read, so that a query-agnostic run of the same (model, context) never pools with
the query-aware ones; one line in ``Logs.exclusions`` says how many runs and inputs were left
out and how to analyse them. A mode that leaves nothing raises :class:`ExclusionError`.
"""

from __future__ import annotations

import os
import re

import polars as pl

from pagestats.core import defaults
from pagestats.io.discovery import _Discovery, _Source
from pagestats.io.validation.problems import ExclusionError, Problem


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

