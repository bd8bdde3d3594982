"""The validation problem record and the helpers that turn bad rows into problems.

:class:`Problem` (one line of a validation report) and :class:`LogError` (all of them,
raised by ``load(strict=True)``), plus the helpers every rule of
:mod:`pagestats.io.validation` shares. The rules are DuckDB queries over the relations
``inputs``, ``outcomes`` and ``topk`` of a connection (views over the files, or frames in
memory), each row carrying ``_file`` (index into the file list) and ``_row``; a rule is
first counted by an aggregate and only its bad rows are fetched, by :func:`emit` (at most
:data:`MAX_ROWS_PER_RULE` rows per rule and file, then a count of the rest), so that no
rule holds all rows in memory. Row numbers are 0-based positions within the file.

References
----------
docs/SCHEMA.md (reader rules: every problem names the file and the row; no rule stops at the
first problem; required columns non-null; no duplicate inputs, outcome rows or topk rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import duckdb
import polars as pl

from pagestats.core import schema
from pagestats.core.escape import terminal

#: Rows reported per (rule, file) before the rest are summarised in one line.
MAX_ROWS_PER_RULE = 20


@dataclass(frozen=True)
class Problem:
    """One validation problem: the file, the 0-based row within it (or ``None``), a message.

    ``str(problem)`` is one line, ``"FILE:row N: message"`` or ``"FILE: message"``, as
    printed by ``pagestats validate``.
    """

    file: str
    row: int | None
    message: str

    def __str__(self) -> str:
        where = self.file if self.row is None else f"{self.file}:row {self.row}"
        return one_line(f"{where}: {self.message}")


def unreadable_parquet(path: str, reason: str) -> Problem:
    """The problem of a parquet file that cannot be read (``reason``: why, one line)."""
    return Problem(path, None, f"cannot read parquet file (corrupt or truncated?): {reason}")


def one_line(text: str) -> str:
    """``text`` with every control, format or line/paragraph-separator character escaped
    (``\\n``, ``\\x1b``, ``\\u2028`` …), so that names from the logs cannot break a
    message into several lines or restyle a terminal (:func:`pagestats.core.escape.terminal`, the
    one escaping helper of every writer)."""
    return terminal(text)


class LogError(ValueError):
    """Raised by ``load(strict=True)``; carries every problem."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = [str(p) for p in self.problems]
        head = f"{len(lines)} problem{'s' if len(lines) != 1 else ''} in the logs"
        super().__init__("\n".join([head, *lines]))


class ExclusionError(LogError):
    """Raised for an ``exclude`` argument that is malformed or matches no row (a usage error)."""


def value_text(value) -> str:
    """A value as a problem message shows it (``null``, ``NaN``, ``inf``, lists as lists)."""
    if value is None:
        return "null"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
    return str(value)


def key_text(values) -> str:
    """``(a, b, c)``: an identity as problem messages show it (strings unquoted)."""
    return "(" + ", ".join(value_text(v) for v in values) + ")"


#: The first row of a group (smallest file index, then row) as one BIGINT: ``_file · 2³² + _row``.
FIRST = "min(_file::BIGINT * 4294967296 + _row)"
#: SQL columns ``_file``, ``_row`` from a :data:`FIRST` value named ``_first``.
FIRST_ROW = "(_first // 4294967296)::INTEGER AS _file, (_first % 4294967296)::INTEGER AS _row"


def first_row(first: int) -> tuple[int, int]:
    """``(_file, _row)`` of a :data:`FIRST` value."""
    return int(first) >> 32, int(first) & 0xFFFFFFFF


