"""The collector's adapters to ``transformers``: every place where the collector depends on how a
transformers release names or keeps something, in one module.

The collector runs on the transformers 5.x releases of its environments (5.24 on the CPU image,
5.17 on the GPU image, before 5.3 beside kvpress), which differ in small ways that matter here:

* the keyword under which ``model.forward`` takes the KV cache (:func:`cache_keyword`);
* the text config of a multimodal config (:func:`text_config`) and the language model inside a
  multimodal model (:func:`language_model`);
* the private attributes and registries the capture and the decode kernel go through: the
  model's attention implementation (:func:`attn_implementation`), the registered attention
  kernels and masks (:func:`kernel_names`, :func:`stock_kernel`, :func:`stock_attention`,
  :func:`has_mask`, :func:`register_kernel`, :func:`wrap_kernel`), the causal-LM class of a
  config (:func:`causal_lm_class`), the hub revision (:func:`revision`), the construction of a
  ``DynamicCache`` (:func:`dynamic_cache`);
* the attention kernel the eviction arms decode with (:func:`decode_attn_impl`, recorded in the
  manifest's ``model.decode_attn_impl``): for an ``sdpa`` model with grouped-query attention, the
  grouped SDPA of one new token per row (:func:`grouped_sdpa_forward`, switched on by
  :func:`grouped_decode`), registered as one more kernel beside the stock ones;
* transformers' own progress bars while a model loads (:func:`hf_progress`).

This module imports nothing of the collector; every other collector module that touches these
things imports them from here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from unittest import mock

#: Attention implementation of the eviction arms' decode steps for an ``sdpa`` model with
#: grouped-query attention (:func:`grouped_decode`).
GROUPED_SDPA = "pagestats_grouped_sdpa"


def cache_keyword(model) -> str:
    """Name under which ``model.forward`` takes, and its output returns, the KV cache.

    ``"cache"`` in recent transformers (5.24 here), ``"past_key_values"`` in earlier 5.x releases
    such as the 5.17 of the GPU image, where a ``cache=`` argument is silently ignored.
    """
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise TypeError(f"{type(model).__name__}.forward takes neither cache nor past_key_values")


def text_config(config):
    """The text part of a config (``config.get_text_config()`` of a multimodal config), else ``config``."""
    getter = getattr(config, "get_text_config", None)
    return getter() if getter is not None else config


def language_model(model):
    """The decoder stack of a causal LM (``model.model``), or the language model inside a
    multimodal one (``model.model.language_model``)."""
    inner = model.model
    return inner.language_model if hasattr(inner, "language_model") else inner


def causal_lm_class(config):
    """The transformers causal-LM class of ``config`` (``AutoModelForCausalLM``'s choice)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]


def revision(config) -> str | None:
    """The hub commit a config was loaded from (``config._commit_hash``), or ``None``."""
    return getattr(config, "_commit_hash", None)


def attn_implementation(model) -> str:
    """The attention implementation ``model`` runs with now (``model.config._attn_implementation``)."""
    return model.config._attn_implementation


def kernel_names() -> tuple[str, ...]:
    """Names of the attention kernels registered in ``transformers.AttentionInterface`` (``eager``
    is not among them: it is each model's own function)."""
    from transformers import AttentionInterface

    return tuple(AttentionInterface._global_mapping)


def stock_kernel(name: str):
    """The attention function registered in ``transformers.AttentionInterface`` under ``name``."""
    from transformers import AttentionInterface

    return AttentionInterface._global_mapping[name]


def stock_attention(base: str, module):
    """The attention function a ``base`` model calls for ``module``: for ``eager``, the model's own
    ``eager_attention_forward`` (defined in its modeling module), else :func:`stock_kernel`."""
    if base == "eager":
        fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if fn is None:
            raise RuntimeError(f"{type(module).__name__} has no eager_attention_forward to delegate to")
        return fn
    return stock_kernel(base)


def has_mask(name: str) -> bool:
    """Whether ``transformers.masking_utils.AttentionMaskInterface`` has a mask function for ``name``."""
    from transformers.masking_utils import AttentionMaskInterface

    return name in AttentionMaskInterface._global_mapping


def register_kernel(name: str, fn, *, mask_of: str) -> None:
    """Register ``fn`` as the attention kernel ``name``, with the mask function of kernel ``mask_of``,
    so that the model builds the mask that kernel would get; nothing is done when ``name`` is
    registered already."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, AttentionMaskInterface._global_mapping[mask_of])


def wrap_kernel(name: str, wrap) -> None:
    """Have the models call ``wrap(kernel)`` for the registered kernel ``name``, as kvpress routes
    every stock kernel at import (``ALL_ATTENTION_FUNCTIONS``' local mapping); once per name."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name not in ALL_ATTENTION_FUNCTIONS._local_mapping:
        ALL_ATTENTION_FUNCTIONS[name] = wrap(stock_kernel(name))


def dynamic_cache(layers=None):
    """A transformers ``DynamicCache``: empty, or holding ``layers``, one (K, V) pair per layer
    (its ``ddp_cache_data`` argument)."""
    from transformers import DynamicCache

    return DynamicCache() if layers is None else DynamicCache(ddp_cache_data=layers)


def decode_attn_impl(attn_impl: str, n_heads: int, n_kv_heads: int) -> str:
    """The attention implementation the eviction arms decode with (recorded in the manifest's
    ``model.decode_attn_impl``): :data:`GROUPED_SDPA` for an ``sdpa`` model whose query heads
    share KV heads, else ``attn_impl`` itself."""
    return GROUPED_SDPA if attn_impl == "sdpa" and n_kv_heads < n_heads else attn_impl


#: Attention keywords that change the attention itself (logit soft-capping, attention sinks, additive
#: position bias): a grouped decode step that carries one goes to the stock kernel.
STOCK_ATTENTION_KEYWORDS = ("softcap", "s_aux", "position_bias")


def grouped_sdpa_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                         is_causal=None, **kwargs):
    """SDPA of one new token per row, grouped-query, without copying K and V per query head.

    transformers' ``sdpa`` kernel expands every KV head to its G query heads
    (``repeat_kv``: a copy of the whole cache, per layer and per decode step) whenever it is
    given a mask, which the batched arms always are (left padding). A decode step has one query
    per row, so the G query heads of KV head j can instead be the G *rows* of one SDPA call
    against K_j, V_j: query (B, H, 1, d) → (B, H_kv, G, d), query head j·G + g reading KV head
    j (``repeat_kv``'s order), and the row's key mask (B, 1, 1, n) broadcast over the G rows.
    The result is the same attention up to float rounding (the reductions run in another order;
    ~1e-7 in float32). Calls with more than one query per row (a prefill, the question step of
    the query-agnostic mode), models without grouping, and calls that carry an attention keyword
    the stock kernel would act on (:data:`STOCK_ATTENTION_KEYWORDS`: ``softcap``, ``s_aux``,
    ``position_bias``) go to the stock ``sdpa`` kernel, which uses or refuses them as it would
    without the collector.
    """
    import torch

    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1 or any(kwargs.get(k) is not None for k in STOCK_ATTENTION_KEYWORDS):
        return stock_kernel("sdpa")(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                    is_causal=is_causal, **kwargs)
    b, h, _, d = query.shape
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(b, h // groups, groups, d), key, value, attn_mask=attention_mask,
        dropout_p=dropout if module.training else 0.0, scale=scaling)
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def grouped_decode(model):
    """Context manager: an ``sdpa`` model decodes through :func:`grouped_sdpa_forward` (the
    model's implementation is restored on exit); any other model is left as it is."""
    previous = attn_implementation(model)
    if previous != "sdpa":
        yield
        return
    register_kernel(GROUPED_SDPA, grouped_sdpa_forward, mask_of="sdpa")
    model.set_attn_implementation(GROUPED_SDPA)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@contextlib.contextmanager
def hf_progress(enabled: bool):
    """transformers' own progress bars follow ``--no-progress`` while the model loads, and are put
    back as they were afterwards: its logging switch ("Loading weights") and the plain tqdm bar of
    its GGUF reader ("Converting and de-quantizing GGUF tensors")."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    with contextlib.ExitStack() as stack:
        if not enabled:
            hf_logging.disable_progress_bar()
            stack.callback(hf_logging.enable_progress_bar if was else lambda: None)
            if hasattr(gguf_utils, "tqdm"):  # the module's own bar (not behind the logging switch)
                stack.enter_context(mock.patch.object(gguf_utils, "tqdm", functools.partial(gguf_utils.tqdm, disable=True)))
        yield


def disable_progress_bars() -> None:
    """Turn transformers' own progress bars off for this process (a Ray shard's worker)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
