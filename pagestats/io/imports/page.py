"""``pagestats import page``: the PAGE paper's released per-input logs as pagestats runs.

The release (the paper's authors' repository ``pankajkumar6002/PAGE``, ``experiments/results/``) is
JSON Lines, one file per (model, context, evictor). :func:`import_page` reads files or folders of it,
recognises each file's schema from its records (:mod:`pagestats.io.imports.records`: gated, Ada-KV /
capbound, per-layer profiles), and writes runs of log schema v2 (docs/SCHEMA.md), one per (model,
context, input draw) and family of files on the same inputs (:mod:`pagestats.io.imports.runs`), so that
the whole analysis (``whatif``, ``report``, …) reads the paper's own logs. The conventions it applies are written into
each run's manifest (``imported``) and described in docs/IMPORT.md:

* an input's full-KV outcome is ``correct_plain`` on its b = 1.0 row; in a file without b = 1.0 rows it
  is the stored ``correct_gated`` of a gate-closed input, and unknown (null ``full_score``) for a
  gate-open one;
* outcomes are the plain arm (``correct_plain``, ``n_kept_plain``): the analysis replays the gate by the
  authors' rule (gated = plain if D ≥ τ, else the full-KV outcome, Eq. 2), never from the stored gated
  column; the τ each file's stored gate ran at is inferred and recorded (:func:`~pagestats.io.imports.gated.infer_tau`);
* absolute budgets (B tokens) become the nominal b = B / context length;
* the release has no top-k sets and no per-pair Jaccards, so k and head-pair replays never run on an
  imported run; layer-subset replays run only where a ``drops_*`` profile was matched.

Files of another schema, stubs and the authors' ``INVALID_*`` folders are skipped with one line each;
a bad record stops the import with one line per bad record (file and line), and nothing is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pagestats.core import schema
from pagestats.io.imports import names
from pagestats.io.imports.adakv import read_adakv
from pagestats.io.imports.gated import gated_tables, incomplete_inputs, read_gated, summed_kept_problem
from pagestats.io.imports.profile import match_profiles
from pagestats.io.imports.records import RecordError, read_records
from pagestats.io.imports.sweep import read_sweep
from pagestats.io.imports.runs import File, ImportError_, Run, group, merge_inputs, merge_outcomes, run_id, write_all

__all__ = ["ImportError_", "ImportReport", "import_page", "source_files"]


@dataclass
class ImportReport:
    """What an import did: the runs written (run_id → directory) and one line per file skipped."""

    runs: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def source_files(sources: Sequence[str], skip: Callable[[str], None]) -> list[str]:
    """The ``.jsonl`` files of ``sources`` (files, or folders searched recursively, sorted by path).

    A file under a folder named ``INVALID_*`` (the authors' own mark of a run they withdrew) is
    skipped with one line; so is a named file that is not ``.jsonl``. Other files found in a folder
    (notes, figures) are counted in one line.
    """
    out, ignored = [], 0
    for source in sources:
        path = Path(source)
        if path.is_dir():
            for found in sorted(p for p in path.rglob("*") if p.is_file()):
                if found.suffix.lower() != ".jsonl":
                    ignored += 1
                elif any(part.startswith("INVALID_") for part in found.relative_to(path).parts[:-1]):
                    skip(f"{found}: skipped: the authors marked its folder invalid ({found.parent.name})")
                else:
                    out.append(str(found))
        elif path.is_file():
            if path.suffix.lower() != ".jsonl":
                skip(f"{path}: skipped: not a JSON Lines (.jsonl) file")
            elif any(part.startswith("INVALID_") for part in path.parts[:-1]):
                skip(f"{path}: skipped: the authors marked its folder invalid ({path.parent.name})")
            else:
                out.append(str(path))
        else:
            raise FileNotFoundError(f"{source}: no such file or folder")
    if ignored:
        skip(f"{ignored} files in the folders given are not .jsonl and were not read")
    return list(dict.fromkeys(out))


def _identity(path: str, model: str | None, context: int | None, skip) -> tuple[names.Model, int, int] | None:
    stem = Path(path).stem
    chosen = names.resolve_model(model) if model else None
    if model and chosen is None:
        raise ValueError(f"model {model!r} is not in the release's table of models ({sorted(names.MODELS_BY_NAME)})")
    token = names.model_token(stem)
    found = chosen or (names.MODELS[token] if token else None)
    length = context or names.context_length(stem)
    if found is None or length is None:
        what = " and ".join(w for w, v in (("model", found), ("context length", length)) if v is None)
        skip(f"{path}: skipped: its name gives no {what} (pass the model and context length explicitly)")
        return None
    return found, length, names.draw(stem)


def _evictor(path: str, override: str | None) -> pl.Expr:
    """The evictor of each gated row: the override, else ``score_policy``, else the file name's, else SnapKV."""
    if override:
        return pl.lit(override)
    by_name = names.evictor(Path(path).stem) or names.UNNAMED_GATED_EVICTOR
    mapped = pl.col("score_policy").replace_strict(names.EVICTORS, default=pl.col("score_policy"))
    return pl.when(pl.col("score_policy").is_null()).then(pl.lit(by_name)).otherwise(mapped)


def _read(f: File, evictor: str | None, skip) -> bool:
    """Fill ``f``'s inputs and outcomes from its records; ``False`` (with a line) for a partial file.
    Raises :class:`~pagestats.io.imports.records.RecordError` for bad records."""
    if f.records.schema == "adakv":
        f.family = "adakv"
        f.inputs, f.outcomes, f.threshold = read_adakv(f.records)
        rows = f.outcomes
    elif f.records.schema == "sweep":
        f.family = "ruler"
        f.inputs, f.outcomes = read_sweep(f.records, _evictor(f.records.path, evictor))
        rows = f.outcomes
    else:
        rows, f.threshold, f.absolute = read_gated(f.records)
        slots = f.model.n_layers * f.model.n_kv_heads
        if f.absolute:
            lines = summed_kept_problem(rows, slots, f.records.path)
            if lines:
                raise RecordError(f.records.path, lines)
        f.inputs, f.outcomes = gated_tables(rows, _evictor(f.records.path, evictor), absolute=f.absolute,
                                            context=f.context, kv_slots=slots)
    partial = incomplete_inputs(rows, f.records.path)
    if partial:
        skip(f"{f.records.path}: skipped: {partial}")
        return False
    return True


def import_page(sources: Sequence[str], out: str | os.PathLike, *, model: str | None = None, context: int | None = None,
                evictor: str | None = None, source_commit: str | None = None, progress=None) -> ImportReport:
    """Import the PAGE release's files or folders ``sources`` into runs under ``out``.

    Parameters
    ----------
    sources : sequence of str
        JSON Lines files of the release, or folders (searched recursively).
    out : path
        The folder the runs are written to (``out/<run_id>/``); a run already there is replaced whole.
    model, context, evictor : optional
        Override what the file names and records say (:mod:`pagestats.io.imports.names`): a hub name
        or file-name token, a context length in tokens, an evictor name.
    source_commit : str, optional
        The release's commit, recorded in each manifest.
    progress : callable, optional
        Wraps the list of files (e.g. ``tqdm``) to show progress.

    Returns
    -------
    ImportReport
        The runs written and one line per skipped file.

    Raises
    ------
    ImportError_
        Bad records (one line per problem, naming file and line); nothing was written.
    ValueError
        An unknown ``model``; FileNotFoundError for a missing source.
    """
    report = ImportReport()
    skip = report.skipped.append
    paths = source_files(sources, skip)
    data: list[File] = []
    profiles: list[File] = []
    problems: list[str] = []
    for path in (progress(paths) if progress else paths):
        try:
            records = read_records(path)
        except RecordError as err:
            problems += err.lines
            continue
        if records.schema is None:
            skip(f"{path}: skipped: {records.why}")
            continue
        identity = _identity(path, model, context, skip)
        if identity is None:
            continue
        f = File(records, schema.sha256_file(path), *identity)
        if records.schema == "profile":
            profiles.append(f)
            continue
        try:
            if _read(f, evictor, skip):
                data.append(f)
        except RecordError as err:
            problems += err.lines
    if problems:
        raise ImportError_(problems)
    runs = _runs(data, skip)
    for f in profiles:
        _attach_profile(f, runs, skip)
    report.runs = write_all(Path(out), runs, source_commit)
    return report


def _runs(files: list[File], note) -> list[Run]:
    """The runs of the files read (:func:`pagestats.io.imports.runs.group`), in file order."""
    by_cell: dict[tuple, list[File]] = {}
    for f in files:
        by_cell.setdefault((f.model.name, f.context, f.draw, f.family), []).append(f)
    runs, taken = [], set()
    for (_, length, draw, family), cell in by_cell.items():
        for members in sorted(group(cell), key=lambda g: -sum(f.inputs.height for f in g)):
            rid = run_id(members[0].model, length, draw, family, members, taken)
            taken.add(rid)
            runs.append(Run(rid, members, merge_inputs(members), merge_outcomes(members, note)))
    return runs


def _attach_profile(f: File, runs: list[Run], skip) -> None:
    """Match a ``drops_*`` file to the gated run of its (model, context, draw), or say why not."""
    target = next((r for r in runs if r.files[0].family == "gated" and (r.files[0].model.name, r.files[0].context,
                   r.files[0].draw) == (f.model.name, f.context, f.draw)), None)
    if target is None:
        skip(f"{f.records.path}: skipped: no gated file of {f.model.name} at {f.context} tokens was given, so its "
             "profiles match no input")
        return
    if target.profiles:
        skip(f"{f.records.path}: skipped: {target.run_id} already has a matched profile file")
        return
    frame, reason = match_profiles(f.records, target.inputs.select("task", "input_id", "n_tokens", "drop"),
                                   f.model.n_layers)
    if frame is None:
        skip(f"{f.records.path}: skipped: {reason}")
        return
    target.inputs = target.inputs.join(frame, on=["task", "input_id"], how="left", maintain_order="left")
    target.profiles.append({"file": f.name, "sha256": f.sha256, "schema": "profile", "records": f.records.frame.height})
