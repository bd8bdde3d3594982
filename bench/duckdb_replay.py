"""Benchmark: validation and the what-if out of core (DuckDB over the parquet files) against
one hand-written DuckDB query, as ratios measured in the same run.

Data: synthetic runs of 1,000,000 inputs each (8 default tasks × 125,000; one model L=12,
H=4; RULER 4K; evictor snapkv; the 9 default budgets; no top-k, no text), one run per chunk
(``input_draws=(i,)``, seed i, so run_ids differ), written by ``--generate`` in a child process
each, so that a release of N million inputs is generated one million at a time; or the runs
already in ``--logs DIR`` (used in draw order, never deleted). The data directory is
``--data DIR`` (default ``bench/tmp``); it is deleted at the end unless ``--keep``.

Measured (each command in its own subprocess, reaped with :func:`os.wait4`, so that its
peak RSS and CPU time are its own), at each size given by ``--sizes``:

- ``query`` (at the sizes of ``--query-sizes``): the baseline, a Python process that imports
  DuckDB and runs :data:`QUERY`, the what-if of the default fixed τ = 0.07 written by hand
  (72 rows × 14 columns at 1M);
- ``validate``: ``pagestats validate RUNS`` (every rule, run by run, as DuckDB queries), cold:
  with an empty validation cache of its own (``PAGESTATS_CACHE_DIR``, docs/CLI.md);
- ``whatif``: ``pagestats whatif RUNS --input-draws pooled --format csv``, cold (the first call on
  these files, with an empty cache of its own: every rule, then the what-if over the files in
  place; every run is one input draw, pooled as the query pools them); its CSV is compared
  with the baseline query's rows (every column, to 1e-12);
- at 1M only: ``whatif_warm`` (the same command again, the validation record of the cold call
  present: the rules are skipped, which its stderr must say),
  ``index`` (``pagestats index RUN --db FILE``, cold, an empty cache of its own),
  ``whatif_db`` (``pagestats whatif --db FILE --format csv``; the CSVs of both are compared
  with the query's as ``whatif``'s is) and, after every size, ``report``
  (``pagestats report --db FILE``, killed after ``--report-timeout`` seconds).

``--repeats N`` (default 5): at 1M the query, ``whatif_warm`` and ``whatif_db`` then run again
in N interleaved rounds (:func:`_rounds`); each round's ratios, their median and maximum are
recorded under ``rounds``, the figure to quote on a shared machine.

``--report-1m [--logs RUN] [--key KEY] [--reference-tree DIR]`` measures the report instead:
the baseline query, ``index`` and ``pagestats report --db FILE`` (and the same report run by
another checkout, e.g. the code before a change, in the same run), written under ``report_1M``
(or ``KEY``) of the results file, its other keys kept (:func:`_report_1m`).

Ratios: ``X / query`` for wall time and peak RSS of every command X measured with the query at
that size. Wall times on a shared machine are inflated by load: the load average at start, at
each size and at the end is recorded. An existing ``bench/results/NAME.json`` is kept, whole,
under ``earlier_runs`` of the new one (with the runs it kept), so no measurement is lost.

At the sizes of ``--warm-sizes`` the ``whatif`` runs after ``validate`` with the validation record
``validate`` wrote (the what-if's own cost; the cold cost is ``validate`` plus it): the 100M run is
``--logs DIR --sizes 1,10,100 --query-sizes 1,10 --warm-sizes 10,100 --timeout 4000 --no-report``.

Run: ``.venv/bin/python bench/duckdb_replay.py [--data DIR] [--logs DIR] [--sizes 1,10]
[--query-sizes 1,10] [--keep]``; writes ``bench/results/duckdb_replay.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import time

from _results import earlier_runs, git_head, measured, write_result

HERE = pathlib.Path(__file__).resolve().parent
N_PER_TASK = 125_000
TIMEOUT_S = 3000
REPORT_TIMEOUT_S = 1500
GIB = 2**30

#: The baseline: the what-if of a fixed τ = 0.07 as one hand-written DuckDB query over the
#: parquet files (``{outcomes}`` / ``{inputs}``: lists of file paths).
QUERY = """
SELECT i.model, i.context_length, o.evictor, o.task, o.budget, count(*) AS n_inputs,
    avg(i.full_score) AS acc_full, avg(o.score) AS acc_plain,
    avg(CASE WHEN i."drop" >= 0.07 THEN o.score ELSE i.full_score END) AS acc_gated,
    avg(CASE WHEN i."drop" >= 0.07 THEN o.score ELSE i.full_score END) - avg(o.score) AS delta,
    avg(CAST(o.score < i.full_score AS DOUBLE)) AS harm_plain,
    avg(CAST((CASE WHEN i."drop" >= 0.07 THEN o.score ELSE i.full_score END) < i.full_score AS DOUBLE)) AS harm_gated,
    avg(CAST(i."drop" >= 0.07 AS DOUBLE)) AS p_open,
    avg((CASE WHEN i."drop" >= 0.07 THEN o.n_kept ELSE i.n_tokens END) / i.n_tokens) AS kept_kv
