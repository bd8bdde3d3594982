"""Issue 10, sound conclusions: recalibration with a profile change and the degenerate flag,
named and held-out pilots, options that do not apply. Every expected number is computed in
the test by hand (NumPy on the planted profile), never by the code under test."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pagestats.core import defaults, profile
from pagestats.cli import main
from pagestats.io import load
from pagestats.replay import FixedTau, Midpoint, ProfileSpec, ZScored, gate, gated_outcomes, recalibrate
from pagestats.testing import synthetic_logs
from pagestats.replay.whatif import whatif_table

N_PER_TASK = 6
TASKS = ("niah_multikey_3", "vt")


def _planted(i: int, task: int) -> list[float]:
    """a_ℓ of one input over L = 6 layers: the first half (layers 0–2) always rises, so D on
    ``--layers first-half`` (a_0 − a_2, bins of one layer) is −0.5 + small < 0 on every input,
    while the full-depth D = mean(a_0, a_1) − mean(a_4, a_5) spreads around 0.07."""
    e = 0.011 * i + 0.037 * task
    return [0.30 + e, 0.30, 0.80 + 0.5 * e, 0.5, 0.26 - e, 0.26]


def hand_built_logs(tmp_path, n=N_PER_TASK):
    s = synthetic_logs(models={"m": (6, 2)}, n_inputs=n, tasks=TASKS, evictors=("snapkv",),
                       budgets=(0.5, 1.0), with_topk=False, seed=3)  # fmt: skip
    keys = s.inputs.select("task", "input_id").rows()
    prof = [_planted(i, TASKS.index(t)) for t, i in keys]
    agreement = np.asarray(prof, dtype=np.float32)
    drop = profile.drop_from_agreement(agreement)
    inputs = s.inputs.with_columns(
        pl.Series("agreement", agreement.tolist(), dtype=pl.List(pl.Float32)),
        pl.Series("pair_jaccard", agreement.tolist(), dtype=pl.List(pl.Float32)),  # H = 2: one pair per layer
        pl.Series("drop", drop),
    )
    run_dirs = dataclasses.replace(s, inputs=inputs).write(tmp_path / "logs")
    return [str(d) for d in run_dirs], keys, agreement.astype(np.float64)


def test_degenerate_layer_subset_flagged_and_warned(tmp_path, capsys):
    runs, keys, a = hand_built_logs(tmp_path)
    assert (a[:, 0] - a[:, 2] < 0).all() and not (profile.drop_from_agreement(a) < 0.07).all()
    logs = load(runs)
    table = whatif_table(logs, FixedTau(0.07), ProfileSpec(layers="first-half"))
    assert table["degenerate"].all() and (table["p_open"] == 0.0).all()
    assert not whatif_table(logs, FixedTau(0.07))["degenerate"].any()

    assert main(["whatif", *runs, "--layers", "first-half", "--format", "csv"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    warnings = [line for line in err if line.startswith("warning:")]
    assert warnings == ["warning: layers first-half: D < τ on every input; the gate never opens (m, 4096 tokens); "
                        "pass --recalibrate z"]


def test_recalibrate_z_is_the_hand_computed_tau(tmp_path, capsys):
    runs, keys, a = hand_built_logs(tmp_path)
    logs = load(runs)
    n = 5
    # the "first" pilot by hand: the first n inputs in (input_id, task) order
    order = sorted(range(len(keys)), key=lambda j: (keys[j][1], keys[j][0]))
    pilot = order[:n]
    d_ref = profile.drop_from_agreement(a)[pilot]
    d_new = (a[:, 0] - a[:, 2])[pilot]
    theta = (0.07 - d_ref.mean()) / d_ref.std(ddof=1)
    tau = d_new.mean() + theta * d_new.std(ddof=1)
    policy = recalibrate(FixedTau(0.07), "z", pilot_n=n, pilot_split="first")
    g = gate(logs, policy, ProfileSpec(layers="first-half"))
    assert g["tau"].to_numpy() == pytest.approx(np.full(g.height, tau), abs=1e-12)
    expected_open = sorted(keys[j] for j in range(len(keys)) if a[j, 0] - a[j, 2] >= tau)
    assert sorted(g.filter("gate_open").select("task", "input_id").rows()) == expected_open
    # the same through the CLI, which also prints the pilot's τ and composition
    assert main(["whatif", *runs, "--layers", "first-half", "--recalibrate", "z", "--pilot-n", str(n),
                 "--pilot-split", "first", "--format", "csv"]) == 0
    out = capsys.readouterr()
    assert f"τ = {tau:.6g}" in out.err and "warning" not in out.err
    assert "by task: niah_multikey_3=3, vt=2" in out.err
    # on the unchanged statistic the recalibrated τ is the fixed τ
    same = gate(logs, policy)
    assert same["tau"].to_numpy() == pytest.approx(np.full(same.height, 0.07), abs=1e-12)


def test_recalibrate_midpoint_is_eq5_on_the_changed_statistic(tmp_path):
    runs, keys, a = hand_built_logs(tmp_path, n=21)  # a_ℓ stays in [0, 1] up to 21 inputs per task
    d_new = a[:, 0] - a[:, 2]
    first = sorted(range(len(keys)), key=lambda j: (keys[j][1], keys[j][0]))  # (input_id, task) order
    cap = [j for j in first if keys[j][0] == "niah_multikey_3"][:20]  # Eq. 5: 20 inputs of each class
    dil = [j for j in first if keys[j][0] == "vt"][:20]
    tau = (d_new[cap].mean() + d_new[dil].mean()) / 2
    g = gate(load(runs), recalibrate(FixedTau(), "midpoint"), ProfileSpec(layers="first-half"))
    assert g["tau"].to_numpy() == pytest.approx(np.full(g.height, tau), abs=1e-12)


def test_midpoint_refuses_a_class_smaller_than_its_sample(tmp_path, capsys):
    runs, keys, a = hand_built_logs(tmp_path)  # 6 inputs per class: Eq. 5 takes 20
    for argv in (["--policy", "midpoint"], ["--layers", "first-half", "--recalibrate", "midpoint"]):
        assert main(["whatif", *runs, *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["error: the midpoint recipe (Eq. 5) takes 20 capacity-bound (niah_multikey_3) and 20 "
                       "dilution-prone (vt) inputs; this cell has 6 and 6 (model=m, context_length=4096)"]
    assert main(["whatif", *runs, "--policy", "midpoint", "--midpoint-tasks", "class"]) == 2  # class-pooled
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: the midpoint recipe (Eq. 5) takes 20 capacity-bound and 20 dilution-prone inputs; "
        "this cell has 6 and 6 (model=m, context_length=4096)"]
    with pytest.raises(ValueError, match="takes 20 capacity-bound"):
        gate(load(runs), Midpoint())


def test_report_tables_7_and_20_name_the_cell_without_the_midpoint_sample(tmp_path):
    from pagestats import tables
    from pagestats.report import build_report
    from pagestats.report.table_entries import TABLES

    kw = dict(models={"m": (6, 2)}, tasks=("niah_multikey_3", "vt"), evictors=("snapkv",), budgets=(0.5, 1.0),
              with_topk=False)
    runs = [str(d) for d in synthetic_logs(n_inputs=20, context_lengths=(512,), seed=1, **kw).write(tmp_path / "a")]
    runs += [str(d) for d in synthetic_logs(n_inputs=15, context_lengths=(1024,), seed=2, **kw).write(tmp_path / "b")]
    logs = load(runs)
    short = Midpoint().shortfall(logs.inputs)
    assert short.select("context_length", "n_capacity", "n_dilution").rows() == [(512, 20, 20), (1024, 15, 15)]
    t7 = tables.calibration_table(logs)
    assert t7["context_length"].to_list() == [512, 1024]
    ok, skipped = t7.row(0, named=True), t7.row(1, named=True)
    assert ok["note"] is None and ok["tau_calibrated"] is not None
    assert skipped["tau_calibrated"] is None and "this cell has 15 and 15" in skipped["note"]
    entries = [e for e in TABLES if e.name in ("tab07_calibration", "tab20_cross_cell")]
    index = json.loads((Path(build_report(logs, tmp_path / "out", entries=entries)).with_suffix(".json")).read_text())
    assert all(o["skipped"] is None for o in index["outputs"])
    t20 = pl.read_csv(tmp_path / "out" / "tables" / "tab20_cross_cell.csv")
    assert t20.filter(pl.col("context_length") == 1024)["delta_calibrated"][0] is None
    assert "this cell has 15 and 15" in t20.filter(pl.col("context_length") == 1024)["note"][0]
    # no cell holds the sample: both entries are skipped with the reason
    index = json.loads((Path(build_report(load(runs[1:]), tmp_path / "out2", entries=entries)).with_suffix(".json")).read_text())
    assert [o["skipped"].split(";")[0] for o in index["outputs"]] == ["the midpoint recipe (Eq. 5) takes 20 capacity-bound (niah_multikey_3) "
                                                                      "and 20 dilution-prone (vt) inputs"] * 2


def _pilot_tau(logs, **kw) -> float:
    taus = gate(logs, ZScored(**kw))["tau"].unique().to_list()
    assert len(taus) == 1
    return taus[0]


@pytest.mark.parametrize("split", ["random", "held-out"])
def test_pilot_tau_invariant_to_file_and_row_order(tmp_path, split):
    s = synthetic_logs(models={"m": (6, 4)}, n_inputs=10, tasks=("niah_multikey_3", "vt", "fwe"), evictors=("snapkv",),
                       budgets=(0.5, 1.0), with_topk=False, input_draws=(0, 1), seed=4)  # fmt: skip
    runs = [str(d) for d in s.write(tmp_path / "logs", n_shards=3)]
    base = load(runs)
    tau = _pilot_tau(base, pilot_n=12, pilot_split=split, seed=7)
    files = sorted(str(p) for p in (tmp_path / "logs").glob("*/*/*.parquet"))
    rng = random.Random(1)
    for _ in range(3):
        rng.shuffle(files)
        shuffled = load(files)
        assert shuffled.inputs.height == base.inputs.height
        rows = dataclasses.replace(shuffled, inputs=shuffled.inputs.sample(fraction=1.0, shuffle=True, seed=rng.randrange(99)))
        assert _pilot_tau(rows, pilot_n=12, pilot_split=split, seed=7) == tau
    assert _pilot_tau(base, pilot_n=12, pilot_split=split, seed=8) != tau


def test_held_out_pilot_is_in_no_evaluated_row(tmp_path):
    s = synthetic_logs(models={"m": (6, 4)}, n_inputs=8, tasks=("niah_multikey_3", "vt"), evictors=("snapkv", "h2o"),
                       budgets=(0.5, 1.0), with_topk=False, seed=5)  # fmt: skip
    logs = load([str(d) for d in s.write(tmp_path / "logs")])
    policy = ZScored(pilot_n=6, pilot_split="held-out", seed=2)
    keys = set(logs.inputs.select("run_id", "task", "input_id").rows())
    evaluated = set(gate(logs, policy).select("run_id", "task", "input_id").rows())
    outcome_keys = set(gated_outcomes(logs, policy).select("run_id", "task", "input_id").rows())
    assert len(keys - evaluated) == 6 and outcome_keys == evaluated
    # the pilot held out is exactly the 6 inputs of smallest seeded hash (in-sample split, same hash)
    in_sample = ZScored(pilot_n=6, pilot_split="random", seed=2)
    assert set(gate(logs, in_sample).select("run_id", "task", "input_id").rows()) == keys
    assert _pilot_tau(logs, pilot_n=6, pilot_split="random", seed=2) == _pilot_tau(logs, pilot_n=6, pilot_split="held-out", seed=2)
    table = whatif_table(logs, policy)
    assert table.group_by("task", "evictor").agg(pl.col("n_inputs").first())["n_inputs"].sum() == 2 * (16 - 6)


@pytest.mark.parametrize("bad, message", [
    (["--theta", "-0.5"], "--theta applies to --policy z"),
    (["--pilot-n", "10"], "--pilot-n applies to a pilot"),
    (["--policy", "midpoint", "--pilot-split", "random"], "--pilot-split applies to a pilot"),
    (["--midpoint-tasks", "niah_multikey_3,vt"], "--midpoint-tasks applies to --policy midpoint"),
    (["--pair-draws", "3"], "--pair-draws applies to --pairs-fraction"),
    (["--policy", "z", "--pilot-n", "100000"], "larger than the data"),
    (["--policy", "z", "--recalibrate", "z"], "applies to a fixed τ"),
])
def test_options_that_do_not_apply_exit_2(tmp_path, capsys, bad, message):
    runs, _, _ = hand_built_logs(tmp_path)
    assert main(["whatif", *runs, *bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


# --------------------------------------------------------------------------- pre-registration


def _prereg_runs(tmp_path):
    """A fitting run at 4096, the target's full-KV-only run at 8192 (both created in 2000), and
    the target's eviction run at 8192 created in 2099, after any band frozen today."""
    common = dict(models={"m": (6, 2)}, n_inputs=12, tasks=("niah_multikey_3", "vt", "fwe"), evictors=("snapkv",),
                  with_topk=False, seed=6)  # fmt: skip
    fit = synthetic_logs(**common, context_lengths=(4096,), budgets=(0.25, 0.5, 1.0))
    full = synthetic_logs(**common, context_lengths=(8192,), budgets=(1.0,), input_draws=(1,))
    later = synthetic_logs(**common, context_lengths=(8192,), budgets=(0.25, 0.5, 1.0), input_draws=(2,),
                           created_at="2099-01-01T00:00:00+00:00")
    before = [str(d) for s, name in ((fit, "fit"), (full, "full")) for d in s.write(tmp_path / name)]
    return before, [str(d) for d in later.write(tmp_path / "later")]


