"""Deploy the PAGE gate: a kvpress press (:class:`GatedPress`) and a generation wrapper without
kvpress (:func:`gated_generate`).

PAGE is "a training-free gating wrapper that applies any base evictor when D ≥ τ and retains the
full cache otherwise" (paper §1, §3). Both entry points compute D exactly as the collector logs it —
the window attention ā of :mod:`collectors.capture` (the collector's own capture, not a copy), the
top-k pair agreement a_ℓ and the drop D of :func:`collectors.signals.gate_signals` (Eq. 3) — and
evict only when D ≥ τ (Eq. 2), once per input, at prefill.

Submodules, in import order:

* :mod:`~collectors.deploy.decision` — the decision on one prefill (:class:`GateDecision`,
  :func:`gate_decision`), τ or a calibrated gate file, the short-prompt rule;
* :mod:`~collectors.deploy.log` — deployment logs (``log_dir=DIR``): a run of kind ``deployment``
  in the project's log schema (docs/SCHEMA.md, "Deployment runs"; :class:`DeploymentLog`,
  :func:`open_log`, :func:`deployment_manifest`); ``pagestats validate DIR`` checks one and
  ``pagestats monitor DIR --gate gate.json`` compares it with the calibration;
* :mod:`~collectors.deploy.press` — :class:`GatedPress`, the gate around any kvpress press
  (built on first use, so that the rest runs without kvpress);
* :mod:`~collectors.deploy.generate` — :func:`gated_generate`, the same gate over the built-in
  evictors, decoded as the collector decodes its arms.

References
----------
PAGE paper §1, §3 (gate, "Algorithm", Eq. 2; D, Eq. 3), App. A.3.4 (calibration), App. F (bins).
"""

from collectors.extras import require

require("collect", "collectors.deploy")  # one line naming the extra, before any import of torch

from collectors.deploy.decision import GateDecision, ShortPromptWarning, gate_decision  # noqa: E402
from collectors.deploy.generate import GenerationResult, gated_generate  # noqa: E402
from collectors.deploy.log import DeploymentLog, close_log, close_logs, deployment_manifest, open_log  # noqa: E402
from collectors.deploy.press import REFUSED_CALL_REASON, gated_press_class  # noqa: E402

__all__ = ["DeploymentLog", "GateDecision", "GatedPress", "GenerationResult", "gated_generate", "gate_decision",
           "REFUSED_CALL_REASON", "ShortPromptWarning", "close_log", "close_logs", "deployment_manifest", "open_log"]


def __getattr__(name):
    if name == "GatedPress":
        return gated_press_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
