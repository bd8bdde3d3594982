"""``pagestats calibrate LOGS --policy risk --alpha A --delta D --budget B [--evictor E] --out gate.json``:
τ certified by Learn then Test on the held-out pilot (:func:`pagestats.deploy.risk.risk_gate`; docs/STATISTICS.md)."""

from __future__ import annotations

import sys

from pagestats.core import defaults
from pagestats.cli.logs import exclusion_line
from pagestats.cli.options import number
from pagestats.core.registry import POLICIES, labelled
from pagestats.io import ExclusionError, LogError, load
from pagestats.io.validation.problems import one_line

#: The options only a policy certified on harm labels reads (:data:`pagestats.core.registry.Entry.harm_labels`).
RISK_OPTIONS = ("alpha", "delta", "budget", "evictor")


def reads_harm_labels(args) -> bool:
    """Whether ``--policy`` names a policy whose τ is certified on harm labels (the registry says so)."""
    return POLICIES[args.policy or "fixed"].harm_labels


def add_risk_options(p) -> None:
    """``--alpha``, ``--delta``, ``--budget``, ``--evictor`` of ``--policy risk``."""
    g = p.add_argument_group("risk policy (--policy risk)")
    g.add_argument("--alpha", type=number(0.0, 1.0, name="--alpha"), default=None,
                   help="A: the harm rate at --budget the gate may reach, in (0, 1) (no default: required by --policy risk)")
    g.add_argument("--delta", type=number(0.0, 1.0, name="--delta"), default=None,
                   help="δ: the probability allowed that the certified τ's harm exceeds A, in (0, 1) (no default: required by "
                   "--policy risk)")
    g.add_argument("--budget", type=number(0.0, 1.0, name="--budget"), default=None,
                   help="b: the eviction budget the harm is measured at, a logged budget < 1 (no default: required by "
                   "--policy risk)")
    g.add_argument("--evictor", default=None,
                   help="the evictor the deployment runs (default: the logs' only evictor; required when they hold several)")


def risk_usage_problem(args) -> str | None:
    """The harm options without a policy that reads them, or such a policy without them, or a value on an edge."""
    given = [f"--{o}" for o in RISK_OPTIONS if getattr(args, o, None) is not None]
    if not reads_harm_labels(args):
        readers = " or ".join(f"--policy {n}" for n in labelled())
        return f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to {readers}" if given else None
    missing = [f"--{o}" for o in RISK_OPTIONS[:3] if getattr(args, o, None) is None]
    if missing:
        return f"--policy {args.policy} needs {', '.join(missing)}"
    for o in ("alpha", "delta"):
        if not 0.0 < getattr(args, o) < 1.0:
            return f"--{o} {getattr(args, o)!r} is not in (0, 1)"
    if not 0.0 < args.budget < 1.0:
        return f"--budget {args.budget!r} is not an eviction budget in (0, 1)"
    if getattr(args, "theta", None) is not None or getattr(args, "midpoint_tasks", None) is not None:
        return f"--theta and --midpoint-tasks apply to --policy z and midpoint, not {args.policy}"
    if getattr(args, "pilot_split", None) not in (None, "held-out"):
        return f"--policy {args.policy} calibrates on the held-out pilot; --pilot-split must be held-out"
    return None


def load_logs(args):
    """The logs of ``calibrate`` (its LOGS, of its ``--mode``), or the exit code after one line on stderr:
    2 for an exclusion that matches nothing, 1 for bad logs."""
    try:
        return load(args.logs, mode=args.mode)
    except ExclusionError as err:
        print(exclusion_line(err), file=sys.stderr)
        return 2
    except LogError as err:
        print(one_line(f"error: bad logs: {'; '.join(p.message for p in err.problems[:3])}"), file=sys.stderr)
        return 1


def run_risk(args) -> int:
    """Exit 0 with the gate written (also when no τ is certified: the gate then never opens, said on
    stderr), 1 on bad logs, 2 on bad usage."""
    from pagestats.deploy.risk import risk_gate

    logs = load_logs(args)
    if isinstance(logs, int):
        return logs
    try:
        gate = risk_gate(logs, harm_bound=args.alpha, delta=args.delta, budget=args.budget, evictor=args.evictor,
                         model=args.model, pilot_n=int(args.pilot_n or defaults.PILOT_N), seed=int(args.seed or 0))
        gate.write(args.out)
    except (ValueError, OSError) as err:
        text = str(err).replace("choose one", "choose one with --model").replace(
            "choose the one the deployment runs", "choose one with --evictor")
        print(one_line(f"error: calibrate: {text}"), file=sys.stderr)
        return 2
    p, cert = gate.pilot, gate.pilot["certificate"]
    gone = p["left_out"]
    if gone["no_outcome"] or gone["unknown_full"]:
        print(one_line(f"note: calibrate: the pilot is drawn from the inputs whose harm is known: left out "
                       f"{gone['no_outcome']} without a {p['evictor']} outcome at b = {p['budget']:g} and "
                       f"{gone['unknown_full']} without a full-KV outcome"), file=sys.stderr)
    where = f"{p['evictor']} at b = {p['budget']:g}, A = {p['harm_bound']:g}, δ = {p['delta']:g}, n = {p['n']} held-out pilot inputs"
    if not p["certified"]:
        print(one_line(f"gate: no τ certified ({where}): even the highest D, {cert['stopped_at']!r}, has p = "
                       f"{cert['stopped_p_value']:.3g} > δ; the gate never opens (τ = {gate.tau!r}); written to {args.out}"),
              file=sys.stderr)
        return 0
    print(one_line(f"gate: τ = {gate.tau!r} (risk, {where}) for model {gate.model}: calibration harm {p['observed_harm']:.3f} "
                   f"({cert['n_harmed']} of {p['n']}), p = {cert['p_value']:.3g} ≤ δ, p_open {p['p_open']:.3f}; "
                   f"{cert['n_rejected']} of {cert['n_candidates']} candidates rejected; written to {args.out}"),
          file=sys.stderr)
    return 0
