"""Benchmark: where ``pagestats report --db`` spends its memory and time, entry by entry.

One process opens the database (``pagestats index RUN --db FILE``), loads it as the report does
(:meth:`pagestats.io.LogDB.load`), builds the report's :class:`~pagestats.report.context.Context`
and renders each catalogue entry into a temporary folder (PNG only) in the report's order
(:func:`pagestats.report.build.run_order`), as :func:`pagestats.report.build_report` does, one at a time (the
report runs an entry with ``beside`` names on a second thread beside them: here each step is one entry's own).
Before each step the kernel's peak-RSS mark is reset
(``/proc/self/clear_refs``, value 5, Linux ≥ 4.0), so that each step's ``peak_gib`` is the most
resident memory the process held *during that step* (the frames it keeps from earlier steps
included), and ``rss_after_gib`` what it still holds after. CPU is the process's user + system
time of the step. The steps are ``load`` (the logs), ``context`` (the split into first draws and
controls), then one per entry, with ``gated`` (the report policy's gated rows, which most entries
read) before the first entry that reads them.

The result is a profile to find the entry to work on, not a figure to quote: the report's own
peak and wall time are those of the CLI (``bench/duckdb_replay.py --report-1m``).

Run: ``.venv/bin/python bench/report_memory.py --db FILE [--only NAME,...] [--out NAME]``;
writes ``bench/results/NAME.json`` (default ``report_memory``), keeping the run it replaces
under ``earlier_runs``, and prints one line per step as it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

from _results import earlier_runs, git_head, write_result

HERE = Path(__file__).resolve().parent
GIB = 1024**3


def _status(field: str) -> float:
    """A memory line of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), in GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / GIB
    raise RuntimeError(f"/proc/self/status has no {field} line")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _measured(name: str, fn, steps: list[dict]):
    _reset_peak()
    wall, cpu = time.perf_counter(), _cpu()
    value = fn()
    step = {"step": name, "wall_s": round(time.perf_counter() - wall, 2), "cpu_s": round(_cpu() - cpu, 2),
            "peak_gib": round(_status("VmHWM"), 3), "rss_after_gib": round(_status("VmRSS"), 3)}
    steps.append(step)
    print(json.dumps(step), flush=True)
    return value


def main() -> int:
    ap = argparse.ArgumentParser(prog="report_memory.py")
    ap.add_argument("--db", required=True, help="a database made by `pagestats index RUN --db FILE`")
    ap.add_argument("--only", default=None, help="comma-separated entry names (default: every entry)")
    ap.add_argument("--out", default="report_memory", help="the results file's name under bench/results")
    args = ap.parse_args()

    from pagestats import io
    from pagestats.report.build import _run_entry, catalogue, run_order
    from pagestats.report.context import Context
    from pagestats.report.write import _EmptyOutput

    entries = catalogue()
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {e.name for e in entries}
        if unknown:
            ap.error(f"not an entry of the report: {', '.join(sorted(unknown))}")
        entries = tuple(e for e in entries if e.name in wanted)
    steps: list[dict] = []
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    code = f"{HERE.parent} at {git_head(HERE.parent)}"  # the commit the run imported, read before it starts
    db = io.open_logs(args.db)
    logs = _measured("load", lambda: db.load(categorical=True), steps)  # as `pagestats report --db` loads
    db.close()  # as the report does once its frames are loaded
    ctx = _measured("context", lambda: Context(logs), steps)
    with tempfile.TemporaryDirectory(prefix="report_memory-") as out:
        for entry in (entries[i] for i in run_order(entries)):  # the report's order: the gated rows built on first use
            if entry.reads_gated and "gated" not in ctx.__dict__:
                _measured("gated", lambda: ctx.gated, steps)
            def render(entry=entry):
                try:
                    return _run_entry(entry, ctx, Path(out), ("png",)).skipped
                except _EmptyOutput as err:
                    return str(err)
            skipped = _measured(entry.name, render, steps)
            if skipped:
                steps[-1]["skipped"] = skipped
    result = {
        "started_at": started, "code": code, "db": str(Path(args.db).resolve()),
        "n_inputs": logs.inputs.height,
        "n_outcomes": logs.outcomes.height, "python": sys.version.split()[0], "machine": platform.machine(),
        "n_cpus": os.cpu_count(), "loadavg_end": list(os.getloadavg()), "steps": steps,
        "peak_gib": max(s["peak_gib"] for s in steps), "cpu_s": round(sum(s["cpu_s"] for s in steps), 1),
    }
    path = HERE / "results" / f"{args.out}.json"
    if path.exists():
        result["earlier_runs"] = earlier_runs(json.loads(path.read_text()))
    write_result(args.out, result, {k: result[k] for k in ("n_inputs", "peak_gib", "cpu_s")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
