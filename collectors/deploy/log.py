"""Deployment logs: one row per input served under the gate, a run of kind ``deployment``.

``log_dir=DIR`` (both entry points of :mod:`collectors.deploy`) appends one row per input to DIR, a
run of kind ``deployment`` in the project's log schema (docs/SCHEMA.md, "Deployment runs";
:class:`DeploymentLog`): D, a_ℓ, τ and the decision, T, the kept KV, and for ``gated_generate`` the
decode's length and stop reason and, with ``log_text=True``, the text. ``GatedPress`` logs at the
prefill, where the decision is taken; kvpress decodes after the press (its pipeline outside the
press's context), so the press has no text to log. ``pagestats validate DIR`` checks the log and
``pagestats monitor DIR --gate gate.json`` compares it with the calibration.
"""

from __future__ import annotations

import functools
import os
import threading

import numpy as np

from collectors import hf
from collectors.capture import CAPTURE_PREFIX
from collectors.deploy.decision import GateDecision
from collectors.writer import RunWriter, run_id_for, software_versions
from pagestats.core import schema


#: The lock a process holds on a ``log_dir`` while it appends to it (one writing process per log_dir).
LOG_LOCK = ".deployment.lock"


class DeploymentLog:
    """The log of one deployed gate: a run of kind ``deployment`` (docs/SCHEMA.md, "Deployment runs")
    in ``log_dir``, one row per input, appended by :class:`GatedPress` and :func:`gated_generate`.

    The rows are those of :data:`pagestats.core.schema.DEPLOYMENT` — D (Eq. 3), a_ℓ, τ and the decision
    (Eq. 2), T, the kept KV, and for :func:`gated_generate` the decode's length and stop reason (and
    the text with ``log_text``) — with no counterfactual arm: a deployed input is decoded once, so it
    has no outcomes and no full-KV score. They are written by :class:`collectors.writer.RunWriter`
    (``kind="deployment"``): each part to a temporary name and renamed, the manifest rewritten
    atomically after each part. A process holds ``log_dir/.deployment.lock`` while it appends, and a
    second one is refused; a later process appending to the same ``log_dir`` with the same gate,
    model and evictor continues the numbering (``input_id`` 0, 1, 2, …) and never rewrites a part,
    and one with another gate, model or evictor is refused (its run id differs), so a log is one gate's.

    Open one with :func:`open_log`; the entry points do so when given ``log_dir``.
    """

    def __init__(self, log_dir, manifest: dict, *, part_size: int = 1):
        import fcntl

        if isinstance(part_size, bool) or not isinstance(part_size, int) or part_size < 1:
            raise ValueError(f"log_part_size must be a positive int, got {part_size!r}")
        self.log_dir = os.path.abspath(os.fspath(log_dir))
        if os.path.exists(self.log_dir) and not os.path.isdir(self.log_dir):
            raise ValueError(f"log_dir {self.log_dir} is a file, not a folder")
        os.makedirs(self.log_dir, exist_ok=True)
        self._lock = open(os.path.join(self.log_dir, LOG_LOCK), "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise ValueError(f"log_dir {self.log_dir} is being appended to by another process; one process "
                             "appends to a log_dir at a time: give each its own") from None
        try:
            self.writer = RunWriter(self.log_dir, manifest, part_size=part_size, topk=False,
                                    kind=schema.DEPLOYMENT_KIND)
            done = self.writer.open()
        except BaseException:
            self._release()
            raise
        self.run_id = manifest["run_id"]
        self.model_name = manifest["model"]["name"]
        self.next_id = max((key[0] for key in done), default=-1) + 1
        self._appending = threading.Lock()  # threads of one server share the log: one row at a time

    def append(self, decision: GateDecision, *, text: str | None = None, n_generated: int | None = None,
               stop_reason: str | None = None) -> int:
        """Log one input's decision (and its decode, when known); returns its ``input_id``."""
        with self._appending:
            return self._append(decision, text, n_generated, stop_reason)

    def _append(self, decision, text, n_generated, stop_reason) -> int:
        import datetime as _dt

        if self.writer is None:
            raise ValueError(f"the deployment log {self.log_dir} is closed")
        row = {
            "run_id": self.run_id, "model": self.model_name, "input_id": self.next_id,
            "n_tokens": int(decision.n_tokens), "drop": float(decision.drop),
            "agreement": [float(a) for a in np.asarray(decision.agreement, dtype=np.float32)],
            "tau": float(decision.tau), "gate_open": bool(decision.gate_open), "reason": decision.reason,
            "n_kept": int(decision.n_kept), "kept_fraction": float(decision.kept_fraction),
            "gate_ms": float(decision.gate_ms),
            "logged_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds"),
        }
        if decision.signals:
            row["signals"] = {name: float(value) for name, value in decision.signals.items()}
        row["prediction"] = None if text is None else str(text)  # null where not logged or not known (GatedPress)
        row["n_generated"] = None if n_generated is None else int(n_generated)
        row["stop_reason"] = None if stop_reason is None else str(stop_reason)
        self.writer.add({"inputs": [row]})
        self.next_id += 1
        return row["input_id"]

    def close(self) -> None:
        """Write the buffered rows, the manifest, and release ``log_dir``."""
        with self._appending:
            if self.writer is None:
                return
            try:
                self.writer.close()
            finally:
                self.writer = None
                self._release()

    def _release(self) -> None:
        import fcntl

        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()


