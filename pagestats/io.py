"""Load and validate schema-v1 logs (DESIGN §3, §9) through DuckDB into polars.

``LOGS`` may be run directories, individual parquet / jsonl files, or globs:

* a directory holding ``manifest.json`` is a *run*: every ``*.parquet`` / ``*.jsonl`` file
  under its ``inputs/``, ``outcomes/`` and ``topk/`` is read and checked against the
  manifest's ``files[]`` (sha256, row count, listed-but-missing, present-but-unlisted);
* a directory without one but with nested ``*/…/manifest.json`` is a collection of runs;
* a directory without any manifest but with ``inputs/`` / ``outcomes/`` / ``topk/``
  subdirectories is a manifest-less run, read as loose files;
* otherwise a directory contributes the log files directly inside it, as loose files;
* a loose file's table is its parent directory's name when that is ``inputs``,
  ``outcomes`` or ``topk``; else it is told from its columns (``indices`` → topk;
  ``evictor`` or ``budget`` → outcomes; ``agreement``, ``drop`` or ``full_score`` →
  inputs). A loose file inside ``<run>/<table>/`` of a run with a manifest is checked
  against that manifest's entry for it (but the run's other files are not required);
* a path that does not exist but contains glob characters is expanded (``**`` allowed).

Parquet files of a table are read in one DuckDB query (``read_parquet`` of the file list
passed as a parameter, ``union_by_name``), jsonl files with ``read_json``, one per file;
SQL is parameterised and paths are never formatted into it. ``columns="analysis"``
leaves out the heavy text columns (:data:`HEAVY_COLUMNS`). Columns are cast to the
writer's types (ints int64, floats float64, ``agreement``/``pair_jaccard``
list<float32>, ``indices`` list<int32>). In jsonl, a JSON number without a decimal
point is read as an integer, so integer types are also accepted for float columns
there.

Every rule of :mod:`pagestats.validation` runs; ``validate_paths`` returns all problems,
``load(strict=True)`` raises :class:`LogError` with all of them, ``load(strict=False)``
returns what could be read and lists the problems in ``Logs.problems``. In lenient mode
files that cannot be read (corrupt, missing or mistyped columns, unreadable schema
version) are left out — and named in ``Logs.problems``; rows with bad values are kept.
Exclusions (``RUN_ID``, ``RUN_ID/TASK``, ``RUN_ID/TASK/INPUT_ID``) are applied to inputs,
outcomes and topk before the row rules run (file-level rules always see every file) and
are reported by :meth:`Logs.exclusion_report`; an exclusion matching nothing raises
:class:`LogError` in either mode.

Schema versions: ``schema_version`` comes from the run's manifest (loose files without
one are taken as the current version). Versions in :data:`pagestats.schema.READABLE_VERSIONS`
are read; an older readable version is upgraded on read by :data:`UPGRADES` (one step per
version, applied to the manifest, to each file's arrow schema before the type check, and
to every table before the row rules). Version 1 is current, so there are no steps yet.
"""

from __future__ import annotations

import glob as _glob
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pagestats import defaults, schema
from pagestats.validation import LogError, Problem, RunInfo, check_frames, check_manifest

__all__ = [
    "LogError",
    "Problem",
    "FileRecord",
    "Logs",
    "load",
    "validate_paths",
    "HEAVY_COLUMNS",
    "UPGRADES",
]

#: Text columns left out by ``columns="analysis"`` (they can be huge).
HEAVY_COLUMNS = ("prompt", "full_prediction", "prediction", "references")
LOG_SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def _same_manifest(manifest: dict) -> dict:
    return manifest


def _same_schema(table: str, arrow_schema: pa.Schema) -> pa.Schema:
    return arrow_schema


def _same_table(table: str, frame: pl.DataFrame) -> pl.DataFrame:
    return frame