FROM read_parquet({outcomes}) o JOIN read_parquet({inputs}) i USING (run_id, task, input_id)
GROUP BY ALL ORDER BY ALL
"""


def _generate(root: str, n_per_task: int, draw: int) -> None:
    """Child: one synthetic run of 8 × n_per_task inputs (draw and seed ``draw``)."""
    from pagestats import testing

    logs = testing.synthetic_logs(
        models=(testing.ModelSpec("synthetic-12L4H", 12, 4),), context_lengths=(4096,), evictors=("snapkv",),
        tasks=testing.SYNTHETIC_TASKS, n_inputs=n_per_task, input_draws=(draw,), with_topk=False, with_text=False,
        seed=draw,
    )  # fmt: skip
    (run_dir,) = logs.write(root, n_shards=2)
    print(json.dumps({"run_dir": str(run_dir), "n_inputs": logs.inputs.height, "n_outcomes": logs.outcomes.height}))


def _query(runs: list[str], out: str) -> None:
    """Child: the baseline query, its rows written as JSON."""
    import duckdb

    def files(table):
        return "[" + ", ".join(f"'{r}/{table}/*.parquet'" for r in runs) + "]"

    # spill beside the result (the bench's temporary folder), not into ./.tmp of the working directory
    spill = pathlib.Path(out).parent / "query-spill"
    con = duckdb.connect(config={"memory_limit": "2GB", "temp_directory": str(spill)})
    rows = con.sql(QUERY.format(outcomes=files("outcomes"), inputs=files("inputs"))).fetchall()
    pathlib.Path(out).write_text(json.dumps(rows))


def _measured(cmd: list[str], stdout_path: pathlib.Path, timeout_s: float = TIMEOUT_S,
              cache: pathlib.Path | None = None) -> dict:
    """Run ``cmd``, stdout to a file; wall time, CPU time and peak RSS of that child alone.
    ``cache``: the child's validation cache (``PAGESTATS_CACHE_DIR``); a new folder is cold."""
    saved = os.environ.get("PAGESTATS_CACHE_DIR")
    if cache is not None:
        os.environ["PAGESTATS_CACHE_DIR"] = str(cache)
    try:
        return measured(cmd, stdout_path, timeout_s, cwd=HERE.parent, rss_unit="gib", stderr_chars=600)
    finally:
        if saved is None:
            os.environ.pop("PAGESTATS_CACHE_DIR", None)
        else:
            os.environ["PAGESTATS_CACHE_DIR"] = saved


def _rounds(py: str, runs: list[str], tmp: pathlib.Path, n: int, whatif: list[str], db: list[str]) -> dict:
    """At 1M: the baseline query, the warm what-if (the validation record of the cold call) and the
    what-if over the database (the commands ``whatif`` and ``db`` that :func:`main` measured once), run
    one after the other ``n`` times, so that each round's ratios compare commands that met the same
    load; one measurement of each is noise on a shared machine."""
    import statistics

    rounds = []
    for i in range(n):
        one = {"query": _measured([py, __file__, "--query", str(tmp / "query_round.json"), *runs], tmp / "query_round.out"),
               "whatif_warm": _measured(whatif, tmp / "whatif_round.csv", cache=tmp / "cache-whatif1"),
               "whatif_db": _measured(db, tmp / "whatif_db_round.csv")}
        if any(m["returncode"] != 0 for m in one.values()):
            raise RuntimeError(f"round {i}: {({k: m['returncode'] for k, m in one.items()})}")
        rounds.append({**{f"{k}_wall_s": m["wall_s"] for k, m in one.items()},
                       **{f"{k}_rss_gib": m["peak_rss_gib"] for k, m in one.items()},
                       "loadavg": list(os.getloadavg())})
    ratios = {f"{name}_{x}_over_query": [r[f"{name}_{x}"] / r[f"query_{x}"] for r in rounds]
              for name in ("whatif_warm", "whatif_db") for x in ("wall_s", "rss_gib")}
    return {"n": n, "rounds": rounds, "ratios": ratios,
            "median_ratios": {k: statistics.median(v) for k, v in ratios.items()},
            "max_ratios": {k: max(v) for k, v in ratios.items()}}


