"""Validated logs as a DuckDB database of views over their files, for queries out of core.

:func:`index_logs` validates the logs once (every rule of :mod:`pagestats.io.validation`;
run by run when every file lies in a named run directory, so that memory grows with the
largest run and not with the release), then writes a DuckDB database whose views ``inputs``, ``outcomes`` (and ``topk``) read the
parquet files where they lie, with the task classes of the manifests joined to ``inputs``.
The database stores no log rows: the file list with each file's sha256, size and
modification time (table ``log_files``), the manifests (``manifests``) and the task
classes (``task_classes``). :func:`open_logs` opens it as a :class:`LogDB`, after checking
that no file changed size or modification time since it was built (re-run ``pagestats
index`` when one did), so repeated what-ifs over a big release skip reading and checking
the files again.

Validation, here as everywhere, is skipped for runs whose validation record still holds
(:mod:`pagestats.io.record`; ``revalidate=True`` checks them anyway).

A database holds the runs of one collection mode (``index_logs(mode=…)``, query-aware by
default, as :func:`pagestats.io.load`): :attr:`LogDB.mode` says which.

Every connection sets DuckDB's ``memory_limit`` and ``temp_directory``, so that a query
larger than the memory limit spills to disk instead of failing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb
import polars as pl

from pagestats.core import defaults, schema
from pagestats.io import duck
from pagestats.io.discovery import log_format
from pagestats.io.duck import MEMORY_LIMIT
from pagestats.io.logs import HEAVY_COLUMNS, INPUT_COLUMNS, OUTCOME_COLUMNS, FileRecord, Logs, categorical_frame
from pagestats.io.read import _literal_name
from pagestats.io.validate import checked_runs
from pagestats.io.validation.problems import LogError, Problem

#: Tables that are views over the log files.
VIEW_TABLES = ("inputs", "outcomes", "topk")


def _files_query(table: str, files: list[FileRecord]) -> str:
    """``read_parquet`` of a table's files; paths are quoted SQL literals (the DDL of a view
    cannot take parameters)."""
    paths = ", ".join("'" + f.path.replace("'", "''") + "'" for f in files)
    return f"read_parquet([{paths}], union_by_name = true)"


def _create(con: duckdb.DuckDBPyConnection, manifests: dict, files: list[FileRecord], task_classes: pl.DataFrame) -> None:
    records = [FileRecord(os.path.abspath(f.path), f.table, f.sha256, f.rows) for f in files]
    jsonl = [f.path for f in records if log_format(f.path) != "parquet"]
    if jsonl:
        raise LogError([Problem(p, None, "index: only parquet files can be indexed (convert jsonl logs with "
                                         "polars.read_ndjson(...).write_parquet(...))") for p in jsonl])
    patterns = [f.path for f in records if not _literal_name(f.path)]
    if patterns:  # a view's read_parquet would read the name as a glob
        raise LogError([Problem(p, None, "index: a name with glob characters cannot be viewed in a database "
                                         "(rename the file, or analyse the files themselves, not a database)") for p in patterns])
    stats = [os.stat(f.path) for f in records]
    con.register("_files", pl.DataFrame(
        {
            "path": [f.path for f in records], "log_table": [f.table for f in records],
            "sha256": [f.sha256 for f in records], "n_rows": [f.rows for f in records],
            "size": [s.st_size for s in stats], "mtime_ns": [s.st_mtime_ns for s in stats],
        },
        schema={"path": pl.String, "log_table": pl.String, "sha256": pl.String, "n_rows": pl.Int64,
                "size": pl.Int64, "mtime_ns": pl.Int64},
    ))  # fmt: skip
    con.execute("CREATE TABLE log_files AS SELECT * FROM _files")
    con.register("_manifests", pl.DataFrame(
        {"run_id": list(manifests), "manifest": [json.dumps(m) for m in manifests.values()]},
        schema={"run_id": pl.String, "manifest": pl.String},
    ))  # fmt: skip
    con.execute("CREATE TABLE manifests AS SELECT * FROM _manifests")
    con.register("_task_classes", task_classes)
    con.execute("CREATE TABLE task_classes AS SELECT * FROM _task_classes")
    for table in VIEW_TABLES:
        files = [f for f in records if f.table == table]
        if not files:
            if table in schema.REQUIRED_TABLES:
                raise LogError([Problem(table, None, f"index: no {table} files")])
            continue
        source = _files_query(table, files)
        if table == "inputs":
            con.execute(f"CREATE VIEW inputs AS SELECT * FROM {source} JOIN task_classes USING (run_id, task)")
        else:
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM {source}")


#: Rows per Arrow batch of :meth:`LogDB.load` with ``categorical=True``.
LOAD_BATCH_ROWS = 1 << 20


def _contiguous(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The batches ``frames`` as one frame of one chunk per column, made a column at a time.

    The Arrow batches DuckDB hands over hold buffers sized past their rows: kept as chunks, the
    outcomes of 1M inputs took 1.1 GiB for 0.54 GiB of values (docs/PERFORMANCE.md, "seventh
    round"). Each column is copied into one buffer and its batches let go before the next, so
    that the table is never held twice."""
    columns = {c: pl.concat([f.get_column(c) for f in frames], rechunk=False) for c in frames[0].columns}
    frames.clear()
    return pl.DataFrame([columns.pop(c).rechunk() for c in list(columns)])


