"""gate.json records what set τ as the policy's SQL computed it (issue 44 §2): the pilot's μ and σ of a
z-scored gate and the two class means of a midpoint gate reproduce its τ exactly, in doubles, and agree
with a brute force over the pilot written here.

Before, calibrate recomputed μ and σ in NumPy (two-pass std) beside DuckDB's streaming stddev_samp: on
these logs σ differed in its last bit for the held-out and random pilots, and μ + θσ missed τ by an ulp.
"""

from __future__ import annotations

import statistics

import polars as pl
import pytest

from pagestats import testing
from pagestats.deploy.calibrate import calibrate
from pagestats.io import load
from pagestats.replay import Midpoint, ZScored


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    syn = testing.synthetic_logs(models={"m": (6, 3)}, context_lengths=(4096,), tasks=("niah_multikey_3", "vt", "fwe"),
                                 n_inputs=25, evictors=("snapkv",), budgets=(0.5, 1.0), with_topk=False,
                                 with_text=False)
    return load([str(r) for r in syn.write(tmp_path_factory.mktemp("gate_record") / "logs")])


@pytest.mark.parametrize("policy", [ZScored(pilot_n=30), ZScored(pilot_n=20, pilot_split="random", seed=3),
                                    ZScored(theta_z=0.3, pilot_n=20, pilot_split="first")], ids=lambda p: p.name)
def test_z_gate_records_the_mu_and_sigma_that_set_tau(logs, policy):
    gate = calibrate(logs, policy)
    p = gate.pilot
    assert gate.policy == "z" and (p["theta"], p["n"], p["split"], p["seed"]) == (
        policy.theta_z, policy.pilot_n, policy.pilot_split, policy.seed)
    assert p["mu"] + p["theta"] * p["sigma"] == gate.tau  # exactly: the doubles DuckDB added
    if policy.pilot_split == "first":  # the first n inputs in (input_id, task, run_id) order
        rows = sorted(logs.inputs.select("input_id", "task", "run_id", "drop").rows())[:policy.pilot_n]
        drops = [r[3] for r in rows]
        assert p["mu"] == pytest.approx(statistics.fmean(drops), rel=1e-13)
        assert p["sigma"] == pytest.approx(statistics.stdev(drops), rel=1e-13)


def test_midpoint_gate_records_the_class_means_that_set_tau(logs):
    gate = calibrate(logs, Midpoint())
    p = gate.pilot
    assert gate.policy == "midpoint" and (p["capacity_mean"] + p["dilution_mean"]) / 2 == gate.tau
    first = {t: logs.inputs.filter(pl.col("task") == t).sort("input_id", "run_id").head(20)["drop"].to_list()
             for t in ("niah_multikey_3", "vt")}
    assert p["capacity_mean"] == pytest.approx(statistics.fmean(first["niah_multikey_3"]), rel=1e-13)
    assert p["dilution_mean"] == pytest.approx(statistics.fmean(first["vt"]), rel=1e-13)
    assert (p["n_capacity"], p["n_dilution"]) == (20, 20)
    assert p["tasks"] == {"capacity": ["niah_multikey_3"], "dilution": ["vt"]}


def test_a_policy_without_a_gate_threshold_is_refused(logs):
    from pagestats.replay import TaskOracle

    with pytest.raises(ValueError, match="policy 'oracle\\(task-label\\)' has no threshold a gate file holds; use "
                                         "fixed, z, midpoint, risk"):
        calibrate(logs, TaskOracle())
