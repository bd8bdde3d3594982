"""pagestats.replay / pagestats.replay.policies against independent references written here.

References: Python-set Jaccards and plain-Python means (no pagestats.core.profile calls) for the
recomputed D; closed forms for the calibrated thresholds; a brute-force loop of
``gated_outcomes`` for the τ curve. The synthetic logs mimic the collector: a_ℓ and pair
Jaccards from the top-k sets, stored as float32, and ``drop`` computed per input from the
stored float32 a_ℓ.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl
import polars.testing
import pytest

from pagestats.core import defaults
from pagestats.core.schema import INPUT_KEY
from pagestats.io import Logs
from pagestats.core.profile import agreement_from_topk, drop_from_agreement
from pagestats.replay import (
    CustomPolicy,
    FixedTau,
    Midpoint,
    ProfileSpec,
    TaskOracle,
    ZScored,
    gate,
    gated_outcomes,
    pair_subsets,
    pilot_mask,
    profile_drop,
    tau_curve,
)

KEY = ["run_id", "task", "input_id"]
TASKS = ("niah_multikey_3", "vt", "fwe")
BUDGETS = (0.125, 0.5, 1.0)


def make_logs(seed=0, models=(("m-a", 7, 4, 1024), ("m-b", 9, 5, 2048)), n=6, k_log=6, k_max=12, n_pos=40):
    """Tiny Logs-like namespace: models (name, L, H, context), TASKS × n inputs, two evictors."""
    rng = np.random.default_rng(seed)
    inputs, outcomes, topk = [], [], []
    for name, n_layers, n_heads, ctx in models:
        run_id = f"run-{name}"
        for task in TASKS:
            for i in range(n):
                # heads draw from a small pool so sets overlap; top-k_max without repeats
                keys = rng.random((n_layers, n_heads, n_pos)) + np.linspace(0, 1.5, n_pos) * rng.random()
                idx = np.argsort(-keys, axis=-1)[..., :k_max].astype(np.int32)
                agreement, jac = agreement_from_topk(idx, k=k_log)
                a32 = agreement.astype(np.float32)
                n_tokens = int(rng.integers(200, 400))
                full = float(rng.integers(0, 2))
                inputs.append(
                    dict(
                        run_id=run_id, model=name, context_length=ctx, task=task, input_id=i, draw=i,
                        n_tokens=n_tokens, drop=float(drop_from_agreement(a32)),
                        agreement=a32.tolist(), pair_jaccard=jac.astype(np.float32).ravel().tolist(),
                        signals={"entropy": float(rng.normal()), "norm": float(rng.random())},
                        full_score=full, task_class=defaults.default_task_class(task),
                    )
                )  # fmt: skip
                for layer in range(n_layers):
                    for head in range(n_heads):
                        topk.append(dict(run_id=run_id, task=task, input_id=i, layer=layer, head=head,
                                         indices=idx[layer, head].tolist()))  # fmt: skip
                for ev in ("snapkv", "h2o"):
                    for b in BUDGETS:
                        kept = n_tokens if b == 1.0 else max(int(b * n_tokens), 36)
                        score = full if b == 1.0 else float(rng.choice([0.0, 0.5, 1.0]))
                        outcomes.append(dict(run_id=run_id, task=task, input_id=i, evictor=ev, budget=b,
                                             n_kept=kept, score=score))  # fmt: skip
    schema = {"agreement": pl.List(pl.Float32), "pair_jaccard": pl.List(pl.Float32)}
    return Logs(
        inputs=pl.DataFrame(inputs, schema_overrides=schema),
        outcomes=pl.DataFrame(outcomes),
        topk=pl.DataFrame(topk, schema_overrides={"indices": pl.List(pl.Int32)}),
        manifests={},
    )


@pytest.fixture(scope="module")
def logs():
    return make_logs()


def _py_drop(a, f=1 / 3):
    """D by hand (deployed bins), plain Python floats."""
    size = max(int(len(a) * f + 1e-9), 1)
    early, late = a[:size], a[len(a) - size :]
    return sum(early) / len(early) - sum(late) / len(late)


def _rows(frame):
    return {tuple(r[c] for c in KEY): r for r in frame.iter_rows(named=True)}


# --------------------------------------------------------------------------- profile_drop


def test_default_replay_reproduces_logged_drop_bit_exactly(logs):
    prof = profile_drop(logs)
    logged = logs.inputs.sort(KEY)
    assert prof.columns == [*KEY, "drop"]
    assert prof.select(KEY).equals(logged.select(KEY))
    assert (prof["drop"].to_numpy() == logged["drop"].to_numpy()).all()


def test_k_equal_to_logged_k_reproduces_logged_drop_bit_exactly(logs):
    prof = profile_drop(logs, ProfileSpec(k=6))
    assert (prof["drop"].to_numpy() == logs.inputs.sort(KEY)["drop"].to_numpy()).all()


@pytest.mark.parametrize("k", [2, 5, 12])
def test_k_replay_matches_python_sets(logs, k):
    prof = _rows(profile_drop(logs, ProfileSpec(k=k)))
    topk = logs.topk.sort([*KEY, "layer", "head"])
    for key, sub in topk.group_by(KEY, maintain_order=True):
        n_layers, n_heads = sub["layer"].max() + 1, sub["head"].max() + 1
        sets = {(r["layer"], r["head"]): set(r["indices"][:k]) for r in sub.iter_rows(named=True)}
        a = []
        for layer in range(n_layers):
            jac = [
                len(sets[layer, i] & sets[layer, j]) / len(sets[layer, i] | sets[layer, j])
                for i in range(n_heads)
                for j in range(i + 1, n_heads)
            ]
            a.append(float(np.float32(sum(jac) / len(jac))))  # stored as float32
        assert prof[key]["drop"] == pytest.approx(_py_drop(a), abs=1e-12)


def test_k_errors(logs):
    with pytest.raises(ValueError, match="k_max"):
        profile_drop(logs, ProfileSpec(k=13))
    no_topk = dataclasses.replace(logs, topk=None)
    with pytest.raises(ValueError, match="topk"):
        profile_drop(no_topk, ProfileSpec(k=4))
    partial = dataclasses.replace(logs, topk=logs.topk.filter(pl.col("input_id") != 3))
    with pytest.raises(ValueError, match="no rows"):
        profile_drop(partial, ProfileSpec(k=4))


def _py_layers(name, n_layers):
    return {
        "first-half": list(range(n_layers // 2)),
        "second-half": list(range(n_layers // 2, n_layers)),
        "every-2": list(range(0, n_layers, 2)),
        "every-4": list(range(0, n_layers, 4)),
        "first-last": [0, n_layers - 1],
        "early-only": list(range(max(n_layers // 3, 1))),
    }[name]


@pytest.mark.parametrize("name", ["first-half", "second-half", "every-2", "every-4", "first-last"])
def test_layer_subsets_match_python_loop(logs, name):
    prof = _rows(profile_drop(logs, ProfileSpec(layers=name)))
    for r in logs.inputs.iter_rows(named=True):
        a = [float(x) for x in r["agreement"]]
        kept = [a[i] for i in _py_layers(name, len(a))]
        assert prof[tuple(r[c] for c in KEY)]["drop"] == pytest.approx(_py_drop(kept), abs=1e-12)


def test_early_only_and_explicit_layers():
    logs = make_logs(models=(("m-deep", 12, 3, 1024),), n=2)
    prof = _rows(profile_drop(logs, ProfileSpec(layers="early-only")))
    expl = _rows(profile_drop(logs, ProfileSpec(layers=(5, 1, 9, 3))))
    for r in logs.inputs.iter_rows(named=True):
        a = [float(x) for x in r["agreement"]]
        key = tuple(r[c] for c in KEY)
        assert prof[key]["drop"] == pytest.approx(a[0] - a[3], abs=1e-12)  # early bin 0..3, thirds of 4 → 1
        assert expl[key]["drop"] == pytest.approx(a[1] - a[9], abs=1e-12)  # kept 1,3,5,9 → bins {1}, {9}
    small = make_logs(models=(("m-small", 5, 3, 1024),), n=1)
    with pytest.raises(ValueError, match="at least 2"):
        profile_drop(small, ProfileSpec(layers="early-only"))
    with pytest.raises(ValueError, match="out of range"):
        profile_drop(small, ProfileSpec(layers=(0, 7)))
    with pytest.raises(ValueError, match="unknown layer subset"):
        ProfileSpec(layers="middle")


@pytest.mark.parametrize("f,conv", [(0.25, "deployed"), (0.5, "deployed"), (1 / 3, "strict")])
def test_bin_fraction_and_strict_convention(logs, f, conv):
    prof = _rows(profile_drop(logs, ProfileSpec(bin_fraction=f, convention=conv)))
    for r in logs.inputs.iter_rows(named=True):
        a = [float(x) for x in r["agreement"]]
        n = len(a)
        size = max(int(n * f + 1e-9), 1)
        late_start = n - size if conv == "deployed" else (2 * n) // 3
        ref = sum(a[:size]) / size - sum(a[late_start:]) / (n - late_start)
        assert prof[tuple(r[c] for c in KEY)]["drop"] == pytest.approx(ref, abs=1e-12)


def test_pair_subsample_matches_python_loop(logs):
    spec = ProfileSpec(pairs_fraction=0.4, pair_draws=5, seed=3)
    prof = profile_drop(logs, spec)
    assert prof.columns == [*KEY, "pair_draw", "drop"]
    assert prof.height == logs.inputs.height * 5
    got = {(*(r[c] for c in KEY), r["pair_draw"]): r["drop"] for r in prof.iter_rows(named=True)}
    for r in logs.inputs.iter_rows(named=True):
        n_layers = len(r["agreement"])
        n_p = len(r["pair_jaccard"]) // n_layers
        subsets = pair_subsets(n_p, spec, r["model"])
        assert subsets.shape == (5, max(1, round(0.4 * n_p)))
        for d, chosen in enumerate(subsets):
            assert len(set(chosen.tolist())) == len(chosen) and max(chosen) < n_p
            a = [
                sum(float(r["pair_jaccard"][layer * n_p + p]) for p in chosen) / len(chosen)
                for layer in range(n_layers)
            ]
            assert got[(*(r[c] for c in KEY), d)] == pytest.approx(_py_drop(a), abs=1e-12)


def test_pair_draws_seeded_and_full_fraction(logs):
    a = pair_subsets(10, ProfileSpec(pairs_fraction=0.3, pair_draws=4, seed=1), "m-a")
    b = pair_subsets(10, ProfileSpec(pairs_fraction=0.3, pair_draws=4, seed=1), "m-a")
    c = pair_subsets(10, ProfileSpec(pairs_fraction=0.3, pair_draws=4, seed=2), "m-a")
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # fraction 1: a_ℓ = mean over all stored pairs ≈ stored a_ℓ (float32 rounding only)
    full = profile_drop(logs, ProfileSpec(pairs_fraction=1.0, pair_draws=2))
    logged = logs.inputs.sort(KEY)["drop"].to_numpy()
    assert np.allclose(full.filter(pl.col("pair_draw") == 1)["drop"].to_numpy(), logged, atol=1e-6)
    # pairs combined with k: fraction 1 of the k-recomputed pairs = the k replay (up to float32)
    both = profile_drop(logs, ProfileSpec(pairs_fraction=1.0, pair_draws=1, k=4))
    assert np.allclose(both["drop"].to_numpy(), profile_drop(logs, ProfileSpec(k=4))["drop"].to_numpy(), atol=1e-6)


def test_profile_statistics(logs):
    plateau = _rows(profile_drop(logs, ProfileSpec(statistic="late_plateau")))
    slope = _rows(profile_drop(logs, ProfileSpec(statistic="slope", layers="every-2")))
    decr = _rows(profile_drop(logs, ProfileSpec(statistic="decreasing_fraction")))
    sig = _rows(profile_drop(logs, ProfileSpec(statistic="signals.entropy")))
    for r in logs.inputs.iter_rows(named=True):
        key = tuple(r[c] for c in KEY)
        a = [float(x) for x in r["agreement"]]
        size = len(a) // 3
        assert plateau[key]["drop"] == pytest.approx(sum(a[-size:]) / size, abs=1e-12)
        xs = list(range(0, len(a), 2))
        assert slope[key]["drop"] == pytest.approx(np.polyfit(xs, [a[x] for x in xs], 1)[0], abs=1e-10)
        assert decr[key]["drop"] == pytest.approx(sum(a[i + 1] < a[i] for i in range(len(a) - 1)) / (len(a) - 1))
        assert sig[key]["drop"] == r["signals"]["entropy"]
    with pytest.raises(ValueError, match="signals field"):
        profile_drop(logs, ProfileSpec(statistic="nope"))
    with pytest.raises(ValueError, match="do not apply"):
        profile_drop(logs, ProfileSpec(statistic="norm", layers="every-2"))


def test_spec_validation():
    for bad in (dict(bin_fraction=0.7), dict(convention="loose"), dict(pairs_fraction=0.0), dict(pair_draws=0), dict(k=0)):
        with pytest.raises(ValueError):
            ProfileSpec(**bad)
    assert ProfileSpec(layers=[3, 1]).layers == (1, 3)


# --------------------------------------------------------------------------- gate and outcomes


def test_tau_extremes(logs):
    plain = gated_outcomes(logs, FixedTau(-math.inf))
    assert plain["gate_open"].all()
    assert plain["score_gated"].equals(plain["score_plain"], check_names=False)
    assert plain["n_kept_gated"].equals(plain["n_kept_plain"], check_names=False)
    full = gated_outcomes(logs, FixedTau(math.inf))
    assert not full["gate_open"].any()
    assert full["score_gated"].equals(full["score_full"], check_names=False)
    assert full["n_kept_gated"].equals(full["n_tokens"], check_names=False)
    assert plain.height == logs.outcomes.height


def test_gated_outcomes_rule_by_hand(logs):
    out = gated_outcomes(logs, FixedTau(0.05))
    full = {tuple(r[c] for c in KEY): r for r in logs.inputs.iter_rows(named=True)}
    for r in out.iter_rows(named=True):
        inp = full[tuple(r[c] for c in KEY)]
        is_open = inp["drop"] >= 0.05
        assert r["gate_open"] == is_open and r["tau"] == 0.05
        assert r["model"] == inp["model"] and r["context_length"] == inp["context_length"]
        assert r["score_gated"] == (r["score_plain"] if is_open else inp["full_score"])
        assert r["n_kept_gated"] == (r["n_kept_plain"] if is_open else inp["n_tokens"])


def test_gated_rows_in_order_share_the_outcome_columns(logs):
    """Outcome rows already in key order (as a database reads them) give the same gated rows as
    any other order, and those rows hold the outcomes' own score column, not a copy of it."""
    order = [*KEY, "evictor", "budget"]
    ordered = dataclasses.replace(logs, outcomes=logs.outcomes.sort(order))
    shuffled = dataclasses.replace(logs, outcomes=logs.outcomes.sample(fraction=1.0, shuffle=True, seed=3))
    got = gated_outcomes(ordered, FixedTau(0.05))
    pl.testing.assert_frame_equal(got, gated_outcomes(shuffled, FixedTau(0.05)))
    assert got.select(order).equals(got.select(order).sort(order))
    assert np.shares_memory(got["score_plain"].to_numpy(), ordered.outcomes["score"].to_numpy())
    assert not np.shares_memory(gated_outcomes(shuffled, FixedTau(0.05))["score_plain"].to_numpy(),
                                shuffled.outcomes["score"].to_numpy())


