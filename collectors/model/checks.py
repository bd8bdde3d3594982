"""The checks made before a model's weights are read: PAGE's architectural scope and what a run needs.

PAGE's gate reads softmax attention in every layer, so models with attention-free or state-space
layers (Mamba, RWKV, linear attention, hybrids) are refused (paper §6 "Architectural scope").

Each check ends the run with a one-line :class:`ModelLoadError` (or :class:`UnsupportedModelError`):
the torch device (:func:`check_device`), the attention kernel (:func:`check_attn_impl`,
:func:`check_kernel_support`), the architecture (:func:`check_architecture`: the scope, read from
the config's layer types and the model's module tree built on the meta device; transformers' own
flag for attention-interface support), the tokenizer files (:func:`check_tokenizer_files`), the
positions a run needs (:func:`check_positions`) and every sliding window or attention chunk
(:func:`check_windows`, with the per-layer windows of :func:`layer_windows`).
"""

from __future__ import annotations

import pathlib
import re

from collectors.hf import causal_lm_class, kernel_names, text_config

#: ``config.layer_types`` values that denote softmax attention (full, sliding or chunked).
ATTENTION_LAYER_TYPES = frozenset(
    {"full_attention", "sliding_attention", "chunked_attention", "attention", "global", "local", "sliding_window"}
)

#: Of those, the layer types whose attention is limited to a window (sliding) or a chunk of positions.
WINDOWED_LAYER_TYPES = frozenset({"sliding_attention", "local", "sliding_window"})

CHUNKED_LAYER_TYPES = frozenset({"chunked_attention"})
#: Words of module class names (CamelCase words, lower-cased, joined) that denote attention-free,
#: state-space or linear-attention sequence mixers. Matched against whole runs of words, so that
#: "SeedOssMLP" (Seed·Oss·MLP) is not read as "ssm".
_NON_SOFTMAX_WORDS = frozenset({
    "mamba", "mamba2", "mixer", "rwkv", "ssm", "s4", "s5", "linearattention", "lightningattention", "lightning",
    "deltanet", "gateddeltanet", "shortconv", "retention", "xlstm", "mlstm", "slstm", "recurrentblock", "rglru",
    "hyena",
})

_CAMEL_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
#: Files of which a model directory needs at least one for its tokenizer to load.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt", "tekken.json")


class ModelLoadError(ValueError):
    """The model cannot be loaded as asked; the message is one line that says why."""


class UnsupportedModelError(ValueError):
    """The model has layers without softmax attention, outside PAGE's scope (§6)."""


def _non_softmax_name(name: str) -> bool:
    """Whether a module class name holds a run of CamelCase words naming a non-softmax sequence mixer."""
    words = [w.lower() for w in _CAMEL_WORD.findall(name)]
    runs = ("".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1))
    return any(run in _NON_SOFTMAX_WORDS for run in runs)


def _scope_error(cls_name: str, config, problems: list[str]) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{cls_name} ({getattr(config, 'model_type', '?')}) is outside PAGE's scope: " + "; ".join(problems)
        + ". The gate needs softmax attention in every layer; attention-free, state-space and hybrid "
        "models are not supported (paper §6, 'Architectural scope')."
    )


def check_supported(model) -> None:
    """Refuse models with attention-free or state-space layers (paper §6 "Architectural scope").

    ``model`` may be a loaded model or its module tree on the meta device (:func:`check_model_class`
    builds one before any weights are read). Checks, in order: ``config.layer_types`` entries that are
    not softmax attention (linear attention, convolutions, state-space or hybrid layers); module
    classes whose CamelCase words name a non-softmax sequence mixer (Mamba, RWKV, linear attention,
    gated delta nets, short convolutions, ...; dense layers such as ``SeedOssMLP`` do not match);
    and that every decoder layer has an attention module with a ``layer_idx`` (the capture
    attributes window attention by it).

    Raises
    ------
    UnsupportedModelError
        Naming the offending layer type(s).
    """
    config = text_config(model.config)
    problems = []
    layer_types = getattr(config, "layer_types", None) or []
    bad_types = sorted({str(t) for t in layer_types if str(t) not in ATTENTION_LAYER_TYPES})
    if bad_types:
        problems.append(f"config.layer_types {bad_types}")
    mixers = sorted({type(m).__name__ for m in model.modules() if _non_softmax_name(type(m).__name__)})
    if mixers:
        problems.append(f"non-attention layer modules {mixers}")
    n_layers = getattr(config, "num_hidden_layers", None)
    attention_layers = {
        m.layer_idx
        for m in model.modules()
        if type(m).__name__.endswith("Attention") and isinstance(getattr(m, "layer_idx", None), int)
    }
    if not problems and n_layers is not None and len(attention_layers) != n_layers:
        problems.append(
            f"only {len(attention_layers)} of {n_layers} layers have an attention module with a layer_idx"
        )
    if problems:
        raise _scope_error(type(model).__name__, config, problems)


