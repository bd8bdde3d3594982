"""Inspection and reading of log files through DuckDB into polars (docs/SCHEMA.md; the rules are
spelled out in :mod:`pagestats.io.load`).

Inspection reads a file's arrow schema (parquet footer, or the whole jsonl file), tells its table
from the columns when the directory does not, and checks the types (relaxed for JSON integers in
float columns). Every file name is taken literally, never as a glob pattern: parquet names with
glob characters are read by pyarrow, jsonl files by DuckDB from an open file.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pagestats.core import schema
from pagestats.io.discovery import _one_line, _Source
from pagestats.io.guard import os_reason
from pagestats.io.upgrades import upgrade_schema
from pagestats.io.validation.problems import Problem, unreadable_parquet

# --------------------------------------------------------------------------- inspection


def out_of_resources(err: BaseException) -> bool:
    """Whether ``err`` is DuckDB running out of memory or of disk to spill to: the command's exit 3,
    never a file's problem (an out-of-memory read was reported as a corrupt file, and the table
    read as empty)."""
    return isinstance(err, (duckdb.OutOfMemoryException, MemoryError)) or (
        isinstance(err, duckdb.IOException) and "No space left on device" in str(err))


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


#: The four bytes a parquet file starts and ends with.
PARQUET_MAGIC = b"PAR1"


def _magic_problem(path: str) -> str | None:
    """Why the file at ``path`` is not a parquet file by its magic bytes (``PAR1`` at the start and
    at the end), or ``None``. The readers look only at the end: pyarrow and DuckDB both read a
    part whose first four bytes are junk, so without this rule such a part, resealed in the
    manifest, was accepted."""
    with open(path, "rb") as fh:
        head = fh.read(4)
        size = fh.seek(0, 2)
        fh.seek(max(size - 4, 0))
        tail = fh.read(4)
    if size < 12 or head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        where = ("start" if head != PARQUET_MAGIC else "end") if size >= 12 else "file"
        return f"not a parquet file: the {where} is not the magic bytes PAR1 ({size} bytes)"
    return None


def _inspect(src: _Source, con: duckdb.DuckDBPyConnection) -> list[Problem]:
    """Read the schema (parquet footer, or the whole jsonl file), decide the table, check types."""
    try:
        if src.fmt == "parquet":
            magic = _magic_problem(src.path)
            if magic:
                src.failed = True
                return [unreadable_parquet(src.path, magic)]
            meta = pq.ParquetFile(src.path)
            src.arrow_schema = meta.schema_arrow
            src.rows = meta.metadata.num_rows
        else:
            with open(src.path, "rb") as fh:  # an open file: DuckDB would read the name as a glob
                arrow = con.read_json(fh, format="newline_delimited").to_arrow_table()
            src.arrow_schema = arrow.schema
            src.rows = arrow.num_rows
            src.frame = pl.from_arrow(arrow) if arrow.num_rows else None
    except OSError as err:
        src.failed = True
        if err.errno is not None:  # the system refused (permission denied …): the file may be fine
            return [Problem(src.path, None, f"cannot read: {os_reason(err)}")]
        kind = "parquet file (corrupt or truncated?)" if src.fmt == "parquet" else "jsonl file"
        return [Problem(src.path, None, f"cannot read {kind}: {_one_line(err)}")]
    except (ValueError, pa.ArrowException, duckdb.Error) as err:
        if out_of_resources(err):
            raise
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


#: DuckDB type of each column kind (the writer's types); struct columns are kept as read.
_DUCK_TYPES = {schema.INT: "BIGINT", schema.FLOAT: "DOUBLE", schema.STRING: "VARCHAR", schema.FLOAT_LIST: "FLOAT[]",
               schema.INT_LIST: "INTEGER[]", schema.STRING_LIST: "VARCHAR[]"}


def _duck_column(col: schema.Column, present: bool) -> str:
    """SQL selecting ``col`` in the writer's type (``NULL`` of that type when absent)."""
    name = '"' + col.name + '"'
    kind = _DUCK_TYPES.get(col.kind)
    value = name if present else "NULL"
    return f"{value}::{kind} AS {name}" if kind else f"{value} AS {name}"


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


#: Characters DuckDB's file reader treats as a glob (backslash: an escape) in a path.
GLOB_CHARACTERS = frozenset("*?[]{}\\")


def _literal_name(path: str) -> bool:
    """Whether DuckDB reads ``path`` as exactly that file (no glob or escape characters)."""
    return not GLOB_CHARACTERS.intersection(path)


def _read_parquet(con, table: str, sources: list[_Source], wanted: list[str]) -> pl.DataFrame:
    """One DuckDB query over the parquet files whose names DuckDB takes literally; the others
    (names with glob characters) are read one by one with pyarrow, so that no name is a pattern."""
    present = set().union(*(s.arrow_schema.names for s in sources))
    cols = [c for c in wanted if c in present]
    literal = [s for s in sources if _literal_name(s.path)]
    frames = []
    if literal:
        # identifiers come from the declared schema (constants), never from the data or paths
        select = ", ".join(f'"{c}"' for c in cols)
        query = (
            f"SELECT {select}, $index[list_position($files, filename)]::INTEGER AS _file, "
            "file_row_number::INTEGER AS _row FROM read_parquet($files, union_by_name = true, filename = true, "
            "file_row_number = true)"
        )
        params = {"files": [s.path for s in literal], "index": [s.index for s in literal]}
        frames.append(con.sql(query, params=params).pl())
    for s in sources:
        if _literal_name(s.path):
            continue
        arrow = pq.read_table(s.path, columns=[c for c in cols if c in s.arrow_schema.names])
        frame = pl.from_arrow(arrow)
        frames.append(frame.with_columns(pl.lit(s.index, dtype=pl.Int32).alias("_file"),
                                         pl.int_range(pl.len(), dtype=pl.Int32).alias("_row")))
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")


def _read_table(con, table: str, sources: list[_Source], wanted: list[str]) -> tuple[pl.DataFrame, list[Problem]]:
    problems: list[Problem] = []
    frames = []
    parquet = [s for s in sources if s.fmt == "parquet"]
    if parquet:
        try:
            frames.append(_canonical(_read_parquet(con, table, parquet, wanted), table, wanted))
        except (duckdb.Error, pl.exceptions.PolarsError, pa.ArrowException, OSError) as err:
            if out_of_resources(err):
                raise
            # find the culprits one file at a time so the error names them
            for s in parquet:
                try:
                    frames.append(_canonical(_read_parquet(con, table, [s], wanted), table, wanted))
                except (duckdb.Error, pl.exceptions.PolarsError, pa.ArrowException, OSError) as err:
                    if out_of_resources(err):
                        raise
                    s.failed = True
                    problems.append(unreadable_parquet(s.path, _one_line(err)))
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


def _version(src: _Source) -> int:
    info = src.run.info if src.run is not None else None
    return info.schema_version if info is not None and info.schema_version is not None else schema.SCHEMA_VERSION
