"""``pagestats import page``: the PAGE paper's released per-input logs as pagestats runs.

The release (the paper's authors' repository ``pankajkumar6002/PAGE``, ``experiments/results/``) is
JSON Lines, one file per (model, context, evictor). :func:`import_page` reads files or folders of it,
recognises each file's schema from its records (:mod:`pagestats.io.imports.records`), and writes one
run per (model, context, input draw) in log schema v2 (docs/SCHEMA.md), so that the whole analysis
(``whatif``, ``report``, …) reads the paper's own logs. The conventions it applies are written into
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
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pagestats import __version__, defaults, schema
from pagestats.io.imports import names
from pagestats.io.imports.gated import Threshold, read_gated
from pagestats.io.imports.profile import match_profiles
from pagestats.io.imports.records import Records, RecordError, read_records

#: ``created_at`` of an imported run: the release does not record when its logs were made, and a
#: time of import would make two imports of the same files differ (manifest ``imported.created_at``
#: says so).
UNKNOWN_TIME = "1970-01-01T00:00:00+00:00"
#: The replays an imported run cannot support, and why (manifest ``imported.unsupported``).
NO_TOPK = "k: the release stores no top-k key sets"
NO_PAIRS = "head pairs: the release stores no per-pair Jaccards"
NO_PROFILE = "layer subsets, bins and profile statistics: no per-layer profile (drops_*) was matched to these inputs"
CONVENTIONS = (
    "full-KV outcome = correct_plain of the input's b = 1.0 row",
    "without b = 1.0 rows: full-KV outcome = stored correct_gated of a gate-closed input; unknown (null) when open",
    "outcomes = the plain arm (correct_plain as a 0/1 score, n_kept_plain); gated arms are replayed by Eq. 2",
    "tau_run = the threshold the stored gate_open fits: 0.07 when it fits, else the shortest decimal that does",
    "absolute budget B tokens → nominal budget B / context_length",
    "no score_policy and no evictor in the file name: SnapKV (the release's unnamed gated_* files)",
    "input_id = the release's id; draw = the file name's seedN, else 0",
)


class ImportError_(ValueError):
    """Bad records: the import stopped and wrote nothing; ``lines`` holds one line per problem."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


@dataclass
class ImportReport:
    """What an import did: the runs written (run_id → directory) and one line per file skipped."""

    runs: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class _File:
    records: Records
    sha256: str
    model: names.Model
    context: int
    draw: int
    rows: pl.DataFrame | None = None
    threshold: Threshold | None = None
    absolute: bool = False
    evictors: tuple[str, ...] = ()


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


def _evictor_column(f: _File, override: str | None) -> pl.Expr:
    """The evictor of each row: the override, else ``score_policy``, else the file name's, else SnapKV."""
    if override:
        return pl.lit(override)
    by_name = names.evictor(Path(f.records.path).stem) or names.UNNAMED_GATED_EVICTOR
    mapped = pl.col("score_policy").replace_strict(names.EVICTORS, default=pl.col("score_policy"))
    return pl.when(pl.col("score_policy").is_null()).then(pl.lit(by_name)).otherwise(mapped)


def _full_outcomes(f: _File) -> pl.DataFrame:
    """Per input of one file: T, D, its full-KV outcome (null when unknown) and its texts."""
    rows = f.rows
    full = rows.filter(pl.col("budget") == 1.0).select("task", "input_id", pl.col("score_plain").alias("full_score"),
                                                      "references", pl.col("prediction").alias("full_prediction"))
    first = rows.unique(["task", "input_id"], keep="first", maintain_order=True)
    if full.height:
        out = first.select("task", "input_id", "n_tokens", "drop", "_line").join(full, on=["task", "input_id"],
                                                                                  how="left", maintain_order="left")
    else:
        out = first.select("task", "input_id", "n_tokens", "drop", "_line", "references",
                           pl.when(~pl.col("gate_open")).then(pl.col("score_gated")).alias("full_score"),
                           pl.lit(None, pl.String).alias("full_prediction"))
    return out.with_columns(pl.lit(f.records.path).alias("_file"))


