"""Benchmark: the cost of fixed-order sums (``stats.weighted_sums`` / ``np.einsum``) against the BLAS
products they replaced in commit 0dec93b, and whether either is bit-identical across thread counts.

Commit 0dec93b replaced ``weights @ values`` (BLAS) by :func:`pagestats.stats.weighted_sums`
(``np.einsum`` without ``optimize``: one thread, index order) in the bootstrap count replicates
(``stats.bootstrap._count_replicates``) and the matched-memory bootstrap
(``metrics.matched._delta_matched``), and by ``np.einsum`` in the through-origin fit's dot products
(``stats.fit``), the head-pair weights (``replay.spec._model_statistic``) and the profile slope
(``replay.spec.profile_statistic``). Three measurements:

- ``micro``: per shape, the new expression against the exact expression it replaced, at the shapes
  the callers use. The ``report`` shapes are those the report on the shipped data (``data/smollm2-*/
  data/controls/*/``) passes (recorded by wrapping the functions during one report run, 2026-12-03):
  count replicates (10,000 × K distinct rows) @ (K × 1), K = 1, 2, 3; matched memory
  (10,000 × n inputs) @ (n × 9 budgets), n = 125, 450, and its point estimate (1 × n); head pairs
  (575 inputs × L = 30 × P = 36 pairs) @ (36 × 20 draws); the slope (575 × 30) · (30); the fit
  (9) · (9). The ``paper`` shapes are the paper-scale ones: count replicates with K = 17 distinct
  rows for one cell and for four shared cells (bench/bootstrap.py), head pairs at the chunk of
  4,096 inputs, L = 12, H = 4, 8, 16, 32 (P = H(H−1)/2), pairs fraction 0.5, 20 draws. Each
  ``--repeats`` round times both sides back to back (the order alternates by round), each as the
  mean of enough calls to fill about 50 ms; the ratio einsum / BLAS is taken per round, and the
  median and max over rounds are reported, wall and process CPU (BLAS may use several threads).
- ``threads``: a child process per setting (``OMP_NUM_THREADS`` = 1, unset (OpenBLAS's default:
  one thread per core), and 4) computes both sides on the same seeded inputs and prints the
  SHA-256 of each result's bytes; the result says, per shape, whether each side is bit-identical
  across the settings, and whether einsum and BLAS agree with each other bitwise (max |diff|).
- ``e2e`` (with ``--before TREE``): ``pagestats report data/smollm2-*/ data/controls/*/ --out DIR --no-pdf``
  as a child process (reaped with ``os.wait4``: wall and CPU of the child alone), from the checkout
  ``TREE`` (the code before the change: ``git worktree add --detach TREE 0dec93b^``), from this
  checkout, and with ``--fix TREE2`` from a checkout of 0dec93b itself (the change alone; this
  checkout also holds every later commit). All read this checkout's ``data/smollm2-*/`` and ``data/controls/``.
  ``--rounds`` rounds, the order of the checkouts rotating by round; ratios per round, median and
  max. The CLI runs as ``python -c "from pagestats.cli import main; ..."`` with ``PYTHONPATH`` set
  to the checkout (0dec93b^ has no ``python -m pagestats``; at HEAD the two are the same call).
  Then the output folders of the first round are compared file by file (which differ, and for CSVs
  which cells and by how much), and each checkout's report is rerun once with
  ``OMP_NUM_THREADS=1`` and compared with its default-thread output (``--no-thread-runs`` skips).

Run: ``.venv/bin/python bench/weighted_sums.py [--before TREE [--fix TREE2]] [--repeats 7] [--rounds 3]``
(``--micro-only`` skips the report runs). Writes bench/results/weighted_sums.json, keeping the
runs it replaces under ``earlier_runs``; report outputs go to bench/tmp/weighted_sums/.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import glob
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _results import earlier_runs, measured, write_result

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TMP = HERE / "tmp" / "weighted_sums"
SAMPLE_S = 0.05
THREAD_SETTINGS = {"1": "1", "default": None, "4": "4"}
LAUNCHER = ("import sys, pagestats; sys.stderr.write('pagestats from ' + pagestats.__file__ + chr(10)); "
            "from pagestats.cli import main; sys.exit(main(sys.argv[1:]))")


# --------------------------------------------------------------------------- shapes


def _counts_case(rng, k, m, rows=10_000, n=400):
    """_count_replicates: multinomial counts (rows × k, int64) over k distinct rows of means (k × m)."""
    p = rng.dirichlet(np.ones(k))
    counts = rng.multinomial(n, p, size=rows)
    # means of 8 budgets of scores in {−1, 0, 1}: multiples of 1/8, so count × value sums are exact
    values = rng.integers(-8, 9, size=(k, m)) / 8.0
    weighted_sums = _weighted_sums()
    return (lambda: counts @ values), (lambda: weighted_sums(counts, values))


def _matched_case(rng, rows, n, m=9):
    """_delta_matched: float64 multinomial input counts (rows × n) @ per-input kept KV fractions (n × m
    budgets; continuous, so sums round; the binary scores' sums are exact integers in any order)."""
    weights = rng.multinomial(n, np.full(n, 1.0 / n), size=rows).astype(np.float64)
    kept = rng.random((n, m))
    weighted_sums = _weighted_sums()
    return (lambda: weights @ kept), (lambda: weighted_sums(weights, kept))


def _pairs_case(rng, n, n_layers, n_heads, draws=20, fraction=0.5):
    """_model_statistic: pair Jaccards (n × L × P, float32 stored, float64 here) @ draw weights (P × draws)."""
    p = n_heads * (n_heads - 1) // 2
    blk = rng.random((n, n_layers, p), dtype=np.float32).astype(np.float64)
    m = max(1, int(np.floor(fraction * p + 0.5)))
    weights = np.zeros((p, draws))
    for d in range(draws):
        weights[np.sort(rng.choice(p, size=m, replace=False)), d] = 1.0 / m
    return (lambda: np.moveaxis(blk @ weights, -1, 0)), (lambda: np.einsum("nlp,pd->dnl", blk, weights))


def _slope_case(rng, shape):
    """profile_statistic(statistic="slope"): a_ℓ (..., L) against centred layer indices."""
    a = rng.random(shape, dtype=np.float32).astype(np.float64)
    xc = np.arange(shape[-1], dtype=np.float64)
    xc -= xc.mean()
    return (lambda: (a @ xc) / (xc @ xc)), (lambda: np.einsum("...l,l->...", a, xc) / np.einsum("l,l->", xc, xc))


def _fit_case(rng, n):
    """through_origin_fit: one of its four dot products."""
    x, y = rng.random(n), rng.random(n)
    return (lambda: float(x @ y)), (lambda: float(np.einsum("i,i->", x, y)))


def cases() -> list[tuple[str, str, str, object]]:
    """(name, source, caller, builder(rng) -> (blas_fn, einsum_fn)) for every measured shape."""
    c = []
    for k in (1, 2, 3):
        c.append((f"counts_10000x{k}@{k}x1", "report", "stats.bootstrap._count_replicates",
                  lambda r, k=k: _counts_case(r, k, 1)))
    c.append(("counts_10000x17@17x1", "paper", "stats.bootstrap._count_replicates", lambda r: _counts_case(r, 17, 1)))
    c.append(("counts_10000x17@17x4", "paper", "stats.bootstrap._count_replicates (4 shared cells)",
              lambda r: _counts_case(r, 17, 4)))
    for n in (125, 450):
        c.append((f"matched_10000x{n}@{n}x9", "report", "metrics.matched._delta_matched",
                  lambda r, n=n: _matched_case(r, 10_000, n)))
    c.append(("matched_1x450@450x9", "report", "metrics.matched._delta_matched (point estimate)",
              lambda r: _matched_case(r, 1, 450)))
    c.append(("pairs_575x30x36@36x20", "report", "replay.spec._model_statistic (H=9)",
              lambda r: _pairs_case(r, 575, 30, 9)))
    for h in (4, 8, 16, 32):
        p = h * (h - 1) // 2
        c.append((f"pairs_4096x12x{p}@{p}x20", "paper", f"replay.spec._model_statistic (L=12, H={h})",
                  lambda r, h=h: _pairs_case(r, 4096, 12, h)))
    c.append(("slope_575x30.30", "report", "replay.spec.profile_statistic (slope)", lambda r: _slope_case(r, (575, 30))))
    c.append(("slope_20x4096x12.12", "paper", "replay.spec.profile_statistic (slope, 20 draws)",
              lambda r: _slope_case(r, (20, 4096, 12))))
    c.append(("fit_9.9", "report", "stats.fit.through_origin_fit", lambda r: _fit_case(r, 9)))
    return c


def _weighted_sums():
    """The library's :func:`pagestats.stats.weighted_sums` (imported when a case is built)."""
    from pagestats import stats

    return stats.weighted_sums


# --------------------------------------------------------------------------- micro


def _calls_for(fn) -> int:
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    return max(1, math.ceil(SAMPLE_S / one))


def _sample(fn, number: int) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - w0) / number, (time.process_time() - c0) / number


