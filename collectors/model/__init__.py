"""The model a collection runs: the checks made before its weights are read, and its loading.

Submodules, in import order: :mod:`~collectors.model.checks` (PAGE's architectural scope, paper §6,
and what a run needs of the model: device, attention kernel, positions, sliding windows; one-line
:class:`ModelLoadError` / :class:`UnsupportedModelError`) and :mod:`~collectors.model.load`
(:func:`load_model`: the model, its tokenizer and the manifest's ``model`` entry, with the cache
the model really keeps, :func:`cache_geometry`). Both reach transformers' version-specific parts
through :mod:`collectors.hf`.
"""

from collectors.model.checks import (
    ATTENTION_LAYER_TYPES, CHUNKED_LAYER_TYPES, TOKENIZER_FILES, WINDOWED_LAYER_TYPES, ModelLoadError,
    UnsupportedModelError, check_architecture, check_attn_impl, check_device, check_kernel_support, check_model_class,
    check_positions, check_supported, check_tokenizer_files, check_windows, layer_windows,
)
from collectors.model.load import (
    DEFAULT_MODEL, DEFAULT_MODEL_NAME, cache_geometry, default_gguf_path, describe_architecture, kv_bytes_per_token,
    load_model, sha256_file,
)

__all__ = [
    "ATTENTION_LAYER_TYPES", "CHUNKED_LAYER_TYPES", "DEFAULT_MODEL", "DEFAULT_MODEL_NAME", "TOKENIZER_FILES",
    "WINDOWED_LAYER_TYPES", "ModelLoadError", "UnsupportedModelError", "cache_geometry", "check_architecture",
    "check_attn_impl", "check_device", "check_kernel_support", "check_model_class", "check_positions",
    "check_supported", "check_tokenizer_files", "check_windows", "default_gguf_path", "describe_architecture",
    "kv_bytes_per_token", "layer_windows", "load_model", "sha256_file",
]