def _run_inputs(files: list[_File]) -> pl.DataFrame:
    """The inputs of one run, merged over its files; one line per input on which two files disagree."""
    parts = [_full_outcomes(f) for f in files]
    merged = pl.concat(parts, how="vertical_relaxed")
    problems = []
    for column, what in (("n_tokens", "T"), ("drop", "D"), ("full_score", "full-KV outcome")):
        seen = merged.filter(pl.col(column).is_not_null())
        first = seen.group_by("task", "input_id", maintain_order=True).agg(
            pl.col(column).first().alias("_first"), pl.col("_file").first().alias("_first_file"))
        bad = seen.join(first, on=["task", "input_id"]).filter(pl.col(column) != pl.col("_first"))
        problems += [f"{r['_file']}:{r['_line']}: input ({r['task']}, {r['input_id']}) has {what} {r[column]!r} here "
                     f"and {r['_first']!r} in {r['_first_file']}" for r in bad.head(5).iter_rows(named=True)]
    if problems:
        raise ImportError_(problems)
    return merged.group_by("task", "input_id", maintain_order=True).agg(
        pl.col("n_tokens").first(), pl.col("drop").first(),
        pl.col("full_score").drop_nulls().first(), pl.col("references").drop_nulls().first(),
        pl.col("full_prediction").drop_nulls().first())


def _run_outcomes(files: list[_File], context: int, evictor: str | None) -> pl.DataFrame:
    parts = []
    for f in files:
        rows = f.rows.with_columns(_evictor_column(f, evictor).alias("evictor"), pl.lit(f.records.path).alias("_file"))
        if f.absolute:
            rows = rows.with_columns(pl.col("budget") / context)
        parts.append(rows.select("task", "input_id", "evictor", "budget", "n_kept", "prediction",
                                 pl.col("score_plain").alias("score"), "_file", "_line"))
    out = pl.concat(parts, how="vertical_relaxed")
    key = pl.struct("evictor", "task", "input_id", "budget")
    repeated = out.filter(key.is_duplicated() & ~key.is_first_distinct())
    if repeated.height:
        raise ImportError_([f"{r['_file']}:{r['_line']}: ({r['evictor']}, {r['task']}, {r['input_id']}, budget "
                            f"{r['budget']:g}) is also in an earlier file" for r in repeated.head(5).iter_rows(named=True)])
    return out


def _manifest(run_id: str, model: names.Model, context: int, draw: int, inputs: pl.DataFrame,
              outcomes: pl.DataFrame, files: list[_File], profiles: list[dict], source_commit: str | None) -> dict:
    tasks = list(dict.fromkeys(inputs["task"].to_list()))
    unsupported = [NO_TOPK, NO_PAIRS] + ([] if profiles else [NO_PROFILE])
    return {
        "run_id": run_id, "created_at": UNKNOWN_TIME,
        "model": {"name": model.name, "revision": None, "n_layers": model.n_layers, "n_heads": model.n_heads,
                  "n_kv_heads": model.n_kv_heads, "head_dim": model.head_dim, "dtype": "bfloat16",
                  "attn_impl": "eager"},
        "device": "unrecorded (the release's GPUs)", "context_length": context, "mode": defaults.MODE,
        "tasks": {t: defaults.default_task_class(t) for t in tasks},
        "evictors": sorted(outcomes["evictor"].unique().to_list()),
        "budgets": sorted(outcomes["budget"].unique().to_list()),
        "gate": {"w": defaults.WINDOW, "k": defaults.TOP_K, "k_max_stored": 0, "bins": defaults.BIN_FRACTION,
                 "convention": defaults.BIN_CONVENTION},
        "protection": {"n_sink": defaults.N_SINK, "n_recent": defaults.N_RECENT}, "seed": 0, "draw": draw,
        "n_per_task": int(inputs.group_by("task").len()["len"].max()),
        "software": {"pagestats": __version__},
        "imported": {
            "format": "page-release", "created_at": "unknown: the release does not record when its logs were made",
            "source_commit": source_commit,
            "sources": [{"file": Path(f.records.path).name, "sha256": f.sha256, "schema": "gated",
                         "records": f.records.frame.height, "evictors": list(f.evictors),
                         "tau_run": f.threshold.tau, "tau_interval": [_finite(f.threshold.low), _finite(f.threshold.high)],
                         "absolute_budgets": f.absolute, "has_full_rows": bool((f.rows["budget"] == 1.0).any())}
                        for f in files] + profiles,
            "conventions": list(CONVENTIONS),
            "full_score_unknown": int(inputs["full_score"].null_count()),
            "text": bool(inputs["references"].is_not_null().any()),
            "unsupported": unsupported,
        },
    }


def _finite(x: float):
    return x if abs(x) != float("inf") else None