@dataclass(frozen=True)
class Upgrade:
    """One schema step ``v`` → ``v + 1``, applied on read to the manifest, to each file's
    arrow schema before the type check, and to each table once read (canonical types)."""

    manifest: Callable[[dict], dict] = _same_manifest
    schema: Callable[[str, pa.Schema], pa.Schema] = _same_schema
    table: Callable[[str, pl.DataFrame], pl.DataFrame] = _same_table


#: from_version → Upgrade. Empty while version 1 is the only one.
UPGRADES: dict[int, Upgrade] = {}


def upgrade_manifest(manifest: dict) -> dict:
    """Apply the :data:`UPGRADES` steps from the manifest's version to the current one."""
    version = manifest.get("schema_version")
    while isinstance(version, int) and version < schema.SCHEMA_VERSION and version in UPGRADES:
        manifest = UPGRADES[version].manifest(dict(manifest))
        version += 1
        manifest["schema_version"] = version
    return manifest


def upgrade_schema(table: str, arrow_schema: pa.Schema, version: int) -> pa.Schema:
    """A file's arrow schema as the current version declares it (for the type check)."""
    while version < schema.SCHEMA_VERSION:
        arrow_schema = UPGRADES[version].schema(table, arrow_schema)
        version += 1
    return arrow_schema


def upgrade_table(table: str, frame: pl.DataFrame, version: int) -> pl.DataFrame:
    """Apply the :data:`UPGRADES` steps to one table read at schema ``version``."""
    while version < schema.SCHEMA_VERSION:
        frame = UPGRADES[version].table(table, frame)
        version += 1
    return frame


@dataclass(frozen=True)
class FileRecord:
    """One log file a :class:`Logs` was read from: path, table, sha256 of its bytes, rows."""

    path: str
    table: str
    sha256: str
    rows: int


@dataclass
class Logs:
    """Validated logs: one tidy frame per level (inputs, outcomes, optional topk).

    Attributes
    ----------
    inputs : polars.DataFrame
        :data:`pagestats.schema.INPUTS` columns (heavy text columns only with
        ``columns="all"``) plus ``task_class`` — the run manifest's ``tasks{name: class}``,
        else :func:`pagestats.defaults.default_task_class`.
    outcomes : polars.DataFrame
        :data:`pagestats.schema.OUTCOMES` columns.
    topk : polars.DataFrame or None
        :data:`pagestats.schema.TOPK` rows, ``None`` when no topk files were given.
    manifests : dict
        run_id → parsed manifest.
    files : list of FileRecord
        Every file read, with its sha256 (reports cite these).
    exclusions : list of str
        One human-readable line per explicit exclusion, with the rows it removed.
    problems : list of Problem
        Problems found (empty after a strict load).
    """

    inputs: pl.DataFrame
    outcomes: pl.DataFrame
    topk: pl.DataFrame | None
    manifests: dict[str, dict] = field(default_factory=dict)
    files: list[FileRecord] = field(default_factory=list)
    exclusions: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def exclusion_report(self) -> list[str]:
        """One line per exclusion, e.g. ``"run r1 task niah_multikey_3: 50 inputs, 1800 outcomes"``."""
        return list(self.exclusions)


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


# --------------------------------------------------------------------------- inspection


def _table_from_columns(names: Sequence[str]) -> str | None:
    names = set(names)
    if "indices" in names:
        return "topk"
    if "evictor" in names or "budget" in names:
        return "outcomes"
    if names & {"agreement", "drop", "full_score"}:
        return "inputs"
    return None


def _json_relaxed_problems(table: str, arrow: pa.Schema) -> list[str]:
    """Schema problems of a jsonl file: JSON integers are acceptable in float columns."""
    fields = []
    for f in arrow:
        t = f.type
        if pa.types.is_integer(t):
            t = pa.float64() if _kind(table, f.name) == schema.FLOAT else t
        elif pa.types.is_list(t) and pa.types.is_integer(t.value_type) and _kind(table, f.name) == schema.FLOAT_LIST:
            t = pa.list_(pa.float64())
        elif pa.types.is_struct(t) and _kind(table, f.name) == schema.STRUCT:
            t = pa.struct([pa.field(c.name, pa.float64() if pa.types.is_integer(c.type) else c.type) for c in t])
        elif pa.types.is_null(t) and _kind(table, f.name) is not None:
            # a column that is null in every row: the type check has nothing to reject;
            # the null check of the rules reports the rows.
            t = schema.columns(table)[[c.name for c in schema.columns(table)].index(f.name)].arrow_type
            if pa.types.is_struct(t):
                t = pa.struct([])
        fields.append(pa.field(f.name, t))
    return schema.schema_problems(table, pa.schema(fields))


