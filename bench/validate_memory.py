"""Benchmark: the first calls on a new release of 1M inputs — cold ``pagestats validate``, then the
warm ``pagestats whatif`` after it — against one hand-written DuckDB query of the same what-if
(issue 40 §5, docs/PERFORMANCE.md "The first calls on a new release").

Data (``--generate``, one child process): one synthetic run of 1,000,000 inputs, the paper's four
tasks (NIAH-MK3, VT, FWE, QA_1) × 250,000, one model (L = 12, H = 4), RULER 4K, SnapKV, the 9
default budgets (9,000,000 outcome rows), with text. ``--text short`` keeps the generator's own
answers (``Answer: r1, r2``, every decode ending at EOS); ``--text long`` gives every answer the
length of the shipped logs' (about 95 characters on average; data/) and stops a quarter of the
decodes at the decode limit with a looping tail, as real logs do (24 % of the shipped outcome rows
stop at the limit), so that the decode-limit readings have work to do. Or ``--logs RUN``, a run made
before (never deleted).

Measured, each command in its own subprocess reaped with :func:`os.wait4` (wall time, CPU time and
peak RSS of that child alone), in ``--rounds`` interleaved rounds (on a shared machine one
measurement is noise):

- ``query``: the baseline, :data:`duckdb_replay.QUERY` (the what-if of the fixed τ = 0.07 over the
  parquet files, 36 rows here) in a Python process that imports DuckDB;
- ``validate``: ``pagestats validate RUN``, cold (an empty validation cache of its own,
  ``PAGESTATS_CACHE_DIR``);
- ``whatif``: ``pagestats whatif RUN --format csv`` right after it, warm (the record ``validate``
  wrote: the rules are skipped, which its stderr must say); its CSV is compared with the query's
  rows (every number to 1e-12).

``--tree DIR`` runs the ``pagestats`` commands from another checkout (``git archive`` of a commit, with
a ``COMMIT`` file naming it),
e.g. the code before a change, and ``--also-tree DIR`` adds a second code's ``validate`` and
``whatif`` to every round, so that both codes and the query meet the same load. Ratios per round:
``X / query`` for wall time and peak RSS, and the cold path ``(validate + whatif) / query`` for wall
time (the sum of both commands' times against one query) and ``max(validate, whatif) / query`` for
peak RSS; their medians and maxima are recorded. The load average before and after every command is
kept beside it.

Run: ``.venv/bin/python bench/validate_memory.py --logs RUN [--tree DIR] [--also-tree DIR]
[--rounds 3] [--out NAME]``; writes ``bench/results/NAME.json`` (default ``validate_memory``), the
result it replaces kept under ``earlier_runs``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time

from _results import earlier_runs, git_head, measured, write_result
from duckdb_replay import _compare, _query

HERE = pathlib.Path(__file__).resolve().parent
PAPER_TASKS = ("niah_multikey_3", "vt", "fwe", "qa_1")
N_PER_TASK = 250_000
TIMEOUT_S = 600
#: ``--text long``: every LOOPING-th decode stops at this limit, its answer followed by a looping tail.
DECODE_LIMIT, LOOPING = 128, 4
_FILLER = ("the special magic number for the key was found in the long text above and it is written here "
           "again for the reader who asked about it ")


def _long_text(frame, pred: str, reason: str, n_gen: str, row):
    """``frame`` with its answers ``pred`` lengthened: every answer followed by a sentence of the
    filler (the shipped logs' length), every LOOPING-th one (by ``row``) cut at the decode limit
    after its tail repeats one phrase. No digit is added, so every score stays what it was."""
    import polars as pl

    looping = (row % LOOPING) == 0
    start = (row % 40).cast(pl.Int64)
    sentence = pl.lit(_FILLER).str.slice(start, 70)
    loop = pl.lit("and again the number and again the number and again the number and again the")
    return frame.with_columns(
        pl.when(looping).then(pl.col(pred) + ". " + sentence + " " + loop)
        .otherwise(pl.col(pred) + ". " + sentence).alias(pred),
        pl.when(looping).then(pl.lit("length")).otherwise(pl.col(reason)).alias(reason),
        pl.when(looping).then(pl.lit(DECODE_LIMIT, pl.Int64)).otherwise(pl.col(n_gen)).alias(n_gen),
    )


def _generate(root: str, n_per_task: int, text: str) -> None:
    """Child: the run of ``len(PAPER_TASKS) × n_per_task`` inputs; prints its directory as JSON."""
    import polars as pl

    from pagestats import testing

    t0 = time.perf_counter()
    logs = testing.synthetic_logs(
        models=(testing.ModelSpec("synthetic-12L4H", 12, 4),), context_lengths=(4096,), evictors=("snapkv",),
        tasks=PAPER_TASKS, n_inputs=n_per_task, input_draws=(0,), with_topk=False, with_text=True, seed=0,
    )  # fmt: skip
    if text == "long":
        logs.inputs = _long_text(logs.inputs, "full_prediction", "full_stop_reason", "full_n_generated",
                                 pl.col("input_id"))
        logs.outcomes = _long_text(logs.outcomes, "prediction", "stop_reason", "n_generated",
                                   pl.int_range(pl.len()) // 3)
        for manifest in logs.manifests.values():
            manifest["task_options"] = {t: {"max_new_tokens": DECODE_LIMIT} for t in PAPER_TASKS}
    gen_s = time.perf_counter() - t0
    (run_dir,) = logs.write(root, n_shards=2)
    print(json.dumps({"run_dir": str(run_dir), "n_inputs": logs.inputs.height, "n_outcomes": logs.outcomes.height,
                      "text": text, "generate_s": gen_s, "write_s": time.perf_counter() - t0 - gen_s}))


def _step(name: str, cmd: list[str], out: pathlib.Path, cwd: pathlib.Path, cache: pathlib.Path | None = None) -> dict:
    """One command in its own child (``cache``: its ``PAGESTATS_CACHE_DIR``), with the load around it."""
    env_saved = os.environ.get("PAGESTATS_CACHE_DIR")
    if cache is not None:
        os.environ["PAGESTATS_CACHE_DIR"] = str(cache)
    before = list(os.getloadavg())
    try:
        m = measured(cmd, out, TIMEOUT_S, cwd=cwd, rss_unit="gib", stderr_chars=400)
    finally:
        if env_saved is None:
            os.environ.pop("PAGESTATS_CACHE_DIR", None)
        else:
            os.environ["PAGESTATS_CACHE_DIR"] = env_saved
    m["loadavg_before"], m["loadavg_after"] = before, list(os.getloadavg())
    print(name, json.dumps({k: m[k] for k in ("wall_s", "cpu_s", "peak_rss_gib", "returncode")}), flush=True)
    return m


def _cold_path(py: str, run: str, tree: pathlib.Path, tmp: pathlib.Path, tag: str, rows: list) -> dict:
    """``validate`` (cold) then ``whatif`` (warm) from ``tree``; the what-if's CSV checked against ``rows``."""
    cache = pathlib.Path(tempfile.mkdtemp(prefix=f"cache-{tag}-", dir=tmp))
    v = _step(f"{tag} validate", [py, "-m", "pagestats", "validate", run], tmp / f"{tag}_validate.out", tree, cache)
    w = _step(f"{tag} whatif", [py, "-m", "pagestats", "whatif", run, "--format", "csv"], tmp / f"{tag}_whatif.csv",
              tree, cache)
    w["skipped_rules"] = "unchanged since validated at" in w["stderr_tail"]
    w["check_vs_query"] = _compare((tmp / f"{tag}_whatif.csv").read_text(), rows) if w["returncode"] == 0 else None
    shutil.rmtree(cache, ignore_errors=True)
    return {"validate": v, "whatif": w}


def _commit(tree: pathlib.Path) -> str:
    """The commit ``tree`` holds: its ``COMMIT`` file (a ``git archive`` of a commit), else its git HEAD."""
    return (tree / "COMMIT").read_text().strip() if (tree / "COMMIT").is_file() else git_head(tree)


def _scan_sql(files: str, columns: list[tuple[str, str]]) -> str:
    """One DuckDB scan that reads every value of every column once: a numeric column summed, a string
    column's lengths summed, a list's elements summed (numeric) or counted (strings), a struct's
    fields each read; the least any check of every value must do."""
    def one(name: str, kind: str) -> str:
        col = f'"{name}"'
        if kind.startswith("STRUCT"):
            fields = re.findall(r"(\w+) [A-Z]+[,)]", kind)
            return " + ".join(f"sum({col}.{f})" for f in fields)
        if kind.endswith("[]"):
            return (f"sum(list_sum(list_transform({col}, lambda x: length(x))))" if kind.startswith("VARCHAR")
                    else f"sum(list_sum({col}))")
        return f"sum(length({col}))" if kind == "VARCHAR" else f"sum({col})"

    return "SELECT " + ", ".join(one(n, k) for n, k in columns) + f" FROM read_parquet({files})"


def _scan(table: str, run: str) -> None:
    """Child: :func:`_scan_sql` over ``run``'s ``table`` files."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    files = f"'{run}/{table}/*.parquet'"
    columns = [(r[0], r[1]) for r in con.sql(f"DESCRIBE SELECT * FROM read_parquet({files})").fetchall()]
    con.sql(_scan_sql(files, columns)).fetchall()


def _ratios(query: dict, path: dict, floor: dict | None = None) -> dict:
    v, w = path["validate"], path["whatif"]
    return {"validate_wall": v["wall_s"] / query["wall_s"], "validate_rss": v["peak_rss_gib"] / query["peak_rss_gib"],
            "whatif_wall": w["wall_s"] / query["wall_s"], "whatif_rss": w["peak_rss_gib"] / query["peak_rss_gib"],
            "cold_path_wall": (v["wall_s"] + w["wall_s"]) / query["wall_s"],
            "cold_path_cpu": (v["cpu_s"] + w["cpu_s"]) / query["cpu_s"],
            "cold_path_rss": max(v["peak_rss_gib"], w["peak_rss_gib"]) / query["peak_rss_gib"],
            **({"floor_wall": (sum(f["wall_s"] for f in floor.values()) + query["wall_s"]) / query["wall_s"],
                "floor_cpu": (sum(f["cpu_s"] for f in floor.values()) + query["cpu_s"]) / query["cpu_s"]}
               if floor else {})}


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--generate":
        _generate(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "--scan":
        _scan(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) >= 4 and sys.argv[1] == "--query":
        _query(sys.argv[3:], sys.argv[2])
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--logs", default=None, help="a run made by --generate (never deleted)")
    ap.add_argument("--text", choices=("short", "long"), default="long", help="the answers of a generated run")
    ap.add_argument("--n-per-task", type=int, default=N_PER_TASK)
    ap.add_argument("--tree", default=str(HERE.parent), help="the checkout whose pagestats runs")
    ap.add_argument("--also-tree", default=None, help="a second checkout measured in the same rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="validate_memory")
    ap.add_argument("--floor", action="store_true", help="also the floor: one scan of every value of inputs "
                    "and of outcomes, each in its own child, in every round")
    args = ap.parse_args()
    # the children keep their bytecode, as a pip-installed package does: with PYTHONDONTWRITEBYTECODE set
    # (this project's machines) every pagestats command would compile its imports again (~1.5 CPU s each)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    import duckdb
    import polars as pl

    py = sys.executable
    data = HERE / "tmp"
    data.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="validate_memory-", dir=data))
    trees = {"code": pathlib.Path(args.tree).resolve()}
    if args.also_tree:
        trees["also"] = pathlib.Path(args.also_tree).resolve()
    result: dict = {
        "benchmark": "validate_memory", "python": platform.python_version(), "polars": pl.__version__,
        "duckdb": duckdb.__version__, "n_cpus": os.cpu_count(), "loadavg_start": list(os.getloadavg()),
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "trees": {k: f"{v} at {_commit(v)}" for k, v in trees.items()}, "failures": [], "rounds": [],
    }  # fmt: skip
    try:
        run = args.logs
        if run is None:
            g = _step("generate", [py, __file__, "--generate", str(tmp / "logs"), str(args.n_per_task), args.text],
                      tmp / "generate.out", HERE.parent)
            if g["returncode"] != 0:
                raise RuntimeError(f"generation failed: {g['stderr_tail']}")
            result["generate"] = {**g, **json.loads((tmp / "generate.out").read_text().splitlines()[-1])}
            run = result["generate"]["run_dir"]
        run = str(pathlib.Path(run).resolve())
        shape = duckdb.sql(f"""SELECT count(*), count(DISTINCT task), avg(length(full_prediction)),
            avg(CAST(full_stop_reason = 'length' AS DOUBLE))
            FROM read_parquet('{run}/inputs/*.parquet')""").fetchall()[0]
        out_shape = duckdb.sql(f"""SELECT count(*), avg(length(prediction)),
            avg(CAST(stop_reason = 'length' AS DOUBLE)) FROM read_parquet('{run}/outcomes/*.parquet')""").fetchall()[0]
        result["run"] = {"dir": run, "n_inputs": shape[0], "n_tasks": shape[1], "n_outcomes": out_shape[0],
                         "mean_chars_full_prediction": shape[2], "share_full_length_stops": shape[3],
                         "mean_chars_prediction": out_shape[1], "share_length_stops": out_shape[2],
                         "parquet_mib": sum(f.stat().st_size for f in pathlib.Path(run).rglob("*.parquet")) / 2**20}
        for i in range(args.rounds):
            one = {"loadavg": list(os.getloadavg())}
            one["query"] = q = _step("query", [py, __file__, "--query", str(tmp / "query.json"), run],
                                     tmp / "query.out", HERE.parent)
            rows = json.loads((tmp / "query.json").read_text())
            if args.floor:
                one["floor"] = {t: _step(f"scan {t}", [py, __file__, "--scan", t, run], tmp / f"scan_{t}.out", HERE.parent)
                                for t in ("inputs", "outcomes")}
            for tag, tree in (trees.items() if i % 2 == 0 else reversed(trees.items())):
                one[tag] = path = _cold_path(py, run, tree, tmp, tag, rows)
                for name, m in path.items():
                    if m["returncode"] != 0:
                        result["failures"].append(f"round {i} {tag} {name}: exit {m['returncode']}")
                if not path["whatif"]["skipped_rules"]:
                    result["failures"].append(f"round {i} {tag}: the what-if did not reuse validate's record")
                check = path["whatif"]["check_vs_query"]
                if check is not None and not check["ok"]:
                    result["failures"].append(f"round {i} {tag}: the what-if differs from the query: {check}")
                if q["returncode"] == 0 and all(m["returncode"] == 0 for m in path.values()):
                    path["ratios"] = _ratios(q, path, one.get("floor"))
            result["rounds"].append(one)
            write_result(args.out, _with_earlier(args.out, result), {})  # so far
        for tag in trees:
            ratios = [r[tag]["ratios"] for r in result["rounds"] if "ratios" in r.get(tag, {})]
            if ratios:
                result[f"{tag}_median"] = {k: statistics.median(r[k] for r in ratios) for k in ratios[0]}
                result[f"{tag}_max"] = {k: max(r[k] for r in ratios) for k in ratios[0]}
    except Exception as err:  # record, don't hide
        result["failures"].append(f"{type(err).__name__}: {err}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a --logs run is not under tmp
        result["loadavg_end"] = list(os.getloadavg())
        shown = {k: v for k, v in result.items() if k not in ("rounds", "earlier_runs")}
        write_result(args.out, _with_earlier(args.out, result), shown)
    return 1 if result["failures"] else 0


_EARLIER: dict[str, list] = {}


def _with_earlier(name: str, result: dict) -> dict:
    """``result`` with the runs of the ``bench/results/NAME.json`` this run found kept under ``earlier_runs``."""
    if name not in _EARLIER:
        path = HERE / "results" / f"{name}.json"
        _EARLIER[name] = earlier_runs(json.loads(path.read_text())) if path.exists() else []
    return {**result, "earlier_runs": _EARLIER[name]} if _EARLIER[name] else result


if __name__ == "__main__":
    raise SystemExit(main())