def _write_run(directory: Path, manifest: dict, inputs: pl.DataFrame, outcomes: pl.DataFrame, run_id: str,
               model: names.Model, context: int, draw: int) -> None:
    n = inputs.height
    frame = inputs.select(
        pl.lit(run_id).alias("run_id"), pl.lit(model.name).alias("model"), pl.lit(context, pl.Int64).alias("context_length"),
        "task", "input_id", pl.lit(draw, pl.Int64).alias("draw"), "n_tokens", "drop",
        (pl.col("agreement") if "agreement" in inputs.columns else pl.lit(None, pl.List(pl.Float64))).alias("agreement"),
        pl.lit(None, pl.List(pl.Float32)).alias("pair_jaccard"), pl.lit(None, pl.String).alias("prompt"),
        "references", "full_prediction", "full_score",
        pl.lit(None, pl.Int64).alias("full_n_generated"), pl.lit(None, pl.String).alias("full_stop_reason"),
        pl.lit(None, pl.Float64).alias("prefill_ms"), pl.lit(None, pl.Float64).alias("gate_ms"))
    assert frame.height == n
    out = outcomes.select(pl.lit(run_id).alias("run_id"), "task", "input_id", "evictor", "budget", "n_kept",
                          "prediction", "score", pl.lit(None, pl.Float64).alias("decode_ms"),
                          pl.lit(None, pl.Int64).alias("n_generated"), pl.lit(None, pl.String).alias("stop_reason"))
    schema.write_parquet("inputs", frame.sort("task", "input_id"), directory / "inputs" / "part-000000.parquet")
    schema.write_parquet("outcomes", out.sort("evictor", "task", "input_id", "budget"),
                         directory / "outcomes" / "part-000000.parquet")
    schema.write_manifest(directory, manifest)


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
    paths = source_files(sources, report.skipped.append)
    gated: list[_File] = []
    profiles: list[_File] = []
    problems: list[str] = []
    for path in (progress(paths) if progress else paths):
        try:
            records = read_records(path)
        except RecordError as err:
            problems += err.lines
            continue
        if records.schema is None:
            report.skipped.append(f"{path}: skipped: {records.why}")
            continue
        identity = _identity(path, model, context, report.skipped.append)
        if identity is None:
            continue
        f = _File(records, schema.sha256_file(path), *identity)
        if records.schema == "profile":
            profiles.append(f)
            continue
        try:
            f.rows, f.threshold, f.absolute = read_gated(records)
        except RecordError as err:
            problems += err.lines
            continue
        f.evictors = tuple(sorted(f.rows.select(_evictor_column(f, evictor).alias("e"))["e"].unique().to_list()))
        gated.append(f)
    if problems:
        raise ImportError_(problems)
    runs: dict[tuple, list[_File]] = {}
    for f in gated:
        runs.setdefault((f.model.name, f.context, f.draw), []).append(f)
    for f in profiles:
        if (f.model.name, f.context, f.draw) not in runs:
            report.skipped.append(f"{f.records.path}: skipped: no gated file of {f.model.name} at {f.context} tokens "
                                  "was given, so its profiles match no input")
    built = []
    for (name, length, draw), files in runs.items():
        model_ = files[0].model
        run_id = names.slug(model_, length, draw)
        inputs = _run_inputs(files)
        outcomes = _run_outcomes(files, length, evictor)
        matched: list[dict] = []
        for f in profiles:
            if (f.model.name, f.context, f.draw) != (name, length, draw):
                continue
            frame, reason = match_profiles(f.records, inputs.select("task", "input_id", "n_tokens", "drop"), model_.n_layers)
            if frame is None:
                report.skipped.append(f"{f.records.path}: skipped: {reason}")
                continue
            if matched:
                report.skipped.append(f"{f.records.path}: skipped: {run_id} already has a matched profile file")
                continue
            inputs = inputs.join(frame, on=["task", "input_id"], how="left", maintain_order="left")
            matched.append({"file": Path(f.records.path).name, "sha256": f.sha256, "schema": "profile",
                            "records": f.records.frame.height})
        manifest = _manifest(run_id, model_, length, draw, inputs, outcomes, files, matched, source_commit)
        built.append((run_id, manifest, inputs, outcomes, model_, length, draw))
    _write_all(Path(out), built, report)
    return report


def _write_all(out: Path, built: list, report: ImportReport) -> None:
    """Write every run into a temporary folder beside ``out``, then move each into place."""
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".import-{os.getpid()}"
    try:
        for run_id, manifest, inputs, outcomes, model, context, draw in built:
            _write_run(staging / run_id, manifest, inputs, outcomes, run_id, model, context, draw)
        for run_id, *_ in built:
            target = out / run_id
            old = out / f".old-{run_id}-{os.getpid()}"
            if target.exists():
                target.rename(old)
            (staging / run_id).rename(target)
            shutil.rmtree(old, ignore_errors=True)
            report.runs[run_id] = str(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