def _kind(table: str, name: str) -> str | None:
    for c in schema.columns(table):
        if c.name == name:
            return c.kind
    return None


def _inspect(src: _Source, con: duckdb.DuckDBPyConnection) -> list[Problem]:
    """Read the schema (parquet footer, or the whole jsonl file), decide the table, check types."""
    try:
        if src.fmt == "parquet":
            meta = pq.ParquetFile(src.path)
            src.arrow_schema = meta.schema_arrow
            src.rows = meta.metadata.num_rows
        else:
            rel = con.sql("SELECT * FROM read_json(?, format = 'newline_delimited')", params=[src.path])
            arrow = rel.to_arrow_table()
            src.arrow_schema = arrow.schema
            src.rows = arrow.num_rows
            src.frame = pl.from_arrow(arrow) if arrow.num_rows else None
    except (OSError, pa.ArrowException, duckdb.Error) as err:
        src.failed = True
        kind = "parquet file (corrupt or truncated?)" if src.fmt == "parquet" else "jsonl file"
        return [Problem(src.path, None, f"cannot read {kind}: {_one_line(err)}")]
    if src.table is None:
        src.table = _table_from_columns(src.arrow_schema.names)
        if src.table is None:
            src.failed = True
            return [Problem(src.path, None, "cannot tell the table: the parent directory is not inputs/, "
                                            "outcomes/ or topk/ and the columns match none of them")]
    if src.fmt == "jsonl" and src.rows == 0:
        src.usable = False
        return []
    declared = upgrade_schema(src.table, src.arrow_schema, _version(src))
    issues = (
        schema.schema_problems(src.table, declared)
        if src.fmt == "parquet"
        else _json_relaxed_problems(src.table, declared)
    )
    src.usable = not issues
    src.failed = bool(issues)
    return [Problem(src.path, None, f"{src.table} table: {msg}") for msg in issues]


# --------------------------------------------------------------------------- reading


def _polars_type(col: schema.Column, current: pl.DataType) -> pl.DataType:
    if col.kind == schema.INT:
        return pl.Int64
    if col.kind == schema.FLOAT:
        return pl.Float64
    if col.kind == schema.STRING:
        return pl.String
    if col.kind == schema.FLOAT_LIST:
        return pl.List(pl.Float32)
    if col.kind == schema.INT_LIST:
        return pl.List(pl.Int32)
    if col.kind == schema.STRING_LIST:
        return pl.List(pl.String)
    if col.kind == schema.STRUCT and isinstance(current, pl.Struct):
        return pl.Struct([pl.Field(f.name, pl.Float64) for f in current.fields])
    return current


def _canonical(frame: pl.DataFrame, table: str, wanted: Sequence[str]) -> pl.DataFrame:
    """Cast to the writer's types and put columns in declared order (+ ``_file``, ``_row``)."""
    exprs = []
    for col in schema.columns(table):
        if col.name not in wanted:
            continue
        if col.name in frame.columns:
            dtype = frame.schema[col.name]
            target = _polars_type(col, dtype)
            exprs.append(pl.col(col.name) if dtype == target else pl.col(col.name).cast(target))
        elif col.required:
            exprs.append(pl.lit(None, dtype=_polars_type(col, pl.Null)).alias(col.name))
    return frame.select(*exprs, pl.col("_file").cast(pl.Int32), pl.col("_row").cast(pl.Int32))


