"""Files of a release, read, grouped into runs and written (docs/IMPORT.md, "Runs").

A run holds the files of one (model, context, input draw, family) whose inputs overlap: the gated
files of several evictors on the same inputs become one run, so that evictors are compared on the
same inputs. Files whose inputs are disjoint share a run only when every input then has the same
(evictor, budget) arms (the schema's one-grid rule, :data:`imported.arms`); otherwise each group of
them is a run of its own, named by the file name's distinguishing words (``…-extra``). Inputs shared
by several files must agree on T, D and the full-KV outcome.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pagestats import __version__
from pagestats.core import defaults, schema
from pagestats.io.imports import names
from pagestats.io.imports.rules import Threshold
from pagestats.io.imports.records import Records

#: ``created_at`` of an imported run: the release does not record when its logs were made, and a
#: time of import would make two imports of the same files differ (``imported.created_at`` says so).
UNKNOWN_TIME = "1970-01-01T00:00:00+00:00"
NO_DROP = "the gate: a RULER sweep logs the plain arm alone and no D; ρ and Table 1 read it"
NO_TOPK = "k: the release stores no top-k key sets"
NO_PAIRS = "head pairs: the release stores no per-pair Jaccards"
NO_PROFILE = "layer subsets, bins and profile statistics: no per-layer profile (drops_*) was matched to these inputs"
CONVENTIONS = (
    "full-KV outcome = correct_plain of the input's b = 1.0 row (Ada-KV files: correct_full)",
    "without b = 1.0 rows: full-KV outcome = stored correct_gated of a gate-closed input; unknown (null) when open",
    "outcomes = the plain arm (correct_plain as a 0/1 score, n_kept_plain); gated arms are replayed by Eq. 2",
    "tau_run = the threshold the stored gate_open fits: 0.07 when it fits, else the shortest decimal that does",
    "absolute budget B tokens → nominal budget B / context_length; an n_kept summed over layers × KV heads is "
    "divided by them",
    "Ada-KV files: evictors snapkv (shared mask) and adakv-snapkv, n_kept rounded to positions, run suffix -adakv",
    "RULER sweeps: the plain arm alone (correct, n_kept), no D (null drop), run suffix -ruler; evictor snapkv "
    "unless named",
    "no score_policy and no evictor in the file name: SnapKV (the release's unnamed gated_* files)",
    "input_id = the release's id; draw = the file name's seedN, else 0",
)


class ImportError_(ValueError):
    """Bad records: the import stopped and wrote nothing; ``lines`` holds one line per problem."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


@dataclass
class File:
    """One file read: where it came from, what it is about, and its inputs and outcomes."""

    records: Records
    sha256: str
    model: names.Model
    context: int
    draw: int
    family: str = "gated"  # "gated", "adakv" or "ruler": files of two families never share a run
    inputs: pl.DataFrame | None = None
    outcomes: pl.DataFrame | None = None
    threshold: Threshold | None = None
    absolute: bool = False

    @property
    def name(self) -> str:
        return Path(self.records.path).name

    @functools.cached_property
    def keys(self) -> frozenset:
        return frozenset(self.inputs.select("task", "input_id").iter_rows())

    @functools.cached_property
    def arms(self) -> frozenset:
        return frozenset(self.outcomes.select("evictor", "budget").unique().iter_rows())


@dataclass
class Run:
    """Files that become one run, and its inputs (with ``agreement`` once a profile is matched)."""

    run_id: str
    files: list[File]
    inputs: pl.DataFrame
    outcomes: pl.DataFrame
    profiles: list[dict] = field(default_factory=list)


def group(files: list[File]) -> list[list[File]]:
    """The files of each run: overlapping inputs join; disjoint groups join when their arms are equal."""
    groups: list[list[File]] = []
    for f in files:
        joined = [g for g in groups if any(f.keys & h.keys for h in g)]
        for g in joined:
            groups.remove(g)
        groups.append([h for g in joined for h in g] + [f])
    merged: list[list[File]] = []
    for g in groups:
        arms = frozenset().union(*(f.arms for f in g))
        same = next((m for m in merged if frozenset().union(*(f.arms for f in m)) == arms), None)
        if same is not None:
            same.extend(g)
        else:
            merged.append(g)
    return merged


