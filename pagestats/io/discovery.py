"""Discovery of the runs and log files named by ``load`` / ``validate_paths`` (DESIGN §3, §9).

Holds :class:`_Run` (a run directory and its checked manifest), :class:`_Source` (one log
file and what its inspection learned), :class:`_Discovery` (expands paths, globs, run
directories and collections of runs into sources, reading and upgrading manifests) and
small helpers (:func:`_log_files`, :func:`_sha256_or_none`, :func:`_one_line`). The rules
are described in the docstring of :mod:`pagestats.io`, the public entry point.
"""

from __future__ import annotations

import glob as _glob
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl
import pyarrow as pa

from pagestats import schema
from pagestats.io.upgrades import upgrade_manifest
from pagestats.io.validation.manifest import RunInfo, check_manifest
from pagestats.io.validation.problems import Problem

LOG_SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}


# --------------------------------------------------------------------------- discovery


@dataclass
class _Run:
    dir: str
    manifest_path: str
    manifest: dict | None = None
    info: RunInfo | None = None
    full: bool = False  # the whole directory was named (so listed-but-missing is checked)


@dataclass
class _Source:
    path: str
    fmt: str  # "parquet" | "jsonl"
    table: str | None  # None: told from the columns
    run: _Run | None = None
    rel: str | None = None  # path relative to the run directory
    index: int = -1  # position in the file list (_file)
    arrow_schema: pa.Schema | None = None
    rows: int | None = None
    frame: pl.DataFrame | None = None  # jsonl: read during inspection
    usable: bool = False
    failed: bool = False  # could not be read (reported): its table is incomplete


class _Discovery:
    def __init__(self) -> None:
        self.runs: dict[str, _Run] = {}  # real dir → run
        self.sources: dict[str, _Source] = {}  # real path → source
        self.problems: list[Problem] = []

    def add(self, arg) -> None:
        arg = os.fspath(arg)
        if os.path.exists(arg):
            targets = [arg]
        elif _glob.has_magic(arg):
            targets = sorted(_glob.glob(arg, recursive=True))
            if not targets:
                self.problems.append(Problem(arg, None, "glob matches no files"))
        else:
            self.problems.append(Problem(arg, None, "no such file or directory"))
            return
        for target in targets:
            if os.path.isdir(target):
                self._add_dir(target)
            else:
                self._add_file(target, explicit=True)

    def _add_dir(self, d: str) -> None:
        root = Path(d)
        if (root / "manifest.json").is_file():
            self._add_run(d)
            return
        nested = sorted(root.rglob("manifest.json"))
        if nested:
            for m in nested:
                self._add_run(str(m.parent))
            return
        table_dirs = [root / t for t in schema.TABLES if (root / t).is_dir()]
        if table_dirs:
            for td in table_dirs:
                for f in _log_files(td):
                    self._add_file(str(f), explicit=False)
            return
        files = _log_files(root)
        if not files:
            self.problems.append(
                Problem(d, None, "no manifest.json, no inputs/ outcomes/ topk/ directories and no log files")
            )
        for f in files:
            self._add_file(str(f), explicit=False)

    def _run(self, d: str) -> _Run:
        real = os.path.realpath(d)
        if real in self.runs:
            return self.runs[real]
        run = _Run(dir=os.path.normpath(d), manifest_path=os.path.join(os.path.normpath(d), "manifest.json"))
        self.runs[real] = run
        try:
            with open(run.manifest_path, encoding="utf-8") as fh:
                manifest = json.load(fh)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            self.problems.append(Problem(run.manifest_path, None, f"cannot read manifest: {_one_line(err)}"))
            return run
        version = manifest.get("schema_version") if isinstance(manifest, dict) else None
        older = (
            isinstance(version, int) and version in schema.READABLE_VERSIONS and version < schema.SCHEMA_VERSION
        )
        if older:
            manifest = upgrade_manifest(manifest)
        info, problems = check_manifest(run.dir, manifest, run.manifest_path)
        if info is not None and older:
            info = replace(info, schema_version=version)  # its tables are upgraded from this version
        self.problems += problems
        run.manifest, run.info = (manifest, info) if info is not None else (None, None)
        return run

    def _add_run(self, d: str) -> None:
        run = self._run(d)
        run.full = True
        root = Path(run.dir)
        for table in schema.TABLES:
            for f in _log_files(root / table):
                self._add_file(str(f), explicit=False, run=run, table=table)

    def _add_file(self, path: str, *, explicit: bool, run: _Run | None = None, table: str | None = None) -> None:
        suffix = Path(path).suffix.lower()
        if suffix not in LOG_SUFFIXES:
            if explicit:
                self.problems.append(Problem(path, None, f"not a log file (expected {', '.join(LOG_SUFFIXES)})"))
            return
        p = Path(path)
        if table is None and p.parent.name in schema.TABLES:
            table = p.parent.name
            if run is None and (p.parent.parent / "manifest.json").is_file():
                run = self._run(str(p.parent.parent))
        real = os.path.realpath(path)
        if real in self.sources:
            return
        src = _Source(path=os.path.normpath(path), fmt=LOG_SUFFIXES[suffix], table=table, run=run)
        if run is not None:
            root = os.path.realpath(run.dir)
            if os.path.commonpath([root, real]) != root:
                self.problems.append(Problem(src.path, None, "resolves outside its run directory (symbolic link?)"))
                return
            src.rel = os.path.relpath(real, root).replace(os.sep, "/")
        self.sources[real] = src


def _sha256_or_none(path: str) -> str | None:
    try:
        return schema.sha256_file(path)
    except OSError:  # unreadable: the inspection reports it
        return None


def _log_files(d: Path) -> list[Path]:
    if not d.is_dir():
        return []
    return sorted(f for f in d.iterdir() if f.is_file() and f.suffix.lower() in LOG_SUFFIXES)


def _one_line(err: BaseException) -> str:
    text = " ".join(line.strip() for line in str(err).strip().splitlines() if line.strip())
    return (text or type(err).__name__)[:300]