def test_gate_columns(logs):
    g = gate(logs)
    assert g.columns == [
        "run_id", "task", "input_id", "model", "context_length", "task_class",
        "n_tokens", "full_score", "drop", "tau", "gate_open",
    ]  # fmt: skip
    assert gate(logs, profile=ProfileSpec(pairs_fraction=0.5, pair_draws=2)).columns[3] == "pair_draw"


def test_orphan_outcomes_are_an_error(logs):
    extra = logs.outcomes.head(1).with_columns(pl.lit(99).cast(pl.Int64).alias("input_id"))
    bad = dataclasses.replace(logs, outcomes=pl.concat([logs.outcomes, extra]))
    with pytest.raises(ValueError, match="no input row"):
        gated_outcomes(bad)


def _frame(drops, tasks=None, models=None, contexts=None):
    n = len(drops)
    tasks = tasks or ["vt"] * n
    return pl.DataFrame(
        {
            "run_id": ["r"] * n,
            "task": tasks,
            "input_id": list(range(n)),
            "model": models or ["m"] * n,
            "context_length": contexts or [4096] * n,
            "task_class": [defaults.default_task_class(t) for t in tasks],
            "drop": [float(d) for d in drops],
        }
    )


def test_zscored_closed_form_paper_example():
    # pilot of 4 inputs with sample mean 0.034 and sample sd (ddof=1) 0.017, then outliers
    z = np.array([-1.5, -0.5, 0.5, 1.5])
    z = z / np.std(z, ddof=1)
    pilot = 0.034 + 0.017 * z
    frame = _frame([*pilot, 5.0, -5.0])  # input_ids 4, 5 are outside a "first" pilot of 4
    out = ZScored(pilot_n=4, pilot_split="first").decide(frame)
    expected = 0.034 - 0.69 * 0.017
    assert expected == pytest.approx(0.02227, abs=1e-12)
    assert np.allclose(out["tau"].to_numpy(), expected, atol=1e-12)
    assert out["gate_open"].to_list() == [d >= expected for d in frame["drop"].to_list()]