def emit(con: duckdb.DuckDBPyConnection, query: str, files: list[str], rule: str, detail=None,
         params=None) -> list[Problem]:
    """Problems for the rows of ``query`` (columns ``_file``, ``_row`` and any the detail
    needs), at most :data:`MAX_ROWS_PER_RULE` per file, then one line counting the rest.

    ``detail`` is ``None`` or a callable taking a reported row as a dict and returning
    text (called for the reported rows only). Only the reported rows leave DuckDB.
    """
    sql = (f"SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY _file ORDER BY _row) AS _k, "
           f"count(*) OVER (PARTITION BY _file) AS _n_file FROM ({query})) WHERE _k <= {MAX_ROWS_PER_RULE} "
           "ORDER BY _file, _row")
    rel = con.sql(sql, params=params)
    names = rel.columns
    out: list[Problem] = []
    for values in rel.fetchall():
        rec = dict(zip(names, values))
        name = files[int(rec["_file"])]
        msg = rule if detail is None else f"{rule}: {detail(rec)}"
        out.append(Problem(name, int(rec["_row"]), msg))
        if rec["_k"] == min(rec["_n_file"], MAX_ROWS_PER_RULE) and rec["_n_file"] > MAX_ROWS_PER_RULE:
            out.append(Problem(name, None, f"{rec['_n_file'] - MAX_ROWS_PER_RULE} more rows with: {rule}"))
    return out


def ident(name: str) -> str:
    """A column name quoted as a DuckDB identifier (names come from the declared schema)."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """A string as a DuckDB string literal (run ids come from manifests)."""
    return "'" + text.replace("'", "''") + "'"


def null_checks(table: str, present: list[str], imported: tuple[str, ...] = ()) -> list[tuple]:
    """The null rules of ``table`` as (SQL condition, rule, detail): nulls in required columns,
    and null elements inside any list column (a list's min/max/length rules do not see them).
    ``detail`` is ``None`` or (extra SQL columns, callable). In the runs ``imported`` (run ids), the
    columns of :data:`pagestats.core.schema.IMPORTED_NULLABLE` may be null."""
    checks = []
    exempt = ", ".join(literal(r) for r in imported)
    for col in schema.columns(table):
        if col.name not in present:
            continue
        q = ident(col.name)
        if col.required:
            cond = f"{q} IS NULL"
            if exempt and col.name in schema.IMPORTED_NULLABLE.get(table, ()):
                cond += f" AND run_id NOT IN ({exempt})"
            checks.append((cond, f"{table} column {col.name!r} is null", None))
        if col.kind in (schema.FLOAT_LIST, schema.INT_LIST, schema.STRING_LIST):
            checks.append((null_elements(col.name), f"{table} column {col.name!r} has null elements",
                           (f"len({q}) - list_count({q}) AS _holes, len({q}) AS _len",
                            lambda r: f"{r['_holes']} of {r['_len']} elements null")))
    return checks


def null_elements(col: str) -> str:
    """SQL condition of :func:`null_checks`: the list column ``col`` holds a null element."""
    q = ident(col)
    return f"list_count({q}) < len({q})"


def null_problems(con, table: str, checks: list[tuple], counts, files: list[str]) -> list[Problem]:
    """The problems of the :func:`null_checks` whose ``counts`` are not zero (their rows fetched)."""
    out: list[Problem] = []
    for n, (cond, rule, detail) in zip(counts, checks):
        if n:
            extra = f", {detail[0]}" if detail else ""
            out += emit(con, f"SELECT _file, _row{extra} FROM {table} WHERE {cond}", files, rule,
                        detail[1] if detail else None)
    return out


def null_rules(con, table: str, present: list[str], files: list[str], imported: tuple[str, ...] = ()) -> list[Problem]:
    """The :func:`null_checks` of ``table``: one counting scan, then the bad rows."""
    checks = null_checks(table, present, imported)
    if not checks:
        return []
    counts = one(con, "SELECT " + ", ".join(f"count(*) FILTER (WHERE {c})" for c, _, _ in checks) + f" FROM {table}")
    return null_problems(con, table, checks, counts, files)


def duplicate_rules(con, table: str, key: tuple[str, ...], files: list[str], what: str) -> tuple[list[Problem], bool]:
    """Problems for later occurrences of a repeated ``key`` among the rows of ``table``; their ``_file``, ``_row`` are stored in the temporary table
    ``_later_<table>`` (so that the rules after this one can leave them out). Returns the
    problems and whether there was any duplicate.

    A count of distinct hashes of the key decides, in one scan, whether there can be a
    duplicate; the rows are compared exactly only then.
    """
    cols = ", ".join(ident(k) for k in key)
    n, distinct = one(con, f"SELECT count(*), count(DISTINCT hash({cols})) FROM {table}")
    con.execute(f"CREATE OR REPLACE TEMP TABLE _later_{table} (_file INTEGER, _row INTEGER)")
    if n == distinct:
        return [], False
    same = " AND ".join(f"d.{ident(k)} IS NOT DISTINCT FROM t.{ident(k)}" for k in key)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _dups_{table} AS
        WITH d AS (SELECT {cols} FROM {table} GROUP BY ALL HAVING count(*) > 1)
        SELECT t._file, t._row, {", ".join(f"t.{ident(k)}" for k in key)},
               first_value(t._file) OVER w AS _f0, first_value(t._row) OVER w AS _r0,
               row_number() OVER w AS _i
        FROM {table} t SEMI JOIN d ON {same}
        WINDOW w AS (PARTITION BY {", ".join(f"t.{ident(k)}" for k in key)} ORDER BY t._file, t._row)
    """)
    con.execute(f"INSERT INTO _later_{table} SELECT _file, _row FROM _dups_{table} WHERE _i > 1")

    def detail(rec):
        values = key_text(rec[k] for k in key)
        return f"({', '.join(key)}) = {values}, first at {files[int(rec['_f0'])]}:row {rec['_r0']}"

    problems = emit(con, f"SELECT * FROM _dups_{table} WHERE _i > 1", files, f"duplicate {what}", detail)
    return problems, True


