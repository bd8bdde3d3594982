"""Reading the logs (docs/SCHEMA.md): discover runs and files, read them through DuckDB, validate every rule.

:func:`load` returns a :class:`Logs` of polars frames (the ``inputs``, ``outcomes`` and ``topk``
tables, the manifests, the files read with their sha256, the exclusions); :func:`validate_paths`
returns every :class:`Problem`, one line each, without holding the rows; :func:`logs_in_place` and
:func:`index_logs` view validated parquet logs in place as a :class:`LogDB`, for queries out of core.
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
