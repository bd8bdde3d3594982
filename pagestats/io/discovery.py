"""Discovery of the runs and log files named by ``load`` / ``validate_paths``: paths, globs, run
directories and collections of runs expanded into sources, their manifests read, checked and
upgraded (docs/SCHEMA.md; the rules are spelled out in :mod:`pagestats.io.load`).
"""

from __future__ import annotations

import glob as _glob
import os
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl
import pyarrow as pa

from pagestats.core import schema
from pagestats.io.guard import Refused, check_regular, inside, list_dir, os_reason, read_manifest
from pagestats.io.upgrades import upgrade_manifest
from pagestats.io.validation.manifest import RunInfo, check_manifest
from pagestats.io.validation.problems import Problem

LOG_SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def log_format(path) -> str | None:
    """``"parquet"`` or ``"jsonl"`` by the suffix of ``path`` in any case (``UPPER.PARQUET`` is
    parquet), ``None`` for another: the one rule of every reader, so that ``validate``, ``whatif``,
    ``index`` and the decode profile agree on a file."""
    return LOG_SUFFIXES.get(Path(os.fspath(path)).suffix.lower())


# --------------------------------------------------------------------------- discovery


@dataclass
class _Run:
    dir: str
    manifest_path: str
    manifest: dict | None = None
    info: RunInfo | None = None
    full: bool = False  # the whole directory was named (so listed-but-missing is checked)
    kind: str = schema.COLLECTION_KIND  # a deployment run (manifest kind) is set apart, its files not read


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
        self.aliases: dict[str, set[str]] = {}  # run dir → listed names that link to a file read under another
        #: real dir → the deployment runs the paths name (pagestats.io.deployment): not collection runs, so
        #: neither their manifests nor their files enter the collection's rules; each reader decides
        self.deployments: dict[str, _Run] = {}

    def _problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(os.path.normpath(path) if path else path, None, message))

    def add(self, arg) -> None:
        arg = os.fspath(arg)
        if not arg:
            self._problem(arg, "empty path")
            return
        try:
            os.stat(arg)
            targets = [arg]
        except FileNotFoundError:
            if _glob.has_magic(arg):
                targets = sorted(_glob.glob(arg, recursive=True))
                if not targets:
                    self._problem(arg, "glob matches no files")
            else:
                self._problem(arg, "no such file or directory")
                return
        except OSError as err:
            self._problem(arg, f"cannot read: {os_reason(err)}")
            return
        for target in targets:
            if os.path.isdir(target):
                self._add_dir(target)
            else:
                self._add_file(target, explicit=True)

    def _entries(self, d: str) -> list[os.DirEntry] | None:
        try:
            return list_dir(d)
        except Refused as err:
            self._problem(d, str(err))
            return None

    def _add_dir(self, d: str) -> None:
        entries = self._entries(d)
        if entries is None:
            return
        names = {e.name for e in entries}
        if "manifest.json" in names:
            self._add_run(d)
            return
        nested = self._nested_manifests(d)
        if nested:
            for run_dir in nested:
                self._add_run(run_dir)
            return
        table_dirs = [os.path.join(d, t) for t in schema.TABLES if t in names and os.path.isdir(os.path.join(d, t))]
        if table_dirs:
            for td in table_dirs:
                for f in self._log_files(td):
                    self._add_file(f, explicit=False)
            return
        files = self._log_files(d)
        if not files:
            self._problem(d, "no manifest.json, no inputs/ outcomes/ topk/ directories and no log files")
        for f in files:
            self._add_file(f, explicit=False)

    def _nested_manifests(self, d: str) -> list[str]:
        """Directories below ``d`` holding a ``manifest.json`` (symbolic links not followed)."""
        found = []
        for parent, dirs, files in os.walk(d, onerror=lambda err: self._problem(err.filename or d, f"cannot list the "
                                                                                f"directory: {os_reason(err)}")):
            dirs.sort()
            if "manifest.json" in files or "manifest.json" in dirs:
                found.append(parent)
        return sorted(found)

    def _run(self, d: str) -> _Run:
        real = os.path.realpath(d)
        if real in self.runs:
            return self.runs[real]
        if real in self.deployments:
            return self.deployments[real]
        run = _Run(dir=os.path.normpath(d), manifest_path=os.path.join(os.path.normpath(d), "manifest.json"))
        try:
            manifest = read_manifest(run.manifest_path, run.dir)
        except Refused as err:
            self.runs[real] = run
            self._problem(run.manifest_path, str(err))
            return run
        if isinstance(manifest, dict) and manifest.get("kind") == schema.DEPLOYMENT_KIND:
            run.kind, run.manifest = schema.DEPLOYMENT_KIND, manifest
            self.deployments[real] = run
            return run
        self.runs[real] = run
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
        if run.kind == schema.DEPLOYMENT_KIND:
            return
        for table in schema.TABLES:
            table_dir = os.path.join(run.dir, table)
            if not os.path.lexists(table_dir):
                continue
            if not os.path.isdir(table_dir) or not inside(table_dir, run.dir):
                try:
                    check_regular(table_dir, run.dir)
                    self._problem(table_dir, "is a file, not a directory of log files")
                except Refused as err:
                    self._problem(table_dir, str(err))
                continue
            for f in self._log_files(table_dir):
                self._add_file(f, explicit=False, run=run, table=table)

    def _add_file(self, path: str, *, explicit: bool, run: _Run | None = None, table: str | None = None) -> None:
        suffix = Path(path).suffix.lower()
        if suffix not in LOG_SUFFIXES:
            if explicit:
                self._problem(path, f"not a log file (expected {', '.join(LOG_SUFFIXES)})")
            return
        p = Path(path)
        if table is None and p.parent.name in schema.TABLES:
            table = p.parent.name
            if run is None and os.path.lexists(p.parent.parent / "manifest.json"):
                run = self._run(str(p.parent.parent))
                if run.kind == schema.DEPLOYMENT_KIND:  # a part of a deployment run: the run is named
                    return
        bad_name = _not_utf8(path)
        if bad_name:
            self._problem(path, bad_name)
            return
        real = os.path.realpath(path)
        if real in self.sources:
            first = self.sources[real]
            if run is not None and first.path != os.path.normpath(path):
                # a second name of one file (a link inside the run): the file is read once, under its first name
                self.aliases.setdefault(run.dir, set()).add(self._rel(path, run))
                self._problem(path, f"is the same file as {first.path} (a link?), which is read already; "
                                    "a file is read once, so list it once")
            return
        src = _Source(path=os.path.normpath(path), fmt=LOG_SUFFIXES[suffix], table=table, run=run)
        try:
            check_regular(path, run.dir if run is not None else None)
        except Refused as err:
            self._problem(src.path, str(err))
            return
        if run is not None:
            src.rel = self._rel(path, run)
        self.sources[real] = src

    @staticmethod
    def _rel(path: str, run: _Run) -> str:
        """The name of ``path`` in its run's ``files[]``: relative to the run as named, not resolved
        (a part that links to a file elsewhere inside the run is listed under its own name)."""
        return os.path.relpath(os.path.abspath(path), os.path.abspath(run.dir)).replace(os.sep, "/")

    def _log_files(self, d: str) -> list[str]:
        """Entries of ``d`` named like log files, of any kind (the kind is checked when added)."""
        entries = self._entries(d)
        if entries is None:
            return []
        return [e.path for e in entries if Path(e.name).suffix.lower() in LOG_SUFFIXES]


def _not_utf8(path: str) -> str | None:
    """Why the file name ``path`` cannot be read (its bytes are not UTF-8: the readers take UTF-8
    names, and a manifest, JSON, cannot list it), or ``None``."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError as err:
        byte = os.fsencode(path)[len(os.fspath(path)[:err.start].encode("utf-8", "surrogateescape"))]
        return f"the file name is not UTF-8 (byte 0x{byte:02x}); rename the file"
    return None


def _sha256_or_none(path: str) -> str | None:
    try:
        return schema.sha256_file(path)
    except OSError:  # unreadable: the inspection reports it
        return None


def _one_line(err: BaseException) -> str:
    text = " ".join(line.strip() for line in str(err).strip().splitlines() if line.strip())
    return (text or type(err).__name__)[:300]
