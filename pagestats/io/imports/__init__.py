"""Released logs of other tools, imported into pagestats runs (docs/IMPORT.md).

One registry keyed by format name; each format's importer writes ordinary runs of log schema v2
(docs/SCHEMA.md), which the analysis then reads like any other. The PAGE paper's release is the
first format (``pagestats import page``).
"""

from pagestats.io.imports.page import ImportError_, ImportReport, import_page

#: Format name → its importer.
FORMATS = {"page": import_page}

__all__ = ["FORMATS", "ImportError_", "ImportReport", "import_page"]
