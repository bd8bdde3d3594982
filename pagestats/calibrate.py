"""``pagestats calibrate``: freeze the gate that ``whatif`` replays into a ``gate.json``.

The gate evicts iff D ≥ τ (PAGE §3, Eq. 2). τ is computed by the very policy object ``whatif`` uses
(:mod:`pagestats.replay.policies`: ``FixedTau``, ``ZScored`` — τ = μ + θ_z σ on an unlabelled pilot,
App. A.3.4 —, ``Midpoint`` — Eq. 5), on the validated inputs of the logs (:func:`pagestats.io.load.load`),
so the τ a deployed :class:`collectors.deploy.GatedPress` uses is the one ``whatif`` used for the same
policy. The file records what τ depends on (:class:`pagestats.gatefile.Gate`): the model, D's window
w, k, bin fraction and convention (read from the manifests, which must agree), the pilot's μ and σ
for ``z``, the class means for ``midpoint``, the calibration D values (for ``pagestats monitor``),
and a sha256 over the logs' data files.
"""

from __future__ import annotations

import datetime as _dt
import hashlib

import numpy as np
import polars as pl

from pagestats.gatefile import Gate


def logs_sha256(files) -> str:
    """sha256 over the logs' data files, in path order: each file's path-independent content digest."""
    digest = hashlib.sha256()
    for path in sorted(str(f) for f in files):
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        digest.update(h.digest())
    return digest.hexdigest()


def _statistic(manifests: dict) -> dict:
    stats = {}
    for run_id, manifest in manifests.items():
        gate = manifest.get("gate") or {}
        stats[run_id] = (gate.get("w"), gate.get("k"), gate.get("bins"), gate.get("convention"))
    distinct = set(stats.values())
    if len(distinct) != 1 or None in next(iter(distinct)):
        raise ValueError(f"calibrate: the runs record different or missing gate statistics (w, k, bins, convention): "
                         f"{sorted(map(str, distinct))}; calibrate one statistic at a time")
    w, k, bins, convention = distinct.pop()
    return {"window": int(w), "k": int(k), "bin_fraction": float(bins), "convention": str(convention)}


def _n_layers(manifests: dict):
    layers = {(m.get("model") or {}).get("n_layers") for m in manifests.values()}
    return int(layers.pop()) if len(layers) == 1 and None not in layers else None


def calibrate(logs, policy, *, model: str | None = None, files=None) -> Gate:
    """The gate of ``policy`` on ``logs`` (a :class:`pagestats.io.load.Logs`), for one model.

    Parameters
    ----------
    logs : pagestats.io.load.Logs
        Validated logs.
    policy : FixedTau, ZScored or Midpoint
        As ``pagestats whatif`` builds it (:func:`pagestats.cli.policy_from_args`).
    model : str, optional
        The model to calibrate for; required when the logs hold several.
    files : sequence of paths, optional
        The data files to hash (default: the logs' file records).

    Returns
    -------
    Gate

    Raises
    ------
    ValueError
        One line: several models and none chosen, an unknown model, a policy without a threshold,
        statistics that differ between runs, or a τ that is not one number for the model (a z or
        midpoint pilot grouped finer than the model: calibrate with ``--pilot-by model``).
    """
    from pagestats.replay.policies import FixedTau, Midpoint, ZScored

    kinds = {FixedTau: "fixed", ZScored: "z", Midpoint: "midpoint"}
    if type(policy) not in kinds:
        raise ValueError(f"calibrate: policy {getattr(policy, 'name', policy)!r} has no threshold; use fixed, z or midpoint")
    inputs = logs.inputs
    models = sorted(inputs["model"].unique().to_list())
    if model is None:
        if len(models) != 1:
            raise ValueError(f"calibrate: the logs hold {len(models)} models ({', '.join(models)}); choose one with --model")
        model = models[0]
    elif model not in models:
        raise ValueError(f"calibrate: no inputs of model {model!r} in the logs (they hold {', '.join(models)})")
    runs = inputs.filter(pl.col("model") == model)["run_id"].unique().to_list()
    manifests = {r: logs.manifests[r] for r in runs if r in logs.manifests}
    statistic = _statistic(manifests)
    decided = policy.decide(inputs)  # on all the inputs, as whatif runs it
    rows = decided.filter(pl.col("model") == model)
    taus = rows["tau"].drop_nulls().unique().to_list()
    if len(taus) != 1:
        raise ValueError(f"calibrate: policy {policy.name} gives {len(taus)} thresholds for model {model!r} "
                         f"({', '.join(f'{t:.6g}' for t in sorted(taus))}); a deployed gate has one: "
                         "calibrate per model (--pilot-by model) or on one context")
    tau = float(taus[0])
    drops = rows["drop"].to_numpy().astype(float)
    pilot: dict = {"drops": [float(d) for d in drops], "p_open": float(np.mean(drops >= tau)), "n_inputs": int(len(drops)),
                   "policy_name": policy.name}
    if isinstance(policy, ZScored):
        from pagestats.replay.pilot import pilot_mask

        mask = pilot_mask(rows, policy.pilot_by, policy.pilot_n, policy.pilot, policy.seed)
        sample = rows.filter(mask)["drop"].to_numpy().astype(float)
        pilot.update({"mu": float(sample.mean()), "sigma": float(sample.std(ddof=1)), "theta": float(policy.theta_z),
                      "n": int(len(sample)), "split": policy.pilot, "seed": int(policy.seed)})
    if isinstance(policy, Midpoint):  # the two sample means of Eq. 5, from the policy's own pilot flags
        from pagestats import defaults

        sample = rows.filter(pl.col("pilot"))
        capacity = (pl.col("task").is_in(list(policy.capacity_tasks)) if policy.capacity_tasks is not None
                    else pl.col("task_class") == defaults.CAPACITY_BOUND)
        cap, dil = sample.filter(capacity), sample.filter(~capacity)
        pilot.update({"capacity_mean": float(cap["drop"].mean()), "dilution_mean": float(dil["drop"].mean()),
                      "n_capacity": cap.height, "n_dilution": dil.height,
                      "tasks": {"capacity": sorted(cap["task"].unique().to_list()),
                                "dilution": sorted(dil["task"].unique().to_list())}})
    file_paths = files if files is not None else [f.path for f in logs.files]
    return Gate(tau=tau, policy=kinds[type(policy)], model=model, n_layers=_n_layers(manifests), pilot=pilot,
                logs_sha256=logs_sha256(file_paths),
                created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **statistic)