@dataclass
class LogDB:
    """Validated logs as DuckDB views (``inputs``, ``outcomes``, ``topk``) over their files.

    Attributes
    ----------
    path : str or None
        The database file (``None``: an in-memory database).
    manifests : dict
        run_id → parsed manifest.
    files : list of FileRecord
        The indexed files, with their sha256.
    has_topk : bool
        Whether a ``topk`` view exists.
    mode : str
        The collection mode of every indexed run (manifest ``mode``; none means query-aware).
    left_out : list of str
        The line saying which runs of another mode :func:`index_logs` left out (empty when
        none, and on a database opened again with :func:`open_logs`).
    notes : list of str
        Lines about the validation itself (:attr:`pagestats.io.validate.Checked.notes`: the rules
        skipped on files unchanged since they passed; a record not read or written).
    """

    path: str | None
    con: duckdb.DuckDBPyConnection = field(repr=False)
    manifests: dict[str, dict]
    files: list[FileRecord]
    has_topk: bool
    mode: str = defaults.MODE
    left_out: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new cursor on the database (its own temporary objects, same settings), with the views
        ``inputs``, ``outcomes`` (and ``topk``): :meth:`pagestats.io.LogTables.cursor`."""
        return self.con.cursor()

    def relate_outcomes(self, con: duckdb.DuckDBPyConnection) -> None:
        """:meth:`pagestats.io.LogTables.relate_outcomes`: nothing to do, ``outcomes`` is a view of every cursor."""

    def exclusion_report(self) -> list[str]:
        """The line saying which runs of another mode were left out (:attr:`left_out`)."""
        return list(self.left_out)

    def typed_names(self, frame: pl.DataFrame) -> pl.DataFrame:
        """:meth:`pagestats.io.LogTables.typed_names`: ``frame`` itself (the views' names are text, as SQL's)."""
        return frame

    def per_input(self, lists: Sequence[str] = (), *, topk: bool = False) -> Logs:
        """:meth:`pagestats.io.LogTables.per_input`: the per-input rows with the columns ``lists``
        (and the top-k rows when ``topk`` and logged), read in key order, as :class:`Logs` without
        outcome rows."""
        con = self.cursor()
        try:
            key = ", ".join(schema.INPUT_KEY)
            cols = ", ".join(f'"{c}"' for c in (*INPUT_COLUMNS, *lists))
            inputs = con.sql(f"SELECT {cols} FROM inputs ORDER BY {key}").pl()
            rows = con.sql(f"SELECT * FROM topk ORDER BY {key}, layer, head").pl() if topk and self.has_topk else None
            outcomes = con.sql(f"SELECT {', '.join(OUTCOME_COLUMNS)} FROM outcomes LIMIT 0").pl()
        finally:
            con.close()
        return Logs(inputs=inputs, outcomes=outcomes, topk=rows, manifests=self.manifests, files=self.files,
                    mode=self.mode, notes=list(self.notes))

    def outcome_rows(self, evictor: str | None = None) -> pl.DataFrame:
        """:meth:`pagestats.io.LogTables.outcome_rows`: read in key order (of ``evictor`` when given)."""
        where, params = ("", None) if evictor is None else (" WHERE evictor = $evictor", {"evictor": evictor})
        order = ", ".join([*schema.INPUT_KEY, "evictor", "budget"])
        con = self.cursor()
        try:
            return con.sql(f"SELECT {', '.join(OUTCOME_COLUMNS)} FROM outcomes{where} ORDER BY {order}",
                           params=params).pl()
        finally:
            con.close()

    def load(self, *, categorical: bool = False) -> Logs:
        """The logs in memory as a :class:`Logs` (already validated; nothing is re-checked).

        ``categorical``: hold the name columns as categoricals (:func:`pagestats.io.categorical_names`),
        each table cast as soon as it is read, so that no two tables are held as text at once.
        """
        con = self.cursor()
        try:
            key = ", ".join(schema.INPUT_KEY)

            def read(table: str, order: str) -> pl.DataFrame:
                names = [r[0] for r in con.sql(f"DESCRIBE {table}").fetchall() if r[0] not in HEAVY_COLUMNS]
                rows = con.sql(f"SELECT {', '.join(chr(34) + n + chr(34) for n in names)} FROM {table} "
                               f"ORDER BY {order}")
                if not categorical:
                    return rows.pl()
                # batch by batch, each cast as it arrives: the table is never held with its names as text
                batches = rows.to_arrow_reader(LOAD_BATCH_ROWS)
                frames = [categorical_frame(pl.from_arrow(b)) for b in batches]
                if not frames:  # no rows: the schema alone
                    return categorical_frame(rows.limit(0).pl())
                return _contiguous(frames)

            inputs = read("inputs", key)
            outcomes = read("outcomes", f"{key}, evictor, budget")
            topk = read("topk", f"{key}, layer, head") if self.has_topk else None
        finally:
            con.close()
        order = [*[c.name for c in schema.INPUTS if c.name in inputs.columns], "task_class"]
        return Logs(inputs=inputs.select(order), outcomes=outcomes, topk=topk, manifests=self.manifests,
                    files=self.files, exclusions=list(self.left_out), mode=self.mode)

    def close(self) -> None:
        self.con.close()



def _validated(paths: list[str], mode: str, memory_limit: str, temp_directory: str | None, revalidate: bool):
    """The :class:`~pagestats.io.validate.Checked` of valid logs (:class:`LogError` otherwise).

    Every rule runs as DuckDB queries over the files (:func:`pagestats.io.validate.checked_runs`),
    run by run when every file lies in a named run directory, without holding the rows; runs
    unchanged since they passed are not checked again unless ``revalidate``.
    """
    checked = checked_runs(paths, mode=mode, memory_limit=memory_limit, temp_directory=temp_directory,
                           revalidate=revalidate, deployments="refuse")  # no outcomes to view
    if checked.problems:
        raise LogError(checked.problems)
    return checked


def logs_in_place(
    paths: Sequence[str] | str, *, memory_limit: str = MEMORY_LIMIT, temp_directory: str | None = None,
    mode: str = defaults.MODE, revalidate: bool = False,
) -> LogDB:
    """Validate the parquet logs at ``paths`` and return an in-memory :class:`LogDB` of views
    over the files where they lie (what :func:`index_logs` writes, without the file): a
    what-if then reads the files once, out of core. Runs of another collection mode than
    ``mode`` are left out (``LogDB.left_out``). Files unchanged since they passed every rule
    are not checked again unless ``revalidate`` (``LogDB.notes`` says so).

    Raises
    ------
    LogError
        Any validation problem, or a jsonl file (only parquet files can be viewed in place).
    """
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else [str(p) for p in paths]
    checked = _validated(paths, mode, memory_limit, temp_directory, revalidate)
    con = duck.connect(memory_limit=memory_limit, temp_directory=temp_directory)
    try:
        _create(con, checked.manifests, checked.files, checked.task_classes)
    except BaseException:
        con.close()
        raise
    return LogDB(path=None, con=con, manifests=checked.manifests, files=_records(checked.files),
                 has_topk=any(f.table == "topk" for f in checked.files), mode=mode, left_out=checked.left_out,
                 notes=checked.notes)


def _records(files: list[FileRecord]) -> list[FileRecord]:
    return sorted((FileRecord(os.path.abspath(f.path), f.table, f.sha256, f.rows) for f in files), key=lambda f: f.path)


def index_logs(
    paths: Sequence[str] | str,
    db: str,
    *,
    memory_limit: str = MEMORY_LIMIT,
    temp_directory: str | None = None,
    mode: str = defaults.MODE,
    revalidate: bool = False,
) -> LogDB:
    """Validate the logs at ``paths`` and write the database ``db`` of views over their files.

    Parameters
    ----------
    paths : str or sequence of str
        Run directories, parquet files or globs (as :func:`pagestats.io.load`).
    db : str
        The DuckDB file to write (an existing one is replaced).
    memory_limit, temp_directory : str
        DuckDB settings of the returned connection (see the module docstring).
    mode : {"query-aware", "query-agnostic"}
        The collection mode to index; runs of the other mode are left out (``LogDB.left_out``).
    revalidate : bool
        Run every rule even on files unchanged since they passed (:mod:`pagestats.io.record`).

    Raises
    ------
    LogError
        Any validation problem (nothing is written), or a jsonl file (only parquet is indexed).
    """
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else [str(p) for p in paths]
    checked = _validated(paths, mode, memory_limit, temp_directory, revalidate)
    tmp = f"{db}.tmp"
    if os.path.lexists(tmp):
        os.remove(tmp)
    try:  # nothing is left behind on failure: neither the .tmp database nor its write-ahead log
        con = duck.connect(tmp, memory_limit=memory_limit, temp_directory=temp_directory)
        try:
            _create(con, checked.manifests, checked.files, checked.task_classes)
        finally:
            con.close()
        os.replace(tmp, db)
    except BaseException:
        for leftover in (tmp, f"{tmp}.wal"):
            if os.path.lexists(leftover) and not os.path.isdir(leftover):
                os.remove(leftover)
        raise
    out = open_logs(db, memory_limit=memory_limit, temp_directory=temp_directory)
    out.left_out, out.notes = checked.left_out, checked.notes
    return out


def open_logs(db: str, *, memory_limit: str = MEMORY_LIMIT, temp_directory: str | None = None) -> LogDB:
    """Open a database written by :func:`index_logs` (read-only).

    Raises
    ------
    LogError
        The file is not such a database, or a log file is missing or changed (size or
        modification time) since it was indexed.
    """
    if not os.path.isfile(db):
        raise LogError([Problem(db, None, "no such database file")])
    try:
        con = duck.connect(db, read_only=True, memory_limit=memory_limit, temp_directory=temp_directory)
    except duckdb.Error as err:
        raise LogError([Problem(db, None, f"cannot open as a DuckDB database: {str(err).splitlines()[0]}")]) from None
    try:
        files = con.sql("SELECT path, log_table, sha256, n_rows, size, mtime_ns FROM log_files ORDER BY path").fetchall()
        manifests = {r: json.loads(m) for r, m in con.sql("SELECT run_id, manifest FROM manifests").fetchall()}
    except duckdb.Error:
        con.close()
        raise LogError([Problem(db, None, "not a pagestats log database (run `pagestats index`)")]) from None
    problems = []
    for path, _, _, _, size, mtime in files:
        try:
            st = os.stat(path)
        except OSError:
            problems.append(Problem(db, None, f"indexed file {path} is missing; re-run `pagestats index`"))
            continue
        if st.st_size != size or st.st_mtime_ns != mtime:
            problems.append(Problem(db, None, f"indexed file {path} changed since indexing; re-run `pagestats index`"))
    if problems:
        con.close()
        raise LogError(problems)
    modes = sorted({m.get("mode", defaults.MODE) for m in manifests.values()})
    if len(modes) > 1:  # indexed before the mode was a choice
        con.close()
        raise LogError([Problem(db, None, f"the database holds runs of several collection modes ({', '.join(modes)}); "
                                          "index the runs of each mode into a database of its own")])
    records = [FileRecord(p, t, h, n) for p, t, h, n, _, _ in files]
    return LogDB(path=db, con=con, manifests=manifests, files=records,
                 has_topk=any(t == "topk" for _, t, *_ in files), mode=modes[0] if modes else defaults.MODE)