def test_zscored_per_model_and_random_pilot():
    rng = np.random.default_rng(5)
    drops = rng.normal(size=40)
    frame = _frame(drops, models=["a"] * 20 + ["b"] * 20, contexts=[4096, 8192] * 20)
    with pytest.raises(ValueError, match="larger than the data"):
        ZScored(theta_z=0.5, pilot_n=30, pilot_split="first").decide(frame)
    out = ZScored(theta_z=0.5, pilot_n=20, pilot_split="first").decide(frame)  # the whole group
    for m, sl in (("a", slice(0, 20)), ("b", slice(20, 40))):
        tau = drops[sl].mean() + 0.5 * drops[sl].std(ddof=1)
        assert np.allclose(out.filter(pl.col("model") == m)["tau"].to_numpy(), tau, atol=1e-12)
    mask = pilot_mask(frame, ["model"], 5, "random", seed=2)
    assert mask.sum() == 10 and mask[:20].sum() == 5
    assert mask.equals(pilot_mask(frame, ["model"], 5, "random", seed=2))
    assert not mask.equals(pilot_mask(frame, ["model"], 5, "random", seed=3))
    rnd = ZScored(pilot_n=5, pilot_split="random", seed=2).decide(frame)
    sel = drops[:20][mask.to_numpy()[:20]]
    assert rnd["tau"][0] == pytest.approx(sel.mean() - 0.69 * sel.std(ddof=1), abs=1e-12)
    by_ctx = ZScored(pilot_n=10, pilot_by=("model", "context_length"), pilot_split="first").decide(frame)
    sel = drops[0:20:2]
    assert by_ctx["tau"][0] == pytest.approx(sel.mean() - 0.69 * sel.std(ddof=1), abs=1e-12)