def _stats(xs: list[float]) -> dict:
    return {"median": round(float(np.median(xs)), 3), "max": round(float(max(xs)), 3), "min": round(float(min(xs)), 3)}


def micro(repeats: int) -> list[dict]:
    rows = []
    for name, source, caller, build in cases():
        blas, ein = build(np.random.default_rng(0))
        nb, ne = _calls_for(blas), _calls_for(ein)
        wall_r, cpu_r, wb, we = [], [], [], []
        for r in range(repeats):
            order = ((blas, nb, "b"), (ein, ne, "e")) if r % 2 == 0 else ((ein, ne, "e"), (blas, nb, "b"))
            got = {}
            for fn, number, tag in order:
                got[tag] = _sample(fn, number)
            wall_r.append(got["e"][0] / got["b"][0])
            cpu_r.append(got["e"][1] / got["b"][1] if got["b"][1] > 0 else float("nan"))
            wb.append(got["b"][0])
            we.append(got["e"][0])
        row = {"shape": name, "source": source, "caller": caller, "calls_per_sample": {"blas": nb, "einsum": ne},
               "blas_us_median": round(float(np.median(wb)) * 1e6, 2),
               "einsum_us_median": round(float(np.median(we)) * 1e6, 2),
               "wall_ratio_einsum_over_blas": _stats(wall_r),
               "cpu_ratio_einsum_over_blas": _stats([x for x in cpu_r if x == x]) if any(x == x for x in cpu_r) else None,
               "wall_ratios": [round(x, 3) for x in wall_r]}
        rows.append(row)
        print(f"{name:28s} einsum/BLAS wall median {row['wall_ratio_einsum_over_blas']['median']:7.3f} "
              f"max {row['wall_ratio_einsum_over_blas']['max']:7.3f}  "
              f"(BLAS {row['blas_us_median']:.1f} µs, einsum {row['einsum_us_median']:.1f} µs)", flush=True)
    return rows


