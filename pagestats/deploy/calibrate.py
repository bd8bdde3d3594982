"""The gate that ``whatif`` replays, frozen into a ``gate.json``.

The gate evicts iff D ≥ τ (PAGE §3, Eq. 2). τ is computed by the very policy object and SQL ``whatif``
uses (τ = μ + θ_z σ on an unlabelled pilot, App. A.3.4; Eq. 5), so a deployed gate's τ is the one
``whatif`` used. The file records what τ depends on: the model, D's window w, k, bin fraction and
convention (the manifests must agree), what set τ, the calibration D values, and a sha256 over the
logs' data files.
"""

from __future__ import annotations

import datetime as _dt
import hashlib

import numpy as np
import polars as pl

from pagestats.deploy.gatefile import Gate
from pagestats.core.registry import deployable
from pagestats.replay.calibration import calibration


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


class ModelChoiceError(ValueError):
    """The logs hold several models and :func:`calibrate` was given none (a gate is for one model)."""

    def __init__(self, models: list[str]):
        self.models = list(models)
        super().__init__(f"calibrate: the logs hold {len(self.models)} models ({', '.join(self.models)}); "
                         "choose one")


class ThresholdCountError(ValueError):
    """The policy gives the model other than one τ (a pilot grouped finer than the model): a deployed
    gate has one."""

    def __init__(self, policy: str, model: str, taus: list[float]):
        self.policy, self.model, self.taus = policy, model, sorted(taus)
        super().__init__(f"calibrate: policy {policy} gives {len(taus)} thresholds for model {model!r} "
                         f"({', '.join(f'{t:.6g}' for t in self.taus)}); a deployed gate has one: calibrate "
                         "per model (a pilot pooled per model) or on one context")


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


def _prompt_style(manifests: dict) -> str:
    styles = {m.get("prompt_style", "ruler") for m in manifests.values()}  # runs before the option: RULER's prompt
    if len(styles) != 1:
        raise ValueError(f"calibrate: the runs record different prompt styles {sorted(styles)}; D differs between "
                         "them, so calibrate one style at a time")
    return styles.pop()


def _model_source(manifests: dict):
    sources = {(m.get("model") or {}).get("source") for m in manifests.values()}
    return sources.pop() if len(sources) == 1 else None


def calibrate(logs, policy, *, model: str | None = None, files=None) -> Gate:
    """The gate of ``policy`` on ``logs`` (a :class:`pagestats.io.Logs`), for one model.

    Parameters
    ----------
    logs : pagestats.io.Logs
        Validated logs.
    policy : pagestats.replay.Policy
        A policy a gate file holds (:func:`pagestats.core.registry.deployable`).
    model : str, optional
        The model to calibrate for; required when the logs hold several.
    files : sequence of paths, optional
        The data files to hash (default: the logs' file records).

    Returns
    -------
    Gate
        ``pilot`` holds what set τ as the policy's SQL computed it (:meth:`pagestats.replay.Policy.record`:
        μ and σ of a z-scored pilot, the class means of Eq. 5), so that τ is recomputed from them exactly.

    Raises
    ------
    ModelChoiceError
        Several models and none chosen.
    ThresholdCountError
        A τ that is not one number for the model (a z pilot grouped finer than the model: calibrate
        with ``pilot_by=("model",)``).
    ValueError
        One line: an unknown model, a policy without a threshold, or statistics that differ between runs.
    """
    if policy.short not in deployable():
        raise ValueError(f"calibrate: policy {policy.name!r} has no threshold a gate file holds; use "
                         f"{', '.join(deployable())}")
    inputs = logs.inputs
    models = sorted(inputs["model"].unique().to_list())
    if model is None:
        if len(models) != 1:
            raise ModelChoiceError(models)
        model = models[0]
    elif model not in models:
        raise ValueError(f"calibrate: no inputs of model {model!r} in the logs (they hold {', '.join(models)})")
    runs = inputs.filter(pl.col("model") == model)["run_id"].unique().to_list()
    manifests = {r: logs.manifests[r] for r in runs if r in logs.manifests}
    statistic = _statistic(manifests)
    decided, groups = calibration(policy, inputs)  # on all the inputs, as whatif runs it
    rows = decided.filter(pl.col("model") == model)
    taus = rows["tau"].drop_nulls().unique().to_list()
    if len(taus) != 1:
        raise ThresholdCountError(policy.name, model, taus)
    tau = float(taus[0])
    drops = rows["drop"].to_numpy().astype(float)
    pilot: dict = {"drops": [float(d) for d in drops], "p_open": float(np.mean(drops >= tau)), "n_inputs": int(len(drops)),
                   "policy_name": policy.name}
    for group, recorded in groups:
        if group.get("model", model) == model:
            pilot.update(recorded)
    file_paths = files if files is not None else [f.path for f in logs.files]
    return Gate(tau=tau, policy=policy.short, model=model, n_layers=_n_layers(manifests), pilot=pilot,
                logs_sha256=logs_sha256(file_paths), mode=logs.mode,
                prompt_style=_prompt_style(manifests), model_source=_model_source(manifests),
                created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **statistic)
