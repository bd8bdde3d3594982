"""Reading the logs (docs/SCHEMA.md): discover runs and files, read them through DuckDB, validate every rule.

:func:`load` returns a :class:`Logs` (polars frames of the ``inputs``, ``outcomes`` and
``topk`` tables, the manifests, the files read with their sha256, the exclusions);
:func:`validate_paths` returns every :class:`Problem` as one line each, checking the files
by DuckDB queries without holding their rows; :func:`logs_in_place` validates parquet logs
the same way and views them in place as an in-memory :class:`LogDB`. Submodules:
:mod:`~pagestats.io.guard` (what may be opened and how much is read),
:mod:`~pagestats.io.discovery` (which runs and files ``LOGS`` names),
:mod:`~pagestats.io.read` (inspection and DuckDB reading), :mod:`~pagestats.io.upgrades`
(schema-version steps), :mod:`~pagestats.io.validation` (the rules),
:mod:`~pagestats.io.logs` (the :class:`LogTables` protocol, the :class:`Logs` and :class:`FileRecord` containers),
:mod:`~pagestats.io.exclusions` (what is left out and why),
:mod:`~pagestats.io.files` (the file-level stage loading and validation share),
:mod:`~pagestats.io.load` (``load``), :mod:`~pagestats.io.validate` (``validate_paths``:
streaming validation),
:mod:`~pagestats.io.database` (:func:`index_logs` / :func:`open_logs`: validated logs as a
DuckDB database of views over their files, :class:`LogDB`, for queries out of core),
:mod:`~pagestats.io.compact` (:func:`compact_run`: a run's parts merged into few files),
:mod:`~pagestats.io.record` (validation records: logs that passed every rule are not checked
again while their files are unchanged), :mod:`~pagestats.io.deployment` (deployment runs),
:mod:`~pagestats.io.decoding` (why decodes stopped), :mod:`~pagestats.io.duck` (every DuckDB
connection).
"""

from pagestats.io.compact import compact_run
from pagestats.io.database import LogDB, index_logs, logs_in_place, open_logs
from pagestats.io.files import only_parquet
from pagestats.io.load import load
from pagestats.io.logs import HEAVY_COLUMNS, NAME_COLUMNS, FileRecord, Logs, LogTables, categorical_names
from pagestats.io.validate import validate_paths
from pagestats.io.validation.problems import ExclusionError, LogError, Problem

__all__ = [
    "HEAVY_COLUMNS", "NAME_COLUMNS", "ExclusionError", "FileRecord", "LogDB", "LogError", "LogTables", "Logs", "Problem",
    "categorical_names", "compact_run", "index_logs",
    "load", "logs_in_place", "only_parquet", "open_logs", "validate_paths",
]
