"""Deployment runs: the logs a deployed gate writes (docs/SCHEMA.md, "Deployment runs").

``collectors.deploy`` writes one row per input it gates — D (Eq. 3), a_ℓ, τ and the decision of
Eq. 2, T and the kept KV — into a run directory whose manifest says ``"kind": "deployment"``, under
``inputs/`` with the columns of :data:`pagestats.core.schema.DEPLOYMENT`. Such a run has no
counterfactual arm (a served input is decoded once): no ``outcomes`` and no full-KV score, so no
replay that compares arms can read it; :class:`DeploymentRunError` says so in one line. Its rules:
the manifest, the files against the manifest's sha256 and row counts, the column types, and the
rows (D from a_ℓ, the decision from D, τ and T, the kept KV).

References
----------
PAGE paper §3 (the gate, Eq. 2; D, Eq. 3), App. F (bins).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pagestats.core import formulas, profile, schema
from pagestats.io.discovery import _Discovery
from pagestats.io.guard import Refused, check_regular, read_manifest
from pagestats.io.validation.manifest import BIN_CONVENTIONS, listed_files, parse_bins
from pagestats.io.validation.problems import (
    MAX_ROWS_PER_RULE,
    ExclusionError,
    LogError,
    Problem,
    unreadable_parquet,
    value_text,
)

__all__ = ["DeploymentRun", "DeploymentRunError", "check_deployment", "deployment_refusal", "is_deployment_dir",
           "is_deployment_manifest", "read_deployment", "split_deployments", "DROP_TOLERANCE", "ENTRIES"]

#: The entry points of ``collectors.deploy`` that write deployment logs (manifest ``deployment.entry``).
ENTRIES = ("GatedPress", "gated_generate")
#: Logged D against D recomputed from the logged a_ℓ (the collection runs' rule, docs/SCHEMA.md).
DROP_TOLERANCE = 1e-6


class DeploymentRunError(ExclusionError):
    """The logs name a deployment run, which has no outcomes to replay (a usage error, exit 2)."""


@dataclass(frozen=True)
class DeploymentRun:
    """A checked deployment run: its directory, manifest, rows (sorted by ``input_id``) and files.

    Attributes
    ----------
    dir : str
    manifest : dict
    rows : polars.DataFrame
        The :data:`pagestats.core.schema.DEPLOYMENT` columns of every row (``prediction`` when logged).
    files : list of (path, sha256, rows)
    """

    dir: str
    manifest: dict
    rows: pl.DataFrame
    files: list = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.manifest["run_id"]

    @property
    def model(self) -> str:
        return self.manifest["model"]["name"]

    def summary(self) -> str:
        """One line naming the run: its id, inputs, model, τ and the inputs the gate opened on."""
        n, n_open = self.rows.height, int(self.rows["gate_open"].sum()) if self.rows.height else 0
        return (f"{self.dir}: a deployment run ({self.run_id}: {n} input{'s' if n != 1 else ''} of model "
                f"{self.model}, τ = {self.manifest['gate']['tau']!r}, gate open on {n_open}); it has no outcomes, so "
                f"whatif and report do not read it: `pagestats monitor {self.dir} --gate gate.json` does")


def is_deployment_manifest(manifest) -> bool:
    """Whether a parsed manifest is a deployment run's (``kind`` = ``"deployment"``)."""
    return isinstance(manifest, Mapping) and manifest.get("kind") == schema.DEPLOYMENT_KIND


def is_deployment_dir(path) -> bool:
    """Whether ``path`` is a directory whose readable ``manifest.json`` says ``kind: deployment``."""
    path = os.fspath(path)
    manifest_path = os.path.join(path, "manifest.json")
    if not os.path.isdir(path) or not os.path.lexists(manifest_path):
        return False
    try:
        return is_deployment_manifest(read_manifest(manifest_path, path))
    except Refused:
        return False


