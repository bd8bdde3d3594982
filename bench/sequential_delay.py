"""Benchmark (issue 43): ``monitor --sequential``'s false alarms with no drift and its detection delay when
p_open shifts by 0.15, on a real D distribution.

The population is the logged D of one model (default: SmolLM2-135M-Instruct, every query-aware input of
data/smollm2-*), τ the fixed 0.07 (Table 8). Each repetition draws a calibration sample and a deployed
stream from that population with replacement (so with no drift the two are exchangeable, the null of the
tests), and runs :func:`pagestats.stats.sequential.sequential_drift` at level α over the stream.

* no drift: the share of repetitions with any alarm within 2,000 looks (one look per input), with its
  Monte Carlo error √(s(1 − s)/R);
* shift from the start: every deployed D is moved by the constant c for which the population's share of
  D + c ≥ τ is the calibration share + 0.15 (p_open shifted by 0.15); the delay is the number of deployed
  inputs up to the first alarm;
* shift after 1,000 inputs: the same shift, after 1,000 undrifted inputs; the delay counts from the change.

Delays are given as median and quartiles over the repetitions that alarmed within the stream, with the
share that did, per test (p_open, D) and for the first of the two.

Run: ``.venv/bin/python bench/sequential_delay.py [--reps 300] [--alpha 0.05] [--n-calibration 300 1000]``;
writes bench/results/sequential_delay.json.
"""

from __future__ import annotations

import argparse
import glob
import time
from pathlib import Path

import numpy as np
import polars as pl

from pagestats.core import defaults
from pagestats.io import load
from pagestats.stats.sequential import sequential_drift

from _results import git_head, write_result


def _shift_for(pop: np.ndarray, tau: float, target: float) -> float:
    """The c with share(pop + c ≥ τ) = target (to the population's resolution): τ minus the
    (1 − target) quantile of the population."""
    return float(tau - np.quantile(pop, 1.0 - target, method="inverted_cdf"))


def _summary(firsts: list, n_reps: int, offset: int = 0) -> dict:
    hit = np.array([f - offset + 1 for f in firsts if f is not None and f >= offset], dtype=float)
    early = sum(1 for f in firsts if f is not None and f < offset)
    out = {"share_detected": len(hit) / n_reps, "alarms_before_change": early}
    if len(hit):
        q = np.percentile(hit, [25, 50, 75])
        out.update({"median_delay": float(q[1]), "q25": float(q[0]), "q75": float(q[2])})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--logs", nargs="+", default=["data/smollm2-*/"])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--null-reps", type=int, default=1000)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--n-calibration", type=int, nargs="+", default=[300, 1000])
    ap.add_argument("--stream", type=int, default=5000)
    args = ap.parse_args()
    t0 = time.perf_counter()
    logs = load(sorted(p for g in args.logs for p in glob.glob(g)))
    model = sorted(logs.inputs["model"].unique().to_list())[0]
    pop = logs.inputs.filter(pl.col("model") == model)["drop"].to_numpy().astype(np.float64)
    tau = defaults.TAU
    p_pop = float(np.mean(pop >= tau))
    c = _shift_for(pop, tau, p_pop + 0.15)
    rng = np.random.default_rng(43)
    runs = []
    for n_cal in args.n_calibration:
        null_alarm = null_p = null_d = 0
        for _ in range(args.null_reps):
            cal, d = rng.choice(pop, n_cal), rng.choice(pop, 2000)
            r = sequential_drift(cal, d, d >= tau, tau, alpha=args.alpha, rng=rng)
            null_alarm += r.first_alarm is not None
            null_p += r.p_open_alarm is not None
            null_d += r.drop_alarm is not None
        share = null_alarm / args.null_reps
        entry = {"n_calibration": n_cal, "no_drift": {
            "looks": 2000, "reps": args.null_reps, "share_any_alarm": share,
            "mc_se": float(np.sqrt(share * (1 - share) / args.null_reps)),
            "share_p_open_alarm": null_p / args.null_reps, "share_drop_alarm": null_d / args.null_reps}}
        for name, change in (("shift_from_start", 0), ("shift_after_1000", 1000)):
            firsts = {"any": [], "p_open": [], "drop": []}
            for _ in range(args.reps):
                cal = rng.choice(pop, n_cal)
                d = rng.choice(pop, args.stream)
                d[change:] += c
                r = sequential_drift(cal, d, d >= tau, tau, alpha=args.alpha, rng=rng)
                firsts["any"].append(r.first_alarm)
                firsts["p_open"].append(r.p_open_alarm)
                firsts["drop"].append(r.drop_alarm)
            entry[name] = {k: _summary(v, args.reps, change) for k, v in firsts.items()}
        runs.append(entry)
        print(entry, flush=True)
    result = {"commit": git_head(Path(__file__).resolve().parents[1]), "model": model, "population": int(pop.size),
              "tau": tau, "p_open_population": p_pop, "p_open_shifted": float(np.mean(pop + c >= tau)), "shift_c": c,
              "alpha": args.alpha, "reps": args.reps, "stream": args.stream, "runs": runs,
              "seconds": round(time.perf_counter() - t0, 1)}
    write_result("sequential_delay", result)


if __name__ == "__main__":
    main()