def run_id(model: names.Model, context: int, draw: int, family: str, files: list[File], taken: set[str]) -> str:
    """``page-<model>-<context>[-seedN][-adakv]``, then the file names' distinguishing words when taken."""
    base = names.slug(model, context, draw) + ("" if family == "gated" else f"-{family}")
    if base not in taken:
        return base
    words = [w for w in Path(files[0].name).stem.lower().split("_") if w not in _NAME_WORDS]
    for word in words:
        if f"{base}-{word}" not in taken:
            return f"{base}-{word}"
    n = 2
    while f"{base}-part{n}" in taken:
        n += 1
    return f"{base}-part{n}"


_NAME_WORDS = {"gated", "drops", "adakv", "capbound", "ruler", *names.MODELS, *names.CONTEXTS, *names.EVICTORS,
               *(w for k in names.MODELS for w in k.split("_"))}


def merge_inputs(files: list[File]) -> pl.DataFrame:
    """The inputs of one run over its files; :class:`ImportError_` names an input two files disagree on."""
    merged = pl.concat([f.inputs.with_columns(pl.lit(f.records.path).alias("_file")) for f in files],
                       how="vertical_relaxed")
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
        pl.col("n_tokens").first(), pl.col("drop").first(), pl.col("full_score").drop_nulls().first(),
        pl.col("references").drop_nulls().first(), pl.col("full_prediction").drop_nulls().first())


def merge_outcomes(files: list[File], note) -> pl.DataFrame:
    """The outcomes of one run. A row that an earlier file holds with the same ``n_kept`` and score (the
    release's nested seed files, ``…_n20`` ⊂ ``…_n100``) is kept once, and ``note`` gets one line per file;
    a row two files hold with different values, or an input missing arms the others have (the schema's
    one-grid rule), is an :class:`ImportError_`."""
    out = pl.concat([f.outcomes.with_columns(pl.lit(f.records.path).alias("_file")) for f in files],
                    how="vertical_relaxed")
    key = pl.struct("evictor", "task", "input_id", "budget")
    later = key.is_duplicated() & ~key.is_first_distinct()
    same = pl.struct("evictor", "task", "input_id", "budget", "n_kept", "score")
    conflicting = out.filter(later & ~(same.is_duplicated() & ~same.is_first_distinct()))
    if conflicting.height:
        raise ImportError_([f"{r['_file']}:{r['_line']}: ({r['evictor']}, {r['task']}, {r['input_id']}, budget "
                            f"{r['budget']:g}) is also in an earlier file, with another outcome"
                            for r in conflicting.head(5).iter_rows(named=True)])
    for path, n in out.filter(later).group_by("_file", maintain_order=True).len().iter_rows():
        note(f"{path}: {n} rows repeat an earlier file's identically; kept once")
    out = out.filter(~later)
    n_arms = out.select("evictor", "budget").n_unique()
    short = out.group_by("task", "input_id").agg(pl.len(), pl.col("_file").first()).filter(pl.col("len") < n_arms)
    if short.height:
        raise ImportError_([f"{r['_file']}: input ({r['task']}, {r['input_id']}) has {r['len']} of the run's {n_arms} "
                            "(evictor, budget) arms: import the files whose inputs differ apart"
                            for r in short.sort("task", "input_id").head(5).iter_rows(named=True)])
    return out


