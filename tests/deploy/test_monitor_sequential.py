"""`pagestats monitor --sequential` (issue 43) on deployment logs written through collectors.deploy's writer:
no warning on the calibration law, a drift named with the input it was first detected at on a shifted one.
The first-detected input is checked by rerunning the test on the log's prefixes (an anytime test decides
at each input from the inputs before it only)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from collectors import deploy  # noqa: E402
from collectors.deploy import GateDecision, close_log  # noqa: E402
from pagestats.core import profile# noqa: E402
from pagestats.cli import main as pagestats_main  # noqa: E402
from pagestats.deploy.gatefile import Gate  # noqa: E402
from pagestats.io.deployment import read_deployment  # noqa: E402
from pagestats.deploy.monitor import monitor  # noqa: E402
from pagestats.stats.sequential import sequential_drift  # noqa: E402


def _profiles(rng, n, late_shift=0.0):
    early = rng.uniform(0.55, 0.75, size=(n, 1))
    middle = rng.uniform(0.4, 0.6, size=(n, 2))
    late = np.clip(rng.uniform(0.35, 0.55, size=(n, 1)) - late_shift, 0, 1)
    return np.concatenate([early, middle, late], axis=1).astype(np.float32)


def _write(model, path: Path, gate: Gate, profiles) -> None:
    manifest = deploy.deployment_manifest(model, model_name="tiny", tau=gate.tau, gate=gate, window=gate.window,
                                          k=gate.k, bin_fraction=gate.bin_fraction, convention=gate.convention,
                                          entry="GatedPress", evictor="SnapKVPress(compression_ratio=0.5)",
                                          budget=None, log_text=False)
    log = deploy.open_log(path, manifest, part_size=64)
    for a in profiles:
        d = float(profile.drop_from_agreement(a))
        opened = d >= gate.tau
        log.append(GateDecision(drop=d, gate_open=opened, tau=gate.tau, agreement=a, n_tokens=100,
                                n_kept=50 if opened else 100, kept_fraction=0.5 if opened else 1.0,
                                reason="open" if opened else "closed"))
    close_log(path)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    from tinymodels import make_tiny_model

    model = make_tiny_model("llama")
    rng = np.random.default_rng(17)
    root = tmp_path_factory.mktemp("sequential")
    cal = profile.drop_from_agreement(_profiles(rng, 300))
    tau = float(np.median(cal))
    gate = Gate(tau=tau, policy="fixed", model="tiny", n_layers=4,
                pilot={"drops": cal.tolist(), "p_open": float(np.mean(cal >= tau)), "n_inputs": 300})
    gate.write(root / "gate.json")
    _write(model, root / "same", gate, _profiles(rng, 400))
    _write(model, root / "shifted", gate, np.concatenate([_profiles(rng, 150), _profiles(rng, 250, late_shift=0.1)]))
    return root, gate


def test_no_drift_no_warning(logs, capsys):
    root, _ = logs
    assert pagestats_main(["monitor", str(root / "same"), "--gate", str(root / "gate.json"), "--sequential",
                           "--alpha", "0.05", "--strict"]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in err and "first detected      none" in out


def test_shift_is_first_detected_where_its_prefix_first_alarms(logs, capsys):
    root, gate = logs
    report = monitor(root / "shifted", root / "gate.json", alpha=0.05, sequential=True)
    assert "drop" in report.drift and report.first_detected["drop"] >= 150  # the shift starts at input 150
    rows = read_deployment(root / "shifted").rows.sort("input_id")
    d, x = rows["drop"].to_numpy(), rows["gate_open"].to_numpy()
    i = report.sequential.drop_alarm
    assert rows["input_id"][i] == report.first_detected["drop"]

    def alarm(n):
        return sequential_drift(gate.pilot["drops"], d[:n], x[:n], gate.tau, alpha=0.05,
                                rng=np.random.default_rng(0)).drop_alarm

    assert alarm(i + 1) == i and alarm(i) is None
    assert pagestats_main(["monitor", str(root / "shifted"), "--gate", str(root / "gate.json"), "--sequential",
                           "--alpha", "0.05", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    body = json.loads(out)
    assert body["sequential"]["first_detected_input_id"]["drop"] == report.first_detected["drop"]
    assert f"first detected at input {report.first_detected['drop']}" in err


def test_seed_needs_sequential(logs, capsys):
    root, _ = logs
    assert pagestats_main(["monitor", str(root / "same"), "--gate", str(root / "gate.json"), "--seed", "3"]) == 2
    assert capsys.readouterr().err.strip() == "error: --seed applies to --sequential"
