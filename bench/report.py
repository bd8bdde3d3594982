"""Benchmark: ``pagestats report`` on paper-scale synthetic logs (docs/CLI.md, docs/PERFORMANCE.md).

Paper-scale logs: 16 cells (4 models × 4 evictors, one context) × 400 inputs per
(model, context) × 9 budgets, from :func:`pagestats.testing.synthetic_logs`, written as
run directories under ``bench/tmp``. Timings in one run:

- ``report``: the whole CLI, ``pagestats report LOGS --out DIR``, as a subprocess (imports,
  load, every replay, every table and figure as PNG + PDF, the index) — target < 120 s;
- ``load``: :func:`pagestats.io.load` + :func:`pagestats.replay.gated_outcomes` in process,
  the baseline unit (one validated scan of the logs and one replay);
- per entry: each catalogue item rendered in process (``report.Context`` shared), to show
  where the time goes.

The headline ratio is ``report / load``. Writes bench/results/report.json.

Run: ``.venv/bin/python bench/report.py``
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pagestats import io, replay, report
from pagestats.report.build import _run_entry
from pagestats.testing import PAPER_SCALE, synthetic_logs

from _results import write_result

ROOT = Path(__file__).resolve().parent
TMP = ROOT / "tmp" / "report"
TARGET_S = 120.0


def write_paper_scale_logs(root: Path) -> list[str]:
    logs = synthetic_logs(**PAPER_SCALE, with_topk=False, with_text=True)
    if root.exists():
        shutil.rmtree(root)
    return [str(p) for p in logs.write(root)]


def main() -> dict:
    runs = write_paper_scale_logs(TMP / "logs")
    out = TMP / "out"

    t0 = time.perf_counter()
    logs = io.load(runs)
    gated = replay.gated_outcomes(logs)
    load_s = time.perf_counter() - t0

    cli = [str(Path(sys.executable).with_name("pagestats")), "report", *runs, "--out", str(out)]
    t0 = time.perf_counter()
    subprocess.run(cli, check=True, capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "Agg"})
    report_s = time.perf_counter() - t0
    index = json.loads((out / "index.json").read_text())

    ctx = report.Context(logs)
    per_entry = {}
    for entry in report.catalogue():
        t0 = time.perf_counter()
        _run_entry(entry, ctx, TMP / "entries")
        per_entry[entry.name] = round(time.perf_counter() - t0, 3)

    result = {
        "benchmark": "report",
        "logs": {"cells": 16, "inputs_per_model_context": 400, "budgets": 9,
                 "inputs": logs.inputs.height, "outcome_rows": logs.outcomes.height, "gated_rows": gated.height,
                 "files": len(logs.files)},
        "report_s": round(report_s, 2),
        "load_and_replay_s": round(load_s, 3),
        "ratio_report_to_load": round(report_s / load_s, 1),
        "target_s": TARGET_S,
        "meets_target": report_s < TARGET_S,
        "outputs": sum(len(o["files"]) for o in index["outputs"]),
        "skipped": {o["name"]: o["skipped"] for o in index["outputs"] if o["skipped"]},
        "per_entry_s": per_entry,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None},
    }
    write_result("report", result)
    return result


if __name__ == "__main__":
    main()