def split_deployments(paths) -> tuple[list, list[str]]:
    """``paths`` less those that name deployment runs only, and the directories of every deployment
    run the paths name (a run directory, a folder holding runs, or a glob), in order, once each.

    A path that also names collection logs (or files the discovery reports a problem with) is kept:
    its deployment runs are set apart by the discovery itself (:mod:`pagestats.io.discovery`).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    kept, dirs = [], {}
    for path in paths:
        disc = _Discovery()
        disc.add(path)
        for real, run in disc.deployments.items():
            dirs.setdefault(real, run.dir)
        if not disc.deployments or disc.sources or disc.problems or disc.runs:
            kept.append(path)
    return kept, list(dirs.values())


def deployment_refusal(run_dirs) -> DeploymentRunError:
    """The one-line error of an analysis command whose logs name the deployment runs ``run_dirs``."""
    dirs = sorted(os.path.normpath(os.fspath(d)) for d in run_dirs)
    shown = ", ".join(dirs[:3]) + (f" and {len(dirs) - 3} more" if len(dirs) > 3 else "")
    message = (f"{shown} {'is a deployment run' if len(dirs) == 1 else 'are deployment runs'} (collectors.deploy "
               f"log_dir), with no outcomes to replay: give collection runs here, and read a deployment run with "
               f"`pagestats monitor {dirs[0]} --gate gate.json`")
    return DeploymentRunError([Problem(dirs[0], None, message)])


# --------------------------------------------------------------------------- the rules


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _manifest_problems(run_dir: str, manifest, bad) -> dict | None:
    """The manifest rules; returns what the row rules need (``None`` when the manifest is unusable)."""
    if not isinstance(manifest, Mapping):
        bad(f"manifest is a JSON {type(manifest).__name__}, not an object")
        return None
    missing = [k for k in ("schema_version", "kind", "run_id", "created_at", "model", "gate", "deployment", "files")
               if k not in manifest]
    if missing:
        bad(f"deployment manifest is missing keys {missing}")
    if manifest.get("schema_version") != schema.SCHEMA_VERSION or not _is_int(manifest.get("schema_version")):
        bad(f"deployment manifest schema_version {manifest.get('schema_version')!r} is not {schema.SCHEMA_VERSION}")
        return None
    run_id = manifest.get("run_id")
    if not isinstance(run_id, str) or not run_id or "/" in run_id:
        bad(f"manifest run_id {run_id!r} is not a non-empty string without '/'")
        return None
    try:
        schema.utc_time(manifest.get("created_at"))
    except ValueError:
        bad(f"manifest created_at {manifest.get('created_at')!r} is not an ISO 8601 time stamp")
    model = manifest.get("model")
    name = n_layers = None
    if not isinstance(model, Mapping):
        bad("manifest model is not an object")
    else:
        name, n_layers = model.get("name"), model.get("n_layers")
        if not isinstance(name, str) or not name:
            bad(f"manifest model.name {name!r} is not a non-empty string")
            name = None
        if not (_is_int(n_layers) and 2 <= n_layers <= schema.MODEL_SIZE_MAX):
            bad(f"manifest model.n_layers {n_layers!r} is not an integer in [2, {schema.MODEL_SIZE_MAX}]")
            n_layers = None
    gate = manifest.get("gate")
    out = {"run_id": run_id, "model": name, "n_layers": n_layers,
           "manifest_path": os.path.join(os.path.normpath(run_dir), "manifest.json")}
    if not isinstance(gate, Mapping):
        bad("manifest gate is not an object")
        return None
    for key in ("w", "k"):
        if not (_is_int(gate.get(key)) and gate.get(key) >= 1):
            bad(f"manifest gate.{key} {gate.get(key)!r} is not an integer ≥ 1")
            return None
    try:
        fraction, convention = parse_bins(gate.get("bins"))
    except (ValueError, TypeError) as err:
        bad(str(err))
        return None
    if gate.get("convention", convention) not in BIN_CONVENTIONS:
        bad(f"manifest gate.convention {gate.get('convention')!r} is not one of {list(BIN_CONVENTIONS)}")
        return None
    tau = gate.get("tau")
    if not (isinstance(tau, (int, float)) and not isinstance(tau, bool) and math.isfinite(tau)):
        bad(f"manifest gate.tau {tau!r} is not a finite number")
        return None
    digest = gate.get("sha256")
    if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                   and all(c in "0123456789abcdef" for c in digest)):
        bad(f"manifest gate.sha256 {digest!r} is neither null nor 64 lowercase hexadecimal digits")
    deployment = manifest.get("deployment")
    if not isinstance(deployment, Mapping) or deployment.get("entry") not in ENTRIES:
        bad(f"manifest deployment.entry is not one of {list(ENTRIES)}")
    out.update(w=gate["w"], k=gate["k"], bin_fraction=fraction, convention=gate.get("convention", convention),
               tau=float(tau))
    files = listed_files(manifest, run_dir, bad, tables=("inputs",),
                         where=" (a deployment run has no outcomes or topk)")
    out["files"] = files
    return out


def _file_problems(run_dir: str, manifest_path: str, info: dict, problems: list[Problem]) -> list[tuple]:
    """Listed files present, unaltered (sha256, rows), no unlisted part, no other table: the files to read."""
    readable = []
    for table in ("outcomes", "topk"):
        d = os.path.join(run_dir, table)
        if os.path.isdir(d) and any(n.lower().endswith((".parquet", ".jsonl", ".ndjson")) for n in os.listdir(d)):
            problems.append(Problem(d, None, f"a deployment run has no {table}; this folder holds log files"))
    inputs = os.path.join(run_dir, "inputs")
    present = sorted(n for n in os.listdir(inputs) if n.lower().endswith(".parquet")) if os.path.isdir(inputs) else []
    for name in present:
        if f"inputs/{name}" not in info["files"]:
            problems.append(Problem(os.path.join(inputs, name), None, f"not listed in {manifest_path} files"))
    for rel, entry in info["files"].items():
        path = os.path.join(run_dir, rel)
        try:
            check_regular(path, run_dir)
        except Refused as err:
            problems.append(Problem(manifest_path, None, f"files[{entry['index']}] {rel!r} is listed but {err}"))
            continue
        digest = schema.sha256_file(path)
        if entry.get("sha256") != digest:
            problems.append(Problem(path, None, f"sha256 {digest} does not match the manifest's "
                                                f"{entry.get('sha256')!r} (files[{entry['index']}])"))
        try:
            meta = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as err:  # a corrupt or truncated part: reported, not read
            reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
            problems.append(unreadable_parquet(path, reason))
            continue
        if meta.metadata.num_rows != entry.get("rows"):
            problems.append(Problem(path, None, f"{meta.metadata.num_rows} rows but the manifest says "
                                                f"{entry.get('rows')!r} (files[{entry['index']}])"))
        type_problems = schema.schema_problems("deployment", meta.schema_arrow)
        problems += [Problem(path, None, message) for message in type_problems]
        if not type_problems:
            readable.append((path, digest, meta.metadata.num_rows))
    if not info["files"]:
        problems.append(Problem(manifest_path, None, "the deployment run lists no inputs files"))
    return readable


def _emit(problems: list[Problem], rows: pl.DataFrame, mask: pl.Expr, files: list[str], message) -> None:
    """One problem per bad row (at most :data:`MAX_ROWS_PER_RULE` per file, then the count of the rest)."""
    bad = rows.filter(mask)
    for (index,), group in bad.group_by(["_file"], maintain_order=True):
        for row in group.head(MAX_ROWS_PER_RULE).iter_rows(named=True):
            problems.append(Problem(files[index], int(row["_row"]), message(row)))
        if group.height > MAX_ROWS_PER_RULE:
            problems.append(Problem(files[index], None, f"{group.height - MAX_ROWS_PER_RULE} more rows: "
                                                        f"{message(group.row(MAX_ROWS_PER_RULE, named=True))}"))


def _row_problems(rows: pl.DataFrame, info: dict, files: list[str], problems: list[Problem]) -> None:
    """The row rules of a deployment run (docs/SCHEMA.md "Deployment runs")."""
    required = [c.name for c in schema.DEPLOYMENT if c.required]
    for name in required:
        _emit(problems, rows, pl.col(name).is_null(), files, lambda r, n=name: f"{n} is null")
    complete = rows.drop_nulls(required)
    if info["model"] is not None:
        _emit(problems, complete, pl.col("model") != info["model"], files,
              lambda r: f"model {r['model']!r} but the manifest says {info['model']!r}")
    _emit(problems, complete, pl.col("run_id") != info["run_id"], files,
          lambda r: f"run_id {r['run_id']!r} but the manifest says {info['run_id']!r}")
    seen = complete.with_columns(pl.col("input_id").cum_count().over("input_id").alias("_nth"))
    _emit(problems, seen, pl.col("_nth") > 1, files, lambda r: f"input_id {r['input_id']} is logged twice")
    ids = np.unique(complete["input_id"].to_numpy())
    expected = np.arange(len(ids))
    if len(ids) and not np.array_equal(ids, expected):
        first = int(expected[ids != expected][0])
        problems.append(Problem(info["manifest_path"], None,
                                f"input_id {first} is missing: a deployment log numbers its inputs 0, 1, 2, … "
                                f"(a part was lost or removed)"))
    _emit(problems, complete, ~pl.col("drop").is_finite(), files,
          lambda r: f"drop {value_text(r['drop'])} is not finite")
    lengths = complete["agreement"].list.len()
    if info["n_layers"] is not None:
        _emit(problems, complete, lengths != info["n_layers"], files,
              lambda r: f"agreement has {len(r['agreement'])} values, not the manifest's n_layers {info['n_layers']}")
    sound = complete.filter((lengths == (info["n_layers"] or lengths)) & pl.col("drop").is_finite())
    if sound.height:
        agreement = np.stack([np.asarray(a, dtype=np.float32) for a in sound["agreement"].to_list()])
        out_of_range = ~((agreement >= 0) & (agreement <= 1)).all(axis=1)
        recomputed = profile.drop_from_agreement(agreement, info["bin_fraction"], info["convention"])
        sound = sound.with_columns(pl.Series("_recomputed", recomputed), pl.Series("_range", out_of_range))
        _emit(problems, sound, pl.col("_range"), files, lambda r: "agreement has values outside [0, 1]")
        _emit(problems, sound, ((pl.col("drop") - pl.col("_recomputed")).abs() > DROP_TOLERANCE)
              | pl.col("_recomputed").is_nan(), files,
              lambda r: f"drop {r['drop']!r} is not D of its agreement ({r['_recomputed']!r}; Eq. 3, "
                        f"bins {info['bin_fraction']:.6g} {info['convention']})")
    _emit(problems, complete, pl.col("tau") != info["tau"], files,
          lambda r: f"tau {r['tau']!r} but the manifest's gate.tau is {info['tau']!r}")
    _emit(problems, complete, ~pl.col("reason").is_in(schema.GATE_REASONS), files,
          lambda r: f"reason {r['reason']!r} is not one of {list(schema.GATE_REASONS)}")
    _emit(problems, complete, pl.col("n_tokens") < 1, files, lambda r: f"n_tokens {r['n_tokens']} is not positive")
    expected_reason = (pl.when(pl.col("n_tokens") < info["w"]).then(pl.lit("short-prompt"))
                       .when(formulas.expr(formulas.GATE_RULE)).then(pl.lit("open")).otherwise(pl.lit("closed")))
    known = complete.filter(pl.col("reason").is_in(schema.GATE_REASONS) & pl.col("drop").is_finite())
    _emit(problems, known.with_columns(expected_reason.alias("_expected")), pl.col("reason") != pl.col("_expected"),
          files, lambda r: f"reason {r['reason']!r} but D = {r['drop']!r}, τ = {r['tau']!r} and T = {r['n_tokens']} "
                           f"(w = {info['w']}) give {r['_expected']!r} (Eq. 2)")
    _emit(problems, known, pl.col("gate_open") != (pl.col("reason") == "open"), files,
          lambda r: f"gate_open {r['gate_open']} contradicts reason {r['reason']!r}")
    _emit(problems, complete, (pl.col("n_kept") < 1) | (pl.col("n_kept") > pl.col("n_tokens")), files,
          lambda r: f"n_kept {r['n_kept']} is not in [1, n_tokens = {r['n_tokens']}]")
    _emit(problems, complete, ~((pl.col("kept_fraction") > 0) & (pl.col("kept_fraction") <= 1)), files,
          lambda r: f"kept_fraction {value_text(r['kept_fraction'])} is not in (0, 1]")
    _emit(problems, complete, ~pl.col("gate_open") & ((pl.col("n_kept") != pl.col("n_tokens"))
                                                       | (pl.col("kept_fraction") != 1.0)), files,
          lambda r: f"the gate is closed but n_kept {r['n_kept']} / kept_fraction {r['kept_fraction']!r} is not the "
                    f"full cache ({r['n_tokens']} / 1.0)")
    if "stop_reason" in complete.columns:
        unknown = pl.col("stop_reason").is_not_null() & ~pl.col("stop_reason").is_in(schema.STOP_REASONS)
        _emit(problems, complete, unknown, files,
              lambda r: f"stop_reason {r['stop_reason']!r} is not one of {list(schema.STOP_REASONS)}")
    stamps = complete.with_columns(pl.col("logged_at").map_elements(_bad_time, return_dtype=pl.Boolean).alias("_bad"))
    _emit(problems, stamps, pl.col("_bad"), files,
          lambda r: f"logged_at {r['logged_at']!r} is not an ISO 8601 time stamp")


def _bad_time(text: str) -> bool:
    try:
        schema.utc_time(text)
    except ValueError:
        return True
    return False


def check_deployment(run_dir) -> tuple[DeploymentRun | None, list[Problem]]:
    """Every rule of the deployment run at ``run_dir``; the run (``None`` when a rule failed) and the problems.

    Each problem names the file and, where there is one, the 0-based row, as ``pagestats validate``
    prints them.
    """
    run_dir = os.path.normpath(os.fspath(run_dir))
    manifest_path = os.path.join(run_dir, "manifest.json")
    problems: list[Problem] = []
    try:
        manifest = read_manifest(manifest_path, run_dir)
    except Refused as err:
        return None, [Problem(manifest_path, None, str(err))]
    if not is_deployment_manifest(manifest):
        return None, [Problem(manifest_path, None, "not a deployment run (the manifest's kind is not 'deployment')")]
    info = _manifest_problems(run_dir, manifest, lambda m: problems.append(Problem(manifest_path, None, m)))
    if info is None:
        return None, problems
    readable = _file_problems(run_dir, manifest_path, info, problems)
    frames = []
    for index, (path, _, _) in enumerate(readable):
        frame = pl.from_arrow(pq.read_table(path))
        frames.append(frame.with_columns(pl.lit(index, pl.Int64).alias("_file"),
                                         pl.int_range(frame.height, dtype=pl.Int64).alias("_row")))
    rows = (pl.concat(frames, how="diagonal_relaxed") if frames
            else pl.DataFrame(schema={c.name: pl.Null for c in schema.DEPLOYMENT if c.required}))
    if frames and not rows.height:
        problems.append(Problem(manifest_path, None, "the deployment run has no rows"))
    elif frames:
        _row_problems(rows, info, [p for p, _, _ in readable], problems)
    if problems:
        return None, problems
    rows = rows.sort("input_id").drop("_file", "_row")
    return DeploymentRun(run_dir, dict(manifest), rows, list(readable)), []


def read_deployment(run_dir) -> DeploymentRun:
    """The checked deployment run at ``run_dir``; :class:`pagestats.io.LogError` with every problem otherwise."""
    run, problems = check_deployment(run_dir)
    if problems:
        raise LogError(problems)
    return run