def test_pilot_first_interleaves_tasks():
    frame = _frame([0.0] * 6, tasks=["vt", "vt", "vt", "fwe", "fwe", "fwe"]).with_columns(
        pl.Series("input_id", [0, 1, 2, 0, 1, 2])
    )
    mask = pilot_mask(frame, ["model"], 3, "first")
    picked = frame.filter(mask).select("task", "input_id").sort("task", "input_id").rows()
    assert picked == [("fwe", 0), ("fwe", 1), ("vt", 0)]


def test_midpoint_by_hand():
    tasks = ["niah_multikey_3"] * 3 + ["vt"] * 3 + ["fwe"] * 2
    drops = [0.01, 0.03, 0.9, 0.10, 0.14, -0.9, 0.5, 0.7]
    frame = _frame(drops, tasks=tasks).with_columns(pl.Series("input_id", [0, 1, 2, 0, 1, 2, 0, 1]))
    out = Midpoint(n=2, capacity_tasks=None, dilution_tasks=None).decide(frame)  # class means, first 2 inputs by (input_id, task)
    cap = (0.01 + 0.03) / 2
    dil = (0.5 + 0.10) / 2  # first two dilution-prone: fwe/0 then vt/0
    assert np.allclose(out["tau"].to_numpy(), (cap + dil) / 2)
    named = Midpoint(n=2).decide(frame)  # the default: the paper's tasks, NIAH-MK3 and VT (App. A.3.4)
    assert np.allclose(named["tau"].to_numpy(), (cap + (0.10 + 0.14) / 2) / 2)
    assert named["gate_open"].to_list() == [d >= (cap + 0.12) / 2 for d in drops]
    with pytest.raises(ValueError, match="capacity-bound"):
        Midpoint().decide(_frame([0.1, 0.2]))