def manifest(run: Run, source_commit: str | None) -> dict:
    """The manifest of an imported run, its ``imported`` block recording sources and conventions."""
    f0 = run.files[0]
    model, inputs, outcomes = f0.model, run.inputs, run.outcomes
    arms = sorted(outcomes.select("evictor", "budget").unique().iter_rows())
    evictors, budgets = sorted({e for e, _ in arms}), sorted({b for _, b in arms})
    product = len(arms) == len(evictors) * len(budgets)
    return {
        "run_id": run.run_id, "created_at": UNKNOWN_TIME,
        "model": {"name": model.name, "revision": None, "n_layers": model.n_layers, "n_heads": model.n_heads,
                  "n_kv_heads": model.n_kv_heads, "head_dim": model.head_dim, "dtype": "bfloat16",
                  "attn_impl": "eager"},
        "device": "unrecorded (the release's GPUs)", "context_length": f0.context, "mode": defaults.MODE,
        "tasks": {t: defaults.default_task_class(t) for t in dict.fromkeys(inputs["task"].to_list())},
        "evictors": evictors, "budgets": budgets,
        "gate": {"w": defaults.WINDOW, "k": defaults.TOP_K, "k_max_stored": 0, "bins": defaults.BIN_FRACTION,
                 "convention": defaults.BIN_CONVENTION},
        "protection": {"n_sink": defaults.N_SINK, "n_recent": defaults.N_RECENT}, "seed": 0, "draw": f0.draw,
        "n_per_task": int(inputs.group_by("task").len()["len"].max()),
        "software": {"pagestats": __version__},
        "imported": {
            "format": "page-release", "created_at": "unknown: the release does not record when its logs were made",
            "source_commit": source_commit,
            "sources": [{"file": f.name, "sha256": f.sha256, "schema": f.records.schema,
                         "records": f.records.frame.height, "evictors": sorted(f.outcomes["evictor"].unique().to_list()),
                         **({"tau_run": f.threshold.tau, "tau_interval": [_finite(f.threshold.low),
                                                                          _finite(f.threshold.high)]}
                            if f.threshold else {"tau_run": None}),
                         "absolute_budgets": f.absolute, "has_full_rows": bool((f.outcomes["budget"] == 1.0).any())}
                        for f in run.files] + run.profiles,
            "conventions": list(CONVENTIONS),
            **({} if product else {"arms": [list(a) for a in arms]}),
            "full_score_unknown": int(inputs["full_score"].null_count()),
            "text": bool(inputs["references"].is_not_null().any()),
            "unsupported": ([NO_DROP] if inputs["drop"].null_count() else [])
            + [NO_TOPK, NO_PAIRS] + ([] if run.profiles else [NO_PROFILE]),
        },
    }


def _finite(x: float):
    return x if abs(x) != float("inf") else None


def _write_run(directory: Path, run: Run, source_commit: str | None) -> None:
    f0 = run.files[0]
    inputs = run.inputs
    frame = inputs.select(
        pl.lit(run.run_id).alias("run_id"), pl.lit(f0.model.name).alias("model"),
        pl.lit(f0.context, pl.Int64).alias("context_length"), "task", "input_id",
        pl.lit(f0.draw, pl.Int64).alias("draw"), "n_tokens", "drop",
        (pl.col("agreement") if "agreement" in inputs.columns else pl.lit(None, pl.List(pl.Float64))).alias("agreement"),
        pl.lit(None, pl.List(pl.Float32)).alias("pair_jaccard"), pl.lit(None, pl.String).alias("prompt"),
        "references", "full_prediction", "full_score",
        pl.lit(None, pl.Int64).alias("full_n_generated"), pl.lit(None, pl.String).alias("full_stop_reason"),
        pl.lit(None, pl.Float64).alias("prefill_ms"), pl.lit(None, pl.Float64).alias("gate_ms"))
    out = run.outcomes.select(
        pl.lit(run.run_id).alias("run_id"), "task", "input_id", "evictor", "budget", "n_kept", "prediction", "score",
        pl.lit(None, pl.Float64).alias("decode_ms"), pl.lit(None, pl.Int64).alias("n_generated"),
        pl.lit(None, pl.String).alias("stop_reason"))
    schema.write_parquet("inputs", frame.sort("task", "input_id"), directory / "inputs" / "part-000000.parquet")
    schema.write_parquet("outcomes", out.sort("evictor", "task", "input_id", "budget"),
                         directory / "outcomes" / "part-000000.parquet")
    schema.write_manifest(directory, manifest(run, source_commit))


def write_all(out: Path, runs: list[Run], source_commit: str | None) -> dict[str, str]:
    """Write every run into a temporary folder inside ``out``, then move each into place (a run
    already there is replaced whole); return run_id → directory."""
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".import-{os.getpid()}"
    written = {}
    try:
        for run in runs:
            _write_run(staging / run.run_id, run, source_commit)
        for run in runs:
            target = out / run.run_id
            old = out / f".old-{run.run_id}-{os.getpid()}"
            if target.exists():
                target.rename(old)
            (staging / run.run_id).rename(target)
            shutil.rmtree(old, ignore_errors=True)
            written[run.run_id] = str(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written
