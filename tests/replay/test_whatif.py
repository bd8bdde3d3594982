"""pagestats.replay.whatif: the docs/CLI.md table against a hand-computed log and a brute-force loop."""

from __future__ import annotations

import argparse
import dataclasses
import csv
import io as stdio
import math
from contextlib import redirect_stdout

import polars as pl
import pytest

from pagestats.core import defaults
from pagestats.io import Logs
from pagestats.replay import FixedTau, Midpoint, ProfileSpec, RecalibratedTau, TaskOracle, ZScored
from pagestats.cli.options import parse_layers, policy_from_args, profile_from_args
from pagestats.replay.whatif import WHATIF_COLUMNS, whatif_table

from brute import brute_whatif


def tiny_logs():
    """2 tasks × 2 inputs, L = 3 (bins {0}, {2}), so D = a_0 − a_2 exactly in float32."""
    spec = [  # task, input_id, a_0, n_tokens, full_score, score at b = 0.5
        ("niah_multikey_3", 0, 0.0625, 100, 1.0, 0.0),
        ("niah_multikey_3", 1, 0.25, 200, 1.0, 0.5),
        ("vt", 0, 0.5, 100, 0.0, 1.0),
        ("vt", 1, -0.125, 120, 1.0, 0.0),
    ]
    inputs, outcomes = [], []
    for task, i, a0, n_tokens, full, score in spec:
        inputs.append(
            dict(run_id="r1", model="m", context_length=4096, task=task, input_id=i, draw=0, n_tokens=n_tokens,
                 drop=a0, agreement=[a0, 0.5, 0.0], pair_jaccard=[a0, 0.5, 0.0], full_score=full,
                 task_class=defaults.default_task_class(task))
        )  # fmt: skip
        outcomes.append(dict(run_id="r1", task=task, input_id=i, evictor="snapkv", budget=0.5,
                             n_kept=n_tokens // 2, score=score))  # fmt: skip
        outcomes.append(dict(run_id="r1", task=task, input_id=i, evictor="snapkv", budget=1.0,
                             n_kept=n_tokens, score=full))  # fmt: skip
    schema = {"agreement": pl.List(pl.Float32), "pair_jaccard": pl.List(pl.Float32)}
    return Logs(inputs=pl.DataFrame(inputs, schema_overrides=schema), outcomes=pl.DataFrame(outcomes), topk=None)


def test_whatif_tiny_log_by_hand():
    table = whatif_table(tiny_logs(), FixedTau(0.07))
    assert table.columns == list(WHATIF_COLUMNS)
    assert table.dtypes[5] == pl.Int64 and all(t == pl.Float64 for t in table.dtypes[6:-1])
    assert table.dtypes[-1] == pl.Boolean
    # gate: mk3/0 D=0.0625 closed, mk3/1 0.25 open, vt/0 0.5 open, vt/1 −0.125 closed
    expected = [
        # task, b, n, full, plain, gated, delta, harm_p, harm_g, p_open, kept_kv
        ("niah_multikey_3", 0.5, 2, 1.0, 0.25, 0.75, 0.5, 1.0, 0.5, 0.5, (1.0 + 0.5) / 2),
        ("niah_multikey_3", 1.0, 2, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5, 1.0),
        ("vt", 0.5, 2, 0.5, 0.5, 1.0, 0.5, 0.5, 0.0, 0.5, (0.5 + 1.0) / 2),
        ("vt", 1.0, 2, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.5, 1.0),
    ]
    got = table.rows()
    assert len(got) == len(expected)
    for row, exp in zip(got, expected):
        assert row[:3] == ("m", 4096, "snapkv")
        assert row[3:6] == exp[:3]
        assert row[6:-1] == pytest.approx(exp[3:], abs=1e-15)
        assert row[-1] is False  # p_open = 0.5: not degenerate


def test_whatif_extremes_and_oracle():
    logs = tiny_logs()
    lo = whatif_table(logs, FixedTau(-math.inf))
    assert (lo["delta"] == 0).all() and (lo["p_open"] == 1).all() and lo["harm_gated"].equals(lo["harm_plain"])
    hi = whatif_table(logs, FixedTau(math.inf))
    assert hi["acc_gated"].equals(hi["acc_full"], check_names=False) and (hi["kept_kv"] == 1).all()
    orc = whatif_table(logs, TaskOracle())
    assert orc.filter(pl.col("task") == "vt")["p_open"].to_list() == [1.0, 1.0]
    assert orc.filter(pl.col("task") == "niah_multikey_3")["p_open"].to_list() == [0.0, 0.0]




@pytest.fixture(scope="module")
def synth():
    from pagestats.testing import synthetic_logs

    s = synthetic_logs(
        models={"qwen-like": (6, 4), "llama-like": (8, 3)},
        n_inputs=5,
        tasks=("niah_multikey_3", "vt", "fwe"),
        evictors=("snapkv", "h2o"),
        budgets=(0.25, 0.5, 1.0),
        k_max=32,
        with_text=False,
        seed=3,
    )
    return Logs(inputs=s.inputs, outcomes=s.outcomes, topk=s.topk, manifests=s.manifests)


@pytest.mark.parametrize(
    "policy,profile",
    [
        (FixedTau(0.05), ProfileSpec()),
        (ZScored(pilot_n=6), ProfileSpec(layers="every-2")),
        (Midpoint(n=3), ProfileSpec(k=16)),
        (FixedTau(0.03), ProfileSpec(pairs_fraction=0.5, pair_draws=3, seed=1)),
    ],
)
def test_whatif_matches_brute_force(synth, policy, profile):
    table = whatif_table(synth, policy, profile)
    ref = brute_whatif(synth, policy, profile)
    assert table.height == len(ref)
    for row, exp in zip(table.rows(), ref):
        assert row[:6] == tuple(exp[:5]) + (int(exp[5]),)
        assert row[6:-1] == pytest.approx(exp[6:], abs=1e-12)


@pytest.mark.parametrize(
    "policy,profile",
    [
        (FixedTau(0.05), ProfileSpec()),
        (ZScored(pilot_n=6, pilot_split="held-out"), ProfileSpec()),
        (FixedTau(0.03), ProfileSpec(pairs_fraction=0.5, pair_draws=3, seed=1)),
    ],
)
def test_whatif_over_several_runs_out_of_core_is_evaluated_run_by_run(tmp_path, synth, policy, profile, monkeypatch):
    """A database of several runs joins and aggregates each run alone and pools the cells
    (memory grows with the largest run); the pooled table equals the row-by-row reference."""
    from pagestats.replay import whatif as whatif_module
    from pagestats.io import load, logs_in_place
    from pagestats.testing import synthetic_logs

    s = synthetic_logs(models={"qwen-like": (6, 4), "llama-like": (8, 3)}, n_inputs=5,
                       tasks=("niah_multikey_3", "vt", "fwe"), evictors=("snapkv", "h2o"), budgets=(0.25, 0.5, 1.0),
                       k_max=32, with_text=False, seed=3)  # fmt: skip
    runs = [str(r) for r in s.write(tmp_path / "logs")]
    assert len(runs) == 2
    calls = []
    real = whatif_module._run_by_run
    monkeypatch.setattr(whatif_module, "_run_by_run", lambda *a: calls.append(a) or real(*a))
    db = logs_in_place(runs)
    try:
        table = whatif_table(db, policy, profile)
    finally:
        db.close()
    assert len(calls) == 1
    ref = brute_whatif(load(runs), policy, profile)
    assert table.height == len(ref)
    for row, exp in zip(table.rows(), ref):
        assert row[:6] == tuple(exp[:5]) + (int(exp[5]),)
        assert row[6:-1] == pytest.approx(exp[6:], abs=1e-12)


def _args(**kw):
    base = dict(tau=None, policy=None, theta=None, pilot_n=None, pilot_by=None, pilot_split=None, layers=None,
                pairs_fraction=None, pair_draws=None, seed=None, k=None, bins=None, strict_bins=False,
                recalibrate="none")  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_args_to_policy_and_profile():
    assert policy_from_args(_args()) == FixedTau(0.07)
    assert policy_from_args(_args(tau=0.04)) == FixedTau(0.04)
    assert policy_from_args(_args(policy="z", theta=-0.5, pilot_n=50, pilot_by="model,context_length", seed=4)) == (
        ZScored(theta_z=-0.5, pilot_n=50, pilot_by=("model", "context_length"), seed=4)
    )
    assert policy_from_args(_args(recalibrate="z", pilot_n=30, pilot_split="first")) == RecalibratedTau(
        tau=0.07, pilot_n=30, pilot_split="first")
    assert policy_from_args(_args(policy="midpoint")) == Midpoint()
    assert policy_from_args(_args(policy="oracle")) == TaskOracle()
    assert profile_from_args(_args()) == ProfileSpec()
    spec = profile_from_args(_args(layers="0:3,7", pairs_fraction=0.1, pair_draws=5, seed=2, k=16, bins=0.25, strict_bins=True))
    assert spec == ProfileSpec(layers=(0, 1, 2, 7), pairs_fraction=0.1, pair_draws=5, seed=2, k=16, bin_fraction=0.25,
                               convention="strict")  # fmt: skip
    assert parse_layers("every-4") == "every-4"
    with pytest.raises(ValueError, match="cannot read"):
        parse_layers("1,x2")


def test_cli_whatif_csv(tmp_path, synth):
    pytest.importorskip("pagestats.io", reason="pagestats.io not available yet")
    from pagestats.cli import main
    from pagestats.io import load
    from pagestats.testing import synthetic_logs

    s = synthetic_logs(models={"qwen-like": (6, 4)}, n_inputs=4, tasks=("niah_multikey_3", "vt"),
                       evictors=("snapkv",), budgets=(0.5, 1.0), with_topk=False, seed=1)  # fmt: skip
    run_dirs = s.write(tmp_path)
    buf = stdio.StringIO()
    with redirect_stdout(buf):
        rc = main(["whatif", str(run_dirs[0]), "--format", "csv", "--tau", "0.05"])
    assert rc == 0
    rows = list(csv.reader(stdio.StringIO(buf.getvalue())))
    assert tuple(rows[0]) == WHATIF_COLUMNS
    ref = whatif_table(load([str(run_dirs[0])]), FixedTau(0.05))
    assert len(rows) - 1 == ref.height
    for got, exp in zip(rows[1:], ref.rows()):
        assert got[0] == exp[0] and got[2:4] == list(exp[2:4])
        assert int(got[1]) == exp[1] and float(got[4]) == exp[4] and int(got[5]) == exp[5]
        assert [float(x) for x in got[6:-1]] == list(exp[6:-1])  # full float precision round-trips
        assert got[-1] == str(exp[-1]).lower()


def test_whatif_draws_keep_gate_free_columns_exact(synth):
    plain = whatif_table(synth, FixedTau(0.03))
    draws = whatif_table(synth, FixedTau(0.03), ProfileSpec(pairs_fraction=0.5, pair_draws=3))
    for c in ("model", "context_length", "evictor", "task", "budget", "n_inputs", "acc_full", "acc_plain", "harm_plain"):
        assert draws[c].equals(plain[c]), c


def test_cli_whatif_bad_options_exit_2_with_one_line(tmp_path, capsys):
    from pagestats.cli import main
    from pagestats.testing import synthetic_logs

    s = synthetic_logs(models={"m": (6, 4)}, n_inputs=4, tasks=("niah_multikey_3", "vt"), evictors=("snapkv",),
                       budgets=(0.5, 1.0), with_topk=False, seed=2)  # fmt: skip
    run = str(s.write(tmp_path)[0])
    for bad in (["--k", "16"], ["--layers", "99"], ["--bins", "0.7"], ["--bins", "1/3x"], ["--layers", "foo"],
                ["--policy", "midpoint", "--midpoint-tasks", "vt"]):  # fmt: skip
        assert main(["whatif", run, *bad]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), (bad, err)


def test_cli_midpoint_tasks_and_fraction_bins():
    ns = argparse.Namespace(tau=None, policy="midpoint", midpoint_tasks="niah_multikey_3,vt")
    assert policy_from_args(ns) == Midpoint(capacity_tasks=("niah_multikey_3",), dilution_tasks=("vt",))
    ns = argparse.Namespace(bins="1/3", layers=None, strict_bins=False, pairs_fraction=None, pair_draws=None, seed=None,
                            k=None)
    assert profile_from_args(ns).bin_fraction == 1 / 3  # exact third, not 0.3333


def test_whatif_is_bit_identical_whatever_the_row_order(synth, tmp_path):
    """The means are summed exactly (DECIMAL terms), so the what-if does not depend on the order the
    rows arrive in (in memory, shuffled) nor on how DuckDB's threads split them (out of core, the
    run-by-run path, three calls): every float of every row is the same bit pattern."""
    from pagestats import io as ps_io
    from pagestats.replay import ZScored
    from pagestats.testing import synthetic_logs

    from pathlib import Path

    policy = ZScored(pilot_n=5, pilot_split="first")
    data = Path(__file__).resolve().parents[2] / "data"
    shipped = ps_io.load([str(data / r) for r in ("smollm2-512-ruler-limits", "smollm2-512-niah_multivalue-ruler-limits",
                                                   "smollm2-512-fwe-ruler-limits")])  # scores in fractions
    ref = whatif_table(shipped, policy)
    for seed in (1, 2, 3):
        shuffled = dataclasses.replace(shipped, inputs=shipped.inputs.sample(fraction=1.0, shuffle=True, seed=seed),
                                       outcomes=shipped.outcomes.sample(fraction=1.0, shuffle=True, seed=seed))
        assert whatif_table(shuffled, policy).equals(ref)
    runs = [str(r) for r in synthetic_logs(models={"m": (6, 4)}, n_inputs=40, evictors=("snapkv", "h2o"),
                                           budgets=(0.25, 0.5, 1.0), with_text=False, seed=4,
                                           context_lengths=(4096, 8192)).write(tmp_path / "logs")]
    db = str(tmp_path / "logs.duckdb")
    ps_io.index_logs(runs, db).close()
    hashes = set()
    for _ in range(3):
        logdb = ps_io.open_logs(db)
        try:
            hashes.add(whatif_table(logdb, policy).hash_rows().to_list().__repr__())
        finally:
            logdb.close()
    assert len(hashes) == 1
