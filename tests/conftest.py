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

Tests that do not use torch never import it: the import happens inside the fixtures.
"""

from __future__ import annotations

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
