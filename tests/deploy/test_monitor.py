"""Deployment logs (collectors.deploy log_dir) and `pagestats monitor` (issue 24), on real parts.

A tiny random Llama / Qwen2 built from a config runs gated_generate with log_dir; the log is a run of
kind deployment, read back and compared with the GateDecision of every call, then monitored against a
gate file whose calibration D values come from the same model on other prompts. Expected numbers are
counted here from the decisions and from scipy/statsmodels on the same arrays, not by the code under
test. Drift is made by writing deployment rows of a shifted D distribution through the same writer.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest

torch = pytest.importorskip("torch")

from collectors import deploy  # noqa: E402
from collectors.deploy import GateDecision, close_log, gated_generate  # noqa: E402
from pagestats.core import profile, schema# noqa: E402
from pagestats.cli import main as pagestats_main  # noqa: E402
from pagestats.deploy.gatefile import Gate  # noqa: E402
from pagestats.io.deployment import read_deployment  # noqa: E402
from pagestats.deploy.monitor import monitor  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny"
PEAKED = dict(initializer_range=0.2)  # peaked attention: D varies between prompts


class Tok:
    """Ids in, text out: enough of a tokenizer for id prompts (decoded to their numbers)."""

    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def prompt(seed: int, n: int = 96):
    return torch.randint(3, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def pilot_drops(model, seeds) -> list[float]:
    """D of the model on the prompts of ``seeds``: the calibration inputs of the gate file."""
    return [gated_generate(model, Tok(), prompt(s), tau=0.0, max_new_tokens=1).decision.drop for s in seeds]


def gate_for(drops, *, tau=None, model=MODEL, n_layers=4, **overrides) -> Gate:
    tau = float(np.median(drops)) if tau is None else tau
    pilot = {"drops": [float(d) for d in drops], "p_open": float(np.mean(np.asarray(drops) >= tau)),
             "n_inputs": len(drops)}
    return Gate(tau=tau, policy="fixed", model=model, n_layers=n_layers, pilot=pilot, **overrides)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def family(request):
    return request.param


@pytest.fixture(scope="module")
def deployed(family, tmp_path_factory):
    """A gate file from 12 pilot prompts and a deployment log of 8 others (one shorter than w)."""
    from tinymodels import make_tiny_model as _make_tiny_model

    model = _make_tiny_model(family, **PEAKED)
    root = tmp_path_factory.mktemp(f"deploy-{family}")
    gate = gate_for(pilot_drops(model, range(100, 112)))
    gate.write(root / "gate.json")
    log = root / "log"
    results = []
    for seed, n in zip(range(8), (96, 96, 20, 120, 96, 64, 80, 96)):
        with pytest.warns(deploy.ShortPromptWarning) if n < 32 else _nothing():
            results.append(gated_generate(model, Tok(), prompt(seed, n), gate=root / "gate.json", max_new_tokens=4,
                                          model_name=MODEL, log_dir=log, log_text=True))
    close_log(log)
    return {"model": model, "gate": gate, "gate_path": root / "gate.json", "log": log, "results": results,
            "family": family}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_logged_rows_equal_the_decisions(deployed):
    run = read_deployment(deployed["log"])
    rows = run.rows
    results = deployed["results"]
    assert rows["input_id"].to_list() == list(range(len(results)))
    for row, r in zip(rows.iter_rows(named=True), results):
        d = r.decision
        assert row["drop"] == d.drop  # bit for bit
        assert np.array_equal(np.asarray(row["agreement"], dtype=np.float32), d.agreement)
        assert (row["gate_open"], row["tau"], row["reason"]) == (d.gate_open, d.tau, d.reason)
        assert (row["n_tokens"], row["n_kept"], row["kept_fraction"]) == (d.n_tokens, d.n_kept, d.kept_fraction)
        assert (row["prediction"], row["n_generated"], row["stop_reason"]) == (r.text, len(r.token_ids), r.stop_reason)
        assert row["model"] == MODEL and row["run_id"] == run.run_id
        assert row["drop"] == float(profile.drop_from_agreement(np.asarray(row["agreement"], dtype=np.float32)))
    reasons = {d.decision.reason for d in results}
    assert reasons == {"open", "closed", "short-prompt"}  # the test covers every decision
    manifest = json.loads((deployed["log"] / "manifest.json").read_text())
    gate = deployed["gate"]
    assert manifest["kind"] == "deployment" and manifest["schema_version"] == schema.SCHEMA_VERSION
    assert manifest["model"]["name"] == MODEL and manifest["model"]["n_layers"] == 4
    assert manifest["gate"] == {"w": 32, "k": 32, "bins": 1 / 3, "convention": "deployed", "tau": gate.tau,
                                "policy": "fixed", "sha256": gate.sha256(), "calibration_model": MODEL,
                                "calibration_logs_sha256": None}
    assert gate.sha256() == schema.sha256_file(deployed["gate_path"])  # the file's own sha256
    assert manifest["deployment"] == {"entry": "gated_generate", "evictor": "snapkv", "budget": 0.5, "log_text": True}
    assert not (deployed["log"] / "outcomes").exists() and not (deployed["log"] / "topk").exists()


def test_monitor_counts_equal_hand_counts_and_scipy(deployed):
    from scipy.stats import ks_2samp
    from statsmodels.stats.proportion import proportion_confint

    results, gate = deployed["results"], deployed["gate"]
    report = monitor(deployed["log"], deployed["gate_path"])
    decided = [r.decision for r in results if r.decision.n_tokens >= 32]
    n_open = sum(d.drop >= gate.tau for d in decided)
    assert (report.n_inputs, report.n_short, report.n_decided) == (8, 1, 7)
    assert (report.n_open, int(report.p_open.k), int(report.p_open.n)) == (n_open, n_open, 7)
    low, high = proportion_confint(n_open, 7, alpha=0.05, method="wilson")
    assert report.p_open.estimate == n_open / 7
    assert (report.p_open.low, report.p_open.high) == pytest.approx((low, high))
    cal = np.asarray(gate.pilot["drops"])
    assert report.p_open_calibration.estimate == pytest.approx(gate.pilot["p_open"])
    assert int(report.p_open_calibration.k) == int(np.sum(cal >= gate.tau)) and int(report.p_open_calibration.n) == 12
    kept = [r.decision.n_kept / r.decision.n_tokens for r in results]
    assert report.kept_fraction == pytest.approx(np.mean(kept), abs=1e-15)
    assert report.compression == pytest.approx(1 / np.mean(kept), abs=1e-12)
    expected = ks_2samp([d.drop for d in decided], cal)
    assert (report.ks_statistic, report.ks_pvalue) == (float(expected.statistic), float(expected.pvalue))
    assert report.tau == report.gate_tau == gate.tau and report.same_gate_file is True
    assert report.drift == [] and report.warnings == []


def test_monitor_cli_table_and_json(deployed, capsys):
    args = ["monitor", str(deployed["log"]), "--gate", str(deployed["gate_path"])]
    assert pagestats_main(args) == 0
    out, err = capsys.readouterr()
    assert err == "" and "p_open" in out and "compression" in out and "KS statistic" in out
    assert pagestats_main([*args, "--format", "json", "--strict"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    report = monitor(deployed["log"], deployed["gate_path"])
    assert data["ks"]["pvalue"] == report.ks_pvalue and data["p_open"]["k"] == report.n_open
    assert data["compression"] == report.compression and data["n_inputs"] == 8 and data["drift"] == []
    for logs in ([str(deployed["log"])], [str(deployed["log"].parent)], [str(deployed["log"].parent / "l*")]):
        assert pagestats_main(["validate", *logs]) == 0  # the run, a folder holding it, a glob
        err = capsys.readouterr().err.splitlines()
        assert "a deployment run" in err[0] and "8 inputs" in err[0] and err[-1].startswith("ok:"), err


def test_whatif_report_index_refuse_a_deployment_run(deployed, tmp_path, capsys):
    log = str(deployed["log"])
    for argv in (["whatif", log], ["whatif", log, "--format", "csv"], ["whatif", str(deployed["log"].parent)],
                 ["report", log, "--out", str(tmp_path / "r")],
                 ["index", log, "--db", str(tmp_path / "x.duckdb")], ["calibrate", log, "--out", str(tmp_path / "g")],
                 ["compact", log, "--out", str(tmp_path / "c")]):
        assert pagestats_main(argv) == 2, argv
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1 and "deployment run" in lines[0], (argv, err)
    assert not (tmp_path / "r").exists() and not (tmp_path / "x.duckdb").exists()


def test_validate_names_a_tampered_deployment_log(deployed, tmp_path, capsys):
    import shutil

    log = tmp_path / "log"
    shutil.copytree(deployed["log"], log)
    part = sorted((log / "inputs").glob("*.parquet"))[1]
    frame = pl.read_parquet(part).with_columns(pl.col("drop") + 0.5)
    schema.write_parquet("deployment", frame, part)
    assert pagestats_main(["validate", str(log)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(str(part) in line and "sha256" in line for line in out)
    assert any(f"{part}:row 0: drop" in line and "is not D of its agreement" in line for line in out)
    assert pagestats_main(["monitor", str(log), "--gate", str(deployed["gate_path"])]) == 1
    assert "problems in the deployment log" in capsys.readouterr().err


RESUME = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from tinymodels import make_tiny_model as _make_tiny_model
    from collectors.deploy import gated_generate
    model = _make_tiny_model({family!r}, initializer_range=0.2)
    class Tok:
        eos_token_id = 2
        def decode(self, ids, skip_special_tokens=False):
            return " ".join(map(str, ids))
    for seed in (50, 51):
        ids = torch.randint(3, 512, (1, 96), generator=torch.Generator().manual_seed(seed))
        r = gated_generate(model, Tok(), ids, gate={gate!r}, max_new_tokens=4, model_name="tiny", log_dir={log!r},
                           log_text=True)
        print(r.decision.drop)
""")