def _empty(table: str, wanted: Sequence[str]) -> pl.DataFrame:
    cols = {c.name: _polars_type(c, pl.Null) for c in schema.columns(table) if c.name in wanted and c.required}
    return pl.DataFrame(schema={**cols, "_file": pl.Int32, "_row": pl.Int32})


def _read_parquet(con, table: str, sources: list[_Source], wanted: list[str]) -> pl.DataFrame:
    present = set().union(*(s.arrow_schema.names for s in sources))
    cols = [c for c in wanted if c in present]
    # identifiers come from the declared schema (constants), never from the data or paths
    select = ", ".join(f'"{c}"' for c in cols)
    query = (
        f"SELECT {select}, $index[list_position($files, filename)]::INTEGER AS _file, "
        "file_row_number::INTEGER AS _row FROM read_parquet($files, union_by_name = true, filename = true, "
        "file_row_number = true)"
    )
    params = {"files": [s.path for s in sources], "index": [s.index for s in sources]}
    return con.sql(query, params=params).pl()


def _read_table(con, table: str, sources: list[_Source], wanted: list[str]) -> tuple[pl.DataFrame, list[Problem]]:
    problems: list[Problem] = []
    frames = []
    parquet = [s for s in sources if s.fmt == "parquet"]
    if parquet:
        try:
            frames.append(_canonical(_read_parquet(con, table, parquet, wanted), table, wanted))
        except (duckdb.Error, pl.exceptions.PolarsError, pa.ArrowException):
            # find the culprits one file at a time so the error names them
            for s in parquet:
                try:
                    frames.append(_canonical(_read_parquet(con, table, [s], wanted), table, wanted))
                except (duckdb.Error, pl.exceptions.PolarsError, pa.ArrowException) as err:
                    s.failed = True
                    problems.append(Problem(s.path, None, f"cannot read parquet file (corrupt or truncated?): "
                                                          f"{_one_line(err)}"))
    for s in sources:
        if s.fmt == "jsonl" and s.frame is not None:
            f = s.frame.with_columns(
                pl.lit(s.index, dtype=pl.Int32).alias("_file"), pl.int_range(pl.len(), dtype=pl.Int32).alias("_row")
            )
            try:
                frames.append(_canonical(f, table, wanted))
            except pl.exceptions.PolarsError as err:
                s.failed = True
                problems.append(Problem(s.path, None, f"cannot convert jsonl columns: {_one_line(err)}"))
    if not frames:
        return _empty(table, wanted), problems
    return pl.concat(frames, how="diagonal_relaxed"), problems


# --------------------------------------------------------------------------- exclusions


def _parse_exclusion(spec: str) -> tuple[str, str | None, int | None]:
    if not isinstance(spec, str) or not spec or spec.count("/") > 2:
        raise LogError([Problem("exclude", None, f"exclusion {spec!r} is not RUN_ID, RUN_ID/TASK or RUN_ID/TASK/INPUT_ID")])
    parts = spec.split("/")
    if any(not p for p in parts):
        raise LogError([Problem("exclude", None, f"exclusion {spec!r} has an empty part")])
    input_id = None
    if len(parts) == 3:
        try:
            input_id = int(parts[2])
        except ValueError:
            raise LogError([Problem("exclude", None, f"exclusion {spec!r}: input id {parts[2]!r} is not an integer")]) from None
    return parts[0], parts[1] if len(parts) > 1 else None, input_id


def _exclusion_mask(frame: pl.DataFrame, run_id, task, input_id) -> pl.Expr:
    expr = pl.col("run_id") == run_id
    if task is not None:
        expr = expr & (pl.col("task") == task)
    if input_id is not None:
        expr = expr & (pl.col("input_id") == input_id)
    return expr


def _apply_exclusions(exclude, inputs, outcomes, topk):
    parsed = [(spec, *_parse_exclusion(spec)) for spec in exclude]
    lines, unmatched = [], []
    drop_in = drop_oc = drop_tk = pl.lit(False)
    for spec, run_id, task, input_id in parsed:
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
        raise LogError(unmatched)
    if parsed:
        inputs = inputs.filter(~drop_in)
        outcomes = outcomes.filter(~drop_oc)
        topk = topk.filter(~drop_tk) if topk is not None else None
    return inputs, outcomes, topk, lines


