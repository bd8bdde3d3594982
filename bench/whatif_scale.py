"""Benchmark: ``pagestats whatif`` on 1,000,000 synthetic inputs × 9 budgets, in memory.

Core-engine requirement: "``whatif`` on 1,000,000 synthetic inputs × 9 budgets completes in
memory on this 24 GiB machine; report time and peak RSS."

Steps (every measured command runs in its own subprocess, reaped with :func:`os.wait4`, so
its peak RSS and CPU time are its own and not the largest of all children):

1. ``generate``: :func:`pagestats.testing.synthetic_logs` draws one run of 1,000,000 inputs
   (8 default tasks × 125,000; one model L=12, H=4; RULER 4K; evictor snapkv; the 9 default
   budgets; fast path, no top-k, no text) and writes it under ``bench/tmp/`` (gitignored);
   a second run of 10,000 inputs (8 × 1,250, same shape, seed 1) is written next to it.
2. ``whatif_1M``: ``python -m pagestats whatif RUN --format csv`` (default fixed τ);
   the CSV is checked: exactly :data:`pagestats.replay.whatif.WHATIF_COLUMNS`, 8 tasks × 9 budgets
   = 72 rows, ``n_inputs`` = 125,000 in every row.
3. Baselines in the same run:

   - ``scan``: DuckDB ``SELECT count(*), avg(score) FROM read_parquet(outcomes)`` plus
     ``SELECT count(*), avg("drop") FROM read_parquet(inputs)``, timed in this process
     (the irreducible cost of reading the columns the table needs, without Python start-up);
   - ``startup``: a subprocess that only imports ``pagestats.io`` and ``pagestats.replay.whatif``
     (the fixed cost every CLI call pays);
   - ``whatif_10k``: the same CLI call on the 10,000-input run.

   Ratios: ``whatif_1M / scan`` and ``whatif_1M / (100 × whatif_10k)`` (< 1 means the
   fixed costs dominate at 10k and the engine scales at worst linearly).
4. ``validate_1M``: ``python -m pagestats validate RUN`` (time, peak RSS, exit code).

Wall times on a shared machine are inflated by load; the load average at start and end and
each subprocess's CPU time (user + system) are recorded next to them. A failure (non-zero
exit, timeout, wrong CSV) is recorded in the JSON rather than hidden. The temporary data is
deleted at the end.

Run: ``.venv/bin/python bench/whatif_scale.py``; writes ``bench/results/whatif_scale.json``.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import time

from _results import measured, write_result

HERE = pathlib.Path(__file__).resolve().parent
TMP_ROOT = HERE / "tmp"
N_PER_TASK = 125_000
N_PER_TASK_SMALL = 1_250
TIMEOUT_S = 1200
GIB = 2**30


def _generate(root: str, n_per_task: int, seed: int) -> None:
    """Child: draw and write one synthetic run; print its directory and sizes as JSON."""
    import resource

    from pagestats import testing

    t0 = time.perf_counter()
    logs = testing.synthetic_logs(
        models=(testing.ModelSpec("synthetic-12L4H", 12, 4),),
        context_lengths=(4096,),
        evictors=("snapkv",),
        tasks=testing.SYNTHETIC_TASKS,
        n_inputs=n_per_task,
        with_topk=False,
        with_text=False,
        seed=seed,
    )
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    (run_dir,) = logs.write(root, n_shards=2)
    write_s = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "run_dir": str(run_dir),
                "n_inputs": logs.inputs.height,
                "n_outcomes": logs.outcomes.height,
                "n_tasks": logs.inputs["task"].n_unique(),
                "budgets": sorted(logs.outcomes["budget"].unique().to_list()),
                "generate_s": gen_s,
                "write_s": write_s,
                "peak_rss_mib_inside": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            }
        )
    )


def _measured(cmd: list[str], stdout_path: pathlib.Path, timeout_s: float = TIMEOUT_S) -> dict:
    """Run ``cmd``, stdout to a file; wall time, CPU time and peak RSS of that child alone."""
    return measured(cmd, stdout_path, timeout_s, cwd=HERE.parent, rss_unit="mib", stderr_chars=2000)


def _check_csv(text: str, n_per_task: int) -> dict:
    """The documented columns, 8 tasks × 9 budgets rows, n_inputs = n_per_task each."""
    import polars as pl

    from pagestats import testing
    from pagestats.replay.whatif import WHATIF_COLUMNS

    problems = []
    table = pl.read_csv(io.StringIO(text))
    if tuple(table.columns) != WHATIF_COLUMNS:
        problems.append(f"columns {table.columns} != WHATIF_COLUMNS {list(WHATIF_COLUMNS)}")
    n_tasks = len(testing.SYNTHETIC_TASKS)
    n_budgets = 9
    if table.height != n_tasks * n_budgets:
        problems.append(f"{table.height} rows, expected {n_tasks} tasks × {n_budgets} budgets = {n_tasks * n_budgets}")
    if "task" in table.columns and sorted(table["task"].unique().to_list()) != sorted(testing.SYNTHETIC_TASKS):
        problems.append(f"tasks {sorted(table['task'].unique().to_list())}")
    if "budget" in table.columns and table["budget"].n_unique() != n_budgets:
        problems.append(f"{table['budget'].n_unique()} budgets")
    if "n_inputs" in table.columns and not (table["n_inputs"] == n_per_task).all():
        problems.append(f"n_inputs not all {n_per_task}: {sorted(table['n_inputs'].unique().to_list())}")
    summary = {"ok": not problems, "problems": problems, "n_rows": table.height}
    if not problems:
        summary["mean_p_open"] = float(table["p_open"].mean())
        summary["mean_delta"] = float(table["delta"].mean())
    return summary


def _scan(run_dir: pathlib.Path) -> dict:
    """DuckDB scan of the columns the what-if reads most: outcomes' score, inputs' drop."""
    import duckdb

    con = duckdb.connect()
    t0 = time.perf_counter()
    n_out, mean_score = con.execute(
        "SELECT count(*), avg(score) FROM read_parquet(?)", [str(run_dir / "outcomes" / "*.parquet")]
    ).fetchone()
    n_in, mean_drop = con.execute(
        'SELECT count(*), avg("drop") FROM read_parquet(?)', [str(run_dir / "inputs" / "*.parquet")]
    ).fetchone()
    s = time.perf_counter() - t0
    con.close()
    return {"s": s, "n_outcomes": n_out, "n_inputs": n_in, "mean_score": mean_score, "mean_drop": mean_drop}


def _mem_gib() -> dict:
    info = {}
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            key, val = line.split(":", 1)
            if key in ("MemTotal", "MemAvailable"):
                info[key] = int(val.split()[0]) * 1024 / GIB
    except OSError:
        pass
    return info


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--generate":
        _generate(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    import duckdb
    import polars as pl

    py = sys.executable
    result: dict = {
        "benchmark": "whatif_scale",
        "python": platform.python_version(),
        "polars": pl.__version__,
        "duckdb": duckdb.__version__,
        "machine": platform.machine(),
        "n_cpus": os.cpu_count(),
        "loadavg_start": list(os.getloadavg()),
        "memory_start_gib": _mem_gib(),
        "shape": {
            "models": ["synthetic-12L4H (L=12, H=4)"],
            "context_length": 4096,
            "evictors": ["snapkv"],
            "n_tasks": 8,
            "n_inputs_per_task": N_PER_TASK,
            "n_budgets": 9,
            "with_topk": False,
            "with_text": False,
        },
        "failures": [],
    }
    TMP_ROOT.mkdir(exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="whatif_scale-", dir=TMP_ROOT))
    try:
        runs = {}
        for name, n, seed in (("1M", N_PER_TASK, 0), ("10k", N_PER_TASK_SMALL, 1)):
            root = tmp / name
            root.mkdir()
            m = _measured([py, __file__, "--generate", str(root), str(n), str(seed)], tmp / f"gen_{name}.out")
            if m["returncode"] != 0:
                result["failures"].append(f"generate {name}: exit {m['returncode']}")
                result[f"generate_{name}"] = m
                raise RuntimeError(f"generation {name} failed")
            info = json.loads((tmp / f"gen_{name}.out").read_text().strip().splitlines()[-1])
            runs[name] = pathlib.Path(info.pop("run_dir"))
            info["disk_mib"] = sum(f.stat().st_size for f in runs[name].rglob("*") if f.is_file()) / 2**20
            m.pop("stderr_tail")
            result[f"generate_{name}"] = {**m, **info}
            print(f"generate_{name}", json.dumps(result[f"generate_{name}"]), flush=True)

        for name, n in (("1M", N_PER_TASK), ("10k", N_PER_TASK_SMALL)):
            out = tmp / f"whatif_{name}.csv"
            m = _measured([py, "-m", "pagestats", "whatif", str(runs[name]), "--format", "csv"], out)
            if m["returncode"] == 0:
                m["csv_check"] = _check_csv(out.read_text(), n)
                if not m["csv_check"]["ok"]:
                    result["failures"].append(f"whatif {name}: CSV check failed: {m['csv_check']['problems']}")
            else:
                result["failures"].append(
                    f"whatif {name}: exit {m['returncode']}" + (" (timed out)" if m["timed_out"] else "")
                )
            result[f"whatif_{name}"] = m
            print(f"whatif_{name}", json.dumps(m), flush=True)

        result["scan"] = _scan(runs["1M"])
        print("scan", json.dumps(result["scan"]), flush=True)
        m = _measured([py, "-c", "import pagestats.io, pagestats.replay.whatif"], tmp / "startup.out")
        m.pop("stderr_tail")
        result["startup"] = m
        print("startup", json.dumps(m), flush=True)

        m = _measured([py, "-m", "pagestats", "validate", str(runs["1M"])], tmp / "validate_1M.out")
        m["n_problem_lines"] = len((tmp / "validate_1M.out").read_text().splitlines())
        if m["returncode"] != 0:
            result["failures"].append(
                f"validate 1M: exit {m['returncode']}, {m['n_problem_lines']} problem lines"
                + (" (timed out)" if m["timed_out"] else "")
            )
        result["validate_1M"] = m
        print("validate_1M", json.dumps(m), flush=True)

        w1, w10 = result["whatif_1M"], result["whatif_10k"]
        if w1["returncode"] == 0 and w10["returncode"] == 0:
            result["ratios"] = {
                "whatif_1M_over_scan": w1["wall_s"] / result["scan"]["s"],
                "whatif_1M_minus_startup_over_scan": (w1["wall_s"] - result["startup"]["wall_s"]) / result["scan"]["s"],
                "whatif_1M_over_100x_whatif_10k": w1["wall_s"] / (100 * w10["wall_s"]),
                "whatif_1M_cpu_over_100x_whatif_10k_cpu": w1["cpu_s"] / (100 * w10["cpu_s"]),
                "whatif_1M_minus_startup_over_100x_whatif_10k_minus_startup": (w1["wall_s"] - result["startup"]["wall_s"])
                / (100 * max(w10["wall_s"] - result["startup"]["wall_s"], 1e-9)),
            }
        result["requirement"] = {
            "text": "whatif on 1,000,000 synthetic inputs × 9 budgets completes in memory on this 24 GiB machine",
            "met": w1["returncode"] == 0 and w1.get("csv_check", {}).get("ok", False)
            and w1["peak_rss_mib"] / 1024 < 24,
            "whatif_1M_wall_s": w1["wall_s"],
            "whatif_1M_peak_rss_gib": w1["peak_rss_mib"] / 1024,
        }
    except Exception as err:  # record, don't hide
        result["failures"].append(f"{type(err).__name__}: {err}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        result["loadavg_end"] = list(os.getloadavg())
        result["temp_data_deleted"] = not tmp.exists()
        write_result("whatif_scale", result, {k: result.get(k) for k in ("requirement", "ratios", "failures")})
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
