"""Where every benchmark writes its result: ``bench/results/<name>.json`` (docs/PERFORMANCE.md).

Imported by the benchmark scripts, which run as ``python bench/<name>.py`` (so this
folder is on ``sys.path``).
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(name: str, result: dict, shown=None) -> Path:
    """Write ``result`` as ``bench/results/<name>.json`` and print ``shown`` (default: all of it)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result if shown is None else shown, indent=2))
    return path
