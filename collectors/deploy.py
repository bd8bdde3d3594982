"""Deploy the PAGE gate: a kvpress press (:class:`GatedPress`) and a generation wrapper without
kvpress (:func:`gated_generate`).

PAGE is "a training-free gating wrapper that applies any base evictor when D ≥ τ and retains the
full cache otherwise" (paper §1, §3). Both entry points compute D exactly as the collector logs it —
the window attention ā of :mod:`collectors.capture` (the collector's own capture, not a copy), the
top-k pair agreement a_ℓ and the drop D of :func:`collectors.signals.gate_signals` (Eq. 3) — and
evict only when D ≥ τ (Eq. 2), once per input, at prefill.

GatedPress
----------
A ``kvpress.BasePress`` that wraps another press. During the prefill each attention layer runs the
base press's own ``forward_hook``; what the hook writes — the layer's compressed keys and values,
and ``module.masked_key_indices`` for head-wise presses (AdaKV, DMS) — is taken and the layer's
full cache put back, so the base compression of every layer is *held*. D needs the late bin, so the
decision is taken after the last layer: open (D ≥ τ) applies every held result, closed drops them
and the full cache stays. A prefill layer's output never depends on its own compression (kvpress
compresses after the layer's attention), so holding changes nothing but memory: until the last
layer, the compressed copy of each layer lives beside the full cache (at most (1 − r) of the full
cache, r the compression ratio) — the cost bench/deploy.py measures.

Supported: presses that act through ``forward_hook`` (every ``ScorerPress``, ``DMSPress`` — also
with ``decoding=True``: its decode-time hooks run only when the gate opened —, ``ComposedPress``,
``PerLayerCompressionPress``, ``AdaKVPress``, ...). Refused with one line: presses that override
``BasePress.__call__`` (``KVzipPress``, ``FastKVzipPress``, ``KVGradPress``, ``DecodingPress``,
``PrefillDecodingPress``, ``FinchPress``, ``KVComposePress``): their compression runs outside the
per-layer hook (extra forward passes, decode-time hooks), so there is no per-layer result to hold.
Batch size: 1 (one prompt per prefill, as the capture and the collector); a batch > 1 is refused
with one line — per-row decisions would give the rows caches of different lengths, which kvpress's
cache layout (one length per layer) cannot hold. A prompt shorter than the window w keeps the full
cache (ā would average fewer than w rows; the collector's capture does that, but τ was calibrated on
w-row windows), and ``press.last.reason`` says so.

gated_generate
--------------
The same gate over the built-in evictors of :mod:`collectors.evict` (or a ``kvpress:<Press>``
scored in the same prefill), decoded by the sweep's own :func:`collectors.sweep.decode_arms`, so its
output is the arm the collector logs: the full-KV answer when the gate is closed, the evictor's arm
at that budget when it is open.

Deployment logs
---------------
``log_dir=DIR`` (both entry points) appends one row per input to DIR, a run of kind ``deployment`` in
the project's log schema (docs/SCHEMA.md, "Deployment runs"; :class:`DeploymentLog`): D, a_ℓ, τ and
the decision, T, the kept KV, and for ``gated_generate`` the decode's length and stop reason and, with
``log_text=True``, the text. ``GatedPress`` logs at the prefill, where the decision is taken; kvpress
decodes after the press (its pipeline outside the press's context), so the press has no text to log.
``pagestats validate DIR`` checks the log and ``pagestats monitor DIR --gate gate.json`` compares it with
the calibration.

References
----------
PAGE paper §1, §3 (gate, "Algorithm", Eq. 2; D, Eq. 3), App. A.3.4 (calibration), App. F (bins).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import threading
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from collectors import capture, signals
from pagestats import defaults, schema
from pagestats.gatefile import Gate

__all__ = ["DeploymentLog", "GateDecision", "GatedPress", "GenerationResult", "gated_generate", "gate_decision",
           "REFUSED_CALL_REASON", "ShortPromptWarning", "close_log", "close_logs", "deployment_manifest", "open_log"]


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


def _resolve_gate(tau, gate, window, k, bin_fraction, convention):
    """(τ, Gate or None, w, k, f, convention) from either a τ or a :class:`Gate` (never both)."""
    if isinstance(gate, (str, bytes)) or hasattr(gate, "__fspath__"):
        gate = Gate.from_file(gate)
    if (tau is None) == (gate is None):
        raise ValueError("give exactly one of tau (a number) or gate (a Gate or a gate.json path)")
    if gate is not None:
        if not isinstance(gate, Gate):
            raise ValueError(f"gate must be a pagestats.gatefile.Gate or a path, got {type(gate).__name__}")
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


def gate_decision(window_attention, *, tau: float, window: int, k: int, bin_fraction: float, convention: str,
                  n_kept=None, kept_fraction=None) -> GateDecision:
    """The gate on one prefill's ā (L, H, T): D by :func:`collectors.signals.gate_signals`, open iff
    D ≥ τ and T ≥ w (§3, Eq. 2).

    ``n_kept`` / ``kept_fraction`` describe the open cache (the closed one keeps all T).
    """
    att = torch.as_tensor(window_attention)
    n_tokens = int(att.shape[-1])
    sig = signals.gate_signals(att, k=k, k_max=k, bin_fraction=bin_fraction, convention=convention)
    short = n_tokens < window
    gate_open = (not short) and sig.drop >= tau
    reason = "short-prompt" if short else ("open" if gate_open else "closed")
    if not gate_open:
        n_kept, kept_fraction = n_tokens, 1.0
    return GateDecision(drop=float(sig.drop), gate_open=bool(gate_open), tau=float(tau), agreement=sig.agreement,
                        n_tokens=n_tokens, n_kept=int(n_tokens if n_kept is None else n_kept),
                        kept_fraction=float(1.0 if kept_fraction is None else kept_fraction), reason=reason,
                        signals=dict(sig.signals), gate_ms=float(sig.gate_ms))


def _short_prompt_warning(n_tokens: int, window: int) -> None:
    warnings.warn(f"prompt of {n_tokens} tokens is shorter than the gate's window w={window}: "
                  "the full cache is kept (press.last.reason = 'short-prompt')", ShortPromptWarning, stacklevel=3)


# --------------------------------------------------------------------------- GatedPress (kvpress)

#: Why presses that override ``BasePress.__call__`` are refused.
REFUSED_CALL_REASON = ("it overrides BasePress.__call__, so its compression does not run through the per-layer "
                       "forward_hook whose result the gate holds until D is known")


def _import_kvpress():
    try:
        import kvpress  # noqa: F401
        from kvpress.presses.base_press import BasePress, is_prefilling
    except ImportError as err:
        raise ImportError(f"GatedPress needs kvpress ({err}); install the extra: pip install 'pagestats[kvpress]' "
                          "(or use collectors.deploy.gated_generate, which needs no kvpress)") from None
    return BasePress, is_prefilling


def _patch_masked_keys(name: str, base: str) -> None:
    """Route the capture implementation ``name`` through kvpress's ``attention_patch``, as kvpress
    routes every stock kernel at import, so head-wise presses' ``masked_key_indices`` act in the
    decode steps. Not for ``eager``: transformers calls the model's own eager function directly, and
    kvpress does not patch it either (its head-wise presses refuse eager)."""
    from kvpress.attention_patch import attention_patch
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if base != "eager" and name not in ALL_ATTENTION_FUNCTIONS._local_mapping:
        ALL_ATTENTION_FUNCTIONS[name] = attention_patch(AttentionInterface._global_mapping[name])


def _language_model(model):
    inner = model.model
    return inner.language_model if hasattr(inner, "language_model") else inner


@functools.cache
def _gated_press_class():
    BasePress, is_prefilling = _import_kvpress()

    @dataclass
    class GatedPress(BasePress):
        """PAGE's gate around any kvpress press: apply ``press`` iff D ≥ τ (§3, Eq. 2).

        Parameters
        ----------
        press : kvpress.BasePress
            The base evictor. Presses overriding ``BasePress.__call__`` are refused (module docstring).
        tau : float, optional
            The threshold τ. Give ``tau`` or ``gate``, not both.
        gate : pagestats.gatefile.Gate or path, optional
            A calibrated gate (``pagestats calibrate``); w, k and the bins come from it, and a model
            other than the calibrated one is refused when the press is applied.
        window, k : int, optional
            w and k of D (§3; default 32 and 32, or the gate's).
        bin_fraction, convention : optional
            D's layer bins (App. F; default 1/3, ``"deployed"``, or the gate's).
        model_name : str, optional
            The model's label, checked against the gate's and written to the deployment log
            (default: ``model.config._name_or_path``).
        log_dir : path, optional
            Append one row per prefill to this deployment log (:class:`DeploymentLog`), at the decision.
        log_part_size : int
            Rows per part file of the log (default 1: each row is on disk when its prefill ends).

        Attributes
        ----------
        last : GateDecision or None
            The decision on the last prefill.
        compression_ratio : float
            Realized ratio of the last input, 1 − kept_fraction (0 when the gate stayed closed).
        """

        press: object = None
        tau: float | None = None
        gate: object = None
        window: int | None = None
        k: int | None = None
        bin_fraction: float | None = None
        convention: str | None = None
        model_name: str | None = None
        log_dir: object = None
        log_part_size: int = 1
        last: GateDecision | None = field(default=None, init=False, repr=False)

        def __post_init__(self):
            if not isinstance(self.press, BasePress):
                raise ValueError(f"GatedPress wraps a kvpress BasePress, got {type(self.press).__name__}")
            if type(self.press).__call__ is not BasePress.__call__:
                raise ValueError(f"GatedPress cannot wrap {type(self.press).__name__}: {REFUSED_CALL_REASON}")
            (self.tau, self.gate, self.window, self.k, self.bin_fraction,
             self.convention) = _resolve_gate(self.tau, self.gate, self.window, self.k, self.bin_fraction,
                                              self.convention)
            self._state = None
            self._log = None

        @classmethod
        def from_file(cls, path, press, **kwargs):
            """A GatedPress with the gate of ``path`` (``pagestats calibrate``'s gate.json).

            ``window``, ``k``, ``bin_fraction``, ``convention`` given in ``kwargs`` must equal the
            file's (one-line ``ValueError`` otherwise); the model is checked when the press is applied.
            """
            return cls(press=press, gate=Gate.from_file(path), **kwargs)

        # ---- what kvpress reads
        @property
        def compression_ratio(self) -> float:
            """Realized compression of the last input: 1 − kept KV entries / (L · H_kv · T)."""
            if self.last is None:
                raise RuntimeError("GatedPress.compression_ratio is known after a prefill has run through the press")
            return 1.0 - self.last.kept_fraction

        @compression_ratio.setter
        def compression_ratio(self, value):
            raise AttributeError("GatedPress's compression ratio is realized per input; set the base press's")

        def post_init_from_model(self, model):
            self.press.post_init_from_model(model)

        def _check_model(self, model):
            name = self.model_name or getattr(model.config, "_name_or_path", None) or None
            if self.gate is not None:
                self.gate.check(model=name, n_layers=model.config.num_hidden_layers)
            if self.log_dir is not None:
                manifest = deployment_manifest(model, model_name=name, tau=self.tau, gate=self.gate,
                                               window=self.window, k=self.k, bin_fraction=self.bin_fraction,
                                               convention=self.convention, entry="GatedPress",
                                               evictor=repr(self.press), budget=None, log_text=False)
                self._log = open_log(self.log_dir, manifest, part_size=self.log_part_size)

        # ---- hooks
        def _pre_hook(self, module, args, kwargs):
            hidden_states = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            q_len = hidden_states.shape[1]
            if not is_prefilling(kwargs["cache_position"], q_len):
                return None
            from transformers import QuantizedCache

            if hidden_states.shape[0] != 1:
                raise ValueError(f"GatedPress supports batch size 1 (one decision per prefill), got a batch of "
                                 f"{hidden_states.shape[0]}")
            if isinstance(kwargs.get("past_key_values"), QuantizedCache):
                raise ValueError("GatedPress does not hold QuantizedCache layers; use a DynamicCache")
            layer = module.layer_idx
            state = self._state
            if layer == 0:
                state["held"] = {}
                state["n_tokens"] = q_len
                state["open"] = False
                state["short"] = q_len < self.window
            for store in (state["recorder"].window_attention, state["recorder"].snapkv_attention,
                          state["recorder"].accumulated_attention):
                store.pop(layer, None)  # the capture records a layer's first call: this prefill's
            return None

        def forward_hook(self, module, input, kwargs, output):
            state = self._state
            q_len = kwargs["hidden_states"].shape[1]
            if not is_prefilling(kwargs["cache_position"], q_len):
                # decode steps: a press that also acts while decoding (DMSPress(decoding=True)) acts
                # only on an input whose gate opened
                return self.press.forward_hook(module, input, kwargs, output) if state["open"] else output
            layer = module.layer_idx
            if not state["short"]:
                cache_layer = kwargs["past_key_values"].layers[layer]
                before = (cache_layer.keys, cache_layer.values, getattr(module, "masked_key_indices", None))
                output = self.press.forward_hook(module, input, kwargs, output)
                after = (cache_layer.keys, cache_layer.values, getattr(module, "masked_key_indices", None))
                cache_layer.keys, cache_layer.values = before[0], before[1]
                module.masked_key_indices = before[2]
                if after[2] is not None and state["base"] == "eager":
                    raise ValueError(f"{type(self.press).__name__} masks keys per head, which kvpress applies through "
                                     "its attention patch, and not under eager attention; use sdpa")
                state["held"][layer] = (module, cache_layer, after)
            if layer == state["n_layers"] - 1:
                self._decide()
            return output

        def _decide(self):
            state = self._state
            rec = state["recorder"]
            att = rec.stacked("window_attention")
            n_tokens = int(att.shape[-1])
            held = state["held"]
            n_kept = kept_fraction = None
            if held:
                entries = total = 0
                for _, _, (keys, _, masked) in held.values():
                    n_heads = keys.shape[1]
                    entries += keys.shape[1] * keys.shape[2] - (0 if masked is None else int(masked[0].numel()))
                    total += n_heads * n_tokens
                kept_fraction = entries / total
                n_kept = int(round(kept_fraction * n_tokens))
            decision = gate_decision(att, tau=self.tau, window=self.window, k=self.k,
                                     bin_fraction=self.bin_fraction, convention=self.convention,
                                     n_kept=n_kept, kept_fraction=kept_fraction)
            if decision.gate_open:
                for module, cache_layer, (keys, values, masked) in held.values():
                    cache_layer.keys, cache_layer.values = keys, values
                    module.masked_key_indices = masked
            state["held"] = {}
            state["open"] = decision.gate_open
            if decision.reason == "short-prompt":
                _short_prompt_warning(n_tokens, self.window)
            self.last = decision
            if self._log is not None:
                self._log.append(decision)

        @contextlib.contextmanager
        def __call__(self, model):
            """Apply the gated press to ``model`` (``with press(model): model.generate(...)``, or
            kvpress's pipeline ``press=``): the capture of :mod:`collectors.capture` and the hooks."""
            self._check_model(model)
            layers = _language_model(model).layers
            previous = model.config._attn_implementation
            base = previous[len(capture.CAPTURE_PREFIX):] if previous.startswith(capture.CAPTURE_PREFIX) else previous
            handles = []
            with capture.capture_attention(model, window=self.window) as recorder:
                _patch_masked_keys(model.config._attn_implementation, base)
                self._state = {"recorder": recorder, "n_layers": len(layers), "held": {}, "open": False,
                               "short": False, "n_tokens": 0, "base": base}
                try:
                    for layer in layers:
                        handles.append(layer.self_attn.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
                    with BasePress.__call__(self, model):
                        yield
                finally:
                    for handle in handles:
                        handle.remove()
                    for layer in layers:  # nothing held past the context
                        if getattr(layer.self_attn, "masked_key_indices", None) is not None and not self._state["open"]:
                            layer.self_attn.masked_key_indices = None
                    self._state["held"] = {}

    GatedPress.__module__ = __name__
    GatedPress.__qualname__ = "GatedPress"
    return GatedPress


def __getattr__(name):
    if name == "GatedPress":
        return _gated_press_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------- gated_generate (no kvpress)


@dataclass(frozen=True)
class GenerationResult:
    """What :func:`gated_generate` returns: the greedy tokens and text, why the decode stopped, the
    gate's decision, and the kept positions of the open arm (``None`` when the full cache was kept)."""

    token_ids: list
    text: str
    stop_reason: str
    decision: GateDecision
    evictor: str
    budget: float
    kept: torch.Tensor | None = None


def _prompt_ids(tokenizer, prompt) -> torch.LongTensor:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer")
        from collectors.tasks import tokenize_prompt

        return torch.tensor([tokenize_prompt(tokenizer, prompt)], dtype=torch.long)
    ids = torch.as_tensor(prompt, dtype=torch.long)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
        raise ValueError(f"prompt ids must have shape (T,) or (1, T) with T ≥ 1 (batch size 1), got {tuple(ids.shape)}")
    return ids


@torch.no_grad()
def gated_generate(model, tokenizer, prompt, *, evictor: str = "snapkv", budget: float = 0.5, tau=None, gate=None,
                   max_new_tokens: int = 64, window=None, k=None, bin_fraction=None, convention=None,
                   n_sink: int = defaults.N_SINK, n_recent: int = defaults.N_RECENT,
                   snapkv_window: int = defaults.SNAPKV_WINDOW, pool_kernel: int = defaults.SNAPKV_POOL_KERNEL,
                   stop_strings=None, model_name: str | None = None, log_dir=None, log_text: bool = False,
                   log_part_size: int = 1) -> GenerationResult:
    """Greedy generation under PAGE's gate, without kvpress: evict with ``evictor`` at ``budget`` iff
    D ≥ τ (§3, Eq. 2), else keep the full cache.

    Parameters
    ----------
    model, tokenizer
        A causal LM whose attention goes through ``AttentionInterface`` and its tokenizer.
    prompt : str or LongTensor
        Text (tokenised as the collector tokenises a prompt: :func:`collectors.tasks.tokenize_prompt`)
        or ids of shape (T,) / (1, T).
    evictor : str
        A built-in evictor (:data:`collectors.evict.EVICTORS`) or ``kvpress:<Press>[:k=v]`` (needs kvpress).
    budget : float
        b ∈ (0, 1], the kept fraction when the gate opens (:func:`collectors.evict.n_kept`).
    tau, gate
        The threshold, or a calibrated :class:`pagestats.gatefile.Gate` / gate.json path (exactly one).
    max_new_tokens : int
        Greedy tokens at most (EOS stops earlier, as in the collector).
    window, k, bin_fraction, convention
        D's definition (§3, App. F; defaults or the gate's).
    n_sink, n_recent, snapkv_window, pool_kernel
        The evictor's protection and window, as in the collector (docs/COLLECTION.md).
    stop_strings : sequence of str, optional
        Extra stop condition on the text.
    model_name : str, optional
        Checked against the gate's model (default ``model.config._name_or_path``).
    log_dir : path, optional
        Append this input's row to the deployment log there (:class:`DeploymentLog`).
    log_text : bool
        Also log the generated text (needs ``log_dir``).
    log_part_size : int
        Rows per part file of the log (default 1: the row is on disk when the call returns).

    Returns
    -------
    GenerationResult

    Notes
    -----
    One prefill (:func:`collectors.capture.prefill`) gives ā, D and the evictor's scores; the decode
    is :func:`collectors.sweep.decode_arms` on the full cache or on the evictor's kept positions
    (:func:`collectors.evict.kept_positions`), so the result equals the collector's logged arm.
    A kept set of all T positions is the full cache, as in the collector's sweep.
    """
    from collectors import presses
    from collectors.evict import ACCUMULATED_EVICTORS, is_evictor, kept_positions
    from collectors.sweep import decode_arms, eos_token_ids, stop_reason

    tau, gate, window, k, bin_fraction, convention = _resolve_gate(tau, gate, window, k, bin_fraction, convention)
    if not is_evictor(evictor):
        from collectors.evict import EVICTORS

        raise ValueError(f"unknown evictor {evictor!r}; choose from {EVICTORS} or kvpress:<Press>")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not (0.0 < float(budget) <= 1.0):
        raise ValueError(f"budget must lie in (0, 1], got {budget!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if log_text and log_dir is None:
        raise ValueError("log_text=True logs the text to a deployment log: give log_dir")
    name = model_name or getattr(model.config, "_name_or_path", None) or None
    if gate is not None:
        gate.check(model=name, n_layers=model.config.num_hidden_layers)
    log = None
    if log_dir is not None:
        manifest = deployment_manifest(model, model_name=name, tau=tau, gate=gate, window=window, k=k,
                                       bin_fraction=bin_fraction, convention=convention, entry="gated_generate",
                                       evictor=evictor, budget=budget, log_text=log_text)
        log = open_log(log_dir, manifest, part_size=log_part_size)
    ids = _prompt_ids(tokenizer, prompt)
    specs = [presses.parse(evictor)] if presses.is_press(evictor) else []
    pf = capture.prefill(model, ids, window=window, snapkv_window=snapkv_window,
                         accumulate=evictor in ACCUMULATED_EVICTORS, presses=specs)
    n_tokens = pf.n_tokens
    decision = gate_decision(pf.window_attention, tau=tau, window=window, k=k, bin_fraction=bin_fraction,
                             convention=convention)
    kept = None
    if decision.gate_open:
        kept = kept_positions(evictor, pf, float(budget), n_sink=n_sink, n_recent=n_recent, pool_kernel=pool_kernel)
        count = int(kept.shape[-1])
        if count == n_tokens:
            kept = None
        decision = dataclasses.replace(decision, n_kept=count, kept_fraction=count / n_tokens)
    elif decision.reason == "short-prompt":
        _short_prompt_warning(n_tokens, window)
    eos_ids = eos_token_ids(model, tokenizer)
    tokens = decode_arms(model, pf, [kept], max_new_tokens=max_new_tokens, eos_ids=eos_ids, tokenizer=tokenizer,
                         stop_strings=stop_strings)[0]
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    reason = stop_reason(tokens, max_new_tokens=max_new_tokens, eos_ids=eos_ids, tokenizer=tokenizer,
                         stop_strings=stop_strings)
    result = GenerationResult(token_ids=list(tokens), text=text, stop_reason=reason, decision=decision,
                              evictor=evictor, budget=float(budget), kept=kept)
    if log is not None:
        log.append(decision, text=text if log_text else None, n_generated=len(tokens), stop_reason=reason)
    return result


# --------------------------------------------------------------------------- deployment logs

#: The lock a process holds on a ``log_dir`` while it appends to it (one writing process per log_dir).
LOG_LOCK = ".deployment.lock"


class DeploymentLog:
    """The log of one deployed gate: a run of kind ``deployment`` (docs/SCHEMA.md, "Deployment runs")
    in ``log_dir``, one row per input, appended by :class:`GatedPress` and :func:`gated_generate`.

    The rows are those of :data:`pagestats.schema.DEPLOYMENT` — D (Eq. 3), a_ℓ, τ and the decision
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

        from collectors.writer import RunWriter

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
    from collectors.model import _text_config

    config = _text_config(model.config)
    n_heads = int(config.num_attention_heads)
    attn = str(model.config._attn_implementation)
    dtype = str(getattr(model, "dtype", "")).replace("torch.", "")
    return {
        "name": name, "revision": getattr(model.config, "_commit_hash", None),
        "n_layers": int(config.num_hidden_layers),
        "n_heads": n_heads, "n_kv_heads": int(getattr(config, "num_key_value_heads", None) or n_heads),
        "head_dim": int(getattr(config, "head_dim", None) or config.hidden_size // n_heads), "dtype": dtype,
        "attn_impl": attn[len(capture.CAPTURE_PREFIX):] if attn.startswith(capture.CAPTURE_PREFIX) else attn,
    }


@functools.cache
def _software() -> dict:
    from collectors.run import software_versions

    return software_versions()


def deployment_manifest(model, *, model_name, tau: float, gate, window: int, k: int, bin_fraction: float,
                        convention: str, entry: str, evictor: str, budget, log_text: bool) -> dict:
    """The manifest of a deployment run (docs/SCHEMA.md "Deployment runs"; ``files`` is the writer's).

    ``gate`` records τ and D's definition (w, k, bins, convention) and, when the gate came from a
    gate file, its identity: ``policy``, ``sha256`` (:meth:`pagestats.gatefile.Gate.sha256`), the
    calibration model and logs; ``deployment`` the entry point, the base evictor and its budget. The
    run id hashes all of these and the model, so a log_dir holds one gate's deployment.
    """
    import datetime as _dt

    from collectors.writer import run_id_for

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