def out_of_range(col: str, lo: float, hi: float, lo_open: bool = False) -> str:
    """SQL condition: ``col`` not null and NaN or outside [lo, hi] (or (lo, hi])."""
    q = ident(col)
    low = f"{q} <= {lo!r}" if lo_open else f"{q} < {lo!r}"
    return f"({q} IS NOT NULL AND (isnan({q}) OR {low} OR {q} > {hi!r}))"


def mode(counts: dict) -> object:
    """The most common value of ``{value: count}`` (ties → the smallest; ``None`` sorts first)."""
    return min(counts.items(), key=lambda kv: (-kv[1], kv[0] is not None, kv[0] if kv[0] is not None else 0))[0]


class Collector:
    """Bad rows of one rule found while streaming (e.g. by NumPy over record batches): keeps
    the first :data:`MAX_ROWS_PER_RULE` rows of each file and counts the rest, in bounded memory."""

    def __init__(self):
        self.rows: dict[int, list[tuple[int, str]]] = {}
        self.counts: dict[int, int] = {}

    def add(self, file: int, row: int, text: str | None) -> None:
        kept = self.rows.setdefault(file, [])
        kept.append((row, text))
        self.counts[file] = self.counts.get(file, 0) + 1
        if len(kept) > 10 * MAX_ROWS_PER_RULE:
            kept.sort(key=lambda rt: rt[0])
            del kept[MAX_ROWS_PER_RULE:]

    def problems(self, files: list[str], rule: str) -> list[Problem]:
        out: list[Problem] = []
        for file in sorted(self.rows):
            kept = sorted(self.rows[file], key=lambda rt: rt[0])[:MAX_ROWS_PER_RULE]
            out += [Problem(files[file], row, rule if text is None else f"{rule}: {text}") for row, text in kept]
            rest = self.counts[file] - len(kept)
            if rest:
                out.append(Problem(files[file], None, f"{rest} more rows with: {rule}"))
        return out


def frame(con, query: str, params=None) -> pl.DataFrame:
    """The (small) result of ``query`` as a polars frame."""
    return pl.from_arrow(con.sql(query, params=params).to_arrow_table())


def one(con, query: str, params=None) -> tuple:
    """The one row of ``query``."""
    return con.sql(query, params=params).fetchall()[0]
