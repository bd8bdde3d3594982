"""Benchmark (issue 43): the risk-controlled gate checked by repeated random calibration/test splits, and
compared with the paper's τ recipes on every report cell.

For each model of the logs, each of its evictors and each budget b asked for, every input is labelled with
whether plain eviction at (evictor, b) harms it (score below its full-KV score, Table 27). Then, n_splits
times, ``n_calibration`` inputs drawn without replacement certify τ by Learn then Test
(:func:`pagestats.deploy.risk.split_validation`) and the rest measure its harm. Learn then Test promises
P(harm of the certified τ > A) ≤ δ over the calibration draw; the share of splits whose realized test harm
exceeds A is reported with its Monte Carlo error, and so is the share whose τ has harm above A on all the
inputs (the finite population the splits draw from, the quantity the promise is about; the test harm adds
the test sample's own noise). Inputs whose harm is not known (no outcome of the evictor at b; the release's
Yi-1.5-9B file has no b = 1 rows, so some full-KV outcomes are unknown) are left out and counted.

Then, per model and evictor at b: the gate certified on the held-out pilot (``calibrate --policy risk``,
:func:`pagestats.deploy.risk.risk_gate`) beside the fixed τ = 0.07, the z-scored τ and the midpoint recipe on each
(model, context) cell: harm, p_open and compression (:func:`pagestats.deploy.risk.policy_comparison`).

Run: ``.venv/bin/python bench/risk_validation.py NAME LOGS... [--budget 0.125] [--alpha 0.1] [--delta 0.1]
[--splits 1000] [--n-calibration 100]``; writes bench/results/risk_validation_NAME.json.
"""

from __future__ import annotations

import argparse
import glob
import time

import numpy as np
import polars as pl

from pagestats.core import defaults
from pagestats.io import load
from pagestats.deploy.risk import harm_labels, labelled_rows, policy_comparison, risk_gate, split_validation

from _results import git_head, write_result
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--budget", type=float, action="append")
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--delta", type=float, default=0.1)
    ap.add_argument("--splits", type=int, default=1000)
    ap.add_argument("--n-calibration", type=int, default=defaults.PILOT_N)
    args = ap.parse_args()
    budgets = args.budget or [0.125]
    t0 = time.perf_counter()
    paths = sorted(p for g in args.logs for p in glob.glob(g))
    logs = load(paths)
    rng = np.random.default_rng(43)
    splits, comparisons, skipped = [], [], []
    for model in sorted(logs.inputs["model"].unique().to_list()):
        rows = logs.inputs.filter(pl.col("model") == model)
        for evictor in sorted(logs.outcomes.filter(pl.col("run_id").is_in(rows["run_id"].unique().to_list()))["evictor"]
                              .unique().to_list()):
            have = set(logs.outcomes.filter(pl.col("evictor") == evictor)["budget"].unique().to_list())
            for b in budgets:
                if b not in have:
                    skipped.append(f"{model} {evictor}: no budget {b}")
                    continue
                known, left_out = labelled_rows(logs, rows, budget=b, evictor=evictor)
                harmed = harm_labels(logs, known, budget=b, evictor=evictor)
                drops = known["drop"].to_numpy().astype(np.float64)
                v = split_validation(drops, harmed, harm_bound=args.alpha, delta=args.delta,
                                     n_calibration=args.n_calibration, n_splits=args.splits, rng=rng)
                splits.append({"model": model, "evictor": evictor, "budget": b, "left_out": left_out,
                               "plain_harm": float(harmed.mean()), **v.to_dict()})
                print(splits[-1], flush=True)
                try:
                    gate = risk_gate(logs, harm_bound=args.alpha, delta=args.delta, budget=b, evictor=evictor, model=model,
                                     pilot_n=args.n_calibration)
                except ValueError as err:  # a model too small for the held-out pilot: said, not hidden
                    skipped.append(f"{model} {evictor} b={b}: {err}")
                    continue
                cmp = policy_comparison(_one_model(logs, model), gate)
                comparisons.extend({**r, "budget": b, "certified": gate.pilot["certified"]} for r in cmp.iter_rows(named=True))
    result = {"commit": git_head(Path(__file__).resolve().parents[1]), "logs": paths[:3] + ([f"... {len(paths)} paths"] if len(paths) > 3 else []),
              "harm_bound": args.alpha, "delta": args.delta, "n_calibration": args.n_calibration, "n_splits": args.splits,
              "seconds": round(time.perf_counter() - t0, 1), "splits": splits, "comparison": comparisons, "skipped": skipped}
    write_result(f"risk_validation_{args.name}", result, shown={k: v for k, v in result.items() if k != "comparison"})


def _one_model(logs, model):
    from dataclasses import replace

    runs = logs.inputs.filter(pl.col("model") == model)["run_id"].unique().to_list()
    return replace(logs, inputs=logs.inputs.filter(pl.col("run_id").is_in(runs)),
                   outcomes=logs.outcomes.filter(pl.col("run_id").is_in(runs)),
                   topk=None if logs.topk is None else logs.topk.filter(pl.col("run_id").is_in(runs)))


if __name__ == "__main__":
    main()
