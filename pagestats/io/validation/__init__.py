"""The validation rules of the log schema, one module per table (the reader rules of
``docs/SCHEMA.md``): :mod:`~pagestats.io.validation.manifest`, :mod:`~pagestats.io.validation.inputs`,
:mod:`~pagestats.io.validation.outcomes`, :mod:`~pagestats.io.validation.topk`;
:mod:`~pagestats.io.validation.tables` runs them all on a run's tables (DuckDB relations) and
:mod:`~pagestats.io.validation.problems` holds the one-line :class:`Problem` record."""

from pagestats.io.validation.manifest import RunInfo, check_manifest
from pagestats.io.validation.problems import MAX_ROWS_PER_RULE, LogError, Problem
from pagestats.io.validation.tables import check_tables

__all__ = ["MAX_ROWS_PER_RULE", "LogError", "Problem", "RunInfo", "check_manifest", "check_tables"]
