"""Check a pooled what-if CSV over many runs against a hand-written query, run by run.

``pagestats whatif RUN_1 … RUN_n --input-draws pooled --format csv`` over a release too big for one
join (the 100M bench of ``bench/duckdb_replay.py``: 100 runs of 1M inputs) is checked here
against an independent computation: the fixed-τ what-if written by hand as one DuckDB query
per run that returns, per cell, the input count and the SUMS of each per-input quantity
(PAGE Eq. 2 gate ``D ≥ τ``; accuracy, harm = Pr[score < full score] as in Table 27, gate-open
fraction, kept-KV fraction); the sums are added over the runs in Python and divided by the
total count at the end. It shares no code with ``pagestats`` (which averages per run and pools
the averages with their counts as weights), so the two agree only if both are right.

Usage::

    python bench/pooled_check.py WHATIF.csv RUN [RUN ...] [--tau 0.07] [--out NAME]

Writes ``bench/results/NAME.json`` (default ``pooled_check``): the largest absolute
difference per column, the number of cells, inputs and runs, and the wall time.
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import sys
import time

import duckdb

HERE = pathlib.Path(__file__).resolve().parent

CELL = ("model", "context_length", "evictor", "task", "budget")
SUMS = ("acc_full", "acc_plain", "acc_gated", "harm_plain", "harm_gated", "p_open", "kept_kv")

#: One run's cells: the count and the sum of each per-input quantity (gate: D ≥ τ).
QUERY = """
SELECT i.model, i.context_length, o.evictor, o.task, o.budget, count(*) AS n,
    sum(i.full_score) AS acc_full, sum(o.score) AS acc_plain,
    sum(CASE WHEN i."drop" >= {tau} THEN o.score ELSE i.full_score END) AS acc_gated,
    sum(CAST(o.score < i.full_score AS DOUBLE)) AS harm_plain,
    sum(CAST((CASE WHEN i."drop" >= {tau} THEN o.score ELSE i.full_score END) < i.full_score AS DOUBLE)) AS harm_gated,
    sum(CAST(i."drop" >= {tau} AS DOUBLE)) AS p_open,
    sum((CASE WHEN i."drop" >= {tau} THEN o.n_kept ELSE i.n_tokens END) / i.n_tokens) AS kept_kv
FROM read_parquet('{run}/outcomes/*.parquet') o JOIN read_parquet('{run}/inputs/*.parquet') i
    USING (run_id, task, input_id)
WHERE o.budget < 1
GROUP BY ALL
"""


def pooled_reference(runs: list[str], tau: float) -> dict[tuple, dict[str, float]]:
    """Per cell: the totals over every run, divided by the total count at the end."""
    totals: dict[tuple, list[float]] = {}
    con = duckdb.connect(config={"memory_limit": "2GB"})
    for k, run in enumerate(runs, 1):
        for row in con.sql(QUERY.format(tau=tau, run=run)).fetchall():
            key, n, sums = tuple(row[:5]), row[5], row[6:]
            acc = totals.setdefault(key, [0] + [0.0] * len(SUMS))
            acc[0] += n
            for j, s in enumerate(sums, 1):
                acc[j] += s
        print(f"\r{k}/{len(runs)} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {key: {"n_inputs": v[0], **{c: s / v[0] for c, s in zip(SUMS, v[1:])}} for key, v in totals.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="the what-if CSV (`pagestats whatif RUNS --input-draws pooled --format csv`)")
    ap.add_argument("runs", nargs="+", help="the run folders the CSV was made from")
    ap.add_argument("--tau", type=float, default=0.07, help="the fixed τ of the CSV (default 0.07)")
    ap.add_argument("--out", default="pooled_check", help="results name: bench/results/NAME.json")
    args = ap.parse_args()

    start = time.perf_counter()
    ref = pooled_reference(args.runs, args.tau)
    with open(args.csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    got = {(r["model"], int(r["context_length"]), r["evictor"], r["task"], float(r["budget"])): r for r in rows}
    got = {k: r for k, r in got.items() if k[4] < 1}
    if set(got) != set(ref):
        raise SystemExit(f"the cells differ: {len(set(got) ^ set(ref))} in one table only")
    diff = {c: 0.0 for c in ("n_inputs", *SUMS, "delta")}
    for key, r in ref.items():
        g = got[key]
        diff["n_inputs"] = max(diff["n_inputs"], abs(int(g["n_inputs"]) - r["n_inputs"]))
        for c in SUMS:
            diff[c] = max(diff[c], abs(float(g[c]) - r[c]))
        diff["delta"] = max(diff["delta"], abs(float(g["delta"]) - (r["acc_gated"] - r["acc_plain"])))
    result = {
        "benchmark": "pooled_check",
        "csv": args.csv,
        "n_runs": len(args.runs),
        "n_cells": len(ref),
        "n_inputs_per_cell": sorted({r["n_inputs"] for r in ref.values()}),
        "tau": args.tau,
        "max_abs_diff": diff,
        "equal_to_1e-12": all(v <= 1e-12 for v in diff.values()),
        "wall_s": round(time.perf_counter() - start, 1),
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    out = HERE / "results" / f"{args.out}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
