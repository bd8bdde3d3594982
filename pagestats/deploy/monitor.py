"""A deployed gate's log against its calibration (docs/CLI.md, "Monitor a deployed gate").

A gate calibrated offline (``pagestats calibrate``) evicts iff D ≥ τ (PAGE §3, Eq. 2). τ holds only
while the deployed traffic's D is distributed as the calibration inputs' D was: the z-scored policy
sets τ = μ + θ_z σ on an unlabelled pilot (App. A.3.4), and the rate at which the gate opens, p_open,
is what the memory saving rests on (App. A.6.2). :func:`monitor` reads a deployment run and its gate
file and reports:

* the inputs, and those shorter than the window w (the full cache kept whatever D is);
* p_open, the share of the inputs decided by D (T ≥ w) on which the gate opened, with its Wilson
  interval (:func:`pagestats.stats.wilson`), beside the calibration's p_open at the same τ — the
  share of the gate file's calibration D values ``pilot.drops`` with D ≥ τ — and its interval;
* the realized compression, 1 / the mean kept fraction over every input (a closed gate keeps 1;
  ``pagestats.metrics.compression``'s definition, App. A.6.2);
* the τ the deployment gated with against the gate file's, and whether it was this gate file;
* a two-sample Kolmogorov–Smirnov test of the deployed D (inputs decided by D) against the
  calibration D (:func:`scipy.stats.ks_2samp`, two-sided).

Drift warnings, one line per kind (:data:`DRIFT_KINDS`):

* ``tau`` — the deployment gated with another τ than the gate file's;
* ``p_open`` — the deployed and the calibration Wilson intervals (95 %) do not overlap: the rates
  differ beyond the sampling noise of both samples (a small deployment sample does not warn on its
  noise alone, which a bound around the calibration estimate alone would);
* ``drop`` — the KS p-value is below α (:data:`ALPHA`, ``--alpha``).

These two fixed-sample checks hold their level at one look; a deployment checked again and again
raises false alarms far above α. ``sequential=True`` (``pagestats monitor --sequential``) replaces
them with the anytime-valid tests of :func:`pagestats.stats.sequential.sequential_drift` over the
inputs in the order they were gated (``input_id``): a confidence sequence for p_open against the
calibration's interval and conformal test martingales of D against the calibration D, with
P(any false alarm, over every look at a growing log) ≤ α. Each warning names the input at which
the drift was first detected.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pagestats.core import formulas
from pagestats.core.escape import terminal
from pagestats.deploy.gatefile import Gate
from pagestats.io.deployment import DeploymentRun, read_deployment
from pagestats.io.validation.manifest import parse_bins
from pagestats.io.deployment import split_deployments

if TYPE_CHECKING:  # statsmodels and SciPy are imported by monitor() only: the CLI's other commands never load them
    from pagestats.stats import Interval
    from pagestats.stats.sequential import SequentialResult

__all__ = ["ALPHA", "DRIFT_KINDS", "MonitorReport", "monitor", "only_deployments", "table_text"]

#: Default level of the KS test of D against the calibration D (``--alpha``).
ALPHA = 0.01
#: The kinds of drift warning, in the order they are printed.
DRIFT_KINDS = ("tau", "p_open", "drop")


@dataclass(frozen=True)
class MonitorReport:
    """What :func:`monitor` found in one deployment run (fields as in the module docstring).

    ``warnings`` holds one line per drift kind found, ``drift`` the kinds.
    """

    run_dir: str
    run_id: str
    model: str
    gate_file: str | None
    n_inputs: int
    n_short: int
    n_open: int
    p_open: Interval
    p_open_calibration: Interval
    kept_fraction: float
    compression: float
    tau: float
    gate_tau: float
    gate_policy: str
    same_gate_file: bool | None
    window: int
    ks_statistic: float | None
    ks_pvalue: float | None
    n_calibration: int
    alpha: float
    warnings: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    sequential: "SequentialResult | None" = None
    first_detected: dict = field(default_factory=dict)

    @property
    def n_decided(self) -> int:
        """Inputs the gate decided by D (T ≥ w)."""
        return self.n_inputs - self.n_short

    def to_dict(self) -> dict:
        """Plain JSON values (``None`` where a quantity is undefined, never NaN)."""

        def interval(i: Interval) -> dict:
            return {"estimate": _number(i.estimate), "low": _number(i.low), "high": _number(i.high), "k": int(i.k),
                    "n": int(i.n), "confidence_level": i.confidence_level, "method": i.method}

        return {
            "run_dir": self.run_dir, "run_id": self.run_id, "model": self.model, "gate_file": self.gate_file,
            "n_inputs": self.n_inputs, "n_short": self.n_short, "n_decided": self.n_decided, "n_open": self.n_open,
            "p_open": interval(self.p_open), "p_open_calibration": interval(self.p_open_calibration),
            "kept_fraction": _number(self.kept_fraction), "compression": _number(self.compression),
            "tau": self.tau, "gate_tau": self.gate_tau, "gate_policy": self.gate_policy,
            "same_gate_file": self.same_gate_file, "window": self.window,
            "ks": {"statistic": self.ks_statistic, "pvalue": self.ks_pvalue, "n_deployment": self.n_decided,
                   "n_calibration": self.n_calibration, "alpha": self.alpha, "test": "scipy.stats.ks_2samp, two-sided"},
            "drift": list(self.drift), "warnings": list(self.warnings),
            **({} if self.sequential is None else {"sequential": {
                **{k: _number(v) if isinstance(v, float) else v for k, v in self.sequential.to_dict().items()},
                "first_detected_input_id": dict(self.first_detected)}}),
        }


def _number(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _overlap(a: Interval, b: Interval) -> bool:
    return bool(a.low <= b.high and b.low <= a.high)


def _interval_text(i: Interval) -> str:
    if not i.defined:
        return "undefined (0 inputs)"
    return f"{i.estimate:.3f} [{i.low:.3f}, {i.high:.3f}] ({int(i.k)} of {int(i.n)})"


def monitor(run, gate, *, alpha: float = ALPHA, gate_file: str | None = None, sequential: bool = False,
            seed: int = 0) -> MonitorReport:
    """Compare the deployment run ``run`` with the gate it was calibrated as (module docstring).

    Parameters
    ----------
    run : pagestats.io.deployment.DeploymentRun or path
        A deployment run (a path is read and checked by :func:`pagestats.io.deployment.read_deployment`).
    gate : pagestats.deploy.gatefile.Gate or path
        The gate file ``pagestats calibrate`` wrote; it must hold the calibration D values (``pilot.drops``).
    alpha : float
        Level of the KS test, in (0, 1).
    gate_file : str, optional
        The gate file's path, for the report (default: ``gate`` when it is a path).
    sequential : bool
        The p_open and D warnings from the anytime-valid tests (module docstring) instead of the
        fixed-sample ones; α is then the probability of any false alarm over all looks.
    seed : int
        Seed of the conformal p-values' tie-breaking uniforms (``sequential`` only).

    Returns
    -------
    MonitorReport

    Raises
    ------
    ValueError
        One line: a gate for another model, depth, w, k or bins (:meth:`Gate.check`), a gate file
        without calibration D values, or α outside (0, 1).
    pagestats.io.LogError
        The run breaks a rule of a deployment run.
    """
    from scipy.stats import ks_2samp

    from pagestats.stats import wilson

    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if not isinstance(gate, Gate):
        gate_file = os.fspath(gate) if gate_file is None else gate_file
        gate = Gate.from_file(gate)
    if not isinstance(run, DeploymentRun):
        run = read_deployment(run)
    manifest = run.manifest
    recorded = manifest["gate"]

    fraction, convention = parse_bins(recorded["bins"])
    gate.check(window=recorded["w"], k=recorded["k"], bin_fraction=fraction,
               convention=recorded.get("convention", convention), model=manifest["model"]["name"],
               n_layers=manifest["model"].get("n_layers"))
    calibration = gate.pilot.get("drops") if isinstance(gate.pilot, dict) else None
    if not isinstance(calibration, list) or not calibration:
        raise ValueError(f"{gate_file or 'the gate'}: the gate file holds no calibration D values (pilot.drops), "
                         "which the two-sample test needs; write it with `pagestats calibrate`")
    cal = np.asarray(calibration, dtype=np.float64)
    if not np.all(np.isfinite(cal)):
        raise ValueError(f"{gate_file or 'the gate'}: the calibration D values (pilot.drops) are not all finite")
    rows = run.rows
    tau = float(recorded["tau"])
    decided = rows.filter(rows["reason"] != "short-prompt")
    n_open = int(decided["gate_open"].sum())
    p_open = wilson(n_open, decided.height)
    p_cal = wilson(formulas.open_count(cal, tau), len(cal))  # D ≥ τ (Eq. 2) at the τ in use
    kept = float(rows["kept_fraction"].mean())
    drops = decided["drop"].to_numpy().astype(np.float64)
    ks = ks_2samp(drops, cal) if len(drops) else None
    same = None if recorded.get("sha256") is None else recorded["sha256"] == gate.sha256()
    report = dict(
        run_dir=run.dir, run_id=run.run_id, model=run.model, gate_file=gate_file, n_inputs=rows.height,
        n_short=rows.height - decided.height, n_open=n_open, p_open=p_open, p_open_calibration=p_cal,
        kept_fraction=kept, compression=1.0 / kept, tau=tau, gate_tau=float(gate.tau), gate_policy=gate.policy,
        same_gate_file=same, window=int(recorded["w"]),
        ks_statistic=None if ks is None else float(ks.statistic), ks_pvalue=None if ks is None else float(ks.pvalue),
        n_calibration=len(cal), alpha=float(alpha),
    )
    warnings, drift = [], []
    if tau != float(gate.tau):
        drift.append("tau")
        warnings.append(f"warning: drift tau: the deployment gated with τ = {tau!r}, the gate file's τ is "
                        f"{float(gate.tau)!r} ({gate.policy}); p_open is compared at the τ in use")
    seq, first = None, {}
    if sequential:
        from pagestats.stats.sequential import sequential_drift

        ordered = decided.sort("input_id")
        seq = sequential_drift(cal, ordered["drop"].to_numpy().astype(np.float64), ordered["gate_open"].to_numpy(),
                               tau, alpha=float(alpha), rng=np.random.default_rng(seed))
        ids = ordered["input_id"].to_list()
        first = {kind: int(ids[i]) for kind, i in (("p_open", seq.p_open_alarm), ("drop", seq.drop_alarm)) if i is not None}
        if "p_open" in first:
            drift.append("p_open")
            warnings.append(f"warning: drift p_open (sequential): first detected at input {first['p_open']} "
                            f"(after {seq.p_open_alarm + 1} inputs decided by D): the confidence sequence for the deployed "
                            f"p_open left the calibration's interval [{seq.calibration_low:.3f}, "
                            f"{seq.calibration_high:.3f}] at τ = {tau!r}; now {seq.p_open:.3f} "
                            f"[{seq.p_open_low:.3f}, {seq.p_open_high:.3f}] over {seq.n} inputs "
                            f"(any-look false-alarm probability ≤ α = {float(alpha):g})")
        if "drop" in first:
            drift.append("drop")
            side = "larger" if seq.drop_direction == "up" else "smaller"
            warnings.append(f"warning: drift drop (sequential): first detected at input {first['drop']} (after "
                            f"{seq.drop_alarm + 1} inputs decided by D): the deployed D runs {side} than the calibration D "
                            f"(conformal test martingale past 4/α; {seq.n} deployed vs {seq.n_calibration} "
                            f"calibration inputs): τ may no longer sit where it was calibrated (App. A.3.4)")
    elif p_open.defined and not _overlap(p_open, p_cal):
        level = round(100 * p_open.confidence_level)
        drift.append("p_open")
        warnings.append(f"warning: drift p_open: the gate opened on {_interval_text(p_open)} of the deployed inputs, "
                        f"on {_interval_text(p_cal)} of the calibration inputs at τ = {tau!r}; the {level} % Wilson "
                        f"intervals do not overlap (realized compression {1.0 / kept:.3g}×)")
    if not sequential and ks is not None and float(ks.pvalue) < float(alpha):
        drift.append("drop")
        warnings.append(f"warning: drift drop: the deployed D is not distributed as the calibration D (two-sample KS "
                        f"statistic {float(ks.statistic):.3f}, p = {float(ks.pvalue):.3g} < α = {float(alpha):g}; "
                        f"{len(drops)} deployed vs {len(cal)} calibration inputs, median D {np.median(drops):.4f} vs "
                        f"{np.median(cal):.4f}): τ may no longer sit where it was calibrated (App. A.3.4)")
    return MonitorReport(**report, warnings=[terminal(w) for w in warnings], drift=drift, sequential=seq,
                         first_detected=first)


def table_text(report: MonitorReport) -> str:
    """The human table of ``pagestats monitor`` (one quantity per line)."""
    same = {True: "this gate file", False: "another gate file", None: "no gate file recorded"}[report.same_gate_file]
    ks = ("not run (no input decided by D)" if report.ks_pvalue is None else
          f"KS statistic {report.ks_statistic:.3f}, p = {report.ks_pvalue:.3g} ({report.n_decided} deployed vs "
          f"{report.n_calibration} calibration inputs; α = {report.alpha:g})")
    rows = [
        ("deployment run", f"{report.run_id} ({report.run_dir})"),
        ("model", report.model),
        ("inputs", f"{report.n_inputs} ({report.n_short} shorter than w = {report.window}: full cache kept)"),
        ("tau", f"{report.tau!r} in use; gate file {report.gate_tau!r} ({report.gate_policy}); deployed with {same}"),
        ("p_open", _interval_text(report.p_open) + " of the inputs decided by D"),
        ("p_open calibration", _interval_text(report.p_open_calibration) + " at the τ in use"),
        ("compression", f"{report.compression:.4g}× (mean kept fraction {report.kept_fraction:.4f})"),
        ("D vs calibration", ks),
        ("drift", ", ".join(report.drift) or "none"),
    ]
    if report.sequential is not None:
        s = report.sequential
        found = ", ".join(f"{k} at input {v}" for k, v in report.first_detected.items()) or "none"
        rows[-1:-1] = [("sequential p_open", f"{s.p_open:.3f}, confidence sequence [{s.p_open_low:.3f}, "
                        f"{s.p_open_high:.3f}] vs calibration [{s.calibration_low:.3f}, {s.calibration_high:.3f}]"),
                       ("sequential D", f"max log martingale up {s.max_log_martingale_up:.2f}, down "
                        f"{s.max_log_martingale_down:.2f} (alarm at {np.log(4 / s.alpha):.2f})"),
                       ("first detected", f"{found} (any-look false-alarm probability ≤ α = {s.alpha:g})")]
    width = max(len(name) for name, _ in rows)
    return "\n".join(terminal(f"{name:<{width}}  {value}") for name, value in rows)


def only_deployments(paths) -> bool:
    """Whether ``paths`` name deployment runs and nothing else (``pagestats validate`` then checks them
    as such, :func:`pagestats.io.deployment.check_deployment`; logs that mix them with collection runs are
    checked by :func:`pagestats.io.validate.checked_runs`)."""

    kept, dirs = split_deployments(paths)
    return bool(dirs) and not kept
