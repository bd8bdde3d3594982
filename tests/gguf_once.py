"""``gguf_parsed_once()``: a GGUF model loaded through transformers parses the file's header once.

transformers' GGUF loading (``load_gguf_checkpoint``) builds a ``gguf.GGUFReader`` of the file once
for the config, once for the tokenizer and once for the weights (4.6 s of CPU each for the
embedded SmolLM2), and calls ``gguf.get_tensor_name_map(arch, n_layers)`` once per module of the
model (397 times, 6.6 s). Both depend only on their arguments and are only read, so inside this
context each is built once per argument: ``collectors.model.load_model()`` of the embedded SmolLM2
takes 8.6 s of CPU instead of 23.0, and gives the same weights, logits, tokenizer and manifest bit
for bit. The tests that load the GGUF (the conftest's ``smollm2`` fixture, the README's deploy
snippet) use it; the collector itself is unchanged.
"""

from __future__ import annotations

import contextlib
import functools


@contextlib.contextmanager
def gguf_parsed_once():
    from unittest import mock

    import gguf

    with mock.patch.object(gguf, "GGUFReader", functools.cache(gguf.GGUFReader)), \
            mock.patch.object(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)):
        yield
