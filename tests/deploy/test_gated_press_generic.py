"""GatedPress over every press kvpress 0.5.5 ships that needs no download (issue 41), in the kvpress venv.

For each press, on tiny random Llama and Qwen2 models (sdpa; ObservedAttentionPress eager), the checks
kvpress runs on its own presses, done here through the gate:

* closed gate (τ = +1, D ≤ 1 always) = no press: after greedy decoding, the cache equals the
  uncompressed run's bit for bit (keys, values, no head mask), and so do the tokens and the text;
* open gate (τ = −1) = the base press: the same cache (keys, values, ``masked_key_indices``), tokens
  and text as the press applied by kvpress alone.

Presses kvpress cannot gate are refused in one line when the GatedPress is built, before any compute:
those that override ``BasePress.__call__`` and those kvpress's pipeline treats by their class.
Left out, because they download weights or statistics: DuoAttentionPress, QFilterPress,
ExpectedAttentionStatsPress, KVzapPress; and LUKVPress, whose budget curves kvpress 0.5.5 ships for
Llama-3.1-8B-Instruct only (any other model is a KeyError in kvpress, with or without the gate).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from collectors.deploy import GatedPress  # noqa: E402
from tinymodels import byte_tokenizer  # noqa: E402

K = kvpress
SNAP = dict(compression_ratio=0.5, window_size=16)

#: Every gateable press of kvpress 0.5.5 that needs no download, built small enough for a 160-token prompt.
PRESSES = {
    "Knorm": lambda: K.KnormPress(compression_ratio=0.5),
    "Random": lambda: K.RandomPress(compression_ratio=0.5, seed=0),
    "StreamingLLM": lambda: K.StreamingLLMPress(compression_ratio=0.5),
    "SnapKV": lambda: K.SnapKVPress(**SNAP),
    "PyramidKV": lambda: K.PyramidKVPress(**SNAP),
    "TOVA": lambda: K.TOVAPress(compression_ratio=0.5),
    "ExpectedAttention": lambda: K.ExpectedAttentionPress(compression_ratio=0.5, n_future_positions=32),
    "KeyDiff": lambda: K.KeyDiffPress(compression_ratio=0.5),
    "LagKV": lambda: K.LagKVPress(compression_ratio=0.5, lag_size=16),
    "CUR": lambda: K.CURPress(compression_ratio=0.5),
    "LeverageScore": lambda: K.LeverageScorePress(compression_ratio=0.5, sketch_dimension=16),
    "NonCausalAttn": lambda: K.NonCausalAttnPress(compression_ratio=0.5, chunk_size=64),
    "Compactor": lambda: K.CompactorPress(compression_ratio=0.5, chunk_size=64, sketch_dimension=16),
    "Cap": lambda: K.CapPress(compression_ratio=0.5, n_future_positions=32),
    "ThinK": lambda: K.ThinKPress(key_channel_compression_ratio=0.5, window_size=16),
    "SimLayerKV": lambda: K.SimLayerKVPress(lazy_threshold=0.05, n_initial=2, n_recent=16, n_last=1),
    "CriticalKV": lambda: K.CriticalKVPress(K.SnapKVPress(**SNAP)),
    "CriticalAdaKV": lambda: K.CriticalAdaKVPress(K.SnapKVPress(**SNAP)),
    "AdaKV": lambda: K.AdaKVPress(K.SnapKVPress(**SNAP)),
    "PerLayerCompression": lambda: K.PerLayerCompressionPress(K.KnormPress(), compression_ratios=[0.2, 0.4, 0.6, 0.8]),
    "Chunk": lambda: K.ChunkPress(K.KnormPress(compression_ratio=0.5), chunk_length=40),
    "ChunkKV": lambda: K.ChunkKVPress(K.SnapKVPress(**SNAP), chunk_length=8),
    "EntropyGatedChunkKV": lambda: K.EntropyGatedChunkKVPress(K.SnapKVPress(**SNAP), chunk_length=8),
    "Block": lambda: K.BlockPress(K.KnormPress(compression_ratio=0.5), block_size=40),
    "Composed": lambda: K.ComposedPress([K.KnormPress(compression_ratio=0.3), K.ThinKPress(0.5, window_size=16)]),
    "Merging": lambda: K.MergingPress(K.KnormPress(compression_ratio=0.5)),
    "DMS": lambda: K.DMSPress(K.KnormPress(), threshold=-3.0, sliding_window_size=16),
    "ObservedAttention": lambda: K.ObservedAttentionPress(compression_ratio=0.5),
}
EAGER = {"ObservedAttention"}
#: kvpress's own press fails on the tiny Qwen2, without the gate too: DMSPress cannot find its keys, and
#: CriticalKV / CriticalAdaKV read ``config.head_dim``, which Qwen2Config does not have.
LLAMA_ONLY = {"DMS", "CriticalKV", "CriticalAdaKV"}

#: Refused when built: they override BasePress.__call__, or kvpress's pipeline dispatches on their class.
REFUSED = {
    "KVzip": (lambda: K.KVzipPress(compression_ratio=0.5), "BasePress.__call__"),
    "FastKVzip": (lambda: K.FastKVzipPress(compression_ratio=0.5), "BasePress.__call__"),
    "KVgrad": (lambda: K.KVgradPress(compression_ratio=0.5), "BasePress.__call__"),
    "Finch": (lambda: K.FinchPress(compression_ratio=0.5), "BasePress.__call__"),
    "KVCompose": (lambda: K.KVComposePress(compression_ratio=0.5), "BasePress.__call__"),
    "RestoreKV": (lambda: K.RestoreKVPress(compression_ratio=0.5), "BasePress.__call__"),
    "Decoding": (lambda: K.DecodingPress(base_press=K.KnormPress()), "BasePress.__call__"),
    "CompressionRatioDecoding": (lambda: K.CompressionRatioDecodingPress(base_press=K.KnormPress()),
                                 "BasePress.__call__"),
    "CAM": (lambda: K.CAMPress(base_press=K.KnormPress()), "BasePress.__call__"),
    "PrefillDecoding": (lambda: K.PrefillDecodingPress(prefilling_press=K.KnormPress(compression_ratio=0.5)),
                        "BasePress.__call__"),
    "KeyRerotation": (lambda: K.KeyRerotationPress(K.KnormPress(compression_ratio=0.5)), "by the press's class"),
    "DMS-decoding": (lambda: K.DMSPress(K.KnormPress(), threshold=-3.0, decoding=True), "by the press's class"),
}

TOKENIZER = byte_tokenizer()


def run(model, ids, press, n=4):
    """Greedy tokens, their text, and the cache (per layer K, V and the head mask) after decoding under
    ``press`` (None: no press). The prefill's cache is that cache's first positions, so equal caches
    mean equal prefills and equal decodes. Seeded: some presses draw random sketches."""
    from transformers import DynamicCache

    cache = DynamicCache()
    torch.manual_seed(0)
    with (press(model) if press is not None else contextlib.nullcontext()), torch.no_grad():
        out = model.generate(ids, past_key_values=cache, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    attn = [layer.self_attn for layer in model.model.layers]
    kv = [(layer.keys.clone(), layer.values.clone(), getattr(a, "masked_key_indices", None))
          for layer, a in zip(cache.layers, attn)]
    for a in attn:  # kvpress leaves a head mask on the module after its context; the next run starts clean
        a.masked_key_indices = None
    tokens = out[0, ids.shape[1]:].tolist()
    return tokens, TOKENIZER.decode(tokens), kv


def same_cache(a, b):
    if len(a) != len(b):
        return False
    for (ka, va, ma), (kb, vb, mb) in zip(a, b):
        if ka.shape != kb.shape or not (torch.equal(ka, kb) and torch.equal(va, vb)):
            return False
        if (ma is None) != (mb is None) or (ma is not None and not all(torch.equal(x, y) for x, y in zip(ma, mb))):
            return False
    return True


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("name", list(PRESSES))
def test_closed_gate_is_no_press_and_open_gate_is_the_press(make_tiny_model, family, name):
    if family == "qwen2" and name in LLAMA_ONLY:
        pytest.skip(f"kvpress's own {name} press fails on the tiny Qwen2, without the gate")
    make = PRESSES[name]
    model = make_tiny_model(family, attn_impl="eager" if name in EAGER else "sdpa", vocab_size=len(TOKENIZER),
                            initializer_range=0.2)
    ids = torch.randint(3, len(TOKENIZER), (1, 128), generator=torch.Generator().manual_seed(41))
    plain, base = run(model, ids, None), run(model, ids, make())
    assert not same_cache(plain[2], base[2]), "the press changed nothing here, so the check could not fail"
    closed, opened = GatedPress(make(), tau=1.0), GatedPress(make(), tau=-1.0)
    got_closed, got_open = run(model, ids, closed), run(model, ids, opened)
    assert not closed.last.gate_open and closed.realized_compression_ratio == 0.0 and opened.last.gate_open
    assert same_cache(got_closed[2], plain[2]) and got_closed[:2] == plain[:2]  # cache, tokens, text
    assert same_cache(got_open[2], base[2]) and got_open[:2] == base[:2]


@pytest.mark.parametrize("name", list(REFUSED))
def test_presses_the_gate_cannot_hold_are_refused_in_one_line_when_built(name):
    make, why = REFUSED[name]
    press = make()
    with pytest.raises(ValueError) as err:
        GatedPress(press, tau=0.0)
    message = str(err.value)
    assert message.startswith(f"GatedPress cannot wrap {type(press).__name__}") and why in message
    assert "\n" not in message
