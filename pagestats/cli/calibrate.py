"""``pagestats calibrate LOGS --policy NAME ... --out gate.json``: freeze the gate that ``whatif`` replays
into a gate file (docs/CLI.md)."""

from __future__ import annotations

import sys

from pagestats.core import defaults
from pagestats.deploy.calibrate import ModelChoiceError, ThresholdCountError, calibrate
from pagestats.cli.calibrate_risk import add_risk_options, load_logs, reads_harm_labels, risk_usage_problem, run_risk
from pagestats.cli.options import MAX_PILOT, MAX_SEED, add_midpoint_tasks, add_mode, number, policy_from_args
from pagestats.io.validation.problems import one_line
from pagestats.core.registry import deployable
from pagestats.replay.pilot import PILOT_SPLITS


def add_parser(sub) -> None:
    """The ``pagestats calibrate`` subparser."""
    p = sub.add_parser("calibrate", help="freeze the gate of a whatif policy into gate.json for GatedPress")
    p.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    p.add_argument("--out", required=True, metavar="FILE", help="the gate file to write (gate.json)")
    p.add_argument("--model", default=None, help="the model to calibrate for (default: the logs' only model; required when they hold several)")
    add_mode(p)  # the gate records it; a deployment in the other mode is refused (collectors.deploy)
    pol = p.add_mutually_exclusive_group()
    pol.add_argument("--tau", type=number(-1.0, 1.0, name="--tau"), help=f"fixed threshold τ (default: {defaults.TAU})")
    pol.add_argument("--policy", choices=deployable(),
                     help="gate policy (default: fixed, τ = 0.07); risk: τ certified by Learn then Test on the "
                     "held-out pilot (harm at --budget ≤ --alpha with probability ≥ 1 − --delta)")
    p.add_argument("--theta", type=number(-1e3, 1e3, name="--theta"), default=None,
                   help=f"θ_z of the z-scored policy (default: {defaults.THETA_Z})")
    add_midpoint_tasks(p)
    p.add_argument("--pilot-n", type=number(1, MAX_PILOT, integer=True, name="--pilot-n"), default=None,
                   help=f"pilot size (default {defaults.PILOT_N})")
    p.add_argument("--pilot-split", choices=list(PILOT_SPLITS), default=None,
                   help=f"which inputs form the pilot (default {defaults.PILOT_SPLIT})")
    p.add_argument("--seed", type=number(0, MAX_SEED, integer=True, name="--seed"), default=None,
                   help="seed of the pilot hash (default: 0)")
    add_risk_options(p)


def usage_problem(args) -> str | None:
    """The risk policy's options go together (the other policies are parsed by :func:`run`)."""
    return risk_usage_problem(args)


def _calibration_error(err: Exception) -> str:
    """The error line of a gate that cannot be calibrated, in the command's options."""
    if isinstance(err, ModelChoiceError):
        return (f"error: calibrate: the logs hold {len(err.models)} models ({', '.join(err.models)}); "
                "choose one with --model")
    if isinstance(err, ThresholdCountError):
        return (f"error: calibrate: policy {err.policy} gives {len(err.taus)} thresholds for model {err.model!r} "
                f"({', '.join(f'{t:.6g}' for t in err.taus)}); a deployed gate has one: "
                "calibrate on the logs of one context length")
    return f"error: {err}"


def run(args) -> int:
    """Exit 0 with the gate written, 1 on bad logs, 2 on bad usage."""
    if reads_harm_labels(args):
        return run_risk(args)
    try:
        policy = policy_from_args(args)
    except ValueError as err:
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    logs = load_logs(args)
    if isinstance(logs, int):
        return logs
    try:
        gate = calibrate(logs, policy, model=args.model)
        gate.write(args.out)
    except (ValueError, OSError) as err:
        print(one_line(_calibration_error(err)), file=sys.stderr)
        return 2
    print(one_line(f"gate: τ = {gate.tau!r} ({policy.name}) for model {gate.model}, w={gate.window}, k={gate.k}, "
                   f"bins={gate.bin_fraction:.6g} {gate.convention}; p_open {gate.pilot['p_open']:.3f} on "
                   f"{gate.pilot['n_inputs']} inputs; written to {args.out}"), file=sys.stderr)
    return 0
