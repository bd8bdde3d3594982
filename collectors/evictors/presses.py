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
  ``torch.topk`` — no sink or recent protection beyond what the press's scores build in.

So every budget is a top-n of one set of scores, and one prefill serves every arm; the kept sets are
per layer and KV head, with the same count in each (gathered by :mod:`collectors.decode`).

kvpress is an optional dependency (``pip install "pagestats[kvpress]"``); it supports transformers
releases before 5.3, so it lives in its own environment (``make kvpress-env``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from collectors import hf

#: Prefix of evictor names that are kvpress presses.
PREFIX = "kvpress:"
#: Presses whose ``score()`` requires the attention weights of the layer.
NEEDS_ATTENTIONS = ("ObservedAttentionPress",)

__all__ = ["PREFIX", "NEEDS_ATTENTIONS", "PressSpec", "is_press", "parse", "version", "press_scores",
           "kept_positions", "n_kept"]


def is_press(evictor: str) -> bool:
    """Whether ``evictor`` names a kvpress press (``kvpress:...``)."""
    return isinstance(evictor, str) and evictor.startswith(PREFIX)


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
    import importlib.metadata as md

    _import_kvpress()
    return md.version("kvpress")


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
class PressSpec:
    """A parsed ``kvpress:<Press>[:k=v]...`` evictor: its name, press class name and parameters."""

    evictor: str
    press: str
    params: tuple[tuple[str, object], ...]

    def make(self, budget: float | None = None):
        """An instance of the press (``compression_ratio = 1 − budget`` when a budget is given)."""
        kvpress = _import_kvpress()
        cls = getattr(kvpress, self.press)
        kwargs = dict(self.params)
        if budget is not None:
            kwargs["compression_ratio"] = 1.0 - float(budget)
        return cls(**kwargs)

    def manifest(self) -> dict:
        """What the manifest records of this evictor: press, parameters and kvpress version."""
        return {"press": self.press, "params": dict(self.params), "kvpress_version": version()}


def parse(evictor: str) -> PressSpec:
    """Parse and check ``kvpress:<Press>[:<param>=<value>]...``.

    Values are read as bool (``true``/``false``), int, float, else string.

    Raises
    ------
    ValueError
        Not a kvpress name, kvpress not installed, unknown press, a press that is not a
        ``ScorerPress``, a malformed or unknown parameter, or ``compression_ratio`` (set per budget).
    """
    if not is_press(evictor):
        raise ValueError(f"{evictor!r} is not a kvpress evictor ({PREFIX}<Press>[:param=value]...)")
    name, *items = evictor[len(PREFIX):].split(":")
    kvpress = _import_kvpress()
    cls = getattr(kvpress, name, None)
    if not (isinstance(cls, type) and issubclass(cls, kvpress.ScorerPress)):
        raise ValueError(f"{evictor}: {name!r} is not a kvpress ScorerPress")
    params = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{evictor}: parameters look like name=value, got {item!r}")
        if key == "compression_ratio":
            raise ValueError(f"{evictor}: compression_ratio is set by each budget (1 − b); leave it out")
        params.append((key, _value(raw)))
    spec = PressSpec(evictor, name, tuple(params))
    try:
        spec.make()
    except TypeError as err:
        raise ValueError(f"{evictor}: {err}") from None
    return spec


def n_kept(n_tokens: int, budget: float) -> int:
    """Positions per layer and KV head that kvpress keeps at ``compression_ratio = 1 − budget``."""
    from kvpress.utils import compute_n_kept

    return int(compute_n_kept(int(n_tokens), 1.0 - float(budget)))


def kept_positions(layer_scores, budget: float) -> torch.LongTensor:
    """(L, H_kv, n) sorted kept positions: per layer, ``torch.topk`` of the press's (1, H_kv, T) scores.

    The top-k is taken on each layer's scores exactly as ``ScorerPress.compress`` takes it, so ties
    resolve as in kvpress.
    """
    n_tokens = int(layer_scores[0].shape[-1])
    count = n_kept(n_tokens, budget)
    rows = [scores.topk(count, dim=-1).indices[0] for scores in layer_scores]
    return torch.sort(torch.stack(rows).cpu(), dim=-1).values


@contextlib.contextmanager
def press_scores(model, specs, cache, recorder):
    """Context manager: hooks that score every press of ``specs`` in each attention layer's forward.

    Yields ``{evictor: {layer: (1, H_kv, T) scores}}``, filled during the (prefill) forward pass run
    inside the ``with`` block. ``recorder`` (:class:`collectors.capture.Recorder`) supplies the
    layer's attention probabilities to the presses of :data:`NEEDS_ATTENTIONS` when the kernel
    returns no weights. Each press sees ``module.rotary_emb`` (the model's rotary embedding), as under
    kvpress's own hooks; that attribute is removed again on exit.
    """
    presses = [(spec.evictor, spec.make(), spec.press in NEEDS_ATTENTIONS) for spec in specs]
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