def test_oracle_and_custom(logs):
    g = gate(logs, TaskOracle())
    assert g["tau"].null_count() == g.height
    assert g["gate_open"].to_list() == [t != "niah_multikey_3" for t in g["task"].to_list()]
    med = float(np.median(logs.inputs["drop"].to_numpy()))
    c = gate(logs, CustomPolicy(lambda f: (f["drop"] > med).to_numpy(), name="above-median"))
    assert c["gate_open"].to_list() == [d > med for d in c["drop"].to_list()]
    # custom policies may read the whole stored profile
    late = gate(logs, CustomPolicy(lambda f: np.array([a[-1] < 0.3 for a in f["agreement"].to_list()])))
    ref = {tuple(r[c] for c in KEY): r["agreement"][-1] < 0.3 for r in logs.inputs.iter_rows(named=True)}
    assert late["gate_open"].to_list() == [ref[tuple(r[c] for c in KEY)] for r in late.iter_rows(named=True)]
    with pytest.raises(ValueError, match="shape"):
        gate(logs, CustomPolicy(lambda f: np.ones(3, bool)))
    with pytest.raises(TypeError, match="booleans"):
        gate(logs, CustomPolicy(lambda f: np.ones(f.height)))


def test_only_a_custom_policy_is_given_the_profile_lists(logs, monkeypatch):
    """A built-in policy reads D only: its frame leaves out the a_ℓ list, which head-pair draws
    would repeat on every draw; a custom policy is given it (and decides the same where it reads D)."""
    spec = ProfileSpec(pairs_fraction=0.5, pair_draws=3)
    seen = {}
    calibrate = FixedTau.calibrate

    def recording(self, con, source):
        columns = [r[0] for r in con.sql(f"DESCRIBE SELECT * FROM {source}").fetchall()]
        seen["fixed"] = (columns, con.sql(f"SELECT count(*) FROM {source}").fetchall()[0][0])
        return calibrate(self, con, source)

    monkeypatch.setattr(FixedTau, "calibrate", recording)
    g = gate(logs, FixedTau(0.07), spec)
    assert "agreement" not in seen["fixed"][0] and seen["fixed"][1] == g.height == 3 * logs.inputs.height
    custom = gate(logs, CustomPolicy(lambda f: seen.update(custom=f.columns) or (f["drop"] >= 0.07).to_numpy()), spec)
    assert "agreement" in seen["custom"]
    assert custom["gate_open"].to_list() == g["gate_open"].to_list() and custom["drop"].equals(g["drop"])