def test_prereg_freeze_then_check(tmp_path, capsys):
    import hashlib

    before, later = _prereg_runs(tmp_path)
    band = tmp_path / "band.json"
    args = ["prereg", "freeze", *before, "--fit-contexts", "4096", "--target-context", "8192", "--out", str(band)]
    assert main(args) == 0
    digest = capsys.readouterr().out.strip()
    assert digest == hashlib.sha256(band.read_bytes()).hexdigest()
    assert main(args) == 2  # never overwritten
    assert "exists" in capsys.readouterr().err

    assert main(["prereg", "check", str(band), "--sha256", digest, *before, *later, "--format", "csv"]) == 0
    out = capsys.readouterr()
    rows = pl.read_csv(bytes(out.out, "utf-8"))
    assert rows.height >= 2 and rows["status"].n_unique() == 1 and rows["status"][0].startswith("pre-registered")
    # the band is ratio × headroom from the fitting run only, by hand
    logs = load([*before, *later])
    fit_in = logs.inputs.filter(pl.col("context_length") == 4096)
    fit_out = logs.outcomes.join(fit_in.select("run_id", "task", "input_id", "full_score"), on=["run_id", "task", "input_id"])
    for r in rows.iter_rows(named=True):
        task_out = fit_out.filter(pl.col("task") == r["task"])
        per_input = task_out.group_by("input_id").agg(
            (pl.col("score").filter(pl.col("budget") < 1).max() > pl.col("score").filter(pl.col("budget") == 1).first()))
        rho = per_input[:, 1].mean()
        head = 1 - fit_in.filter(pl.col("task") == r["task"])["full_score"].mean()
        target_head = 1 - logs.inputs.filter((pl.col("run_id") == "syn-m-8192-d1") & (pl.col("task") == r["task"])
                                             )["full_score"].mean()  # the full-KV run the band was frozen from
        assert r["predicted_low"] == pytest.approx(rho / head * target_head, abs=1e-12)

    # a changed byte, or another hash, is refused
    assert main(["prereg", "check", str(band), "--sha256", "0" * 64, *before, *later]) == 2
    assert "does not match" in capsys.readouterr().err
    text = band.read_text()
    band.write_text(text.replace('"headroom": 0.', '"headroom": 1.', 1))
    assert main(["prereg", "check", str(band), "--sha256", digest, *before, *later]) == 2
    assert "changed after it was frozen" in capsys.readouterr().err
    band.write_text(text)
    assert main(["prereg", "check", str(band), "--sha256", digest, *before, *later]) == 0