#: log_dir (absolute) → the open DeploymentLog of this process.
_LOGS: dict[str, DeploymentLog] = {}
_AT_EXIT: list = []  # close_logs, once registered


def open_log(log_dir, manifest: dict, *, part_size: int = 1) -> DeploymentLog:
    """The :class:`DeploymentLog` of ``log_dir`` for the run ``manifest`` describes, opened once per
    process (closed at exit, or by :func:`close_log`); a log_dir already open for another run id is
    refused with one line."""
    import atexit

    key = os.path.abspath(os.fspath(log_dir))
    log = _LOGS.get(key)
    if log is not None:
        if log.run_id != manifest["run_id"]:
            raise ValueError(f"log_dir {key} is open for another deployment (run {log.run_id}) in this process: "
                             "a log holds one gate, model and evictor; give this one its own log_dir")
        return log
    if not _AT_EXIT:
        _AT_EXIT.append(atexit.register(close_logs))
    log = _LOGS[key] = DeploymentLog(key, manifest, part_size=part_size)
    return log


def close_log(log_dir) -> None:
    """Flush and release the deployment log of ``log_dir`` (a later append opens it again)."""
    log = _LOGS.pop(os.path.abspath(os.fspath(log_dir)), None)
    if log is not None:
        log.close()


def close_logs() -> None:
    """Flush and release every deployment log of this process (run at exit)."""
    for key in list(_LOGS):
        close_log(key)


def _model_block(model, name: str) -> dict:
    """The manifest's ``model`` entry of a deployed model (docs/SCHEMA.md), from its config."""
    config = hf.text_config(model.config)
    n_heads = int(config.num_attention_heads)
    attn = str(hf.attn_implementation(model))
    dtype = str(getattr(model, "dtype", "")).replace("torch.", "")
    return {
        "name": name, "revision": hf.revision(model.config),
        "n_layers": int(config.num_hidden_layers),
        "n_heads": n_heads, "n_kv_heads": int(getattr(config, "num_key_value_heads", None) or n_heads),
        "head_dim": int(getattr(config, "head_dim", None) or config.hidden_size // n_heads), "dtype": dtype,
        "attn_impl": attn[len(CAPTURE_PREFIX):] if attn.startswith(CAPTURE_PREFIX) else attn,
    }


@functools.cache
def _software() -> dict:
    return software_versions()


def deployment_manifest(model, *, model_name, tau: float, gate, window: int, k: int, bin_fraction: float,
                        convention: str, entry: str, evictor: str, budget, log_text: bool) -> dict:
    """The manifest of a deployment run (docs/SCHEMA.md "Deployment runs"; ``files`` is the writer's).

    ``gate`` records τ and D's definition (w, k, bins, convention) and, when the gate came from a
    gate file, its identity: ``policy``, ``sha256`` (:meth:`pagestats.deploy.gatefile.Gate.sha256`), the
    calibration model and logs; ``deployment`` the entry point, the base evictor and its budget. The
    run id hashes all of these and the model, so a log_dir holds one gate's deployment.
    """
    import datetime as _dt

    name = model_name or getattr(model.config, "_name_or_path", None) or None
    if not name:
        raise ValueError("a deployment log records the model's name: pass model_name= (model.config._name_or_path "
                         "is empty)")
    model_info = _model_block(model, str(name))
    gate_info = {"w": int(window), "k": int(k), "bins": float(bin_fraction), "convention": str(convention),
                 "tau": float(tau), "policy": None if gate is None else gate.policy,
                 "sha256": None if gate is None else gate.sha256(),
                 "calibration_model": None if gate is None else gate.model,
                 "calibration_logs_sha256": None if gate is None else gate.logs_sha256}
    deployment = {"entry": entry, "evictor": str(evictor), "budget": None if budget is None else float(budget),
                  "log_text": bool(log_text)}
    parameters = {"kind": schema.DEPLOYMENT_KIND, "model": model_info, "gate": gate_info, "deployment": deployment}
    return {
        "kind": schema.DEPLOYMENT_KIND,
        "run_id": run_id_for(parameters, label=f"deploy-{os.path.basename(os.path.normpath(str(name)))}"),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": model_info,
        "device": str(getattr(model, "device", "")),
        "gate": gate_info,
        "deployment": deployment,
        "software": _software(),
        "parameters": parameters,
    }