# --------------------------------------------------------------------------- public


def _task_classes(inputs: pl.DataFrame, runs: dict[str, RunInfo]) -> pl.DataFrame:
    pairs = inputs.select("run_id", "task").unique()
    classes = []
    for run_id, task in pairs.iter_rows():
        info = runs.get(run_id)
        if info is not None and info.tasks is not None and task in info.tasks:
            classes.append(info.tasks[task])
        else:
            classes.append(defaults.default_task_class(task))
    mapping = pairs.with_columns(pl.Series("task_class", classes, dtype=pl.String))
    return inputs.join(mapping, on=["run_id", "task"], how="left", maintain_order="left", nulls_equal=True)


def _load(paths, exclude: Sequence[str], columns: str) -> tuple[Logs, list[Problem]]:
    if columns not in ("analysis", "all"):
        raise ValueError(f"columns must be 'analysis' or 'all', got {columns!r}")
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if isinstance(exclude, str):
        exclude = [exclude]
    disc = _Discovery()
    for p in paths:
        disc.add(p)
    problems = disc.problems
    sources = list(disc.sources.values())
    for i, s in enumerate(sources):
        s.index = i
    names = [s.path for s in sources]

    with ThreadPoolExecutor(max_workers=2) as pool:
        hashes = pool.map(_sha256_or_none, names)
        con = duckdb.connect()
        try:
            for s in sources:
                problems += _inspect(s, con)
            # runs: manifest checks per file, unreadable versions, duplicates of run_id
            runs: dict[str, RunInfo] = {}
            manifests: dict[str, dict] = {}
            for run in disc.runs.values():
                if run.info is None:
                    continue
                if run.info.run_id in runs:
                    problems.append(Problem(run.manifest_path, None, f"run_id {run.info.run_id!r} is also the run_id "
                                                                     f"of {runs[run.info.run_id].manifest_path}"))
                    continue
                runs[run.info.run_id] = run.info
                manifests[run.info.run_id] = run.manifest
            for s in sources:
                if s.run is not None and s.run.manifest is None and os.path.exists(s.run.manifest_path):
                    s.usable, s.failed = False, True  # manifest unreadable or unknown schema version: reported above
            wanted = {
                t: [c.name for c in cols if columns == "all" or c.name not in HEAVY_COLUMNS]
                for t, cols in schema.TABLES.items()
            }
            tables: dict[str, pl.DataFrame] = {}
            for table in schema.TABLES:
                group = [s for s in sources if s.table == table and s.usable]
                parts = []
                for version in sorted({_version(s) for s in group}):
                    same = [s for s in group if _version(s) == version]
                    frame, read_problems = _read_table(con, table, same, wanted[table])
                    problems += read_problems
                    parts.append(upgrade_table(table, frame, version))
                tables[table] = pl.concat(parts, how="diagonal_relaxed") if parts else _empty(table, wanted[table])
        finally:
            con.close()
        digests = list(hashes)

    files = [
        FileRecord(s.path, s.table, digest, s.rows)
        for s, digest in zip(sources, digests)
        if not s.failed and s.table is not None and digest is not None and s.rows is not None
    ]
    manifest_problems, missing_tables = _check_against_manifests(disc, sources, digests)
    problems += manifest_problems
    incomplete = set(missing_tables)
    for s in sources:
        if s.failed:
            incomplete |= {s.table} if s.table else set(schema.TABLES)

    has_topk = any(s.table == "topk" for s in sources)
    inputs, outcomes = tables["inputs"], tables["outcomes"]
    topk = tables["topk"] if has_topk else None
    inputs, outcomes, topk, lines = _apply_exclusions(list(exclude), inputs, outcomes, topk)

    file_runs = {s.index: s.run.info.run_id for s in sources if s.run is not None and s.run.info is not None}
    problems += check_frames(
        inputs, outcomes, topk, files=names, runs=runs, file_runs=file_runs, incomplete=frozenset(incomplete)
    )

    inputs = _task_classes(inputs, runs)
    logs = Logs(
        inputs=inputs.drop("_file", "_row"),
        outcomes=outcomes.drop("_file", "_row"),
        topk=topk.drop("_file", "_row") if topk is not None else None,
        manifests=manifests,
        files=files,
        exclusions=lines,
        problems=problems,
    )
    return logs, problems


