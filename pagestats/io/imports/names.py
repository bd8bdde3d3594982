"""What the PAGE release's file names say: model, context length, evictor and input draw.

The release (the paper's authors' repository ``pankajkumar6002/PAGE``, folder ``experiments/results/``)
records neither the model nor the context length inside its records, and records the evictor
(``score_policy``) only in some files. Its file names carry them (``gated_4k_qwen15b.jsonl``,
``gated_h2o_qwen14b_4k.jsonl``, ``drops_yi15_9b_4k.jsonl``). This module is the one documented table
of those tokens (docs/IMPORT.md repeats it); ``pagestats import page --model/--context/--evictor``
override it. The architecture of each model is its public ``config.json`` (layers, attention heads,
KV heads, head dimension): the release does not record it, and the report's KV bytes per token
(2 · L · H_kv · d · bytes) need it.

What the code cannot do: a file whose name holds no known token, and whose records hold no
``score_policy``, gets no evictor; the caller refuses it in one line naming the option to pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    """A model of the release: its hub name and the architecture fields of a run manifest."""

    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int


#: File-name token → model (public config.json of each hub id). Longer tokens are matched first.
MODELS: dict[str, Model] = {
    "qwen15b": Model("Qwen2.5-1.5B-Instruct", 28, 12, 2, 128),
    "qwen3b": Model("Qwen2.5-3B-Instruct", 36, 16, 2, 128),
    "qwen14b": Model("Qwen2.5-14B-Instruct", 48, 40, 8, 128),
    "qwen25_32b": Model("Qwen2.5-32B-Instruct", 64, 40, 8, 128),
    "qwen32b": Model("Qwen2.5-32B-Instruct", 64, 40, 8, 128),
    # DBTrimKV's files: the evictor is the DBTrimKV fine-tune of this model; D is the base model's
    "qwen3_4b": Model("Qwen3-4B-Instruct-2507", 36, 32, 8, 128),
    "qwen3": Model("Qwen3-4B-Instruct-2507", 36, 32, 8, 128),  # gated_dbtrimkv_qwen3_4k: qwen3, then 4k
    "mistral7b": Model("Mistral-7B-Instruct-v0.3", 32, 32, 8, 128),
    "yi15_9b": Model("Yi-1.5-9B-Chat", 48, 32, 4, 128),
    "llama31_8b": Model("Llama-3.1-8B-Instruct", 32, 32, 8, 128),
    "llama31": Model("Llama-3.1-8B-Instruct", 32, 32, 8, 128),
}
#: Models by hub name (``--model`` takes a hub name or a file-name token).
MODELS_BY_NAME: dict[str, Model] = {m.name: m for m in MODELS.values()}

#: File-name token → context length in tokens.
CONTEXTS: dict[str, int] = {"4k": 4096, "8k": 8192, "16k": 16384, "32k": 32768}

#: Evictor token (in a file name, or a record's ``score_policy``) → the project's evictor name
#: (docs/DEFINITIONS.md). The release's StreamingLLM keeps 36 positions at every b < 1 (sinks +
#: window), which is the project's ``streamingllm-fixed``.
EVICTORS: dict[str, str] = {
    "snapkv": "snapkv",
    "h2o": "h2o",
    "pyramidkv": "pyramidkv",
    "streamingllm": "streamingllm-fixed",
    "streaming": "streamingllm-fixed",
    "manifoldkv": "manifoldkv",
    "dbtrimkv": "dbtrimkv",
    "capkv": "capkv",
}
#: The release's gated files without ``score_policy`` and without an evictor token ran SnapKV (the
#: release's README and the paper's Table 2: "SnapKV" cells are the unnamed ``gated_*`` files).
UNNAMED_GATED_EVICTOR = "snapkv"


def _tokens(stem: str) -> list[str]:
    return stem.lower().split("_")


def _find(stem: str, table: dict) -> str | None:
    """The longest key of ``table`` that is a run of whole ``_``-separated tokens of ``stem``."""
    parts = _tokens(stem)
    best = None
    for key in table:
        k = key.split("_")
        for i in range(len(parts) - len(k) + 1):
            if parts[i:i + len(k)] == k and (best is None or len(key) > len(best)):
                best = key
    return best


def model_token(stem: str) -> str | None:
    """The model token of a file name's stem, or ``None``."""
    return _find(stem, MODELS)


def context_length(stem: str) -> int | None:
    """The context length a file name's stem names (``4k`` → 4096), or ``None``."""
    token = _find(stem, CONTEXTS)
    return CONTEXTS[token] if token else None


def evictor(stem: str) -> str | None:
    """The evictor a file name's stem names (``gated_h2o_qwen14b_4k`` → ``h2o``), or ``None``."""
    token = _find(stem, EVICTORS)
    return EVICTORS[token] if token else None


def draw(stem: str) -> int:
    """The input draw a file name's stem names (``…_seed2`` → 2); 0, the release's main draw, otherwise."""
    found = re.search(r"(?:^|_)seed(\d+)(?:_|$)", stem.lower())
    return int(found.group(1)) if found else 0


def resolve_model(text: str) -> Model | None:
    """A model named by hub name or by file-name token (``--model``), or ``None`` when unknown."""
    return MODELS_BY_NAME.get(text) or MODELS.get(text.lower())


def slug(model: Model, context: int, draw_: int) -> str:
    """The run id of (model, context, draw): ``page-qwen2.5-14b-instruct-4k`` (``-seed2`` for draw 2)."""
    name = re.sub(r"[^a-z0-9.]+", "-", model.name.lower()).strip("-")
    size = f"{context // 1024}k" if context % 1024 == 0 else str(context)
    return f"page-{name}-{size}" + (f"-seed{draw_}" if draw_ else "")