def test_resume_in_a_new_process_appends_and_never_overwrites(deployed, tmp_path):
    import shutil

    log = tmp_path / "log"
    shutil.copytree(deployed["log"], log)
    before = {p.name: schema.sha256_file(p) for p in (log / "inputs").glob("*.parquet")}
    script = RESUME.format(tests=str(ROOT / "tests"), family=deployed["family"], gate=str(deployed["gate_path"]),
                           log=str(log))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    drops = [float(x) for x in done.stdout.split()]
    after = {p.name: schema.sha256_file(p) for p in (log / "inputs").glob("*.parquet")}
    assert {k: after[k] for k in before} == before and len(after) == len(before) + 2  # old parts untouched
    run = read_deployment(log)
    assert run.rows["input_id"].to_list() == list(range(10))
    assert run.rows["drop"].to_list()[8:] == drops
    assert run.rows["drop"].to_list()[:8] == [r.decision.drop for r in deployed["results"]]

    # while this process appends to the log, another is refused, with one line
    model = deployed["model"]
    gated_generate(model, Tok(), prompt(60), gate=deployed["gate_path"], max_new_tokens=1, model_name=MODEL,
                   log_dir=log, log_text=True)
    try:
        refused = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100, cwd=ROOT)
        assert refused.returncode != 0 and "is being appended to by another process" in refused.stderr
        # another gate into the same log_dir: refused (a log is one gate's)
        with pytest.raises(ValueError, match="open for another deployment"):
            gated_generate(model, Tok(), prompt(61), tau=0.5, max_new_tokens=1, model_name=MODEL, log_dir=log)
    finally:
        close_log(log)
    with pytest.raises(ValueError, match="holds another run"):
        gated_generate(model, Tok(), prompt(61), tau=0.5, max_new_tokens=1, model_name=MODEL, log_dir=log)
    close_log(log)
    assert read_deployment(log).rows.height == 11