def test_prereg_band_frozen_after_the_outcomes_is_refused(tmp_path, capsys):
    before, _ = _prereg_runs(tmp_path)
    band = tmp_path / "band.json"
    assert main(["prereg", "freeze", *before, "--fit-contexts", "4096", "--target-context", "8192",
                 "--out", str(band)]) == 0
    digest = capsys.readouterr().out.strip()
    # the target's own full-KV run (created 2000) carries no eviction outcomes: nothing to check on
    assert main(["prereg", "check", str(band), "--sha256", digest, *before]) == 2
    assert "no snapkv eviction outcomes" in capsys.readouterr().err
    old = synthetic_logs(models={"m": (6, 2)}, n_inputs=12, tasks=("niah_multikey_3", "vt", "fwe"), evictors=("snapkv",),
                         with_topk=False, seed=6, context_lengths=(8192,), budgets=(0.5, 1.0), input_draws=(3,))  # fmt: skip
    old_runs = [str(d) for d in old.write(tmp_path / "old")]
    assert main(["prereg", "check", str(band), "--sha256", digest, *before, *old_runs]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "after run syn-m-8192-d3" in err[0]


def test_report_table21_labels_post_hoc_and_shows_a_frozen_band(tmp_path, capsys):
    from pagestats.report import build_report
    from pagestats.report.table_entries import TABLES

    before, later = _prereg_runs(tmp_path)
    logs = load([*before, *later])
    entry = [e for e in TABLES if e.name == "tab21_preregistered"]
    build_report(logs, tmp_path / "posthoc", entries=entry)
    post = pl.read_csv(tmp_path / "posthoc" / "tables" / "tab21_preregistered.csv")
    assert set(post["status"]) == {"post-hoc illustration, not a pre-registration"}
    band = tmp_path / "band.json"
    assert main(["prereg", "freeze", *before, "--fit-contexts", "4096", "--target-context", "8192",
                 "--out", str(band)]) == 0
    digest = capsys.readouterr().out.strip()
    assert main(["report", *before, *later, "--out", str(tmp_path / "frozen"), "--prereg", str(band),
                 "--prereg-sha256", digest, "--no-pdf"]) == 0
    frozen = pl.read_csv(tmp_path / "frozen" / "tables" / "tab21_preregistered.csv")
    assert frozen["status"][0].startswith("pre-registered (frozen ")
    assert main(["report", *before, *later, "--out", str(tmp_path / "bad"), "--prereg", str(band),
                 "--prereg-sha256", "1" * 64]) == 2


# --------------------------------------------------------------------------- scaling fit


def test_scaling_fit_is_the_binomial_mle_with_its_se():
    """The slope and SE equal a statsmodels fit written here and the binomial likelihood
    maximised by SciPy with the Fisher information at the optimum; zero-headroom rows are
    left out and counted."""
    import statsmodels.api as sm
    from scipy.optimize import minimize_scalar

    from pagestats import metrics

    rows = pl.DataFrame({
        "task_class": ["dilution-prone"] * 6 + ["capacity-bound"],
        "headroom": [0.9, 0.5, 0.3, 0.7, 0.0, 0.0, 0.95],
        "n": [65, 15, 50, 20, 40, 30, 50], "k": [20, 2, 5, 7, 0, 0, 0],
    }).with_columns((pl.col("k") / pl.col("n")).alias("rho"), (pl.col("k") / pl.col("n") >= 0.05).alias("dilution_prone"))
    fit = metrics.scaling_fit(rows, rule="task-class")
    h, k, n = np.array([0.9, 0.5, 0.3, 0.7]), np.array([20, 2, 5, 7]), np.array([65, 15, 50, 20])
    ref = sm.GLM(np.column_stack([k, n - k]), h[:, None], family=sm.families.Binomial(link=sm.families.links.Identity())).fit()
    nll = lambda b: -np.sum(k * np.log(b * h) + (n - k) * np.log(1 - b * h))  # noqa: E731
    mle = minimize_scalar(nll, bounds=(1e-6, 1 / h.max() - 1e-6), method="bounded", options={"xatol": 1e-12}).x
    mu = mle * h
    se = 1 / np.sqrt(np.sum(n * h * h / (mu * (1 - mu))))
    assert fit.slope == pytest.approx(ref.params[0], rel=1e-8) and fit.slope == pytest.approx(mle, rel=1e-6)
    assert fit.se == pytest.approx(ref.bse[0], rel=1e-6) and fit.se == pytest.approx(se, rel=1e-5)
    assert (fit.n, fit.n_excluded) == (4, 2)
    unweighted = np.dot(h, k / n) / np.dot(h, h)  # the old least squares: a different number
    assert abs(unweighted - fit.slope) > 1e-3


# --------------------------------------------------------------------------- equal footing, BH, n_inputs


def _unequal_logs(tmp_path):
    """Two evictors on 8 inputs per task, and a second input draw logged for snapkv only."""
    common = dict(models={"m": (6, 2)}, tasks=("niah_multikey_3", "vt"), budgets=(0.25, 0.5, 1.0), with_topk=False)
    both = synthetic_logs(**common, n_inputs=8, evictors=("snapkv", "h2o"), seed=7)
    extra = synthetic_logs(**common, n_inputs=5, evictors=("snapkv",), input_draws=(1,), seed=8)
    return load([str(d) for s, name in ((both, "both"), (extra, "extra")) for d in s.write(tmp_path / name)])


def test_evictor_comparison_uses_identical_input_sets(tmp_path):
    from pagestats import metrics, tables

    logs = _unequal_logs(tmp_path)
    gated = gated_outcomes(logs, FixedTau())
    kept, left = metrics.equal_inputs(gated)
    sets = {ev: set(part.select("run_id", "task", "input_id").unique().rows())
            for (ev,), part in kept.partition_by(["evictor"], as_dict=True).items()}
    assert sets["snapkv"] == sets["h2o"] and len(sets["h2o"]) == 16
    assert dict(left.select("evictor", "n_left_out").rows()) == {"h2o": 0, "snapkv": 10}
    # Table 2 and Table 28 report Δ on those inputs: the hand-computed mean over the common inputs
    t2 = tables.delta_matrix_table(gated)
    t28 = tables.bootstrap_table(gated, rng=np.random.default_rng(0), n_boot=200)
    for ev in ("snapkv", "h2o"):
        rows = gated.filter((pl.col("evictor") == ev) & (pl.col("budget") < 1) & (pl.col("run_id") == "syn-m-4096-d0"))
        want = (rows["score_gated"] - rows["score_plain"]).mean()
        for t in (t2, t28):
            r = t.filter(pl.col("evictor") == ev).row(0, named=True)
            assert r["delta"] == pytest.approx(want, abs=1e-12) and r["n_inputs"] == 16
            assert r["n_left_out"] == (10 if ev == "snapkv" else 0)


def test_evicted_on_equal_inputs_is_the_relation_of_the_filtered_common_rows(tmp_path):
    """The relation the headline, Table 13 and the decision frontier read instead of a polars copy:
    the rows b < 1 whose input every evictor of the cell holds, by brute force over Python sets."""
    from pagestats import metrics

    gated = gated_outcomes(_unequal_logs(tmp_path), FixedTau())
    key = ["run_id", "task", "input_id"]
    evicted = gated.filter(pl.col("budget") < 1)
    held = [set(evicted.filter(pl.col("evictor") == ev).select(key).rows()) for ev in ("snapkv", "h2o")]
    common = held[0] & held[1]
    assert len(common) == 16 and len(held[0]) == 26  # ten of snapkv's inputs are left out
    want = sorted(r for r in evicted.rows() if tuple(r[evicted.columns.index(c)] for c in key) in common)
    got = metrics.evicted_on_equal_inputs(gated)
    assert sorted(got.pl().rows()) == want and got.columns == gated.columns
    one = gated.filter(pl.col("evictor") == "snapkv")  # one evictor: every row b < 1, none left out
    assert sorted(metrics.evicted_on_equal_inputs(one).pl().rows()) == sorted(one.filter(pl.col("budget") < 1).rows())


def test_no_variation_cells_leave_the_bh_family_and_n_inputs_counts_inputs(tmp_path):
    from pagestats import metrics, stats

    logs = _unequal_logs(tmp_path)
    gated = gated_outcomes(logs, FixedTau(-1.0))  # the gate opens everywhere: gated ≡ plain, Δ ≡ 0
    res = metrics.delta_bootstrap(metrics.relation(gated), rng=np.random.default_rng(1), n_boot=200)
    assert res["p_value"].is_nan().all() and (res["note"] == "no variation").all() and not res["rejected"].any()
    mixed = pl.concat([gated.filter(pl.col("evictor") == "h2o"),
                       gated_outcomes(logs, FixedTau(0.07)).filter(pl.col("evictor") == "snapkv")])
    res = metrics.delta_bootstrap(metrics.relation(mixed), rng=np.random.default_rng(1), n_boot=200)
    h2o = res.filter(pl.col("evictor") == "h2o").row(0, named=True)
    snap = res.filter(pl.col("evictor") == "snapkv").row(0, named=True)
    assert np.isnan(h2o["p_value"]) and np.isnan(h2o["p_adjusted"])
    assert snap["p_adjusted"] == pytest.approx(stats.bh(np.array([snap["p_value"]])).adjusted[0])  # a family of one
    # n_inputs counts distinct inputs, not input × evictor
    by_task = metrics.delta(metrics.relation(gated), by=("model", "task"))
    assert dict(by_task.select("task", "n_inputs").rows()) == {"niah_multikey_3": 13, "vt": 13}


def test_whatif_input_draws_are_split_pooled_on_purpose_or_chosen(tmp_path, capsys):
    logs = _unequal_logs(tmp_path)  # draw 0: 8 inputs per task (snapkv, h2o); draw 1: 5 per task (snapkv)
    split = whatif_table(logs)
    assert split.columns[-1] == "draw" and sorted(split["draw"].unique().to_list()) == [0, 1]
    snap = split.filter((pl.col("evictor") == "snapkv") & (pl.col("task") == "vt") & (pl.col("budget") == 0.5))
    assert dict(snap.select("draw", "n_inputs").rows()) == {0: 8, 1: 5}
    pooled = whatif_table(logs, input_draws="pooled")
    row = pooled.filter((pl.col("evictor") == "snapkv") & (pl.col("task") == "vt") & (pl.col("budget") == 0.5))
    assert row["n_inputs"].to_list() == [13] and row["draw"].null_count() == 1
    # pooled accuracy is the input-weighted mean of the two draws' (by hand)
    assert row["acc_plain"][0] == pytest.approx((snap["acc_plain"] * snap["n_inputs"]).sum() / 13, abs=1e-12)
    one = whatif_table(logs, input_draws=1)
    assert "draw" not in one.columns and set(one["evictor"]) == {"snapkv"} and (one["n_inputs"] == 5).all()
    runs = [str(p) for p in sorted(tmp_path.glob("*/syn-*"))]
    assert main(["whatif", *runs, "--input-draws", "7"]) == 2
    assert "logged input draws [0, 1]" in capsys.readouterr().err


def test_layer_table_reports_the_gate_recalibrated_and_flags_the_fixed_tau(tmp_path):
    from pagestats import tables

    runs, keys, a = hand_built_logs(tmp_path)
    logs = load(runs)
    fixed = tables.layer_subset_table(logs, subsets=("all", "first-half"), recalibrate="none", pilot_n=5)
    row = fixed.filter(pl.col("layers") == "first-half").row(0, named=True)
    assert row["degenerate"] is True and row["p_open"] == 0.0 and row["tau_gate"] == 0.07
    recal = tables.layer_subset_table(logs, subsets=("all", "first-half"), pilot_n=5)  # z, held-out pilot of 5
    full = recal.filter(pl.col("layers") == "all").row(0, named=True)
    half = recal.filter(pl.col("layers") == "first-half").row(0, named=True)
    assert full["tau_gate"] == pytest.approx(0.07, abs=1e-12)  # the unchanged statistic keeps τ
    assert half["degenerate"] is False and 0 < half["p_open"] < 1 and half["tau_gate"] < 0
    policy = recalibrate(FixedTau(0.07), "z", pilot_n=5)
    g = gate(logs, policy, ProfileSpec(layers="first-half"))
    assert half["p_open"] == pytest.approx(g["gate_open"].mean()) and g.height == len(keys) - 5
    small = tables.layer_subset_table(logs, subsets=("first-half",))  # 100 > 12 inputs: said, not guessed
    assert small["tau_gate"].is_null().all() and small["recalibration"][0].startswith("not computed")


# --------------------------------------------------------------------------- collection mode
WHATIF_KEY = ["model", "context_length", "evictor", "task", "budget", "n_inputs"]


def _same_numbers(a: pl.DataFrame, b: pl.DataFrame) -> None:
    """Same rows, keys and flags; floats equal up to the summation order of the engine (1e-12)."""
    assert a.columns == b.columns and a.height == b.height
    for c in a.columns:
        if a.schema[c] == pl.Float64:
            assert np.allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=0, atol=1e-12, equal_nan=True), c
        else:
            assert a[c].to_list() == b[c].to_list(), c