def check_model_class(config) -> None:
    """Everything about the architecture that is decided before the weights are read.

    1. The scope (:func:`check_supported`), on the model's module tree built on the meta device
       (no weights allocated or read).
    2. transformers' own class flag ``_supports_attention_backend``: a model without it (Falcon,
       MPT, Bloom, StableLM in transformers 5.x) computes attention itself instead of calling
       ``transformers.AttentionInterface``, so the capture would never see it.

    Raises
    ------
    UnsupportedModelError
        Attention-free, state-space or hybrid layers.
    ModelLoadError
        No attention-interface support.
    """
    import copy

    import torch

    cls = causal_lm_class(config)
    try:
        with torch.device("meta"):  # the module tree only: no weights are allocated or read
            skeleton = cls(copy.deepcopy(config))
    except Exception as err:  # noqa: BLE001 - any failure of the class on this config ends the run in one line
        reason = (str(err).strip().splitlines() or [""])[0]
        raise ModelLoadError(f"cannot build {cls.__name__}'s module tree from its config (to check its layers before "
                             f"loading): {type(err).__name__}: {reason}") from None
    check_supported(skeleton)
    if not getattr(cls, "_supports_attention_backend", False):
        import transformers

        raise ModelLoadError(
            f"{cls.__name__} ({config.model_type}) computes attention inside its own modules instead of calling "
            f"transformers' AttentionInterface ({cls.__name__}._supports_attention_backend is False in transformers "
            f"{transformers.__version__}), so the capture cannot read its attention; use a model family that supports "
            "it (docs/COLLECTION.md, 'Model families')"
        )


