"""Run the benchmarks: ``python -m bench [NAME ...]``.

Each benchmark is a script ``bench/<name>.py`` that measures speed as ratios against a
baseline in the same run and writes ``bench/results/<name>.json``. Without names, the
offline (no model) benchmarks run; the model benchmarks (gate_signal, capture_memory,
sweep) load SmolLM2 and are run by name, and so is ``gpu`` (random-weight 1.5B–70B shapes on a
CUDA GPU; ``python bench/gpu.py --smoke`` is its CPU check); ``kvpress_sweep`` runs in the kvpress
environment (``make kvpress-env``; ``.venv-kvpress/bin/python -m bench kvpress_sweep``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OFFLINE = ("synthetic_scale", "tau_curve", "profile_replay", "bootstrap", "report", "whatif_scale")
MODEL = ("gate_signal", "capture_memory", "sweep", "gpu", "kvpress_sweep")


def main(argv: list[str]) -> int:
    names = argv or list(OFFLINE)
    unknown = [n for n in names if not (HERE / f"{n}.py").exists()]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(OFFLINE + MODEL)}")
        return 2
    failed = []
    for name in names:
        print(f"== bench/{name}.py", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(HERE / f"{name}.py")], cwd=HERE.parent)
        print(f"== {name}: exit {rc} in {time.perf_counter() - t0:.1f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