def _compare(csv_text: str, rows: list) -> dict:
    """The what-if CSV against the baseline rows: same cells, every number to 1e-12 (``--input-draws
    pooled`` over several runs adds a ``draw`` column, null)."""
    import polars as pl

    from pagestats.replay.whatif import WHATIF_COLUMNS

    table = pl.read_csv(io.StringIO(csv_text))
    problems = []
    pooled = tuple(table.columns) == (*WHATIF_COLUMNS, "draw")  # several runs' draws pooled: a null draw column
    if tuple(table.columns) != WHATIF_COLUMNS and not pooled:
        problems.append(f"columns {table.columns}")
    if pooled and table["draw"].null_count() != table.height:
        problems.append("draw column not null although the draws are pooled")
    if table.height != len(rows):
        problems.append(f"{table.height} rows vs {len(rows)}")
    worst = 0.0
    for got, exp in zip(table.rows(), rows):
        if tuple(got[:6]) != tuple(exp[:6]):
            problems.append(f"cell {got[:6]} vs {exp[:6]}")
            break
        worst = max(worst, *(abs(a - b) for a, b in zip(got[6:], exp[6:])))
    if worst > 1e-12:
        problems.append(f"max abs difference {worst:.3g} > 1e-12")
    return {"ok": not problems, "problems": problems, "n_rows": table.height, "max_abs_diff": worst}


def _with_earlier(name: str, result: dict) -> dict:
    """``result`` with the runs already in ``bench/results/NAME.json`` under ``earlier_runs``
    (newest first; the file as this run found it, read once)."""
    if name not in _EARLIER:
        path = HERE / "results" / f"{name}.json"
        old = json.loads(path.read_text()) if path.exists() else None
        _EARLIER[name] = [] if old is None else earlier_runs(old)
    return {**result, "earlier_runs": _EARLIER[name]} if _EARLIER[name] else result


_EARLIER: dict[str, list] = {}


def _progress(measured_step: dict, tmp: pathlib.Path) -> None:
    """For a report killed at the timeout: the entries it had written (the files of its staging
    folder), each with the seconds from the report's start to its first file."""
    if not measured_step["timed_out"]:
        return
    done: dict[str, float] = {}
    for f in sorted(tmp.glob(".report_*.partial-*/*/*")):
        name = f.stem.split("-")[0]  # a figure or table of several parts: NAME-PART
        done[name] = min(done.get(name, float("inf")), f.stat().st_mtime - measured_step["started"])
    measured_step["written_before_timeout"] = {k: round(v, 1) for k, v in sorted(done.items(), key=lambda kv: kv[1])}