def layer_windows(config) -> list[int | None]:
    """Per decoder layer, the positions its attention may reach: ``None`` for full attention, else the
    sliding window (``sliding_window``) or chunk (``attention_chunk_size``) of that layer.

    ``config.layer_types`` decides which layers are sliding or chunked where the config has it
    (Gemma-2/3, Cohere2, gpt-oss, Qwen2 with ``use_sliding_window``, Llama-4); without it a set
    ``sliding_window`` makes every layer sliding (Mistral, Phi-3, Starcoder2), and a set
    ``attention_chunk_size`` every layer chunked, as transformers' caches and masks read them.
    """
    config = text_config(config)
    n_layers = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None)
    chunk = getattr(config, "attention_chunk_size", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        kind = "sliding_attention" if window is not None else "chunked_attention" if chunk is not None else "full"
        layer_types = [kind] * n_layers
    out = []
    for i, kind in enumerate(layer_types):
        if kind in WINDOWED_LAYER_TYPES:
            size = window
        elif kind in CHUNKED_LAYER_TYPES:
            size = chunk if chunk is not None else window
        else:
            out.append(None)
            continue
        if size is None:
            raise ModelLoadError(f"layer {i} is {kind} but the config sets no window size")
        out.append(int(size))
    return out


def check_windows(config, positions: int) -> None:
    """Refuse a run whose positions exceed a sliding window or attention chunk of some layer.

    A sliding layer whose window W holds every position of the run (prompt plus decode,
    ``positions ≤ W``) attends to exactly what a full layer attends to, so the collector runs it as
    one: the prefill keeps every key, and eviction and decode treat it like any other layer
    (docs/COLLECTION.md, "Model families"). A shorter window would make the model itself drop keys
    during the decode, which the eviction arms do not model; such a run is refused here, before
    the weights are read.

    Raises
    ------
    ModelLoadError
    """
    windows = [(i, w) for i, w in enumerate(layer_windows(config)) if w is not None]
    if not windows:
        return
    smallest = min(w for _, w in windows)
    if int(positions) > smallest:
        layers = [i for i, w in windows if w == smallest]
        kind = "attention chunk" if getattr(text_config(config), "attention_chunk_size", None) == smallest else \
            "sliding window"
        raise ModelLoadError(
            f"the run needs {positions} positions (context length + tokens to generate) but layer(s) {layers} "
            f"have a {kind} of {smallest}; sliding-window layers run only where the window covers the whole run, "
            f"so lower the context length (or max_new_tokens) to at most {smallest} positions in all"
        )


def check_device(device: str) -> None:
    """Refuse a torch device this process cannot use (e.g. ``cuda`` on a CPU build of torch).

    Raises
    ------
    ModelLoadError
    """
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ModelLoadError(f"device {device!r} is not a torch device ({err})") from None
    if dev.type == "cuda":
        if torch.version.cuda is None:
            raise ModelLoadError(
                f"device {device} asks for CUDA, but torch {torch.__version__} is a build without CUDA; "
                "install a CUDA build of torch (make gpu-env) or use device cpu"
            )
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {device} asks for CUDA, but torch sees no CUDA device "
                                 "(check the driver and CUDA_VISIBLE_DEVICES)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"device {device} asks for MPS, which this machine or torch build does not offer")


def check_attn_impl(attn_impl: str, *, device: str, dtype: str) -> None:
    """Refuse an attention kernel that is unknown or not usable here, before any weights are read.

    ``eager`` and ``sdpa`` always run. The flash-attention kernels need their package
    (``transformers.utils.is_flash_attn_*_available``), a CUDA device and float16/bfloat16 weights.

    Raises
    ------
    ModelLoadError
    """
    import torch
    import transformers.utils as tu

    known = ["eager", *[k for k in kernel_names() if "|" not in k]]
    if attn_impl not in known:
        raise ModelLoadError(f"attn_impl {attn_impl!r} is not a transformers attention kernel; choose from "
                             + ", ".join(known))
    if attn_impl.startswith("flash_attention"):
        version = attn_impl.rsplit("_", 1)[-1]
        available = getattr(tu, f"is_flash_attn_{version}_available", None)
        if available is None or not available():
            raise ModelLoadError(f"attn_impl {attn_impl} is not available: transformers finds no usable "
                                 f"flash-attn {version} package with a CUDA GPU here; use attn_impl sdpa")
        if torch.device(device).type != "cuda" or dtype == "float32":
            raise ModelLoadError(f"attn_impl {attn_impl} runs only on a CUDA device with float16 or bfloat16 "
                                 f"weights (got device {device}, dtype {dtype})")


def check_kernel_support(config, attn_impl: str) -> None:
    """Refuse a kernel the model's class does not implement (transformers' ``_supports_*`` flags), and
    ``sdpa`` for a config with attention-logit soft-capping (Gemma-2): torch's SDPA cannot soft-cap,
    and transformers' ``sdpa`` kernel ignores ``softcap`` (5.2) or refuses it (5.24), so the model's
    own attention would not be the one its config describes.

    Raises
    ------
    ModelLoadError
    """
    import transformers

    cls = causal_lm_class(config)
    flag = {"sdpa": "_supports_sdpa", "flex_attention": "_supports_flex_attn"}.get(attn_impl)
    if attn_impl.startswith("flash_attention"):
        flag = "_supports_flash_attn"
    if flag and not getattr(cls, flag, False):
        raise ModelLoadError(f"{cls.__name__} has no {attn_impl} kernel in transformers {transformers.__version__}; "
                             "use attn_impl eager")
    if attn_impl == "sdpa" and getattr(text_config(config), "attn_logit_softcapping", None) is not None:
        raise ModelLoadError(f"{cls.__name__} soft-caps its attention logits (attn_logit_softcapping), which the sdpa "
                             "kernel cannot do; use attn_impl eager")


def check_tokenizer_files(directory: str) -> None:
    """Refuse a model directory without any of the :data:`TOKENIZER_FILES`.

    Raises
    ------
    ModelLoadError
    """
    if not any((pathlib.Path(directory) / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"{directory} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); "
                             "save the tokenizer beside the weights (tokenizer.save_pretrained(DIR))")


def check_positions(config, positions: int) -> None:
    """Refuse a run that needs more positions than the model has (``max_position_embeddings``).

    Parameters
    ----------
    config : transformers.PretrainedConfig
    positions : int
        Prompt tokens plus tokens to generate: the largest position a run feeds is ``positions − 1``.

    Raises
    ------
    ModelLoadError
        When the (text) config states ``max_position_embeddings`` and ``positions`` exceeds it;
        a config that states no limit is not checked.
    """
    limit = getattr(text_config(config), "max_position_embeddings", None)
    if limit is not None and int(positions) > int(limit):
        raise ModelLoadError(f"the run needs {positions} positions (context length + tokens to generate) but the "
                             f"model has max_position_embeddings = {limit}; lower the context length")


def check_architecture(config, positions: int | None = None) -> None:
    """All architecture checks made before any weights are read: scope and attention-interface
    support (:func:`check_model_class`), then, with ``positions``, the positions and every
    layer's window (:func:`check_positions`, :func:`check_windows`).

    Raises
    ------
    ModelLoadError, UnsupportedModelError
    """
    check_model_class(config)
    if positions is not None:
        check_positions(config, positions)
        check_windows(config, positions)