def _two_mode_runs(tmp_path):
    """A query-aware run and a query-agnostic run of the same (model, context), with other draws."""
    kw = dict(models={"m": (4, 2)}, n_inputs=8, tasks=("niah_multikey_3", "vt"), evictors=("snapkv", "h2o"),
              budgets=(0.25, 0.5, 1.0), with_topk=False)
    aware = synthetic_logs(seed=1, **kw).write(tmp_path / "aware")
    agnostic = synthetic_logs(seed=2, mode="query-agnostic", **kw).write(tmp_path / "agnostic")
    return [str(d) for d in aware], [str(d) for d in agnostic]


def test_query_agnostic_run_never_pools_with_query_aware(tmp_path, capsys):
    from pagestats import tables

    aware, agnostic = _two_mode_runs(tmp_path)
    alone, both = load(aware), load([*aware, *agnostic])
    assert set(both.inputs["run_id"].unique()) == set(alone.inputs["run_id"].unique())
    assert both.inputs.equals(alone.inputs) and both.outcomes.equals(alone.outcomes)
    _same_numbers(whatif_table(both, FixedTau()), whatif_table(alone, FixedTau()))
    gated_both, gated_alone = gated_outcomes(both, FixedTau()), gated_outcomes(alone, FixedTau())
    assert gated_both.equals(gated_alone)
    _same_numbers(tables.delta_matrix_table(gated_both), tables.delta_matrix_table(gated_alone))
    assert [f.path for f in both.files] == [f.path for f in alone.files]  # the other run's files are not read
    line, = both.exclusions
    assert "1 query-agnostic run" in line and "16 inputs" in line and "--mode query-agnostic" in line

    assert main(["whatif", *aware, "--format", "csv"]) == 0
    only = capsys.readouterr().out
    assert main(["whatif", *aware, *agnostic, "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    _same_numbers(pl.read_csv(out.encode()), pl.read_csv(only.encode()))  # no query-aware number changes
    left = [x for x in err.splitlines() if "query-agnostic" in x]
    assert len(left) == 1 and "--mode query-agnostic" in left[0]

    # --mode query-agnostic reports the other run, and only it
    assert main(["whatif", *aware, *agnostic, "--mode", "query-agnostic", "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    got, expected = pl.read_csv(out.encode()), whatif_table(load(agnostic, mode="query-agnostic"), FixedTau())
    assert got.select(WHATIF_KEY).equals(expected.select(WHATIF_KEY).cast(got.select(WHATIF_KEY).schema))
    assert np.allclose(got["delta"].to_numpy(), expected["delta"].to_numpy(), rtol=0, atol=1e-12)
    assert not np.allclose(pl.read_csv(out.encode())["delta"].to_numpy(), pl.read_csv(only.encode())["delta"].to_numpy())
    assert "1 query-aware run" in err and "--mode query-aware" in err


def test_manifest_without_mode_is_query_aware_and_a_bad_mode_is_a_problem(tmp_path, capsys):
    import json

    from pagestats.io import validate_paths

    aware, agnostic = _two_mode_runs(tmp_path)
    manifest = tmp_path / "aware" / "syn-m-4096-d0" / "manifest.json"
    old = json.loads(manifest.read_text())
    del old["mode"]  # written before the collector recorded the mode
    manifest.write_text(json.dumps(old))
    assert load(aware).inputs.height == 16
    assert main(["whatif", *aware, "--mode", "query-agnostic"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no query-agnostic runs in the logs") and "--mode query-aware" in err

    manifest.write_text(json.dumps({**old, "mode": "query-blind"}))
    assert any("mode 'query-blind' is not one of" in p.message for p in validate_paths(aware))
    # a bad mode is bad logs for every command alike (exit 1, the manifest named); the mode filter
    # must not hide it behind a usage error (found by the fuzz: null mode, validate 1 but whatif 2)
    for bad_mode in ("query-blind", None):
        manifest.write_text(json.dumps({**old, "mode": bad_mode}))
        for argv in (["validate", *aware], ["whatif", *aware], ["report", *aware, "--out", str(tmp_path / "r")]):
            assert main(argv) == 1, (bad_mode, argv[0])
            out, err = capsys.readouterr()  # validate lists its problems on stdout, the others on stderr
            assert "manifest.json" in out + err and "mode" in out + err, (bad_mode, argv[0])


def test_index_holds_one_mode_and_db_refuses_the_other(tmp_path, capsys):
    aware, agnostic = _two_mode_runs(tmp_path)
    db = str(tmp_path / "logs.duckdb")
    assert main(["index", *aware, *agnostic, "--db", db]) == 0
    err = capsys.readouterr().err
    assert "1 query-agnostic run" in err and "of query-aware runs" in err
    assert main(["whatif", *aware, "--format", "csv"]) == 0
    direct = capsys.readouterr().out
    assert main(["whatif", "--db", db, "--format", "csv"]) == 0
    via_db, direct = pl.read_csv(capsys.readouterr().out.encode()), pl.read_csv(direct.encode())
    assert via_db.select(WHATIF_KEY).equals(direct.select(WHATIF_KEY))  # the agnostic run is not in the database
    assert np.allclose(via_db["delta"].to_numpy(), direct["delta"].to_numpy(), rtol=0, atol=1e-12)
    assert main(["whatif", "--db", db, "--mode", "query-agnostic"]) == 2
    assert "holds query-aware runs, not query-agnostic" in capsys.readouterr().err


# --------------------------------------------------------------------------- equal footing (Fig. 7, 8, N1; Tables 14, 20, N1, N2)
def _hand_common(gated) -> set:
    """The (run, task, input) that every evictor of the frame holds, by hand."""
    sets = [set(part.select("run_id", "task", "input_id").unique().rows())
            for _, part in gated.partition_by(["evictor"], as_dict=True).items()]
    return set.intersection(*sets)


def _hand_mean(gated, keys, col_a, col_b=None):
    rows = [r for r in gated.iter_rows(named=True) if (r["run_id"], r["task"], r["input_id"]) in keys]
    return float(np.mean([r[col_a] - (r[col_b] if col_b else 0.0) for r in rows]))


def test_fig8_fig7_and_the_decision_frontier_compare_evictors_on_the_same_inputs(tmp_path):
    from pagestats import figures
    from pagestats.report.context import Context
    from pagestats.report.decision import decision_data

    logs = _unequal_logs(tmp_path)
    gated = gated_outcomes(logs, FixedTau())
    common = _hand_common(gated)
    assert len(common) == 16
    evict = gated.filter(pl.col("budget") < 1)
    data = figures.delta_matrix_data(gated)
    for ev in ("snapkv", "h2o"):
        r = data.filter(pl.col("evictor") == ev).row(0, named=True)
        sub = evict.filter(pl.col("evictor") == ev)
        assert r["delta"] == pytest.approx(_hand_mean(sub, common, "score_gated", "score_plain"), abs=1e-12)
        assert (r["n_inputs"], r["n_left_out"]) == (16, 10 if ev == "snapkv" else 0)

    lines = figures.delta_of_f_data(gated, f=[0.5])
    for ev in ("snapkv", "h2o"):
        sub = evict.filter(pl.col("evictor") == ev)
        cap = _hand_mean(sub.filter(pl.col("task_class") == defaults.CAPACITY_BOUND), common, "score_gated", "score_plain")
        rest = _hand_mean(sub.filter(pl.col("task_class") == defaults.DILUTION_PRONE), common, "score_gated", "score_plain")
        got = lines.filter((pl.col("line") == "cell") & (pl.col("evictor") == ev))["delta"][0]
        assert got == pytest.approx(0.5 * cap + 0.5 * rest, abs=1e-12)

    frontier = decision_data(Context(logs))
    for ev in ("snapkv", "h2o"):  # τ = +∞: the gate never opens, so the point is the full cache on the common inputs
        point = frontier.filter((pl.col("evictor") == ev) & (pl.col("budget") == 0.5) & (pl.col("tau") == np.inf))
        sub = evict.filter((pl.col("evictor") == ev) & (pl.col("budget") == 0.5))
        assert point["accuracy"][0] == pytest.approx(_hand_mean(sub, common, "score_full"), abs=1e-12)


def _hash(seed, run, task, i) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(f"{seed}/{run}/{task}/{i}".encode(), digest_size=8).digest(), "big") >> 1


def test_pilot_sensitivity_evaluates_every_definition_on_the_same_inputs(tmp_path):
    from pagestats import metrics, tables

    logs = _unequal_logs(tmp_path)  # one (model, context): 26 inputs for snapkv, the headline evictor
    units = logs.inputs.select("run_id", "task", "input_id").rows()
    by_hash = sorted(units, key=lambda u: _hash(0, *u))
    reference = ZScored(pilot_n=5)  # held out
    table = tables.pilot_sensitivity_table(logs, pilot_sizes=(3, 5), reference=reference)
    # the held-out pilots (3 and 5 inputs of smallest hash, per model and per cell alike) are nested: the
    # compared inputs are all but the 5 of smallest hash
    common = set(units) - set(by_hash[:5])
    per_task = {t: sum(1 for u in common if u[1] == t) for t in ("niah_multikey_3", "vt")}
    assert len(table.select("pilot_split", "pilot_by", "pilot_n").unique()) == 12
    assert all(per_task[r["task"]] == r["n_evaluated"] for r in table.iter_rows(named=True))
    left = table.group_by("pilot_split", "pilot_by", "pilot_n").agg(pl.col("n_left_out").sum())
    for pilot, _, n, n_left in left.rows():
        assert n_left == (5 - n if pilot == "held-out" else 5)
    g = gate(logs, ZScored(pilot_n=3, pilot_split="first"))
    rows = table.filter((pl.col("pilot_split") == "first") & (pl.col("pilot_n") == 3) & (pl.col("pilot_by") == "model"))
    for r in rows.iter_rows(named=True):
        drops = [x["drop"] for x in g.iter_rows(named=True) if (x["run_id"], x["task"], x["input_id"]) in common
                 and x["task"] == r["task"]]
        assert r["p_open"] == pytest.approx(np.mean(np.asarray(drops) >= r["tau"]), abs=1e-12)
    # the helper behind it: every frame on the same (run, task, input)
    frames = [gated_outcomes(logs, p) for p in (reference, ZScored(pilot_n=3, pilot_split="first"), FixedTau())]
    kept, _ = metrics.same_inputs(*frames)
    assert all(set(k.select("run_id", "task", "input_id").unique().rows()) == common for k in kept)


def test_oracle_gap_and_cross_cell_compare_policies_on_the_same_inputs(tmp_path):
    from pagestats import tables
    from pagestats.replay import Midpoint, TaskOracle

    logs = _unequal_logs(tmp_path)
    policy = ZScored(pilot_n=5)  # held out: its 5 pilot inputs are in no evaluated row
    gated, oracle = gated_outcomes(logs, policy), gated_outcomes(logs, TaskOracle())
    pilot = {u for u in logs.inputs.select("run_id", "task", "input_id").rows()} - set(
        gated.select("run_id", "task", "input_id").unique().rows())
    assert len(pilot) == 5
    common = _hand_common(oracle) - pilot
    t14 = tables.oracle_gap_table(gated, oracle)
    for ev in ("snapkv", "h2o"):
        r = t14.filter(pl.col("evictor") == ev).row(0, named=True)
        sub = oracle.filter((pl.col("evictor") == ev) & (pl.col("budget") < 1))
        assert r["delta_oracle"] == pytest.approx(_hand_mean(sub, common, "score_gated", "score_plain"), abs=1e-12)
        assert r["n_inputs"] == len(common)
    t20 = tables.cross_cell_table(gated, gated_outcomes(logs, Midpoint(n=3)))
    snap = gated_outcomes(logs, Midpoint(n=3)).filter((pl.col("evictor") == "snapkv") & (pl.col("budget") < 1))
    want = _hand_mean(snap, set(gated.select("run_id", "task", "input_id").unique().rows()), "score_gated", "score_plain")
    assert t20["delta_calibrated"][0] == pytest.approx(want, abs=1e-12)
