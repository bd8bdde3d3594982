"""Shared fixtures: tiny randomly initialised causal LMs built from a config in code.

No weights are downloaded (docs/COLLECTION.md). Each model has 4 layers, 4 query heads and 2 KV heads
(grouped-query attention), hidden size 64, a 512-token vocabulary, float32 weights, eval mode,
``sdpa`` attention, and is initialised from a fixed seed so every test sees the same weights.

Fixtures
--------
tiny_llama, tiny_qwen2
    A fresh ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` per test (cheap: ~0.2 M parameters).
tiny_model
    Parametrised over both families (``request.param`` is "llama" or "qwen2").
make_tiny_model
    The factory itself, ``make_tiny_model(family="llama", *, seed=0, **config_overrides)``, for
    tests that need another vocabulary size, depth or attention implementation.
tiny_input_ids
    ``torch.LongTensor`` of shape (1, 80), seeded, ids in [3, 512).
validation_cache
    Autouse: ``PAGESTATS_CACHE_DIR`` is a fresh folder of each test, so validation records
    (:mod:`pagestats.io.record`) never reach the user's cache and no test sees another's; the
    whole session (session-scoped fixtures, before any test) uses one temporary folder.
model_dir
    A directory holding the tiny Llama (``save_pretrained``) and a byte-level tokenizer with a chat
    template: a local model for ``pagestats-collect --model``.
smollm2
    The embedded SmolLM2-135M-Instruct, loaded from its GGUF by ``collectors.model.load_model()`` once
    per test session (all xdist workers together) and saved as a float32 safetensors directory with its
    tokenizer, plus ``gguf-manifest.json``, the manifest entry of that GGUF load. Loading the directory
    takes ~1 s of CPU, the GGUF ~23 s (transformers parses the GGUF's header three times, builds a
    tensor-name table per module and dequantises the weights), ~9 s with the header and the table built
    once, as the fixture does (``gguf_once.py``: the same weights, tokenizer and manifest); the weights and the
    tokenizer of the directory are the GGUF's (equal logits, vocabulary and chat template, checked in
    tests/collectors/test_model.py).

Tests that do not use torch never import it: the import happens inside the fixtures.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile

import pytest

from tinymodels import TINY_CONFIG, byte_tokenizer, make_tiny_model as _make_tiny_model

_SESSION_CACHE: list[str] = []


def pytest_configure(config):
    """Validation records of the whole session go to a temporary folder, never the user's cache. Under
    xdist each worker's torch runs one thread: with two workers on two cores, OpenMP's spinning threads
    of one worker starved the other's (the real-model collection fixture took 35 s alone and over 300 s
    beside another worker, which killed that worker in a clean-clone `make test`)."""
    _SESSION_CACHE.append(tempfile.mkdtemp(prefix="pagestats-test-cache-"))
    os.environ["PAGESTATS_CACHE_DIR"] = _SESSION_CACHE[-1]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, "1")


def pytest_unconfigure(config):
    for folder in _SESSION_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def validation_cache(tmp_path_factory, monkeypatch):
    """A fresh ``PAGESTATS_CACHE_DIR`` for each test (subprocesses inherit it), outside its ``tmp_path``."""
    folder = tmp_path_factory.mktemp("pagestats-cache")
    monkeypatch.setenv("PAGESTATS_CACHE_DIR", str(folder))
    return folder

@pytest.fixture
def make_tiny_model():
    return _make_tiny_model


@pytest.fixture
def tiny_llama():
    return _make_tiny_model("llama")


@pytest.fixture
def tiny_qwen2():
    return _make_tiny_model("qwen2")


@pytest.fixture(params=["llama", "qwen2"])
def tiny_model(request):
    return _make_tiny_model(request.param)


@pytest.fixture
def tiny_input_ids():
    import torch

    gen = torch.Generator().manual_seed(1234)
    return torch.randint(3, TINY_CONFIG["vocab_size"], (1, 80), generator=gen)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A saved tiny Llama (vocabulary 512) beside a byte-level tokenizer with a small chat template."""
    tok = byte_tokenizer()
    tok.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                         "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
    d = tmp_path_factory.mktemp("tiny_model")
    _make_tiny_model("llama", vocab_size=512).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def shared_artefact(tmp_path_factory, name: str, build):
    """A folder ``name`` built once per test session by ``build(folder)``, shared by the xdist workers.

    The folder lies beside the workers' base temporary folders (pytest's own base folder without
    xdist); a file lock makes the first worker build it while another that needs it waits, and a
    folder is published only whole (built under another name, then renamed)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / name
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not folder.is_dir():
                partial = base / f"{name}.partial"
                shutil.rmtree(partial, ignore_errors=True)
                partial.mkdir()
                build(partial)
                partial.rename(folder)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return folder


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """The embedded SmolLM2 as a safetensors directory, converted once per session from its GGUF."""
    from collectors.model import default_gguf_path, sha256_file

    gguf = default_gguf_path()

    def convert(folder):
        from collectors.model import load_model
        from gguf_once import gguf_parsed_once

        with gguf_parsed_once():  # the same load_model(), 14 s of CPU less
            lm, tokenizer, manifest = load_model()
        lm.hf_quantizer = None  # the weights are dequantised float32: save them as they are
        del lm.config.quantization_config
        lm.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / "gguf-manifest.json").write_text(json.dumps(manifest))

    return shared_artefact(tmp_path_factory, f"smollm2-{sha256_file(gguf)[:16]}", convert)
