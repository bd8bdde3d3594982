"""GatedPress: PAGE's gate around any kvpress press (needs kvpress).

A ``kvpress.BasePress`` that wraps another press. During the prefill each attention layer runs the
base press's own ``forward_hook``; what the hook writes — the layer's compressed keys and values,
and ``module.masked_key_indices`` for head-wise presses (AdaKV, DMS) — is taken and the layer's
full cache put back, so the base compression of every layer is *held*. D needs the late bin, so the
decision is taken after the last layer (:func:`collectors.deploy.decision.gate_decision`): open (D ≥ τ)
applies every held result, closed drops them and the full cache stays. A prefill layer's output
never depends on its own compression (kvpress compresses after the layer's attention), so holding
changes nothing but memory: until the last layer, the compressed copy of each layer lives beside
the full cache (at most (1 − r) of the full cache, r the compression ratio) — the cost
bench/deploy.py measures.

A base press may edit the cache in place (``ThinKPress`` zeroes key channels), so it runs on a copy
of the layer's keys and values; the full cache a closed gate keeps is the prefill's own tensors.

Supported: presses that act through ``forward_hook`` at prefill (every ``ScorerPress``,
``DMSPress``, ``ThinKPress``, ``ComposedPress``, ``PerLayerCompressionPress``, ``AdaKVPress``, ...).
Refused with one line when the press is built, before any compute (:func:`refusal`): presses that
override ``BasePress.__call__`` (``KVzipPress``, ``FastKVzipPress``, ``KVgradPress``,
``DecodingPress`` and its subclasses, ``PrefillDecodingPress``, ``FinchPress``, ``KVComposePress``),
whose compression runs outside the per-layer hook; and presses that kvpress's pipeline treats by
their class (``KeyRerotationPress``, ``RestoreKVPress``, ``DMSPress(decoding=True)``), which the
gate would hide from it (wrong decode positions, no decode-time eviction). The gate must be the
outermost press: nested in ``ComposedPress`` or ``PrefillDecodingPress`` it is refused when the
outer press is applied, before the prefill. A batch of more than one prompt is refused before the
model runs — per-row decisions would give the rows caches of different lengths, which kvpress's
cache layout (one length per layer) cannot hold. A prompt shorter than the window w keeps the full
cache, and ``press.last.reason`` says so.

The class is built on first use (:func:`gated_press_class`; ``collectors.deploy.GatedPress``), so
that the rest of :mod:`collectors.deploy` runs without kvpress.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

from collectors import capture, hf
from collectors.deploy.decision import (GateDecision, check_deployment, check_mode, gate_decision, resolve_gate,
                                    warn_short_prompt)
from collectors.deploy.log import deployment_manifest, open_log
from pagestats.core import defaults
from pagestats.deploy.gatefile import Gate


#: Why presses that override ``BasePress.__call__`` are refused.
REFUSED_CALL_REASON = ("it overrides BasePress.__call__, so its compression does not run through the per-layer "
                       "forward_hook whose result the gate holds until D is known")
#: Why presses that kvpress's pipeline treats by their class are refused.
REFUSED_CLASS_REASON = ("kvpress's pipeline picks its decoding for this press by the press's class, which the gate "
                        "hides (it would decode from the wrong positions or skip decode-time compression)")
#: Why a GatedPress inside another press is refused.
NESTED_REASON = ("GatedPress must be the outermost press (its gate needs its own capture of the prefill); wrap the "
                 "other press in it instead: GatedPress(press=ComposedPress([...]), ...)")


def refusal(press) -> str | None:
    """Why ``press`` cannot be gated (one line), or None. Decided from the press alone, before any compute."""
    from kvpress import DMSPress, KeyRerotationPress, RestoreKVPress
    from kvpress.presses.base_press import BasePress

    name = type(press).__name__
    if not isinstance(press, BasePress):
        return f"GatedPress wraps a kvpress BasePress, got {name}"
    if type(press).__call__ is not BasePress.__call__:
        return f"GatedPress cannot wrap {name}: {REFUSED_CALL_REASON}"
    if isinstance(press, (KeyRerotationPress, RestoreKVPress)) or (isinstance(press, DMSPress) and press.decoding):
        what = f"{name}(decoding=True)" if isinstance(press, DMSPress) else name
        return f"GatedPress cannot wrap {what}: {REFUSED_CLASS_REASON}"
    return None


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

    if base != "eager":
        hf.wrap_kernel(name, attention_patch)


def _check_inputs(module, args, kwargs):
    """Refuse, before the model runs, a batch of several prompts (one decision per prefill) and a
    QuantizedCache (whose layers the gate cannot hold and put back)."""
    from transformers import QuantizedCache

    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        ids = kwargs.get("inputs_embeds")
    if ids is not None and ids.shape[0] != 1:
        raise ValueError(f"GatedPress supports batch size 1 (one decision per prefill), got a batch of {ids.shape[0]}")
    if isinstance(kwargs.get("past_key_values"), QuantizedCache):
        raise ValueError("GatedPress does not hold QuantizedCache layers; use a DynamicCache")


@functools.cache
def gated_press_class():
    """The :class:`GatedPress` class, a subclass of kvpress's ``BasePress`` built once, on first use."""
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
        gate : pagestats.deploy.gatefile.Gate or path, optional
            A calibrated gate (``pagestats calibrate``); w, k and the bins come from it, and a model
            other than the calibrated one is refused when the press is applied.
        window, k : int, optional
            w and k of D (§3; default 32 and 32, or the gate's).
        bin_fraction, convention : optional
            D's layer bins (App. F; default 1/3, ``"deployed"``, or the gate's).
        model_name : str, optional
            The model's label, checked against the gate's (:func:`collectors.deploy.decision.model_matches`)
            and written to the deployment log (default: ``model.config._name_or_path``).
        mode : {"query-aware", "query-agnostic"}
            How the press is used: the whole prompt prefilled under it (query-aware, the default, as the
            paper), or the context alone with the question after (kvpress's pipeline with ``question=``:
            query-agnostic). A gate calibrated in the other mode is refused (one line).
        allow_mode_mismatch : bool
            Deploy a gate calibrated in the other mode anyway.
        log_dir : path, optional
            Append one row per prefill to this deployment log (:class:`DeploymentLog`), at the decision.
        log_part_size : int
            Rows per part file of the log (default 1: each row is on disk when its prefill ends).

        Attributes
        ----------
        last : GateDecision or None
            The decision on the last prefill.
        compression_ratio : float
            The base press's own (nominal) ratio, read and set through the gate as kvpress's wrappers
            do, so that ratio sweeps (``press.compression_ratio = r``) work; the ratio applies when the
            gate opens.
        realized_compression_ratio : float or None
            1 − kept_fraction of the last input (0 when the gate stayed closed; None before a prefill).
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
        mode: str = defaults.MODE
        allow_mode_mismatch: bool = False
        last: GateDecision | None = field(default=None, init=False, repr=False)

        def __post_init__(self):
            reason = refusal(self.press)
            if reason is not None:
                raise ValueError(reason)
            (self.tau, self.gate, self.window, self.k, self.bin_fraction,
             self.convention) = resolve_gate(self.tau, self.gate, self.window, self.k, self.bin_fraction,
                                              self.convention)
            check_mode(self.gate, self.mode, self.allow_mode_mismatch)  # before any model is seen
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
        def compression_ratio(self):
            """The base press's compression ratio; None when it has none or knows it only after a forward
            pass (kvpress's SimLayerKVPress and DMSPress raise then), so that probing never raises."""
            try:
                return getattr(self.press, "compression_ratio", None)
            except (ValueError, AssertionError):  # kvpress's "Forward pass must be run to compute ..."
                return None

        @compression_ratio.setter
        def compression_ratio(self, value):
            cls = type(self.press)
            if not (hasattr(cls, "compression_ratio") or "compression_ratio" in vars(self.press)):
                raise AttributeError(f"{cls.__name__} has no compression_ratio to set")
            try:
                self.press.compression_ratio = value
            except AttributeError:
                raise AttributeError(f"{cls.__name__}'s compression_ratio is computed from its other parameters "
                                     "and cannot be set") from None

        @property
        def realized_compression_ratio(self):
            """Realized compression of the last input: 1 − kept KV entries / (L · H_kv · T); None before one."""
            return None if self.last is None else 1.0 - self.last.kept_fraction

        def post_init_from_model(self, model):
            if self._state is None:  # called by an outer press (ComposedPress, PrefillDecodingPress), not by us
                raise ValueError(NESTED_REASON)
            self.press.post_init_from_model(model)

        def _check_model(self, model):
            name = self.model_name or getattr(model.config, "_name_or_path", None) or None
            check_deployment(self.gate, model_name=name, n_layers=model.config.num_hidden_layers, mode=self.mode,
                             allow_mode_mismatch=self.allow_mode_mismatch)
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
                return output  # decode steps: no press that acts while decoding is gated (refusal)
            layer = module.layer_idx
            if not state["short"]:
                cache_layer = kwargs["past_key_values"].layers[layer]
                before = (cache_layer.keys, cache_layer.values, getattr(module, "masked_key_indices", None))
                # the base press works on a copy: one that edits keys in place (ThinK) leaves the full cache whole
                cache_layer.keys, cache_layer.values = before[0].clone(), before[1].clone()
                output = self.press.forward_hook(module, input, kwargs, output)
                after = (cache_layer.keys, cache_layer.values, getattr(module, "masked_key_indices", None))
                cache_layer.keys, cache_layer.values = before[0], before[1]
                module.masked_key_indices = before[2]
                if after[2] is not None and state["base"] == "eager":
                    raise ValueError(f"{type(self.press).__name__} masks keys per head, which kvpress applies through "
                                     "its attention patch, and not under eager attention; use sdpa")
                state["held"][layer] = (module, cache_layer, after)
            if layer == state["n_layers"] - 1:
                self._apply_gate()
            return output

        def _apply_gate(self):
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
                warn_short_prompt(n_tokens, self.window)
            self.last = decision
            if self._log is not None:
                self._log.append(decision)

        @contextlib.contextmanager
        def __call__(self, model):
            """Apply the gated press to ``model`` (``with press(model): model.generate(...)``, or
            kvpress's pipeline ``press=``): the capture of :mod:`collectors.capture` and the hooks."""
            self._check_model(model)
            layers = hf.language_model(model).layers
            previous = hf.attn_implementation(model)
            base = previous[len(capture.CAPTURE_PREFIX):] if previous.startswith(capture.CAPTURE_PREFIX) else previous
            handles = []
            with capture.capture_attention(model, window=self.window) as recorder:
                _patch_masked_keys(hf.attn_implementation(model), base)
                self._state = {"recorder": recorder, "n_layers": len(layers), "held": {}, "open": False,
                               "short": False, "n_tokens": 0, "base": base}
                try:
                    handles.append(hf.language_model(model).register_forward_pre_hook(_check_inputs, with_kwargs=True))
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
                    self._state = None  # nothing held past the context; a later outer press is seen as one

    GatedPress.__module__ = __package__  # collectors.deploy, where the class is found by name
    GatedPress.__qualname__ = "GatedPress"
    return GatedPress
