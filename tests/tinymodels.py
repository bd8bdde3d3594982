"""Tiny randomly initialised causal LMs built from a config in code (no weights downloaded).

Shared by the fixtures of ``conftest.py`` and by tests that build a model outside a fixture
(module-scoped fixtures, subprocess scripts): ``from tinymodels import make_tiny_model``. Each
model has 4 layers, 4 query heads and 2 KV heads, hidden size 64, a 512-token vocabulary,
float32 weights, eval mode, and is initialised from a fixed seed.
"""

from __future__ import annotations

TINY_CONFIG = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def make_tiny_model(family: str = "llama", *, seed: int = 0, attn_impl: str = "sdpa", **overrides):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    configs = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if family not in configs:
        raise ValueError(f"unknown tiny model family {family!r}; choose from {sorted(configs)}")
    config = configs[family](**{**TINY_CONFIG, **overrides})
    config._attn_implementation = attn_impl
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    finally:
        torch.random.set_rng_state(generator_state)
    if attn_impl != model.config._attn_implementation:
        model.set_attn_implementation(attn_impl)
    return model.eval()


def byte_tokenizer():
    """A byte-level tokenizer (ids 0–2 are ``<pad>``, ``<s>``, ``</s>``; then the 256 byte symbols), no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