def _report_1m(argv: list[str]) -> int:
    """``--report-1m``: the report at 1M inputs, against the baseline query in the same run.

    Measures (each in its own subprocess) ``pagestats index RUN --db FILE``, the baseline
    :data:`QUERY`, ``pagestats report --db FILE`` and, with ``--also-logs``,
    ``pagestats report RUN``; the load average before and after each. The run is
    ``--logs RUN`` (a 1M run made by ``--generate``) or generated into the temporary folder.
    Writes the key ``--key`` (``report_1M``) of ``bench/results/NAME.json``, keeping its other keys;
    the run it replaces under that key is kept under the key's ``earlier_runs``.
    """
    ap = argparse.ArgumentParser(prog="duckdb_replay.py --report-1m")
    ap.add_argument("--data", default=str(HERE / "tmp"))
    ap.add_argument("--logs", default=None, help="a 1M run directory made by --generate (never deleted)")
    ap.add_argument("--timeout", type=float, default=REPORT_TIMEOUT_S, help="seconds per report")
    ap.add_argument("--also-logs", action="store_true", help="also measure `pagestats report RUN`")
    ap.add_argument("--out", default="duckdb_replay")
    ap.add_argument("--key", default="report_1M", help="the key of the results file to write")
    ap.add_argument("--reference-tree", default=None, help="another checkout (e.g. the code before a change) "
                    "whose `pagestats report --db` is measured in the same run, as report_db_reference")
    args = ap.parse_args(argv)
    py = sys.executable
    data = pathlib.Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="report_1m-", dir=data))
    at: dict = {"n_cpus": os.cpu_count(), "failures": [], "code": f"{HERE.parent} at {git_head(HERE.parent)}",
                "started_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}

    def step(name: str, cmd: list[str], timeout_s: float = TIMEOUT_S, cwd: pathlib.Path = HERE.parent) -> dict:
        before, started = list(os.getloadavg()), time.time()
        at[name] = measured(cmd, tmp / f"{name}.out", timeout_s, cwd=cwd, rss_unit="gib", stderr_chars=600)
        at[name]["started"] = started
        at[name]["loadavg_before"], at[name]["loadavg_after"] = before, list(os.getloadavg())
        if at[name]["returncode"] != 0:
            at["failures"].append(f"{name}: exit {at[name]['returncode']}" + (" (timed out)" if at[name]["timed_out"] else ""))
        print(name, json.dumps({k: at[name][k] for k in ("wall_s", "peak_rss_gib", "returncode")}), flush=True)
        return at[name]

    try:
        run = args.logs
        if run is None:
            if step("generate", [py, __file__, "--generate", str(tmp / "logs"), str(N_PER_TASK), "0"])["returncode"]:
                raise RuntimeError("generation failed")
            run = json.loads((tmp / "generate.out").read_text().splitlines()[-1])["run_dir"]
        at["run"] = run
        import duckdb

        n = duckdb.sql(f"SELECT count(*) FROM read_parquet('{run}/inputs/*.parquet')").fetchall()[0][0]
        at["shape"] = f"{n:,} inputs = 8 tasks × {n // 8:,}; L=12, H=4; 4096; snapkv; 9 budgets"
        step("query", [py, __file__, "--query", str(tmp / "query.json"), run])
        db = tmp / "logs.duckdb"
        step("index", [py, "-m", "pagestats", "index", run, "--db", str(db)])
        step("report_db", [py, "-m", "pagestats", "report", "--db", str(db), "--out", str(tmp / "report_db")],
             args.timeout)
        _progress(at["report_db"], tmp)
        if args.reference_tree:
            ref = pathlib.Path(args.reference_tree).resolve()
            at["reference_tree"] = f"{ref} at {git_head(ref)}"
            step("report_db_reference", [py, "-m", "pagestats", "report", "--db", str(db), "--out",
                                         str(tmp / "report_db_reference")], args.timeout, cwd=ref)
            _progress(at["report_db_reference"], tmp)
        if args.also_logs:
            step("report_logs", [py, "-m", "pagestats", "report", run, "--out", str(tmp / "report_logs")],
                 args.timeout)
            _progress(at["report_logs"], tmp)
        q = at["query"]
        at["ratios"] = {f"{name}_{x}_over_query": at[name][key] / q[key]
                        for name in ("report_db", "report_db_reference", "report_logs")
                        if name in at and at[name]["returncode"] == 0 and q["returncode"] == 0
                        for x, key in (("wall", "wall_s"), ("rss", "peak_rss_gib"))}
    except Exception as err:  # record, don't hide
        at["failures"].append(f"{type(err).__name__}: {err}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a --logs run is not under tmp
        path = HERE / "results" / f"{args.out}.json"
        result = json.loads(path.read_text()) if path.exists() else {}
        if args.key in result:  # the run this one replaces is kept, whole, under its earlier_runs
            old = result[args.key]
            at["earlier_runs"] = earlier_runs(old)
        result[args.key] = at
        write_result(args.out, result, {k: ({x: v.get(x) for x in ("wall_s", "peak_rss_gib", "loadavg_before")}
                                            if isinstance(v, dict) and "wall_s" in v else v) for k, v in at.items()})
    return 1 if at["failures"] else 0


def main() -> int:
    if len(sys.argv) >= 2 and sys.argv[1] == "--report-1m":
        return _report_1m(sys.argv[2:])
    if len(sys.argv) == 5 and sys.argv[1] == "--generate":
        _generate(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    if len(sys.argv) >= 4 and sys.argv[1] == "--query":
        _query(sys.argv[3:], sys.argv[2])
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(HERE / "tmp"))
    ap.add_argument("--logs", default=None, help="a folder of runs already made (one per million inputs, "
                    "named ...-d<i>); they are used in draw order and never deleted")
    ap.add_argument("--sizes", default="1,10", help="release sizes in millions of inputs (1 first)")
    ap.add_argument("--query-sizes", default="1,10", help="sizes at which the baseline query also runs")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("--report-timeout", type=float, default=REPORT_TIMEOUT_S)
    ap.add_argument("--out", default="duckdb_replay", help="results name: bench/results/NAME.json")
    ap.add_argument("--warm-sizes", default="", help="sizes at which whatif runs after validate with the record "
                    "validate wrote (validation skipped: the what-if's own cost), instead of cold")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds each command may run")
    ap.add_argument("--repeats", type=int, default=5, help="at 1M: the query, whatif_warm and whatif_db again, "
                    "interleaved, this many times; the ratios of each round and their median are recorded")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    query_sizes = {int(s) for s in args.query_sizes.split(",") if s}
    warm_sizes = {int(s) for s in args.warm_sizes.split(",") if s}
    import duckdb
    import polars as pl

    py = sys.executable
    result: dict = {
        "benchmark": "duckdb_replay", "python": platform.python_version(), "polars": pl.__version__,
        "duckdb": duckdb.__version__, "n_cpus": os.cpu_count(), "loadavg_start": list(os.getloadavg()),
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "shape": {"per_run": "1,000,000 inputs = 8 tasks × 125,000; L=12, H=4; 4096; snapkv; 9 budgets",
                  "sizes_millions": sizes},
        "baseline_query": QUERY.strip(),
        "failures": [],
    }  # fmt: skip
    data = pathlib.Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="duckdb_replay-", dir=data))
    made: list[str] = []
    if args.logs is not None:
        made = sorted((str(p.parent) for p in pathlib.Path(args.logs).glob("*/manifest.json")),
                      key=lambda r: int(r.rsplit("-d", 1)[1]))
        result["logs"] = {"folder": args.logs, "n_runs": len(made),
                          "copies": sum("copied_from" in json.loads((pathlib.Path(r) / "manifest.json").read_text())
                                        for r in made)}
    runs: list[str] = []
    try:
        for size in sizes:
            while len(runs) < size:
                draw = len(runs)
                if made:
                    runs.append(made[draw])
                    continue
                m = _measured([py, __file__, "--generate", str(tmp / "logs"), str(N_PER_TASK), str(draw)],
                              tmp / f"gen{draw}.out")
                if m["returncode"] != 0:
                    raise RuntimeError(f"generation {draw} failed: {m['stderr_tail']}")
                runs.append(json.loads((tmp / f"gen{draw}.out").read_text().splitlines()[-1])["run_dir"])
            at = {"n_inputs": size * 1_000_000, "loadavg": list(os.getloadavg()),
                  "disk_gib": sum(f.stat().st_size for r in runs for f in pathlib.Path(r).rglob("*") if f.is_file()) / GIB}
            if size in query_sizes:
                at["query"] = _measured([py, __file__, "--query", str(tmp / f"query{size}.json"), *runs],
                                        tmp / f"query{size}.out")
            at["validate"] = _measured([py, "-m", "pagestats", "validate", *runs], tmp / f"validate{size}.out",
                                       cache=tmp / f"cache-validate{size}", timeout_s=args.timeout)
            whatif = [py, "-m", "pagestats", "whatif", *runs, "--input-draws", "pooled", "--format", "csv"]
            if size in warm_sizes:  # the record validate wrote: whatif skips the rules
                at["whatif"] = w = _measured(whatif, tmp / f"whatif{size}.csv", cache=tmp / f"cache-validate{size}",
                                             timeout_s=args.timeout)
                w["skipped_rules"] = "unchanged since validated at" in w["stderr_tail"]
            else:
                at["whatif"] = _measured(whatif, tmp / f"whatif{size}.csv", cache=tmp / f"cache-whatif{size}",
                                         timeout_s=args.timeout)
            if size == 1:  # the same command again: the cold call's validation record is there
                at["whatif_warm"] = w = _measured(whatif, tmp / "whatif_warm1.csv", cache=tmp / "cache-whatif1")
                w["skipped_rules"] = "unchanged since validated at" in w["stderr_tail"]
                if w["returncode"] == 0 and not w["skipped_rules"]:
                    result["failures"].append("1M whatif_warm did not reuse the validation record")
                db = tmp / "logs1.duckdb"
                at["index"] = _measured([py, "-m", "pagestats", "index", *runs, "--db", str(db)], tmp / "index1.out",
                                        cache=tmp / "cache-index1")
                whatif_db = [py, "-m", "pagestats", "whatif", "--db", str(db), "--format", "csv"]
                at["whatif_db"] = _measured(whatif_db, tmp / "whatif_db1.csv")
                if "query" in at and args.repeats > 0:
                    at["rounds"] = _rounds(py, runs, tmp, args.repeats, whatif, whatif_db)
            q = at.get("query")
            if q is not None and q["returncode"] == 0:
                for name, csv in (("whatif", f"whatif{size}.csv"), ("whatif_warm", "whatif_warm1.csv"),
                                  ("whatif_db", "whatif_db1.csv")):
                    w = at.get(name)
                    if w is None or w["returncode"] != 0:
                        continue
                    w["check_vs_query"] = _compare((tmp / csv).read_text(),
                                                   json.loads((tmp / f"query{size}.json").read_text()))
                    if not w["check_vs_query"]["ok"]:
                        result["failures"].append(f"{name} {size}M differs from the query: {w['check_vs_query']}")
                at["ratios"] = {f"{name}_{x}_over_query": at[name][key] / q[key]
                                for name in ("whatif", "whatif_warm", "validate", "index", "whatif_db")
                                for x, key in (("wall", "wall_s"), ("rss", "peak_rss_gib"))
                                if name in at and at[name]["returncode"] == 0}
            for k, v in at.items():
                if isinstance(v, dict) and v.get("returncode", 0) != 0:
                    result["failures"].append(f"{size}M {k}: exit {v['returncode']}" + (" (timed out)" if v.get("timed_out") else ""))
            result[f"{size}M"] = at
            print(size, json.dumps({k: (v if not isinstance(v, dict) else {x: v.get(x) for x in
                                        ("wall_s", "peak_rss_gib", "returncode")}) for k, v in at.items()
                                    if k != "ratios"}), json.dumps(at.get("ratios")), flush=True)
            write_result(args.out, _with_earlier(args.out, result), {})  # so far, in case a later size fails
        if not args.no_report and "1M" in result:  # last: it may run until the timeout
            at = result["1M"]
            at["report"] = _measured([py, "-m", "pagestats", "report", "--db", str(tmp / "logs1.duckdb"), "--out",
                                      str(tmp / "report")], tmp / "report.out", timeout_s=args.report_timeout)
            if at["report"]["returncode"] != 0:
                result["failures"].append(f"1M report: exit {at['report']['returncode']}"
                                          + (" (timed out)" if at["report"]["timed_out"] else ""))
    except Exception as err:  # record, don't hide
        result["failures"].append(f"{type(err).__name__}: {err}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)  # a --logs folder is not under tmp
        result["loadavg_end"] = list(os.getloadavg())
        result["data_deleted"] = not tmp.exists()
        shown = {k: result.get(k) for k in ("failures", "loadavg_start", "loadavg_end")}
        for size in sizes:
            at = result.get(f"{size}M", {})
            shown[f"{size}M"] = {k: ({x: v.get(x) for x in ("wall_s", "peak_rss_gib")} if "wall_s" in v else v)
                                 for k, v in at.items() if isinstance(v, dict)}
        write_result(args.out, _with_earlier(args.out, result), shown)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