# --------------------------------------------------------------------------- drift, written through the writer


def _decisions(agreement_of, tau: float, n_tokens: int = 100):
    """GateDecisions of synthetic agreement profiles (D from a_ℓ as the collector computes it)."""
    out = []
    for a in agreement_of:
        a = np.asarray(a, dtype=np.float32)
        d = float(profile.drop_from_agreement(a))
        opened = d >= tau
        out.append(GateDecision(drop=d, gate_open=opened, tau=tau, agreement=a, n_tokens=n_tokens,
                                n_kept=n_tokens // 2 if opened else n_tokens,
                                kept_fraction=0.5 if opened else 1.0, reason="open" if opened else "closed"))
    return out


def _profiles(rng, n, late_shift=0.0):
    """a_ℓ of 4 layers: early high, late lower by ``late_shift`` on average (larger D)."""
    early = rng.uniform(0.55, 0.75, size=(n, 1))
    middle = rng.uniform(0.4, 0.6, size=(n, 2))
    late = np.clip(rng.uniform(0.35, 0.55, size=(n, 1)) - late_shift, 0, 1)
    return np.concatenate([early, middle, late], axis=1)


def _write_log(model, path: Path, gate: Gate, decisions) -> None:
    manifest = deploy.deployment_manifest(model, model_name=MODEL, tau=gate.tau, gate=gate, window=gate.window,
                                          k=gate.k, bin_fraction=gate.bin_fraction, convention=gate.convention,
                                          entry="GatedPress", evictor="SnapKVPress(compression_ratio=0.5)",
                                          budget=None, log_text=False)
    log = deploy.open_log(path, manifest, part_size=16)
    for d in decisions:
        log.append(d)
    close_log(path)


