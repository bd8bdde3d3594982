"""Reading schema-v1 logs: discover runs and files, read them through DuckDB, validate every rule.

:func:`load` returns a :class:`Logs` (polars frames of the ``inputs``, ``outcomes`` and
``topk`` tables, the manifests, the files read with their sha256, the exclusions);
:func:`validate_paths` returns every :class:`Problem` as one line each. Submodules:
:mod:`~pagestats.io.guard` (what may be opened and how much is read),
:mod:`~pagestats.io.discovery` (which runs and files ``LOGS`` names),
:mod:`~pagestats.io.read` (inspection and DuckDB reading), :mod:`~pagestats.io.upgrades`
(schema-version steps), :mod:`~pagestats.io.validation` (the rules),
:mod:`~pagestats.io.load` (``load``, ``validate_paths``, exclusions).
"""

from pagestats.io.load import HEAVY_COLUMNS, FileRecord, Logs, load, validate_paths
from pagestats.io.validation.problems import ExclusionError, LogError, Problem

__all__ = ["HEAVY_COLUMNS", "ExclusionError", "FileRecord", "LogError", "Logs", "Problem", "load", "validate_paths"]
