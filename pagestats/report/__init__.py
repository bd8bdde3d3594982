"""The report: every paper table and figure the logs support, an index of what it was computed
from, and a one-line reason for every item the logs cannot support.

:func:`build_report` runs the :func:`catalogue` of :class:`Entry` values
(:mod:`~pagestats.report.table_entries`, :mod:`~pagestats.report.figure_entries`) on one
:class:`Context` (:mod:`~pagestats.report.context`) and writes them
(:mod:`~pagestats.report.write`); :mod:`~pagestats.report.build` holds the run and the index.
"""

from pagestats.report.build import build_report, catalogue
from pagestats.report.context import Context, Entry

__all__ = ["Context", "Entry", "build_report", "catalogue"]
