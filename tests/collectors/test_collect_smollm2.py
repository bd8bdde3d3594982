"""The real embedded SmolLM2-135M-Instruct through pagestats-collect, then `pagestats validate`.

Slow (runs the 135M model on CPU): a few inputs at ~512 tokens, two evictors, every budget,
four generated tokens. The model is the embedded GGUF as the conftest's session fixture
converted it (one GGUF load per session, checked in test_model.py), labelled with its name.
"""

import json

import pyarrow.parquet as pq
import pytest

from pagestats.core import defaults

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, smollm2):
    from collectors import cli

    out = tmp_path_factory.mktemp("smollm2") / "run"
    code = cli.main(["--model", str(smollm2), "--model-name", "SmolLM2-135M-Instruct",
                     "--tasks", "niah_single_1,vt", "--context-length", "512", "--n", "1",
                     "--evictors", "snapkv,h2o", "--max-new-tokens", "4", "--allow-cut-answers", "--out", str(out), "--no-progress"])
    assert code == 0
    return out


def test_smollm2_run_validates(run_dir):
    pytest.importorskip("pagestats.io", reason="pagestats.io (the log reader) is not importable yet")
    from pagestats.cli import main as pagestats_main

    assert pagestats_main(["validate", str(run_dir)]) == 0


def test_smollm2_run_contents(run_dir):
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["model"]["name"] == "SmolLM2-135M-Instruct" and len(m["model"]["sha256"]) == 64
    assert m["model"]["n_layers"] == 30 and m["budgets"] == list(defaults.BUDGETS)
    inputs = [r for f in sorted((run_dir / "inputs").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    outcomes = [r for f in sorted((run_dir / "outcomes").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert len(inputs) == 2 and len(outcomes) == 2 * 2 * len(defaults.BUDGETS)
    L = m["model"]["n_layers"]
    H = m["model"]["n_heads"]
    for r in inputs:
        assert 0.98 * 512 <= r["n_tokens"] <= 512
        assert len(r["agreement"]) == L and len(r["pair_jaccard"]) == L * H * (H - 1) // 2
        assert r["prompt"].startswith("<|im_start|>system")
        assert 0.0 <= r["full_score"] <= 1.0
    full = {(r["task"], r["input_id"]): r["full_prediction"] for r in inputs}
    for o in outcomes:
        if o["budget"] == 1.0:
            assert o["prediction"] == full[(o["task"], o["input_id"])]
