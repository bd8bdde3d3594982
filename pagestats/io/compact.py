"""Compaction of a run: its many part files rewritten as one file per table (or parts of a
chosen number of rows), every row kept in order, and a new manifest with the new hashes.

A collection writes a run as many small parts (so that it can resume after a crash); once it is
finished, fewer files read faster and list shorter. The new run is written with the collector's
own writer into a staging folder beside the target, validated, and only then moved into place
(docs/SCHEMA.md, docs/CLI.md ``compact``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from pagestats.core import schema
from pagestats.io.deployment import is_deployment_dir
from pagestats.io.discovery import log_format
from pagestats.io.upgrades import upgrade_manifest, upgrade_table
from pagestats.io.validate import validate_paths
from pagestats.io.validation.problems import LogError


def compact_run(run, out, *, rows_per_file: int | None = None, tasks=None) -> str:
    """Rewrite the run directory ``run`` as the new run directory ``out``.

    Parameters
    ----------
    run : str or path
        A valid run directory (with ``manifest.json``) whose files are parquet; a run of an older
        readable schema version is upgraded (:mod:`pagestats.io.upgrades`) and written in the
        current one.
    out : str or path
        The new run directory; it must not exist.
    rows_per_file : int, optional
        Rows per output file (default: one file per table).
    tasks : sequence of str, optional
        Keep only these tasks of the run (default: all): their rows, and their entries of the
        manifest's ``tasks`` and ``task_options``; ``parameters`` and the run id stay those of the
        collection, and the manifest gains ``tasks_kept``. Used to replace some tasks of a run by a
        re-collection (data/README.md).
    Returns
    -------
    str
        ``out``.

    Raises
    ------
    LogError
        ``run`` is not valid (its problems), or, which would be a bug, the result is not.
    ValueError
        ``run`` is not a run directory, ``out`` exists, ``rows_per_file`` < 1, or ``tasks`` names a task
        the run does not hold.

    Notes
    -----
    Each table's rows are the concatenation of its parts in the manifest's order, cast to the
    writer's declared types; the manifest keeps every key but ``files`` (rewritten with the new
    paths, sha256 and row counts) and gains ``compacted_from``: the sha256 of the old manifest
    and its number of files.
    """
    run, out = Path(run), Path(out)
    manifest_path = run / "manifest.json"
    if not manifest_path.is_file():
        raise ValueError(f"{run}: not a run directory (no manifest.json)")
    if is_deployment_dir(run):
        raise ValueError(f"{run} is a deployment run: compact merges a collection run's parts, and a deployment log "
                         "is appended to where it lies")
    if out.exists() or out.is_symlink():
        raise ValueError(f"{out} exists; compact_run writes a new run directory")
    if rows_per_file is not None and rows_per_file < 1:
        raise ValueError(f"rows_per_file must be at least 1, got {rows_per_file}")
    problems = validate_paths([str(run)])
    if problems:
        raise LogError(problems)
    raw = manifest_path.read_bytes()
    manifest = json.loads(raw)
    version = manifest.get("schema_version")
    if tasks is not None:
        tasks = list(dict.fromkeys(tasks))
        unknown = [t for t in tasks if t not in (manifest.get("tasks") or {})]
        if unknown or not tasks:
            raise ValueError(f"{run}: tasks {unknown or tasks} are not among the run's tasks "
                             f"{sorted(manifest.get('tasks') or {})}")
    entries = manifest.get("files") or []
    loose = [e["path"] for e in entries if log_format(str(e["path"])) != "parquet"]
    if loose:
        raise ValueError(f"{run}: compact reads parquet parts; {loose[0]} is not one")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.compact-{os.getpid()}"
    try:
        for table in schema.TABLES:
            parts = [e for e in entries if str(e["path"]).split("/")[0] == table]
            if not parts:
                continue
            data = pa.concat_tables([pq.read_table(run / e["path"]) for e in parts], promote_options="default")
            if tasks is not None:
                data = data.filter(pa.compute.is_in(data.column("task"), pa.array(tasks)))
            if version != schema.SCHEMA_VERSION:
                data = upgrade_table(table, pl.from_arrow(data), version).to_arrow()
            step = rows_per_file or max(data.num_rows, 1)
            for i, start in enumerate(range(0, max(data.num_rows, 1), step)):
                schema.write_parquet(table, data.slice(start, step), staging / table / f"part-{i:06d}.parquet")
        kept = {k: v for k, v in upgrade_manifest(manifest).items() if k not in ("files", "schema_version", "compacted_from")}
        if tasks is not None:
            kept["tasks"] = {t: c for t, c in manifest["tasks"].items() if t in tasks}
            if isinstance(kept.get("task_options"), dict):
                kept["task_options"] = {t: o for t, o in kept["task_options"].items() if t in tasks}
            kept["tasks_kept"] = tasks
        kept["compacted_from"] = {"manifest_sha256": hashlib.sha256(raw).hexdigest(), "files": len(entries)}
        schema.write_manifest(staging, kept)
        problems = validate_paths([str(staging)])
        if problems:
            raise LogError(problems)
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return str(out)