def _version(src: _Source) -> int:
    info = src.run.info if src.run is not None else None
    return info.schema_version if info is not None and info.schema_version is not None else schema.SCHEMA_VERSION


def _check_against_manifests(disc: _Discovery, sources: list[_Source], digests: list[str]):
    """sha256 and row counts against ``files[]``; listed-but-missing and present-but-unlisted files.

    Returns the problems and the set of tables with a listed file missing.
    """
    problems: list[Problem] = []
    missing_tables: set[str] = set()
    seen: dict[str, set[str]] = {}
    for s, digest in zip(sources, digests):
        if s.run is None or s.run.info is None:
            continue
        seen.setdefault(s.run.dir, set()).add(s.rel)
        entry = s.run.info.files.get(s.rel)
        if entry is None:
            problems.append(Problem(s.path, None, f"not listed in {s.run.manifest_path} files"))
            continue
        if entry.get("sha256") != digest:
            problems.append(Problem(s.path, None, f"sha256 {digest} does not match the manifest's "
                                                  f"{entry.get('sha256')!r} (files[{entry['index']}])"))
        if "rows" in entry and s.rows is not None and entry.get("rows") != s.rows:
            problems.append(Problem(s.path, None, f"{s.rows} rows but the manifest says {entry.get('rows')!r} "
                                                  f"(files[{entry['index']}])"))
    for run in disc.runs.values():
        if not run.full or run.info is None:
            continue
        present = seen.get(run.dir, set())
        for rel, entry in run.info.files.items():
            if rel not in present:
                missing_tables.add(rel.split("/")[0])
                problems.append(Problem(run.manifest_path, None, f"files[{entry['index']}] {rel!r} is listed but "
                                                                 "missing (or unreadable)"))
        for table in schema.REQUIRED_TABLES:
            if not any(r.split("/")[0] == table for r in present):
                problems.append(Problem(run.manifest_path, None, f"run has no {table} files"))
    return problems, missing_tables


def validate_paths(paths: Sequence[str]) -> list[Problem]:
    """Every problem of the logs at ``paths`` (run directories, parquet/jsonl files, globs).

    Runs every rule of :mod:`pagestats.validation` and never stops at the first problem.
    Returns an empty list when the logs are valid.
    """
    try:
        _, problems = _load(paths, (), "analysis")
    except LogError as err:  # pragma: no cover - only exclusions raise, and there are none
        return err.problems
    return problems


def load(paths, *, exclude: Sequence[str] = (), columns: str = "analysis", strict: bool = True) -> Logs:
    """Load and validate logs into a :class:`Logs` (DESIGN §3).

    Parameters
    ----------
    paths : str or sequence of str
        Run directories, parquet / jsonl files, or globs (see the module docstring).
    exclude : sequence of str
        Explicit exclusions ``RUN_ID``, ``RUN_ID/TASK`` or ``RUN_ID/TASK/INPUT_ID``, applied
        to inputs, outcomes and topk and reported by :meth:`Logs.exclusion_report`. One that
        matches nothing raises :class:`LogError`.
    columns : {"analysis", "all"}
        ``"analysis"`` leaves out :data:`HEAVY_COLUMNS`; ``"all"`` keeps them.
    strict : bool
        ``True``: raise :class:`LogError` listing every problem. ``False``: return what
        could be read, with the problems in ``Logs.problems``.

    Returns
    -------
    Logs
    """
    logs, problems = _load(paths, exclude, columns)
    if strict and problems:
        raise LogError(problems)
    return logs
