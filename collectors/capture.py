"""Observation-window capture during prefill, through ``transformers.AttentionInterface``.

The paper's gate (§3 "Head-Agreement Drop D") needs, per layer ℓ and query head h, the
observation attention ā_{ℓ,h}: the mean over the last w prompt rows of the causal softmax
attention over all prompt keys. H2O (§4, Table 2) needs the attention accumulated over *all*
prompt queries. Both are computed here from the post-RoPE queries and keys that the model hands
to its attention function, without touching the output path.

How it works
------------
:func:`install` registers, once per stock kernel ``base`` (``"sdpa"``, ``"eager"``,
``"flash_attention_2"``, ...), an attention function named ``pagestats_capture_<base>`` in
``transformers.AttentionInterface`` and the stock mask function under the same name in
``transformers.masking_utils.AttentionMaskInterface``, so the model builds exactly the mask the
stock kernel would get. The function

1. calls the stock kernel with the unchanged arguments and returns its output unchanged (App. A.3.6
   reports that rewriting the output path shifted D by 33%; logits are therefore bit-identical to a
   stock run, which the tests check with ``torch.equal``);
2. when a :class:`Recorder` is active (a context variable, set only inside :func:`capture_attention`)
   and the call is the layer's first in that context (the prefill), computes
   softmax(q_{last w} Kᵀ · scaling + mask) for the last w rows only — a w × T block per head, never
   T × T — and averages over the rows; and, when asked, accumulates the column sums of the causal
   softmax over all prompt queries in chunks of ``query_chunk`` rows (chunk × T per head at a time).

Outside a capture context the function is a pure pass-through, so a model left with the capture
implementation behaves like the stock one. :func:`capture_attention` switches the model's
implementation and restores the previous one on exit, so nothing leaks between calls or models.

The probabilities are those of the model's own attention: they use the mask the stock kernel
receives (causal when it receives none, which transformers passes only where no key is masked,
e.g. a sliding window that covers the prompt), logit soft-capping when the model passes ``softcap``
(Gemma-2), an additive ``position_bias`` when it passes one, and attention sinks when it passes
``s_aux`` (gpt-oss): one learned logit per head that joins every row's softmax and is dropped
after it, so the key probabilities of a row sum to less than one, as in the model's own eager
attention. Limitation: batch size 1 (one prompt per prefill, no padding).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from dataclasses import dataclass, field

import torch

from collectors import hf
from collectors.evictors.presses import NEEDS_ATTENTIONS, press_scores
from pagestats.core import defaults

#: Prefix of the attention-implementation names this module registers.
CAPTURE_PREFIX = "pagestats_capture_"

_ACTIVE: contextvars.ContextVar["Recorder | None"] = contextvars.ContextVar(
    "pagestats_capture_recorder", default=None
)


@dataclass
class Prefill:
    """Everything one prefill yields for the gate and for every eviction arm (docs/COLLECTION.md).

    Attributes
    ----------
    input_ids : torch.LongTensor, shape (1, T)
    past_key_values : transformers.Cache
        Full-prompt KV cache (``DynamicCache`` of full layers, sliding-window layers included:
        their windows cover the run), positions 0..T−1.
    last_logits : torch.Tensor, shape (vocab,)
        float32 logits at position T−1 (those of the first generated token).
    window_attention : torch.Tensor, shape (L, H, T)
        float32 ā_{ℓ,h}: mean over the last w prompt rows (all rows when T < w) of the causal
        softmax attention over all prompt keys, per query head (GQA keys repeated) (§3).
    accumulated_attention : torch.Tensor or None, shape (L, H, T)
        float32 sum over all prompt queries of the causal softmax attention (H2O's score), or
        ``None`` unless requested.
    prefill_ms : float
        Wall time of the forward pass (``time.perf_counter``), milliseconds.
    snapkv_attention : torch.Tensor or None, shape (L, H, T)
        Like ``window_attention`` but over the last ``snapkv_window`` rows, the SnapKV-family
        evictors' window; ``None`` when that window equals the gate's (then ``window_attention`` is it).
    press_scores : dict or None
        ``{evictor: [per layer (1, H_kv, T) scores]}`` of the kvpress evictors scored in this prefill
        (:mod:`collectors.evictors.presses`), or ``None``.
    """

    input_ids: torch.LongTensor
    past_key_values: object
    last_logits: torch.Tensor
    window_attention: torch.Tensor
    accumulated_attention: torch.Tensor | None
    prefill_ms: float
    snapkv_attention: torch.Tensor | None = None
    press_scores: dict | None = None

    @property
    def n_tokens(self) -> int:
        """T, the prompt length."""
        return int(self.input_ids.shape[-1])

    @property
    def n_kv_heads(self) -> int:
        """H_kv, the number of KV heads of the cache (= H without grouped-query attention)."""
        return int(self.past_key_values.layers[0].keys.shape[1])


@dataclass
class Recorder:
    """Per-call store of captured attention statistics, keyed by ``module.layer_idx``.

    Parameters
    ----------
    window : int
        w, the number of last prompt rows averaged (all rows when T < w).
    accumulate : bool
        Also accumulate H2O column sums over all prompt queries.
    query_chunk : int
        Rows per chunk of the accumulation (memory chunk × T per head).
    snapkv_window : int or None
        Also average the last ``snapkv_window`` rows (the SnapKV-family eviction window) when it
        differs from ``window``.
    full_attention : bool
        Also keep each layer's full causal softmax (1, H, T, T) in ``attention_matrix`` until a
        kvpress hook takes it (:mod:`collectors.evictors.presses`).
    """

    window: int = defaults.WINDOW
    accumulate: bool = False
    query_chunk: int = 256
    snapkv_window: int | None = None
    window_attention: dict[int, torch.Tensor] = field(default_factory=dict)
    accumulated_attention: dict[int, torch.Tensor] = field(default_factory=dict)
    snapkv_attention: dict[int, torch.Tensor] = field(default_factory=dict)
    full_attention: bool = False
    attention_matrix: dict[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self):
        if int(self.window) < 1:
            raise ValueError(f"window must be ≥ 1, got {self.window}")
        if self.snapkv_window is not None and int(self.snapkv_window) < 1:
            raise ValueError(f"snapkv_window must be ≥ 1, got {self.snapkv_window}")
        if self.snapkv_window == self.window:
            self.snapkv_window = None
        if int(self.query_chunk) < 1:
            raise ValueError(f"query_chunk must be ≥ 1, got {self.query_chunk}")

    def stacked(self, name: str) -> torch.Tensor:
        """The per-layer tensors of ``name`` stacked to (L, H, T), float32, on the CPU."""
        store = getattr(self, name)
        if not store:
            raise RuntimeError(
                "no attention was captured: the model never called its attention interface "
                "(is it an AttentionInterface-based transformers model?)"
            )
        layers = sorted(store)
        if layers != list(range(len(layers))):
            raise RuntimeError(f"captured layers {layers} are not 0..L-1")
        return torch.stack([store[i] for i in layers]).to("cpu", torch.float32)


# --------------------------------------------------------------------------- probabilities


def _scores(module, query, key, attention_mask, scaling, softcap, rows: slice, position_bias=None) -> torch.Tensor:
    """Masked, scaled logits of query rows ``rows`` against all keys, shape (H, r, T_k), float32.

    GQA: query head h uses KV head h // g (the order of ``repeat_kv``); computed by grouping the
    query heads instead of materialising the repeated keys. ``position_bias`` (B, 1 or H, q, T_k),
    when given, is added to the logits before the mask, as the stock kernels add it.
    """
    _, n_heads, q_len, head_dim = query.shape
    n_kv = key.shape[1]
    t_k = key.shape[2]
    group = n_heads // n_kv
    q = query[0, :, rows, :].float()  # (H, r, d)
    r = q.shape[1]
    k = key[0].float()  # (Hkv, T_k, d)
    s = torch.matmul(q.reshape(n_kv, group * r, head_dim), k.transpose(1, 2))
    s = s.reshape(n_heads, r, t_k) * scaling
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if position_bias is not None:
        s = s + position_bias[0, :, rows, :t_k].float()
    if attention_mask is None:
        # Causal, bottom-right aligned: query row i sits at absolute position t_k − q_len + i.
        offset = t_k - q_len
        row_pos = torch.arange(rows.start, rows.stop, device=s.device) + offset
        allowed = torch.arange(t_k, device=s.device)[None, :] <= row_pos[:, None]
        s = s.masked_fill(~allowed, float("-inf"))
    else:
        m = attention_mask[0, :, rows, :t_k]  # (1 or H, r, T_k)
        if m.dtype == torch.bool:
            s = s.masked_fill(~m, float("-inf"))
        else:
            s = s + m.float()
    return s


def _softmax(s: torch.Tensor, sinks) -> torch.Tensor:
    """Row softmax of logits (H, r, T_k); with ``sinks`` (H,), each head's sink logit joins every
    row's normalisation and its probability is dropped (gpt-oss's ``s_aux``)."""
    if sinks is None:
        return torch.softmax(s, dim=-1)
    sink = sinks.reshape(-1, 1, 1).to(s.dtype).expand(s.shape[0], s.shape[1], 1)
    return torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]


def window_probabilities(module, query, key, attention_mask, scaling, window, softcap=None, sinks=None,
                         position_bias=None):
    """ā for one layer: mean over the last ``window`` query rows of the softmax, shape (H, T_k).

    Notes
    -----
    §3: ā_{ℓ,h} = (1/w) Σ_{i ∈ last w rows} softmax(q_i Kᵀ · scaling + causal mask). Only the
    w × T_k block is formed. When the call has fewer than w query rows, all rows are used.
    ``softcap``, ``sinks`` and ``position_bias`` are the model's own (module docstring).
    """
    q_len = query.shape[2]
    w = min(int(window), q_len)
    s = _scores(module, query, key, attention_mask, scaling, softcap, slice(q_len - w, q_len), position_bias)
    return _softmax(s, sinks).mean(dim=1)


def accumulated_probabilities(module, query, key, attention_mask, scaling, query_chunk, softcap=None, sinks=None,
                              position_bias=None):
    """H2O score for one layer: Σ over all query rows of the causal softmax, shape (H, T_k).

    Built chunk by chunk (``query_chunk`` rows × T_k per head), never the full T × T matrix.
    """
    q_len = query.shape[2]
    total = None
    for start in range(0, q_len, int(query_chunk)):
        stop = min(start + int(query_chunk), q_len)
        s = _scores(module, query, key, attention_mask, scaling, softcap, slice(start, stop), position_bias)
        part = _softmax(s, sinks).sum(dim=1)
        total = part if total is None else total + part
    return total


# --------------------------------------------------------------------------- registration


def _make_capture_function(base: str):
    def capture_attention_forward(module, query, key, value, attention_mask, *args, **kwargs):
        output = hf.stock_attention(base, module)(module, query, key, value, attention_mask, *args, **kwargs)
        recorder = _ACTIVE.get()
        if recorder is None:
            return output
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise RuntimeError(f"{type(module).__name__} has no layer_idx; cannot attribute captured attention")
        if layer in recorder.window_attention:  # not the prefill call of this layer
            return output
        if query.shape[0] != 1:
            raise ValueError(f"capture supports batch size 1, got {query.shape[0]}")
        # transformers passes scaling/dropout as keywords (their positional order differs between
        # the eager and sdpa signatures, so positional values are not interpreted).
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = getattr(module, "scaling", None) or query.shape[-1] ** -0.5
        extra = {"softcap": kwargs.get("softcap"), "sinks": kwargs.get("s_aux"),
                 "position_bias": kwargs.get("position_bias")}
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) else None
        with torch.no_grad():
            recorder.window_attention[layer] = window_probabilities(
                module, query, key, mask, scaling, recorder.window, **extra
            )
            if recorder.snapkv_window is not None:
                recorder.snapkv_attention[layer] = window_probabilities(
                    module, query, key, mask, scaling, recorder.snapkv_window, **extra
                )
            if recorder.accumulate:
                recorder.accumulated_attention[layer] = accumulated_probabilities(
                    module, query, key, mask, scaling, recorder.query_chunk, **extra
                )
            if recorder.full_attention:
                rows = slice(0, query.shape[2])
                probs = _softmax(_scores(module, query, key, mask, scaling, extra["softcap"], rows,
                                         extra["position_bias"]), extra["sinks"])
                recorder.attention_matrix[layer] = probs.to(query.dtype)[None]
        return output

    capture_attention_forward.__name__ = f"{CAPTURE_PREFIX}{base}"
    return capture_attention_forward


def install(base: str = "sdpa") -> str:
    """Register the capture implementation wrapping stock kernel ``base``; idempotent.

    Returns
    -------
    str
        The implementation name, ``"pagestats_capture_<base>"``, to pass to
        ``model.set_attn_implementation``.
    """
    if base.startswith(CAPTURE_PREFIX):
        return base
    if base != "eager" and base not in hf.kernel_names():
        raise ValueError(f"unknown stock attention implementation {base!r}")
    if not hf.has_mask(base):
        raise ValueError(f"no mask function is registered for attention implementation {base!r}")
    name = f"{CAPTURE_PREFIX}{base}"
    hf.register_kernel(name, _make_capture_function(base), mask_of=base)
    return name


@contextlib.contextmanager
def capture_attention(model, *, window: int = defaults.WINDOW, accumulate: bool = False, query_chunk: int = 256,
                      snapkv_window: int | None = None):
    """Context manager: run ``model`` with the capture installed; yields the :class:`Recorder`.

    The model's attention implementation is switched to the capture wrapper of its current stock
    kernel and restored on exit; the recorder is visible only inside the ``with`` block.
    """
    recorder = Recorder(window=window, accumulate=accumulate, query_chunk=query_chunk, snapkv_window=snapkv_window)
    previous = hf.attn_implementation(model)
    base = previous[len(CAPTURE_PREFIX):] if previous.startswith(CAPTURE_PREFIX) else previous
    name = install(base)
    if previous != name:
        model.set_attn_implementation(name)
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)
        if previous != name:
            model.set_attn_implementation(previous)


def prefill(model, input_ids, *, window: int = defaults.WINDOW, accumulate: bool = False, query_chunk: int = 256,
            snapkv_window: int | None = None, presses=()) -> Prefill:
    """One prompt forward pass with the observation window (and optionally H2O scores) captured.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM whose attention goes through ``AttentionInterface`` (Llama, Qwen2, ...).
    input_ids : torch.LongTensor, shape (1, T) or (T,)
    window : int
        w (§3; default 32).
    accumulate : bool
        Also compute H2O's accumulated attention.
    query_chunk : int
        Query rows per accumulation chunk.
    snapkv_window : int or None
        Window of the SnapKV-family evictors; captured separately only when it differs from ``window``.
    presses : sequence of collectors.evictors.presses.KVPress
        kvpress evictors to score in this forward pass (``Prefill.press_scores``).

    Returns
    -------
    Prefill
    """
    input_ids = torch.as_tensor(input_ids)
    if input_ids.ndim == 1:
        input_ids = input_ids[None]
    if input_ids.ndim != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape (1, T) with T ≥ 1, got {tuple(input_ids.shape)}")
    device = next(model.parameters()).device
    input_ids = input_ids.to(device=device, dtype=torch.long)
    # Full (unbounded) cache layers for every layer. A sliding layer's mask still applies its window,
    # so the prefill (logits, capture) is the model's own whatever the window; the eviction arms
    # decode from this cache only where every window covers the run (decode.check_decode_windows).
    cache = hf.dynamic_cache()
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        rec = stack.enter_context(capture_attention(model, window=window, accumulate=accumulate,
                                                    query_chunk=query_chunk, snapkv_window=snapkv_window))
        scored = None
        if presses:
            rec.full_attention = any(e.press in NEEDS_ATTENTIONS for e in presses)
            scored = stack.enter_context(press_scores(model, presses, cache, rec))
        start = time.perf_counter()
        out = model(input_ids=input_ids, **{hf.cache_keyword(model): cache}, use_cache=True, logits_to_keep=1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        prefill_ms = (time.perf_counter() - start) * 1e3
    n_layers = model.config.num_hidden_layers
    window_attention = rec.stacked("window_attention")
    if window_attention.shape[0] != n_layers:
        raise RuntimeError(f"captured {window_attention.shape[0]} layers, model has {n_layers}")
    return Prefill(
        input_ids=input_ids,
        past_key_values=cache,
        last_logits=out.logits[0, -1].float(),
        window_attention=window_attention,
        accumulated_attention=rec.stacked("accumulated_attention") if accumulate else None,
        prefill_ms=prefill_ms,
        snapkv_attention=rec.stacked("snapkv_attention") if rec.snapkv_window is not None else None,
        press_scores=None if scored is None else {e: [by_layer[i] for i in range(n_layers)] for e, by_layer in scored.items()},
    )