def test_policies_through_gate(logs):
    z = gate(logs, ZScored(pilot_n=5, pilot_split="first"))
    for m in ("m-a", "m-b"):
        sub = logs.inputs.filter(pl.col("model") == m).sort("input_id", "task", "run_id").head(5)
        tau = sub["drop"].mean() - 0.69 * sub["drop"].std(ddof=1)
        assert np.allclose(z.filter(pl.col("model") == m)["tau"].to_numpy(), tau, atol=1e-12)
    mid = gate(logs, Midpoint(n=3))
    assert mid["tau"].n_unique() == 2 and (mid["gate_open"] == (mid["drop"] >= mid["tau"])).all()
    draws = gate(logs, ZScored(pilot_n=5), ProfileSpec(pairs_fraction=0.5, pair_draws=3))
    assert draws.group_by("model", "pair_draw").agg(pl.col("tau").n_unique())["tau"].max() == 1


# --------------------------------------------------------------------------- τ curve


def _brute_curve(logs, taus, by, profile=ProfileSpec()):
    rows = []
    for tau in taus:
        out = gated_outcomes(logs, FixedTau(tau), profile).filter(pl.col("budget") < 1)
        groups = [*by, *(["pair_draw"] if "pair_draw" in out.columns else [])]
        for key, sub in out.group_by(groups, maintain_order=True):
            units = sub.unique([*KEY], keep="first")
            cap = units.filter(pl.col("task_class") == "capacity-bound")
            dil = units.filter(pl.col("task_class") == "dilution-prone")
            rows.append(
                dict(
                    zip(groups, key),
                    tau=tau,
                    n_inputs=units.height,
                    p_open=units["gate_open"].mean(),
                    delta=(sub["score_gated"] - sub["score_plain"]).mean(),
                    fp_rate=cap["gate_open"].mean() if cap.height else float("nan"),
                    fn_rate=(~dil["gate_open"]).mean() if dil.height else float("nan"),
                    kept_kv=(sub["n_kept_gated"] / sub["n_tokens"]).mean(),
                )
            )
    return pl.DataFrame(rows)


