"""Where every benchmark writes its result: ``bench/results/<name>.json`` (docs/PERFORMANCE.md).

Imported by the benchmark scripts, which run as ``python bench/<name>.py`` (so this
folder is on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def earlier_runs(old: dict) -> list[dict]:
    """The runs a new result keeps of the result ``old`` it replaces, newest first: ``old``
    itself (without its own ``earlier_runs``), then the runs ``old`` kept."""
    return [{k: v for k, v in old.items() if k != "earlier_runs"}, *old.get("earlier_runs", [])]


def git_head(tree: Path) -> str:
    """The short commit checked out in ``tree`` (the code a result measured), or ``"unknown commit"``."""
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown commit"


def write_result(name: str, result: dict, shown=None) -> Path:
    """Write ``result`` as ``bench/results/<name>.json`` and print ``shown`` (default: all of it)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result if shown is None else shown, indent=2))
    return path


def measured(cmd: list[str], stdout_path: Path, timeout_s: float, *, cwd: Path, rss_unit: str = "gib",
             stderr_chars: int = 600) -> dict:
    """Run ``cmd`` (stdout to ``stdout_path``, stderr beside it) and reap it with :func:`os.wait4`:
    wall time, CPU time (user + system) and peak RSS of that child alone (Linux ``ru_maxrss``,
    KiB), as ``peak_rss_gib`` or ``peak_rss_mib`` (``rss_unit``). A child still running after
    ``timeout_s`` is killed and marked ``timed_out``."""
    err_path = stdout_path.with_suffix(".stderr")
    with open(stdout_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=cwd)
        timed_out = False
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout_s:
                timed_out = True
                proc.send_signal(signal.SIGKILL)
                pid, status, ru = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # already reaped: keep Popen quiet
    return {
        "cmd": " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cmd)),
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        f"peak_rss_{rss_unit}": ru.ru_maxrss / (1024.0 if rss_unit == "mib" else 1024.0 * 1024.0),
        "stderr_tail": err_path.read_text(errors="replace")[-stderr_chars:],
    }