# --------------------------------------------------------------------------- thread counts


def _blas_threads() -> dict:
    """OpenBLAS's thread count and core as this process loaded it (NumPy's bundled scipy-openblas)."""
    libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line.lower()})
    out: dict = {"libs": [Path(p).name for p in libs]}
    for path in libs:
        lib = ctypes.CDLL(path)
        for suffix in ("64_", ""):
            f = getattr(lib, f"scipy_openblas_get_num_threads{suffix}", None) or getattr(
                lib, f"openblas_get_num_threads{suffix}", None)
            if f is not None:
                f.restype = ctypes.c_int
                out["num_threads"] = int(f())
                g = getattr(lib, f"scipy_openblas_get_corename{suffix}", None) or getattr(
                    lib, f"openblas_get_corename{suffix}", None)
                if g is not None:
                    g.restype = ctypes.c_char_p
                    out["core"] = g().decode()
                return out
    return out


def child_hashes() -> int:
    out = {"blas": _blas_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "shapes": {}}
    for name, _, _, build in cases():
        blas, ein = build(np.random.default_rng(0))
        b, e = np.asarray(blas(), dtype=np.float64), np.asarray(ein(), dtype=np.float64)
        out["shapes"][name] = {
            "blas": hashlib.sha256(np.ascontiguousarray(b).tobytes()).hexdigest(),
            "einsum": hashlib.sha256(np.ascontiguousarray(e).tobytes()).hexdigest(),
            "einsum_equals_blas": bool(np.array_equal(b, e)),
            "max_abs_diff": float(np.max(np.abs(b - e))) if b.size else 0.0,
        }
    print(json.dumps(out))
    return 0