@pytest.mark.parametrize(
    "by,profile",
    [
        (("model", "context_length", "evictor"), ProfileSpec()),
        (("model", "task", "budget"), ProfileSpec()),
        (("evictor",), ProfileSpec(pairs_fraction=0.5, pair_draws=2)),
    ],
)
def test_tau_curve_equals_brute_force(logs, by, profile):
    drops = np.sort(profile_drop(logs, profile)["drop"].unique().to_numpy())
    taus = [-np.inf, drops[3], 0.0, float(np.median(drops)), drops[-2], 0.05, np.inf]
    curve = tau_curve(logs, taus, profile=profile, by=by)
    ref = _brute_curve(logs, taus, by, profile)
    groups = [c for c in ref.columns if c in curve.columns and c not in ("tau",) and c in (*by, "pair_draw")]
    curve = curve.sort([*groups, "tau"])
    ref = ref.sort([*groups, "tau"])
    assert curve.height == ref.height == len(taus) * ref.select(groups).n_unique()
    assert curve.select(groups).equals(ref.select(groups))
    for c in ("tau", "n_inputs", "p_open", "delta", "fp_rate", "fn_rate", "kept_kv"):
        assert np.allclose(curve[c].to_numpy(), ref[c].to_numpy(), rtol=0, atol=1e-12, equal_nan=True), c


def test_tau_curve_bad_group(logs):
    with pytest.raises(ValueError, match="cannot group"):
        tau_curve(logs, [0.0], by=("nope",))
    with pytest.raises(ValueError, match="NaN"):
        tau_curve(logs, [np.nan])


@pytest.mark.parametrize("span", [40, 100_000])  # positions dense in / spread over a long context
def test_topk_pair_jaccard_equals_python_sets(span):
    """The vectorised k-replay (dense renumbering + one-hot) equals Python set arithmetic bit for bit."""
    from pagestats.replay.spec import topk_pair_jaccard

    g = np.random.default_rng(span)
    n, n_layers, h, k_max, k = 3, 2, 4, 8, 5
    idx = np.stack([g.choice(span, k_max, replace=False) for _ in range(n * n_layers * h)]).reshape(n, n_layers, h, k_max)
    got = topk_pair_jaccard(idx, k)
    for i in range(n):
        for layer in range(n_layers):
            sets = [set(idx[i, layer, head, :k].tolist()) for head in range(h)]
            want = [len(a & b) / len(a | b) for x, a in enumerate(sets) for b in sets[x + 1:]]
            assert got[i, layer].tolist() == want


@pytest.mark.parametrize("block_rows", [1, 80, 10**9])  # one draw per block, two (36 inputs), all draws at once
@pytest.mark.parametrize("policy", [FixedTau(0.05), ZScored(pilot_n=4, pilot_split="held-out"),
                                    Midpoint(n=3, by=("model",), capacity_tasks=("niah_multikey_3",),
                                             dilution_tasks=("vt",))])
