"""kvpress presses as base evictors: ``--evictors kvpress:SnapKVPress:window_size=32``.

An evictor named ``kvpress:<Press>[:<param>=<value>]...`` is any ``kvpress.ScorerPress`` subclass
with its parameters (every one except ``compression_ratio``, which each budget sets). Its arms are
what kvpress itself keeps, computed inside the collector's ONE prefill:

* during the prefill, a forward hook on every attention layer calls the press's own ``score()`` with
  the arguments kvpress's hook passes it — the layer's input hidden states, its cached keys (after
  RoPE) and values, the attention weights the layer returned (``None`` under sdpa) and the layer's
  keyword arguments (position embeddings, ...); presses that cannot score without attention weights
  (:data:`NEEDS_ATTENTIONS`) get the causal softmax of the layer computed by
  :mod:`collectors.capture` when the kernel returns none;
* the arm at budget b keeps kvpress's own selection at ``compression_ratio = 1 − b``: in every layer and
  KV head, ``kvpress.utils.compute_n_kept(T, 1 − b)`` positions, the top of the scores by
  ``torch.topk`` — no sink or recent protection beyond what the press's scores build in, no budget
  floor, no pooling.

So every budget is a top-n of one set of scores, and one prefill serves every arm; the kept sets are
per layer and KV head, with the same count in each (gathered by :mod:`collectors.decode`).

kvpress is an optional dependency (``pip install "pagestats[kvpress]"``); it supports transformers
releases before 5.3, so it lives in its own environment (``make kvpress-env``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from dataclasses import dataclass
from typing import ClassVar

import torch

from collectors import hf
from collectors.evictors.base import Evictor
from pagestats.core import defaults

#: Prefix of evictor names that are kvpress presses.
PREFIX = "kvpress:"
#: Presses whose ``score()`` requires the attention weights of the layer.
NEEDS_ATTENTIONS = ("ObservedAttentionPress",)

__all__ = ["PREFIX", "NEEDS_ATTENTIONS", "KVPress", "version", "press_scores"]


def _import_kvpress():
    try:
        import kvpress
    except ImportError as err:
        raise ValueError(
            f"kvpress evictors need the kvpress package ({err}); install the extra: pip install 'pagestats[kvpress]' "
            "(kvpress supports transformers < 5.3; `make kvpress-env` builds such an environment)"
        ) from None
    return kvpress


def version() -> str:
    """The installed kvpress version."""
    _import_kvpress()
    return importlib.metadata.version("kvpress")


def _value(text: str):
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class KVPress(Evictor):
    """A kvpress ``ScorerPress`` as an evictor (module docstring): its name, press class and parameters.

    Scored inside the prefill (``capture.prefill(..., presses=[...])`` fills ``prefill.press_scores``),
    and kept by kvpress's own rule, so :meth:`kept` replaces the collector's budget rule.
    """

    name: str
    press: str
    params: tuple[tuple[str, object], ...]

    granularity: ClassVar[str] = "head"
    in_prefill: ClassVar[bool] = True
    usage: ClassVar[str] = f"{PREFIX}<Press>[:param=value]..."

    @classmethod
    def from_name(cls, text: str) -> KVPress:
        """Parse and check ``kvpress:<Press>[:<param>=<value>]...``.

        Values are read as bool (``true``/``false``), int, float, else string.

        Raises
        ------
        ValueError
            kvpress not installed, unknown press, a press that is not a ``ScorerPress``, a malformed
            or unknown parameter, or ``compression_ratio`` (set per budget).
        """
        if not text.startswith(PREFIX):
            raise ValueError(f"{text!r} is not a kvpress evictor ({cls.usage})")
        name, *items = text[len(PREFIX):].split(":")
        kvpress = _import_kvpress()
        press_class = getattr(kvpress, name, None)
        if not (isinstance(press_class, type) and issubclass(press_class, kvpress.ScorerPress)):
            raise ValueError(f"{text}: {name!r} is not a kvpress ScorerPress")
        params = []
        for item in items:
            key, sep, raw = item.partition("=")
            if not sep or not key:
                raise ValueError(f"{text}: parameters look like name=value, got {item!r}")
            if key == "compression_ratio":
                raise ValueError(f"{text}: compression_ratio is set by each budget (1 − b); leave it out")
            params.append((key, _value(raw)))
        evictor = cls(text, name, tuple(params))
        try:
            evictor.make()
        except TypeError as err:
            raise ValueError(f"{text}: {err}") from None
        return evictor

    def make(self, budget: float | None = None):
        """An instance of the press (``compression_ratio = 1 − budget`` when a budget is given)."""
        kvpress = _import_kvpress()
        kwargs = dict(self.params)
        if budget is not None:
            kwargs["compression_ratio"] = 1.0 - float(budget)
        return getattr(kvpress, self.press)(**kwargs)

    def manifest(self) -> dict:
        """What the manifest records of this evictor: press, parameters and kvpress version."""
        return {"press": self.press, "params": dict(self.params), "kvpress_version": version()}

    def count(self, n_tokens: int, budget: float, n_sink: int = 0, n_recent: int = 0,
              budget_floor: str = "protected") -> int:
        """Positions per layer and KV head that kvpress keeps at ``compression_ratio = 1 − budget``
        (kvpress's count: the protection and floor arguments do not apply)."""
        from kvpress.utils import compute_n_kept

        return int(compute_n_kept(int(n_tokens), 1.0 - float(budget)))

    def score(self, prefill) -> list:
        """The press's per-layer (1, H_kv, T) scores from this prefill."""
        scored = getattr(prefill, "press_scores", None) or {}
        if self.name not in scored:
            raise ValueError(f"{self.name} was not scored in this prefill (capture.prefill(..., presses=...))")
        return scored[self.name]

    def kept(self, prefill, budget: float, *, n_sink: int = defaults.N_SINK, n_recent: int = defaults.N_RECENT,
             pool_kernel: int = 1, budget_floor: str = "protected") -> torch.LongTensor:
        """(L, H_kv, n) sorted kept positions: per layer, ``torch.topk`` of the press's scores, as
        ``ScorerPress.compress`` takes it (so ties resolve as in kvpress); no protection, floor or
        pooling (the keyword arguments are the built-in evictors' and do not apply)."""
        layer_scores = self.score(prefill)
        count = self.count(int(layer_scores[0].shape[-1]), budget)
        rows = [scores.topk(count, dim=-1).indices[0] for scores in layer_scores]
        return torch.sort(torch.stack(rows).cpu(), dim=-1).values


@contextlib.contextmanager
def press_scores(model, evictors, cache, recorder):
    """Context manager: hooks that score every :class:`KVPress` of ``evictors`` in each attention layer's forward.

    Yields ``{evictor: {layer: (1, H_kv, T) scores}}``, filled during the (prefill) forward pass run
    inside the ``with`` block. ``recorder`` (:class:`collectors.capture.Recorder`) supplies the
    layer's attention probabilities to the presses of :data:`NEEDS_ATTENTIONS` when the kernel
    returns no weights. Each press sees ``module.rotary_emb`` (the model's rotary embedding), as under
    kvpress's own hooks; that attribute is removed again on exit.
    """
    presses = [(e.name, e.make(), e.press in NEEDS_ATTENTIONS) for e in evictors]
    for _, press, _ in presses:
        press.post_init_from_model(model)
    store: dict[str, dict[int, torch.Tensor]] = {evictor: {} for evictor, _, _ in presses}
    language_model = hf.language_model(model)

    def hook(module, args, kwargs, output):
        hidden_states = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        layer = module.layer_idx
        keys, values = cache.layers[layer].keys, cache.layers[layer].values
        returned = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        for evictor, press, needs_attentions in presses:
            attentions = returned
            if attentions is None and needs_attentions:
                attentions = recorder.attention_matrix[layer]
            with torch.no_grad():
                store[evictor][layer] = press.score(module, hidden_states, keys, values, attentions, kwargs).detach()
        recorder.attention_matrix.pop(layer, None)
        return output

    handles, added = [], []
    try:
        for layer in language_model.layers:
            attention = layer.self_attn
            if not hasattr(attention, "rotary_emb"):
                attention.rotary_emb = language_model.rotary_emb
                added.append(attention)
            handles.append(attention.register_forward_hook(hook, with_kwargs=True))
        yield store
    finally:
        for handle in handles:
            handle.remove()
        for attention in added:
            del attention.rotary_emb