@pytest.fixture(scope="module")
def drift_logs(tmp_path_factory):
    from tinymodels import make_tiny_model as _make_tiny_model

    model = _make_tiny_model("llama")
    rng = np.random.default_rng(7)
    root = tmp_path_factory.mktemp("drift")
    cal = profile.drop_from_agreement(_profiles(rng, 200).astype(np.float32))
    gate = gate_for(cal.tolist())
    gate.write(root / "gate.json")
    _write_log(model, root / "same", gate, _decisions(_profiles(rng, 120), gate.tau))
    _write_log(model, root / "shifted", gate, _decisions(_profiles(rng, 120, late_shift=0.15), gate.tau))
    return {"root": root, "gate": gate, "model": model}


def test_no_drift_on_the_calibration_distribution(drift_logs, capsys):
    root = drift_logs["root"]
    report = monitor(root / "same", root / "gate.json")
    assert report.drift == [] and report.ks_pvalue > 0.01
    assert pagestats_main(["monitor", str(root / "same"), "--gate", str(root / "gate.json"), "--strict"]) == 0
    assert capsys.readouterr().err == ""


def test_shifted_drop_warns_once_per_kind_and_strict_exits_1(drift_logs, capsys):
    from scipy.stats import ks_2samp

    root, gate = drift_logs["root"], drift_logs["gate"]
    rows = read_deployment(root / "shifted").rows
    report = monitor(root / "shifted", root / "gate.json")
    assert report.ks_pvalue == float(ks_2samp(rows["drop"].to_numpy(), gate.pilot["drops"]).pvalue) < 0.01
    assert report.drift == ["p_open", "drop"] and report.p_open.low > report.p_open_calibration.high
    args = ["monitor", str(root / "shifted"), "--gate", str(root / "gate.json")]
    assert pagestats_main(args) == 0
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("warning: drift p_open:")
    assert lines[1].startswith("warning: drift drop:")
    assert "drift               p_open, drop" in out
    assert pagestats_main([*args, "--strict", "--format", "json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["drift"] == ["p_open", "drop"]
    assert err.strip().splitlines()[-1] == "error: --strict: 2 drift warnings (p_open, drop)"
    # a smaller alpha than the p-value: the D warning goes, the p_open one stays
    assert pagestats_main([*args, "--alpha", f"{report.ks_pvalue / 2:.3g}", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["drift"] == ["p_open"]


def test_another_tau_in_use_warns_tau(drift_logs, tmp_path, capsys):
    root, gate = drift_logs["root"], drift_logs["gate"]
    moved = dataclasses.replace(gate, tau=gate.tau + 1e-3)
    moved.write(tmp_path / "moved.json")
    report = monitor(root / "same", tmp_path / "moved.json")
    assert report.drift[0] == "tau" and report.same_gate_file is False and report.tau == gate.tau
    assert pagestats_main(["monitor", str(root / "same"), "--gate", str(tmp_path / "moved.json"), "--strict"]) == 1
    assert capsys.readouterr().err.startswith("warning: drift tau: the deployment gated with τ")


def test_bad_inputs_exit_2_with_one_line(drift_logs, tmp_path, capsys):
    root, gate = drift_logs["root"], drift_logs["gate"]
    collection = tmp_path / "collection"
    collection.mkdir()
    (collection / "manifest.json").write_text(json.dumps({"schema_version": 2, "run_id": "r"}))
    cases = {"other-model": {"model": "other"}, "other-w": {"window": 16}, "other-k": {"k": 8},
             "other-bins": {"bin_fraction": 0.25}, "other-convention": {"convention": "strict"},
             "other-depth": {"n_layers": 6}, "no-drops": {"pilot": {"p_open": 0.5}}}
    for name, change in cases.items():
        dataclasses.replace(gate, **change).write(tmp_path / f"{name}.json")
    (tmp_path / "broken.json").write_text("{")
    log, good = str(root / "same"), str(root / "gate.json")
    argvs = [
        ["monitor", str(tmp_path / "missing"), "--gate", good],
        ["monitor", str(collection), "--gate", good],
        ["monitor", str(tmp_path), "--gate", good],
        ["monitor", log, "--gate", str(tmp_path / "missing.json")],
        ["monitor", log, "--gate", str(tmp_path / "broken.json")],
        ["monitor", log, "--gate", good, "--alpha", "0"],
        ["monitor", log, "--gate", good, "--alpha", "1"],
        ["monitor", log, "--gate", good, "--alpha", "nan"],
        ["monitor", log, "--gate", good, "--format", "csv"],
        ["monitor", log],
        *(["monitor", log, "--gate", str(tmp_path / f"{name}.json")] for name in cases),
    ]
    for argv in argvs:
        try:
            code = pagestats_main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (argv, code, err)
        assert "Traceback" not in err