def test_decisions_by_draw_are_the_gate_draw_by_draw(logs, monkeypatch, block_rows, policy):
    """Table 9 replays a block of draws at a time: the blocks' rows, together, are the rows of the
    gate of all draws at once (pilot, τ per draw, held-out inputs left out), each draw in one block."""
    import importlib

    from pagestats.replay import decisions_by_draw, profile_drop_by_draw

    monkeypatch.setattr(importlib.import_module("pagestats.replay.session"), "DRAW_BLOCK_ROWS", block_rows)
    spec = ProfileSpec(pairs_fraction=0.4, pair_draws=5, seed=3)
    whole = gate(logs, policy, spec)
    order = [*INPUT_KEY, "pair_draw"]
    calibration = importlib.import_module("pagestats.replay.calibration")
    drawn, store = [], calibration.store_calibration
    monkeypatch.setattr(calibration, "store_calibration", lambda *a: drawn.append(store(*a)) or drawn[-1])
    blocks = [logs.typed_names(block.pl()).sort(order) for block in decisions_by_draw(logs, policy, spec)]
    if isinstance(policy, ZScored):  # the pilot is drawn in the first block and kept for the others
        assert drawn == [True] + [False] * (len(blocks) - 1)
    assert len(blocks) == {1: 5, 80: 3, 10**9: 1}[block_rows]
    draws = [set(b["pair_draw"].to_list()) for b in blocks]
    assert sorted(d for ds in draws for d in ds) == list(range(5))  # each draw in one block
    assert pl.concat(blocks).sort(["pair_draw", *INPUT_KEY]).select(whole.columns).equals(
        whole.sort(["pair_draw", *INPUT_KEY]))
    prof = profile_drop(logs, spec)
    for d, part in enumerate(profile_drop_by_draw(logs, spec)):
        assert part.equals(prof.filter(pl.col("pair_draw") == d))
    # without draws: the gate itself, once
    (only,) = [logs.typed_names(b.pl()) for b in decisions_by_draw(logs, policy, ProfileSpec())]
    want = gate(logs, policy, ProfileSpec())
    assert only.sort(INPUT_KEY).select(want.columns).equals(want.sort(INPUT_KEY))
    with pytest.raises(TypeError, match="CustomPolicy"):
        next(decisions_by_draw(logs, CustomPolicy(lambda f: f["drop"] >= 0.1, name="c"), spec))


@pytest.mark.parametrize("policy", [FixedTau(0.05), ZScored(pilot_n=4, pilot_split="held-out"), TaskOracle()])
def test_gated_outcomes_of_one_evictor_and_few_columns(logs, policy):
    """Tables 7, 14, 20 and N1 hold narrow gated rows: the rows and values of the full frame."""
    full = gated_outcomes(logs, policy)
    ev = sorted(full["evictor"].unique().to_list())[-1]
    cols = ["run_id", "task", "input_id", "evictor", "budget", "gate_open", "score_gated"]
    got = gated_outcomes(logs, policy, evictor=ev, columns=cols)
    assert got.columns == cols
    assert got.equals(full.filter(pl.col("evictor") == ev).select(cols))
    assert gated_outcomes(logs, policy, columns=["score_plain", "n_kept_gated"]).equals(
        full.select("score_plain", "n_kept_gated"))
    with pytest.raises(ValueError, match="unknown columns"):
        gated_outcomes(logs, policy, columns=["score"])


def test_paper_tau_curve_is_the_cell_mean_by_hand():
    """Fig. 6's recipe by brute force at a few τ: Δ the mean over (task, budget ∈ the paper's four) of
    the cell's mean gated − plain; FP the share of MK3 inputs open; FN the share of VT/FWE inputs closed."""
    import polars as pl

    from pagestats import replay, testing
    from pagestats.core import defaults

    syn = testing.synthetic_logs(models={"m": (6, 3)}, evictors=("snapkv",), tasks=("niah_multikey_3", "vt", "fwe"),
                                 n_inputs=12, budgets=(0.0625, 0.125, 0.25, 0.375, 0.5, 1.0), with_topk=False,
                                 with_text=False)
    taus = [0.0, 0.05, 0.08, 0.2]
    curve = replay.paper_tau_curve(syn, taus)
    for tau in taus:
        g = replay.gated_outcomes(syn, replay.FixedTau(tau)).filter(pl.col("budget").is_in(list(defaults.FIG6_BUDGETS)))
        cells = g.group_by("task", "budget").agg((pl.col("score_gated") - pl.col("score_plain")).mean().alias("d"))
        inputs = g.unique(["run_id", "task", "input_id"])
        mk3 = inputs.filter(pl.col("task") == "niah_multikey_3")["gate_open"].mean()
        closed = 1 - inputs.filter(pl.col("task").is_in(["vt", "fwe"]))["gate_open"].mean()
        row = curve.filter(pl.col("tau") == tau).row(0, named=True)
        assert row["delta"] == pytest.approx(cells["d"].mean(), abs=1e-12)
        assert row["fp_rate"] == pytest.approx(mk3) and row["fn_rate"] == pytest.approx(closed)
        assert row["n_inputs"] == inputs.height
