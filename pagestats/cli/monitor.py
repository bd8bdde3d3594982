"""``pagestats monitor DIR --gate gate.json``: a deployed gate's log against its calibration, with one
warning line per drift kind (docs/CLI.md, "Monitor a deployed gate"; :func:`pagestats.deploy.monitor.monitor`)."""

from __future__ import annotations

import json
import os
import sys

from pagestats.cli.options import number
from pagestats.deploy.gatefile import Gate
from pagestats.io import LogError
from pagestats.io.deployment import is_deployment_dir
from pagestats.io.validation.problems import one_line
from pagestats.deploy.monitor import ALPHA, monitor, table_text


def add_parser(sub) -> None:
    """The ``pagestats monitor`` subparser."""
    p = sub.add_parser("monitor", help="compare a deployed gate's log (collectors.deploy log_dir) with its gate file: "
                       "p_open, compression, τ, and a KS test of D; one warning line per drift kind")
    p.add_argument("run", metavar="DIR", help="a deployment run: the log_dir of GatedPress / gated_generate")
    p.add_argument("--gate", required=True, metavar="FILE", help="the gate file the deployment was calibrated as "
                   "(`pagestats calibrate --out`)")
    p.add_argument("--alpha", type=number(0.0, 1.0, name="--alpha"), default=ALPHA,
                   help="level of the two-sample KS test of D against the calibration D, in (0, 1)")
    p.add_argument("--format", choices=["table", "json"], default="table", help="output on stdout")
    p.add_argument("--strict", action="store_true", help="exit 1 when a drift warning is printed (default: exit 0)")
    p.add_argument("--sequential", action="store_true",
                   help="anytime-valid drift tests (a confidence sequence for p_open, conformal test martingales of D): "
                   "P(any false alarm over every look at a growing log) <= --alpha; each drift names the input it was "
                   "first detected at (default: off, the fixed-sample Wilson and KS checks)")
    p.add_argument("--seed", type=number(0, 2**63 - 1, integer=True, name="--seed"), default=None,
                   help="seed of the sequential test's tie-breaking uniforms (with --sequential; default 0)")


def usage_problem(args) -> str | None:
    """``--seed`` without ``--sequential`` (:func:`run` checks ``--alpha`` and DIR)."""
    if args.seed is not None and not args.sequential:
        return "--seed applies to --sequential"
    return None


def _bad_deployment_line(err: LogError, run: str) -> str:
    """One line for a deployment log that breaks a rule: the count, the first three problems, and the
    ``pagestats validate`` command that lists them all."""
    shown = "; ".join(str(p) for p in err.problems[:3])
    more = f"; {len(err.problems) - 3} more" if len(err.problems) > 3 else ""
    return (f"error: {len(err.problems)} problem{'s' if len(err.problems) != 1 else ''} in the deployment log: "
            f"{shown}{more}; run `pagestats validate {run}` for the full list")


def run(args) -> int:
    """Exit 0, or 1 with ``--strict`` and a drift warning; 1 on bad logs; 2 on bad usage."""
    path = args.run
    if not 0.0 < args.alpha < 1.0:
        print(one_line(f"error: --alpha {args.alpha!r} is not in (0, 1)"), file=sys.stderr)
        return 2
    if not os.path.isdir(path):
        print(one_line(f"error: {path}: no such directory (monitor reads a deployment run, the log_dir of "
                       "collectors.deploy)"), file=sys.stderr)
        return 2
    if not is_deployment_dir(path):
        print(one_line(f"error: {path} is not a deployment run (no manifest.json whose kind is 'deployment'); "
                       "monitor reads the log_dir of collectors.deploy's GatedPress / gated_generate"), file=sys.stderr)
        return 2
    try:
        gate = Gate.from_file(args.gate)
    except ValueError as err:
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    try:
        report = monitor(path, gate, alpha=args.alpha, gate_file=args.gate, sequential=args.sequential,
                         seed=int(args.seed or 0))
    except LogError as err:
        print(one_line(_bad_deployment_line(err, path)), file=sys.stderr)
        return 1
    except ValueError as err:
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    if report.ks_pvalue is None:
        print(one_line(f"note: no input of {path} was decided by D (every prompt was shorter than w = "
                       f"{report.window}): p_open and the D test need one"), file=sys.stderr)
    for line in report.warnings:
        print(one_line(line), file=sys.stderr)
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2, allow_nan=False))
    else:
        print(table_text(report))
    if args.strict and report.warnings:
        n = len(report.warnings)
        print(one_line(f"error: --strict: {n} drift warning{'s' if n != 1 else ''} ({', '.join(report.drift)})"),
              file=sys.stderr)
        return 1
    return 0
