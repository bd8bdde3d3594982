"""`pagestats calibrate --policy risk` (issue 43): the gate file records what anyone needs to recompute τ,
and recomputing it from the recorded keys with a brute force (scipy's exact binomial test) gives it again."""

from __future__ import annotations

import json

import polars as pl
import pytest

from pagestats.cli import main
from pagestats.deploy.risk import NEVER_OPENS
from pagestats.testing import synthetic_logs
from brute import brute_ltt_tau


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    s = synthetic_logs(models={"m": (4, 2)}, n_inputs=40, tasks=("niah_multikey_3", "vt", "fwe"),
                       evictors=("snapkv", "h2o"), budgets=(0.125, 0.5, 1.0), seed=3)
    root = tmp_path_factory.mktemp("risk")
    return s, [str(p) for p in s.write(root)]




def _calibrate_risk(paths, out, capsys, alpha: str, delta: str, pilot_n: str):
    """``pagestats calibrate --policy risk`` at b = 1/8 for SnapKV: exit code, stderr and the gate file."""
    rc = main(["calibrate", *paths, "--policy", "risk", "--alpha", alpha, "--delta", delta, "--budget", "0.125",
               "--evictor", "snapkv", "--pilot-n", pilot_n, "--out", str(out)])
    err = capsys.readouterr().err
    return rc, err, json.loads(out.read_text()) if out.exists() else None


def test_gate_file_recomputes(runs, tmp_path, capsys):
    s, paths = runs
    rc, err, gate = _calibrate_risk(paths, tmp_path / "gate.json", capsys, "0.3", "0.1", "60")
    assert rc == 0, err
    p = gate["pilot"]
    assert gate["policy"] == "risk" and (p["harm_bound"], p["delta"], p["budget"], p["evictor"]) == (0.3, 0.1, 0.125, "snapkv")
    assert gate["mode"] == "query-aware" and gate["prompt_style"] == "ruler"  # as calibrate's other policies record
    keys = pl.DataFrame(p["calibration_inputs"], schema=["run_id", "task", "input_id"], orient="row")
    assert keys.height == p["n"] == 60 and keys.unique().height == 60
    # labels read here from the synthetic frames, not through pagestats.deploy.risk
    rows = keys.join(s.inputs.select("run_id", "task", "input_id", "drop", "full_score"), on=["run_id", "task", "input_id"])
    rows = rows.join(s.outcomes.filter((pl.col("evictor") == "snapkv") & (pl.col("budget") == 0.125))
                     .select("run_id", "task", "input_id", "score"), on=["run_id", "task", "input_id"])
    harmed = (rows["score"] < rows["full_score"]).to_list()
    tau = brute_ltt_tau(rows["drop"].to_list(), harmed, 0.3, 0.1)
    assert tau is not None and gate["tau"] == tau and p["certified"]
    x = sum(1 for d, h in zip(rows["drop"], harmed) if d >= tau and h)
    assert p["observed_harm"] == x / 60
    assert "τ = " in err and "risk" in err


def test_nothing_certified_never_opens(runs, tmp_path, capsys):
    _, paths = runs
    rc, err, gate = _calibrate_risk(paths, tmp_path / "gate.json", capsys, "0.001", "0.05", "20")
    assert rc == 0 and gate["tau"] == NEVER_OPENS and gate["pilot"]["certified"] is False
    assert "never opens" in err and "no τ certified" in err


@pytest.mark.parametrize("argv,text", [
    (["--alpha", "0.1"], "--alpha applies to --policy risk"),
    (["--policy", "risk", "--alpha", "0.1", "--delta", "0.1"], "needs --budget"),
    (["--policy", "risk", "--alpha", "0", "--delta", "0.1", "--budget", "0.125"], "--alpha 0.0 is not in (0, 1)"),
    (["--policy", "risk", "--alpha", "0.1", "--delta", "0.1", "--budget", "0.125"], "choose one with --evictor"),
    (["--policy", "risk", "--alpha", "0.1", "--delta", "0.1", "--budget", "0.25", "--evictor", "snapkv"],
     "not an eviction budget"),
    (["--policy", "risk", "--alpha", "0.1", "--delta", "0.1", "--budget", "0.125", "--evictor", "snapkv",
      "--pilot-split", "first"], "--pilot-split must be held-out"),
])
def test_bad_usage_is_one_line_exit_2(runs, tmp_path, capsys, argv, text):
    _, paths = runs
    out = tmp_path / "gate.json"
    rc = main(["calibrate", *paths, *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and text in err and err.count("\n") == 1, err
    assert not out.exists()


def test_policy_comparison_evaluates_the_risk_gate_outside_its_calibration_inputs(runs, tmp_path, capsys):
    """The risk row: harm and p_open over the inputs outside the gate's calibration set, counted here
    from the synthetic frames; the fixed τ row: over every input."""
    from pagestats.deploy.gatefile import Gate
    from pagestats.deploy.risk import policy_comparison
    from pagestats.io import load

    s, paths = runs
    rc, err, _ = _calibrate_risk(paths, tmp_path / "gate.json", capsys, "0.3", "0.1", "60")
    assert rc == 0, err
    gate = Gate.from_file(tmp_path / "gate.json")
    out = policy_comparison(load(paths), gate)
    key = ["run_id", "task", "input_id"]
    cal = pl.DataFrame(gate.pilot["calibration_inputs"], schema=key, orient="row")
    rows = s.inputs.select(*key, "drop", "full_score").join(
        s.outcomes.filter((pl.col("evictor") == "snapkv") & (pl.col("budget") == 0.125)).select(*key, "score"), on=key)
    for policy, tau, evaluated in (("risk", gate.tau, rows.join(cal, on=key, how="anti")), ("fixed", 0.07, rows)):
        opened = evaluated["drop"] >= tau
        harmed = opened & (evaluated["score"] < evaluated["full_score"])
        row = out.filter(pl.col("policy") == policy).row(0, named=True)
        assert row["n_inputs"] == evaluated.height
        assert row["p_open"] == pytest.approx(opened.mean()) and row["harm"] == pytest.approx(harmed.mean())