def _thread_env(setting: str | None, tree: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                           "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(tree)
    env["MPLBACKEND"] = "Agg"
    if setting is not None:
        env["OMP_NUM_THREADS"] = setting
    return env


def thread_check() -> dict:
    runs = {}
    for label, setting in THREAD_SETTINGS.items():
        proc = subprocess.run([sys.executable, str(HERE / "weighted_sums.py"), "--child-hashes"], cwd=ROOT,
                              env=_thread_env(setting, ROOT), capture_output=True, text=True, check=True)
        runs[label] = json.loads(proc.stdout)
    base = runs["default"]
    shapes = {}
    for name in base["shapes"]:
        shapes[name] = {
            "einsum_identical_across_settings": len({r["shapes"][name]["einsum"] for r in runs.values()}) == 1,
            "blas_identical_across_settings": len({r["shapes"][name]["blas"] for r in runs.values()}) == 1,
            "blas_differs_1_vs_default": runs["1"]["shapes"][name]["blas"] != base["shapes"][name]["blas"],
            "einsum_equals_blas": base["shapes"][name]["einsum_equals_blas"],
            "max_abs_diff_einsum_vs_blas": base["shapes"][name]["max_abs_diff"],
        }
    return {"settings": {k: {"OMP_NUM_THREADS": v, "blas": runs[k]["blas"]} for k, v in THREAD_SETTINGS.items()},
            "shapes": shapes,
            "einsum_identical_everywhere": all(s["einsum_identical_across_settings"] for s in shapes.values()),
            "blas_shapes_that_differ_across_settings": [n for n, s in shapes.items()
                                                        if not s["blas_identical_across_settings"]]}


# --------------------------------------------------------------------------- end to end


def _report_cmd(out: Path) -> list[str]:
    runs = sorted(glob.glob(f"{ROOT}/data/smollm2-*/")) + sorted(glob.glob(f"{ROOT}/data/controls/*/"))  # folders only
    return [sys.executable, "-c", LAUNCHER, "report", *runs, "--out", str(out), "--no-pdf"]


def _run_report(label: str, tree: Path, out: Path, setting: str | None = None) -> dict:
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.stdout"
    cmd = _report_cmd(out)
    env = _thread_env(setting, tree)
    # measured() takes no env: set it for the child through os.environ, restored after
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        m = measured(cmd, log, timeout_s=1800, cwd=tree, rss_unit="mib")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    first = log.with_suffix(".stderr").read_text(errors="replace").splitlines()[:1]
    if m["returncode"] != 0 or not first or str(tree) not in first[0]:
        raise RuntimeError(f"{label}: report failed or imported the wrong pagestats: {first} {m['stderr_tail']}")
    m["cmd"] = f"pagestats report <{len(cmd) - 7} run dirs> --out {out.name} --no-pdf"
    m.pop("stderr_tail")
    m["label"] = label
    print(f"{label:8s} wall {m['wall_s']:6.1f} s  CPU {m['cpu_s']:6.1f} s  peak {m['peak_rss_mib']:.0f} MiB", flush=True)
    return m


def _csv_diff(a: Path, b: Path) -> dict:
    ra, rb = list(csv.reader(a.open())), list(csv.reader(b.open()))
    if len(ra) != len(rb) or (ra and ra[0] != rb[0]):
        return {"shape_differs": True, "rows": [len(ra), len(rb)]}
    header = ra[0] if ra else []
    cells, max_abs, max_rel, columns = 0, 0.0, 0.0, set()
    for row_a, row_b in zip(ra[1:], rb[1:]):
        for j, (x, y) in enumerate(zip(row_a, row_b)):
            if x == y:
                continue
            cells += 1
            columns.add(header[j] if j < len(header) else str(j))
            try:
                fx, fy = float(x), float(y)
                max_abs = max(max_abs, abs(fx - fy))
                max_rel = max(max_rel, abs(fx - fy) / max(abs(fx), abs(fy), 1e-300))
            except ValueError:
                max_abs = float("inf")
    return {"cells_differ": cells, "of_cells": sum(len(r) for r in ra[1:]), "columns": sorted(columns),
            "max_abs_diff": max_abs, "max_rel_diff": max_rel}


def compare_trees(a: Path, b: Path) -> dict:
    fa = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    fb = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    differ = {}
    for rel in sorted(fa & fb):
        if (a / rel).read_bytes() != (b / rel).read_bytes():
            differ[rel] = _csv_diff(a / rel, b / rel) if rel.endswith(".csv") else {}
    return {"files": len(fa | fb), "only_in_first": sorted(fa - fb), "only_in_second": sorted(fb - fa),
            "differ": differ, "identical": not differ and fa == fb}


def e2e(trees: dict[str, Path], rounds: int, thread_runs: bool) -> dict:
    labels = list(trees)
    runs: list[dict] = []
    for r in range(rounds):
        order = labels[r % len(labels):] + labels[: r % len(labels)]
        for label in order:
            m = _run_report(label, trees[label], TMP / f"{label}-r{r}")
            m["round"] = r
            runs.append(m)

    def ratio(num: str, den: str, key: str) -> dict:
        xs = [next(m[key] for m in runs if m["label"] == num and m["round"] == r)
              / next(m[key] for m in runs if m["label"] == den and m["round"] == r) for r in range(rounds)]
        return {**_stats(xs), "per_round": [round(x, 3) for x in xs]}

    result = {"rounds": runs, "ratios": {}}
    for label in labels:
        if label != "before":
            result["ratios"][f"{label}_over_before"] = {"wall": ratio(label, "before", "wall_s"),
                                                       "cpu": ratio(label, "before", "cpu_s")}
    result["outputs_vs_before"] = {label: compare_trees(TMP / "before-r0", TMP / f"{label}-r0")
                                   for label in labels if label != "before"}
    result["rerun_identical"] = {label: all(compare_trees(TMP / f"{label}-r0", TMP / f"{label}-r{r}")["identical"]
                                            for r in range(1, rounds)) for label in labels}
    if thread_runs:
        result["omp1_vs_default"] = {}
        for label in labels:
            m = _run_report(f"{label}-omp1", trees[label], TMP / f"{label}-omp1", setting="1")
            result["omp1_vs_default"][label] = {"run": m, **compare_trees(TMP / f"{label}-r0", TMP / f"{label}-omp1")}
    return result


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True, check=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(prog="weighted_sums.py")
    ap.add_argument("--before", type=Path, help="a checkout of the code before the change (0dec93b^)")
    ap.add_argument("--fix", type=Path, help="a checkout of the change alone (0dec93b)")
    ap.add_argument("--repeats", type=int, default=7, help="micro rounds per shape (default 7)")
    ap.add_argument("--rounds", type=int, default=3, help="report rounds per checkout (default 3)")
    ap.add_argument("--micro-only", action="store_true")
    ap.add_argument("--no-thread-runs", action="store_true", help="skip the OMP_NUM_THREADS=1 report reruns")
    ap.add_argument("--child-hashes", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_hashes:
        return child_hashes()
    if not args.micro_only and args.before is None:
        ap.error("--before TREE is needed for the report runs (or --micro-only)")

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_start = list(os.getloadavg())
    result: dict = {"benchmark": "weighted_sums", "started_at": started, "head": _git(ROOT, "rev-parse", "HEAD"),
                    "loadavg_start": load_start}
    print("== micro", flush=True)
    result["micro"] = {"repeats": args.repeats, "sample_s": SAMPLE_S, "blas": _blas_threads(),
                       "shapes": micro(args.repeats)}
    result["loadavg_after_micro"] = list(os.getloadavg())
    print("== thread counts", flush=True)
    result["threads"] = thread_check()
    print(json.dumps({k: result["threads"][k] for k in ("einsum_identical_everywhere",
                                                        "blas_shapes_that_differ_across_settings")}), flush=True)
    if not args.micro_only:
        trees = {"before": args.before.resolve()}
        if args.fix is not None:
            trees["fix"] = args.fix.resolve()
        trees["after"] = ROOT
        result["e2e_commits"] = {k: _git(v, "rev-parse", "HEAD") for k, v in trees.items()}
        print("== report", flush=True)
        result["e2e"] = e2e(trees, args.rounds, not args.no_thread_runs)
    result["loadavg_end"] = list(os.getloadavg())
    result["machine"] = {"python": platform.python_version(), "numpy": np.__version__, "cpu": platform.machine(),
                         "n_cpus": os.cpu_count()}
    path = HERE / "results" / "weighted_sums.json"
    if path.exists():
        result["earlier_runs"] = earlier_runs(json.loads(path.read_text()))
    shown = {"micro": {s["shape"]: s["wall_ratio_einsum_over_blas"] for s in result["micro"]["shapes"]},
             "threads": result["threads"]["blas_shapes_that_differ_across_settings"]}
    if "e2e" in result:
        shown["e2e"] = result["e2e"]["ratios"]
        shown["differ"] = {k: sorted(v["differ"]) for k, v in result["e2e"]["outputs_vs_before"].items()}
    write_result("weighted_sums", result, shown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