# --------------------------------------------------------------------------- command line

def add_parser(sub) -> None:
    """The ``pagestats calibrate LOGS --policy fixed|z|midpoint ... --out gate.json`` subparser (docs/CLI.md)."""
    from pagestats import defaults
    from pagestats.cli import MAX_PILOT, MAX_SEED, add_midpoint_tasks, number
    from pagestats.replay.pilot import PILOT_SPLITS

    p = sub.add_parser("calibrate", help="freeze the gate of a whatif policy into gate.json for GatedPress")
    p.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    p.add_argument("--out", required=True, metavar="FILE", help="the gate file to write (gate.json)")
    p.add_argument("--model", default=None, help="the model to calibrate for (default: the logs' only model; required when they hold several)")
    pol = p.add_mutually_exclusive_group()
    pol.add_argument("--tau", type=number(-1.0, 1.0, name="--tau"), help=f"fixed threshold τ (default: {defaults.TAU})")
    pol.add_argument("--policy", choices=["fixed", "z", "midpoint"], help="gate policy (default: fixed, τ = 0.07)")
    p.add_argument("--theta", type=number(-1e3, 1e3, name="--theta"), default=None,
                   help=f"θ_z of the z-scored policy (default: {defaults.THETA_Z})")
    add_midpoint_tasks(p)
    p.add_argument("--pilot", type=number(1, MAX_PILOT, integer=True, name="--pilot"), default=None,
                   help=f"pilot size (default {defaults.PILOT_N})")
    p.add_argument("--pilot-split", choices=list(PILOT_SPLITS), default=None,
                   help=f"which inputs form the pilot (default {defaults.PILOT_SPLIT})")
    p.add_argument("--seed", type=number(0, MAX_SEED, integer=True, name="--seed"), default=None,
                   help="seed of the pilot hash (default: 0)")


def main(args) -> int:
    """Run ``pagestats calibrate``: exit 0 with the gate written, 1 on bad logs, 2 on bad usage."""
    import sys

    from pagestats.cli import one_line, policy_from_args
    from pagestats.io import ExclusionError, LogError, load

    try:
        policy = policy_from_args(args)
    except ValueError as err:
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    try:
        logs = load(args.logs)
    except ExclusionError as err:
        print(one_line(f"error: {'; '.join(p.message for p in err.problems)}"), file=sys.stderr)
        return 2
    except LogError as err:
        print(one_line(f"error: bad logs: {'; '.join(p.message for p in err.problems[:3])}"), file=sys.stderr)
        return 1
    try:
        gate = calibrate(logs, policy, model=args.model)
        gate.write(args.out)
    except (ValueError, OSError) as err:
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    print(one_line(f"gate: τ = {gate.tau!r} ({policy.name}) for model {gate.model}, w={gate.window}, k={gate.k}, "
                   f"bins={gate.bin_fraction:.6g} {gate.convention}; p_open {gate.pilot['p_open']:.3f} on "
                   f"{gate.pilot['n_inputs']} inputs; written to {args.out}"), file=sys.stderr)
    return 0
