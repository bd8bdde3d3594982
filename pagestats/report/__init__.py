"""The report: every paper table and figure the logs support, an index of what it was computed
from, and a one-line reason for every item the logs cannot support.
"""

from pagestats.report.build import build_report, catalogue
from pagestats.report.context import Context, Entry

__all__ = ["Context", "Entry", "build_report", "catalogue"]
