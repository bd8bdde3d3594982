"""The paper's tables (pagestats.tables) against brute-force loops written here, the planted
truth of the synthetic logs, and closed forms; plus rendering and the report registry."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pagestats import io, replay, report, tables, testing, metrics
from pagestats.core import defaults
from pagestats.replay.policies import FixedTau, TaskOracle, ZScored
from pagestats.report.table_entries import TABLES

CAP, DIL = defaults.CAPACITY_BOUND, defaults.DILUTION_PRONE
TASKS = ("niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "vt", "fwe")
SMALL = dict(models={"m6": (6, 3), "m8": (8, 4)}, evictors=("snapkv", "h2o"), tasks=TASKS, n_inputs=10,
             budgets=(0.125, 0.5, 1.0), with_topk=False, with_text=False, context_lengths=(4096, 16384), input_draws=(0, 1))


@pytest.fixture(scope="module")
def syn():
    return testing.synthetic_logs(**SMALL)


@pytest.fixture(scope="module")
def gated(syn):
    return replay.gated_outcomes(syn, FixedTau())


@pytest.fixture(scope="module")
def gate(syn):
    return replay.gate(syn, FixedTau())


def wilson_ref(k, n, z=1.959963984540054):
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return c - h, c + h


def rows_of(frame):
    return frame.to_dicts()


def input_table(gated):
    """input key -> dict(meta, scores[evictor][budget])"""
    out = {}
    for r in rows_of(gated):
        key = (r["run_id"], r["task"], r["input_id"])
        d = out.setdefault(key, {**{c: r[c] for c in ("model", "context_length", "task", "task_class", "drop", "gate_open",
                                                       "score_full", "n_tokens")}, "arms": defaultdict(dict)})
        d["arms"][r["evictor"]][r["budget"]] = r
    return out


# --------------------------------------------------------------------------- Table 1


def test_recovery_table_matches_loops_and_planted(syn, gated):
    t = tables.recovery_table(gated)
    assert set(t["evictor"]) == {"snapkv"}
    counts = defaultdict(lambda: [0, 0])
    pooled = defaultdict(lambda: [0, 0])
    for d in input_table(gated).values():
        arms = d["arms"]["snapkv"]
        rec = max(r["score_plain"] for b, r in arms.items() if b < 1) > d["score_full"]
        for acc in (counts[(d["model"], d["context_length"], d["task"])], pooled[d["task_class"]]):
            acc[0] += rec
            acc[1] += 1
    cells = t.filter(pl.col("scope") == "cell")
    assert cells.height == len(counts)
    for r in rows_of(cells):
        k, n = counts[(r["model"], r["context_length"], r["task"])]
        assert (r["k"], r["n"]) == (k, n)
        assert r["rho"] == pytest.approx(k / n)
        lo, hi = wilson_ref(k, n)
        assert r["low"] == pytest.approx(max(lo, 0), abs=1e-12) and r["high"] == pytest.approx(min(hi, 1), abs=1e-12)
        assert r["dilution_prone"] == (k / n >= 0.05)
    pool = {r["task_class"]: r for r in rows_of(t.filter(pl.col("scope") == "pooled"))}
    assert (pool[CAP]["k"], pool[CAP]["n"]) == tuple(pooled[CAP])
    # planted: capacity-bound inputs are never recovered; dilution-prone ρ = 0.12 (binomial tolerance)
    assert pool[CAP]["k"] == 0
    truth = syn.planted_rates().filter(pl.col("task_class") == DIL)["rho"][0]
    n = pool[DIL]["n"]
    assert abs(pool[DIL]["rho"] - truth) < 4 * math.sqrt(truth * (1 - truth) / n)


# --------------------------------------------------------------------------- Tables 2, 12


def _delta_loop(gated, keep=lambda r: True):
    acc = defaultdict(list)
    for r in rows_of(gated):
        if r["budget"] < 1 and keep(r):
            acc[(r["model"], r["context_length"], r["evictor"])].append(r["score_gated"] - r["score_plain"])
    return {k: sum(v) / len(v) for k, v in acc.items()}


@pytest.mark.parametrize("tau", [0.07, -1.0])
def test_delta_matrix_by_loops(syn, tau):
    g = replay.gated_outcomes(syn, FixedTau(tau))
    t = tables.delta_matrix_table(g)
    full = _delta_loop(g)
    rest = _delta_loop(g, lambda r: r["task_class"] != CAP)
    opened = defaultdict(list)
    for d in input_table(g).values():
        if d["task_class"] != CAP:
            opened[(d["model"], d["context_length"])].append(d["gate_open"])
    assert t.height == len(full)
    for r in rows_of(t):
        key = (r["model"], r["context_length"], r["evictor"])
        assert r["delta"] == pytest.approx(full[key], abs=1e-12)
        assert r["delta_rest"] == pytest.approx(rest[key], abs=1e-12)
        ops = opened[key[:2]]
        assert r["p_open_rest"] == pytest.approx(sum(ops) / len(ops))
        assert r["identical"] == all(ops)
        if r["identical"]:
            assert r["delta_rest"] == 0.0  # gated ≡ plain exactly there
    if tau < 0:  # every gate open: the two arms are the same system everywhere
        assert t["identical"].all() and (t["delta"] == 0).all()


def test_delta_by_task_sums_to_matrix(gated):
    t12 = tables.delta_by_task_table(gated)
    t2 = tables.delta_matrix_table(gated)
    # equal inputs and budgets per task: the cell Δ is the mean of the per-task Δ
    back = t12.group_by("model", "context_length", "evictor").agg(pl.col("delta").mean()).sort("model", "context_length", "evictor")
    assert np.allclose(back["delta"].to_numpy(), t2["delta"].to_numpy())
    mk3 = t12.filter(pl.col("task") == "niah_multikey_3")
    assert (mk3["delta"] > 0).all()  # planted: the closed gate rescues the harmed capacity-bound task


# --------------------------------------------------------------------------- Tables 3, 24, 4


def test_drop_by_task_planted_and_loops(syn, gate):
    t = tables.drop_by_task_table(gate)
    by = defaultdict(list)
    for r in rows_of(gate):
        by[(r["model"], r["context_length"], r["task"])].append((r["drop"], r["gate_open"]))
    for r in rows_of(t):
        vals = by[(r["model"], r["context_length"], r["task"])]
        assert r["n"] == len(vals)
        assert r["mean_drop"] == pytest.approx(statistics.fmean(v for v, _ in vals), abs=1e-12)
        assert r["sd_drop"] == pytest.approx(statistics.stdev(v for v, _ in vals), abs=1e-12)
        assert r["p_open"] == pytest.approx(sum(o for _, o in vals) / len(vals))
    # planted: the capacity-bound task has the smallest mean D in every cell
    smallest = t.filter(pl.col("smallest"))
    assert set(smallest["task"]) == {"niah_multikey_3"}
    assert smallest.height == t.select("model", "context_length").n_unique()
    mk3 = t.filter(pl.col("task") == "niah_multikey_3")["mean_drop"].mean()
    assert abs(mk3 - syn.effect.capacity_bound.drop_mean) < 0.02


def test_strict_bins_differ_only_by_convention(syn):
    strict = replay.gate(syn, FixedTau(), replay.ProfileSpec(convention="strict"))
    t24 = tables.drop_by_task_table(strict)
    first = syn.inputs.sort("run_id", "task", "input_id").row(0, named=True)
    ag = np.asarray(first["agreement"], dtype=np.float64)
    L = ag.size
    third = L // 3
    d_strict = ag[:third].mean() - ag[(2 * L) // 3:].mean()
    row = strict.filter((pl.col("run_id") == first["run_id"]) & (pl.col("task") == first["task"]) &
                        (pl.col("input_id") == first["input_id"]))
    assert row["drop"][0] == pytest.approx(d_strict, abs=1e-6)
    assert t24.height == tables.drop_by_task_table(replay.gate(syn)).height


def test_distractor_sweep_monotone_flag():
    rows = []
    for cell, means in ((("a", 4096), (0.12, 0.08, 0.03)), (("b", 4096), (0.12, 0.13, 0.03))):
        for task, m in zip(tables.MULTIKEY_TASKS, means):
            for i, eps in enumerate((-0.01, 0.01)):
                rows.append(dict(run_id=f"r{cell[0]}", task=task, input_id=i, model=cell[0], context_length=cell[1],
                                 task_class=DIL, drop=m + eps, gate_open=m + eps >= 0.07, tau=0.07))
    t = tables.distractor_sweep_table(pl.DataFrame(rows))
    mono = dict(t.select("model", "monotone").unique().iter_rows())
    assert mono == {"a": True, "b": False}
    ra = t.filter(pl.col("model") == "a")
    assert ra["mean_drop"].to_list() == pytest.approx([0.12, 0.08, 0.03])
    assert ra["ratio_first_last"][0] == pytest.approx(0.12 / 0.03)
    assert ra["distractors"].to_list() == [0, 1, 2]


# --------------------------------------------------------------------------- Tables 5–6, 9, 10


def _margin(task_mean: dict, classes: dict, exclude=()):
    cap = [m for t, m in task_mean.items() if classes[t] == CAP and t not in exclude]
    dil = [m for t, m in task_mean.items() if classes[t] == DIL and t not in exclude]
    return min(dil) - max(cap)


def _auc_ref(x_dil, x_cap):
    wins = sum((a > b) + 0.5 * (a == b) for a in x_dil for b in x_cap)
    return wins / (len(x_dil) * len(x_cap))


def test_signal_ablation_by_loops(syn, gate):
    t = tables.signal_ablation_table(syn, statistics=("drop", "attention_entropy", "sink_mass"))
    assert t["statistic"].unique(maintain_order=True).to_list() == ["drop", "attention_entropy", "sink_mass"]
    sig = {(r["run_id"], r["task"], r["input_id"]): r["signals"] for r in rows_of(syn.inputs)}
    classes = dict(zip(TASKS, [defaults.default_task_class(x) for x in TASKS]))
    for stat in ("drop", "attention_entropy"):
        for r in rows_of(t.filter(pl.col("statistic") == stat)):
            cell = gate.filter((pl.col("model") == r["model"]) & (pl.col("context_length") == r["context_length"]))
            vals = defaultdict(list)
            for g in rows_of(cell):
                v = g["drop"] if stat == "drop" else sig[(g["run_id"], g["task"], g["input_id"])][stat]
                vals[g["task"]].append(v)
            means = {k: statistics.fmean(v) for k, v in vals.items()}
            assert r["margin"] == pytest.approx(_margin(means, classes), abs=1e-12)
            assert r["margin_minus"] == pytest.approx(_margin(means, classes, ("niah_multivalue",)), abs=1e-12)
            x_cap = [v for k, vs in vals.items() if classes[k] == CAP for v in vs]
            x_dil = [v for k, vs in vals.items() if classes[k] == DIL for v in vs]
            assert r["auc"] == pytest.approx(_auc_ref(x_dil, x_cap), abs=1e-12)
            assert r["auc_oriented"] == pytest.approx(max(r["auc"], 1 - r["auc"]))
            if stat == "drop":
                assert r["pearson_r"] == pytest.approx(1.0)
                assert r["below"] and r["separated"]  # planted partition
            mk = [means[k] for k in tables.MULTIKEY_TASKS]
            steps = np.diff(mk)
            assert r["mk_monotone"] == bool((steps > 0).all() or (steps < 0).all())
    # planted: attention_entropy is informative (dilution-prone shifted by +0.8, sd 0.4: true AUC Φ(√2) ≈ 0.92)
    ent = t.filter(pl.col("statistic") == "attention_entropy")["auc"]
    assert (ent > 0.7).all() and ent.mean() > 0.85
    # BH across all rows, by a hand loop of the step-up rule
    p = t["p_value"].to_numpy()
    m = len(p)
    order = np.argsort(p)
    adj = np.empty(m)
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, p[i] * m / rank)
        adj[i] = running
    assert np.allclose(t["p_adjusted"].to_numpy(), adj)


def _bins(L, f=1 / 3):
    n = int(math.floor(f * L))
    return list(range(n)), list(range(L - n, L))


def test_head_pair_margins_by_hand(syn):
    t = tables.head_pair_table(syn, fractions=(0.34, 1.0), pair_draws=5, seed=3)
    inputs = syn.inputs.sort("run_id", "task", "input_id")
    classes = {t_: defaults.default_task_class(t_) for t_ in TASKS}
    for model in ("m6", "m8"):
        sub = inputs.filter(pl.col("model") == model)
        L = len(sub["agreement"][0])
        P = len(sub["pair_jaccard"][0]) // L
        early, late = _bins(L)
        spec = replay.ProfileSpec(pairs_fraction=0.34, pair_draws=5, seed=3)
        subsets = replay.pair_subsets(P, spec, model)
        for ctx in (4096, 16384):
            cell = sub.filter(pl.col("context_length") == ctx)
            margins = []
            for chosen in subsets:
                vals = defaultdict(list)
                for r in rows_of(cell):
                    pj = np.asarray(r["pair_jaccard"], dtype=np.float64).reshape(L, P)
                    a = pj[:, chosen].mean(axis=1)
                    vals[r["task"]].append(a[early].mean() - a[late].mean())
                margins.append(_margin({k: statistics.fmean(v) for k, v in vals.items()}, classes))
            row = t.filter((pl.col("model") == model) & (pl.col("context_length") == ctx) & (pl.col("pairs_fraction") == 0.34))
            assert row["n_pairs"][0] == P and row["n_pairs_kept"][0] == subsets.shape[1]
            assert row["margin_mean"][0] == pytest.approx(statistics.fmean(margins), abs=1e-9)
            assert row["margin_min"][0] == pytest.approx(min(margins), abs=1e-9)
            assert row["n_ordered"][0] == sum(m > 0 for m in margins)
    full = t.filter(pl.col("pairs_fraction") == 1.0)
    assert (full["margin_min"] - full["margin_max"]).abs().max() < 1e-9  # every draw keeps every pair


def test_layer_subsets_by_hand(syn, gate):
    t = tables.layer_subset_table(syn, subsets=("all", "first-last", (0, 1), (0, 50)))
    classes = {t_: defaults.default_task_class(t_) for t_ in TASKS}
    for r in rows_of(t):
        cell = syn.inputs.filter((pl.col("model") == r["model"]) & (pl.col("context_length") == r["context_length"]))
        vals = defaultdict(list)
        for i in rows_of(cell):
            a = np.asarray(i["agreement"], dtype=np.float64)
            if r["layers"] == "all":
                d = i["drop"]
            elif r["layers"] == "first-last":
                d = a[0] - a[-1]
            elif r["layers"] == "0,1":  # bins hold at least one layer: D = a_0 − a_1
                d = a[0] - a[1]
            else:
                d = None
            vals[i["task"]].append(d)
        if r["layers"] == "0,50":  # layer 50 does not exist: reported, not raised
            assert r["margin"] is None and "out of range" in r["note"]
            continue
        assert r["note"] is None
        means = {k: statistics.fmean(v) for k, v in vals.items()}
        assert r["margin"] == pytest.approx(_margin(means, classes), abs=1e-6)
        assert r["ordered"] == (r["margin"] > 0)


# --------------------------------------------------------------------------- Table 7, pilot sensitivity


def _pilot(rows, n):
    return sorted(rows, key=lambda r: (r["input_id"], r["task"], r["run_id"]))[:n]


def test_calibration_midpoint_by_hand(syn, gate):
    t = tables.calibration_table(syn, n=7)
    fixed = _delta_loop(replay.gated_outcomes(syn, FixedTau()))
    for r in rows_of(t):
        cell = [g for g in rows_of(gate) if g["model"] == r["model"] and g["context_length"] == r["context_length"]]
        # the paper's recipe: the pilot of NIAH-MK3 against the pilot of VT (App. A.3.4, Table 7)
        dc = statistics.fmean(g["drop"] for g in _pilot([g for g in cell if g["task"] == "niah_multikey_3"], 7))
        dd = statistics.fmean(g["drop"] for g in _pilot([g for g in cell if g["task"] == "vt"], 7))
        assert r["mean_drop_capacity"] == pytest.approx(dc) and r["mean_drop_dilution"] == pytest.approx(dd)
        assert r["tau_calibrated"] == pytest.approx((dc + dd) / 2)
        assert r["delta_fixed"] == pytest.approx(fixed[(r["model"], r["context_length"], "snapkv")])
        tau = (dc + dd) / 2
        g2 = replay.gated_outcomes(syn, FixedTau(tau))
        cal = _delta_loop(g2)[(r["model"], r["context_length"], "snapkv")]
        assert r["delta_calibrated"] == pytest.approx(cal, abs=1e-9)
        assert r["winner"] == ("calibrated" if cal > r["delta_fixed"] else "fixed" if cal < r["delta_fixed"] else "tie")


def test_pilot_sensitivity_by_hand(syn, gate):
    t = tables.pilot_sensitivity_table(syn, pilot_sizes=(8, 100), reference=ZScored(pilot_n=100, pilot_split="first"))
    # 200 inputs per model, 100 per (model, context): a held-out pilot of 100 per cell leaves none, so it is left out
    assert t.select("pilot_split", "pilot_by", "pilot_n").n_unique() == 3 * 2 * 2 - 1
    assert t.filter((pl.col("pilot_split") == "held-out") & (pl.col("pilot_by") == "model×context_length")
                    & (pl.col("pilot_n") == 100)).height == 0
    ref = t.filter((pl.col("pilot_split") == "first") & (pl.col("pilot_by") == "model") & (pl.col("pilot_n") == 100))
    assert not ref["flips"].any()
    # every definition is evaluated on the inputs no held-out pilot of the table takes: per model the 100 of
    # smallest hash, and per (model, context) the 8 of smallest hash (blake2b of "0/run/task/input", by hand)
    def h(g):
        return int.from_bytes(hashlib.blake2b(f"0/{g['run_id']}/{g['task']}/{g['input_id']}".encode(),
                                              digest_size=8).digest(), "big") >> 1

    rows = rows_of(gate)
    held_out = set()
    for group in ({(g["model"],) for g in rows}, {(g["model"], g["context_length"]) for g in rows}):
        for key in group:
            members = sorted((g for g in rows if (g["model"], g["context_length"])[:len(key)] == key), key=h)
            held_out |= {(g["run_id"], g["task"], g["input_id"]) for g in members[:100 if len(key) == 1 else 8]}
    rows = [g for g in rows if (g["run_id"], g["task"], g["input_id"]) not in held_out]
    for (pilot, by, n), part in t.group_by("pilot_split", "pilot_by", "pilot_n"):
        assert part["n_evaluated"].sum() == 400 - len(held_out), (pilot, by, n)
    held = t.filter((pl.col("pilot_split") == "held-out") & (pl.col("pilot_by") == "model") & (pl.col("pilot_n") == 8))
    assert held["n_left_out"].sum() == 400 - 2 * 8 - (400 - len(held_out))
    for model in ("m6", "m8"):
        pil = [g["drop"] for g in _pilot([g for g in rows_of(gate) if g["model"] == model], 8)]
        tau = statistics.fmean(pil) + defaults.THETA_Z * statistics.stdev(pil)
        got = t.filter((pl.col("pilot_split") == "first") & (pl.col("pilot_by") == "model") & (pl.col("pilot_n") == 8)
                       & (pl.col("model") == model))
        assert np.allclose(got["tau"].to_numpy(), tau)
        policy_tau = replay.gate(syn, ZScored(pilot_n=8, pilot_split="first")).filter(pl.col("model") == model)["tau"].unique()
        assert policy_tau.len() == 1 and (got["tau"] == policy_tau[0]).all()  # bit-exact, not a mean of copies
        for r in rows_of(got):
            task_rows = [g for g in rows if g["model"] == model and g["context_length"] == r["context_length"]
                         and g["task"] == r["task"]]
            p = sum(g["drop"] >= tau for g in task_rows) / len(task_rows)
            assert r["p_open"] == pytest.approx(p)
            assert r["closed_call"] == (p < 0.5)
    # flips counted consistently
    counts = t.group_by("model", "context_length", "task").agg(pl.col("flips").sum(), pl.col("n_flipping_definitions").first())
    assert (counts["flips"] == counts["n_flipping_definitions"]).all()


# --------------------------------------------------------------------------- Tables 13, 14, 17, 20


def test_budget_axis_and_best_evictor_by_loops(gated):
    t13 = tables.budget_axis_table(gated)
    acc = defaultdict(lambda: defaultdict(list))
    for r in rows_of(gated):
        if r["budget"] < 1:
            k = (r["model"], r["context_length"], r["evictor"], r["budget"])
            for arm in ("score_full", "score_plain", "score_gated"):
                acc[k][arm].append(r[arm])
            acc[k]["kept"].append(r["n_kept_gated"] / r["n_tokens"])
    for r in rows_of(t13):
        a = acc[(r["model"], r["context_length"], r["evictor"], r["budget"])]
        assert r["acc_plain"] == pytest.approx(statistics.fmean(a["score_plain"]))
        assert r["acc_gated"] == pytest.approx(statistics.fmean(a["score_gated"]))
        assert r["delta"] == pytest.approx(r["acc_gated"] - r["acc_plain"], abs=1e-12)
        assert r["kept_kv_gated"] == pytest.approx(statistics.fmean(a["kept"]))
    t17 = tables.best_evictor_table(gated)
    per = defaultdict(dict)
    for (m, c, e, b), a in acc.items():
        per[(m, c)].setdefault(e, {"p": [], "g": []})
        per[(m, c)][e]["p"] += a["score_plain"]
        per[(m, c)][e]["g"] += a["score_gated"]
    for r in rows_of(t17):
        evs = per[(r["model"], r["context_length"])]
        plain = {e: statistics.fmean(v["p"]) for e, v in evs.items()}
        gatedm = {e: statistics.fmean(v["g"]) for e, v in evs.items()}
        assert r["acc_best_plain"] == pytest.approx(max(plain.values()))
        assert r["acc_best_gated"] == pytest.approx(max(gatedm.values()))
        assert plain[r["best_plain"]] == pytest.approx(max(plain.values()))
        assert r["gain"] == pytest.approx(max(gatedm.values()) - max(plain.values()))


def test_oracle_gap_by_loops(syn, gated):
    oracle = replay.gated_outcomes(syn, TaskOracle())
    t = tables.oracle_gap_table(gated, oracle)
    dp, do = _delta_loop(gated), _delta_loop(oracle)
    same = defaultdict(lambda: True)
    for a, b in zip(rows_of(gated), rows_of(oracle)):
        assert (a["run_id"], a["task"], a["input_id"], a["evictor"], a["budget"]) == (b["run_id"], b["task"], b["input_id"], b["evictor"], b["budget"])
        k = (a["model"], a["context_length"], a["evictor"])
        same[k] = same[k] and a["gate_open"] == b["gate_open"]
    for r in rows_of(t):
        k = (r["model"], r["context_length"], r["evictor"])
        assert r["gap"] == pytest.approx(dp[k] - do[k], abs=1e-12)
        assert r["same_decisions"] == same[k]
        if r["same_decisions"]:
            assert r["gap"] == 0.0


def test_cross_cell_fixed_and_calibrated(syn, gated):
    from pagestats.replay.policies import Midpoint

    cal = replay.gated_outcomes(syn, Midpoint())
    t = tables.cross_cell_table(gated, cal)
    df, dc = defaultdict(list), defaultdict(list)
    for r in rows_of(gated.filter(pl.col("evictor") == "snapkv")):
        if r["budget"] < 1:
            df[(r["model"], r["context_length"])].append(r["score_gated"] - r["score_plain"])
    for r in rows_of(cal.filter(pl.col("evictor") == "snapkv")):
        if r["budget"] < 1:
            dc[(r["model"], r["context_length"])].append(r["score_gated"] - r["score_plain"])
    for r in rows_of(t):
        k = (r["model"], r["context_length"])
        assert r["delta_fixed"] == pytest.approx(statistics.fmean(df[k]))
        assert r["delta_calibrated"] == pytest.approx(statistics.fmean(dc[k]))
        # τ is reported bit-exactly (one value per cell, not a mean of its copies)
        assert r["tau_fixed"] == 0.07
        cell_tau = cal.filter((pl.col("model") == k[0]) & (pl.col("context_length") == k[1]))["tau"].unique()
        assert cell_tau.len() == 1 and r["tau_calibrated"] == cell_tau[0]


# --------------------------------------------------------------------------- Tables 21, 22, 23, 25, 27


def test_compression_and_batching_closed_form(gated):
    t22 = tables.compression_table(gated)
    sn = [r for r in rows_of(gated) if r["evictor"] == "snapkv" and r["budget"] < 1]
    for r in rows_of(t22):
        rows = [x for x in sn if x["model"] == r["model"] and x["context_length"] == r["context_length"]
                and (r["budget"] is None or x["budget"] == r["budget"])]
        kg = statistics.fmean(x["n_kept_gated"] / x["n_tokens"] for x in rows)
        kp = statistics.fmean(x["n_kept_plain"] / x["n_tokens"] for x in rows)
        assert r["kept_kv_gated"] == pytest.approx(kg) and r["kept_kv_plain"] == pytest.approx(kp)
        assert r["compression"] == pytest.approx(1 / kg)
    t23 = tables.batching_table(gated)
    assert t23["budget"].unique().to_list() == [0.125]
    for r in rows_of(t23):
        rows = [x for x in sn if x["model"] == r["model"] and x["context_length"] == r["context_length"] and x["budget"] == 0.125]
        p = statistics.fmean(x["gate_open"] for x in rows)
        k_open = statistics.fmean(x["n_kept_plain"] / x["n_tokens"] for x in rows if x["gate_open"])
        B = r["batch_size"]
        assert r["p_open"] == pytest.approx(p) and r["kept_open"] == pytest.approx(k_open)
        assert r["compression"] == pytest.approx(1 / ((1 - p**B) + p**B * k_open))
    assert sorted(t23["batch_size"].unique().to_list()) == list(defaults.BATCH_SIZES)


def test_scaling_slope_by_hand(gated):
    import statsmodels.api as sm

    t = tables.scaling_table(gated)
    for rule, chosen in (("task_class", pl.col("task_class") == DIL), ("rho", pl.col("rho") >= 0.05)):
        fit = t.filter(chosen & (pl.col("headroom") > 0))
        assert t.filter(pl.col(f"in_fit_{rule}")).equals(fit)
        assert t[f"zero_headroom_{rule}"][0] == t.filter(chosen & (pl.col("headroom") == 0)).height
        h, k, n = fit["headroom"].to_numpy(), fit["k"].to_numpy(), fit["n"].to_numpy()
        ref = sm.GLM(np.column_stack([k, n - k]), h[:, None],
                     family=sm.families.Binomial(link=sm.families.links.Identity())).fit()
        assert t[f"slope_{rule}"][0] == pytest.approx(ref.params[0], rel=1e-6)
        assert t[f"slope_se_{rule}"][0] == pytest.approx(ref.bse[0], rel=1e-5)
        assert t[f"fit_n_{rule}"][0] == fit.height
        ols = sm.OLS(fit["rho"].to_numpy(), h[:, None]).fit()  # the paper's estimator (App. A.6.4)
        assert t[f"slope_ls_{rule}"][0] == pytest.approx(ols.params[0], rel=1e-10)
    for r in rows_of(t):
        assert r["fitted_rho"] == pytest.approx(t["slope_task_class"][0] * r["headroom"])


def test_preregistered_band_post_hoc(syn, gated):
    t = tables.preregistered_table(gated, syn.inputs)
    assert set(t["status"]) == {"post-hoc illustration, not a pre-registration"}
    rows25 = tables.scaling_table(gated)
    for r in rows_of(t):
        fit = rows25.filter((pl.col("model") == r["model"]) & (pl.col("task") == r["task"]) &
                            (pl.col("context_length") < 16384) & (pl.col("headroom") > 0))
        ratios = (fit["rho"] / fit["headroom"]).to_list()
        full = syn.inputs.filter((pl.col("model") == r["model"]) & (pl.col("task") == r["task"]) &
                                 (pl.col("context_length") == 16384))["full_score"].to_list()
        h = 1 - statistics.fmean(full)
        assert r["headroom"] == pytest.approx(h)
        assert r["predicted_low"] == pytest.approx(min(ratios) * h) and r["predicted_high"] == pytest.approx(max(ratios) * h)
        meas = rows25.filter((pl.col("model") == r["model"]) & (pl.col("task") == r["task"]) & (pl.col("context_length") == 16384))
        assert r["rho"] == pytest.approx(meas["rho"][0])
        assert r["inside"] == (r["predicted_low"] <= r["rho"] <= r["predicted_high"])


def test_preregistered_needs_two_contexts(syn):
    one = replay.gated_outcomes(syn).filter(pl.col("context_length") == 4096)
    with pytest.raises(ValueError, match="≥2 context"):
        tables.preregistered_table(one, syn.inputs)


def test_harm_rates_planted_and_loops(syn, gated):
    t = tables.harm_table(gated)
    truth = syn.planted_rates().filter(pl.col("evictor") == "snapkv")
    sn = [r for r in rows_of(gated) if r["evictor"] == "snapkv"]
    for r in rows_of(t):
        rows = [x for x in sn if x["task"] == r["task"] and x["budget"] == r["budget"]]
        hp = sum(x["score_plain"] < x["score_full"] for x in rows) / len(rows)
        hg = sum(x["score_gated"] < x["score_full"] for x in rows) / len(rows)
        assert (r["n"], r["harm_plain"], r["harm_gated"]) == (len(rows), pytest.approx(hp), pytest.approx(hg))
        p = truth.filter((pl.col("task") == r["task"]) & (pl.col("budget") == r["budget"]))["harm_probability"][0]
        assert abs(r["harm_plain"] - p) <= 4 * math.sqrt(max(p * (1 - p), 1e-3) / r["n"]) + 1e-12
    mk3 = t.filter(pl.col("task") == "niah_multikey_3")
    assert (mk3["harm_gated"] < mk3["harm_plain"]).all()  # the gate cuts harm on the capacity-bound task


# --------------------------------------------------------------------------- Tables 28–30


def test_bootstrap_table_cells_and_bh(gated):
    t = tables.bootstrap_table(gated, rng=np.random.default_rng(0), n_boot=500)
    loop = _delta_loop(gated)
    for r in rows_of(t):
        assert r["delta"] == pytest.approx(loop[(r["model"], r["context_length"], r["evictor"])])
        assert r["low"] <= r["delta"] <= r["high"]
        assert r["excludes_zero"] == (r["low"] > 0 or r["high"] < 0)
    p = t["p_value"].to_numpy()
    m = len(p)
    ranks = np.argsort(np.argsort(p)) + 1
    adj = np.array([min(min(1.0, p[j] * m / ranks[j]) for j in range(m) if p[j] >= p[i]) for i in range(m)])
    assert np.allclose(t["p_adjusted"].to_numpy(), adj)
    per_task = tables.bootstrap_table(gated, rng=np.random.default_rng(0), n_boot=200, tasks=["niah_multikey_3"],
                                      by=("model", "context_length", "evictor", "task"))
    assert set(per_task["task"]) == {"niah_multikey_3"}


def test_draw_replicates_by_loops(syn, gated):
    draws = syn.inputs.select("run_id", "draw").unique()
    t = tables.draw_replicates_table(gated, draws)
    dmap = dict(draws.iter_rows())
    acc = defaultdict(list)
    for r in rows_of(gated):
        if r["evictor"] == "snapkv" and r["budget"] < 1:
            for subset in ("all tasks", "niah_multikey_3") if r["task"] == "niah_multikey_3" else ("all tasks",):
                acc[(subset, r["model"], r["context_length"], dmap[r["run_id"]])].append(r["score_gated"] - r["score_plain"])
    for r in rows_of(t):
        assert r["delta"] == pytest.approx(statistics.fmean(acc[(r["subset"], r["model"], r["context_length"], r["draw"])]))
        per = [statistics.fmean(acc[(r["subset"], r["model"], r["context_length"], d)]) for d in (0, 1)]
        assert r["mean"] == pytest.approx(statistics.fmean(per))
        assert r["sd"] == pytest.approx(statistics.stdev(per))
        assert r["range"] == pytest.approx(max(per) - min(per))
        assert r["n_draws"] == 2


def test_draw_replicates_compare_common_tasks_only(syn, gated):
    # A replicate draw that lacks a task: that task leaves the comparison for every draw of the cell.
    draws = syn.inputs.select("run_id", "draw").unique()
    dmap = dict(draws.iter_rows())
    draw1 = [run for run, d in dmap.items() if d == 1]
    partial = gated.filter(~(pl.col("run_id").is_in(draw1) & (pl.col("task") == "vt")))
    t = tables.draw_replicates_table(partial, draws)
    acc = defaultdict(list)
    for r in rows_of(partial):
        if r["evictor"] == "snapkv" and r["budget"] < 1 and r["task"] != "vt":
            acc[(r["model"], r["context_length"], dmap[r["run_id"]])].append(r["score_gated"] - r["score_plain"])
    for r in rows_of(t.filter(pl.col("subset") == "all tasks")):
        assert r["delta"] == pytest.approx(statistics.fmean(acc[(r["model"], r["context_length"], r["draw"])]))


# --------------------------------------------------------------------------- rendering, errors, registry


def test_format_interval_and_write(tmp_path):
    f = pl.DataFrame({"task": ["vt", "mk3"], "rho": [0.75, None], "low": [0.6149, None], "high": [0.8612, None], "n": [10, 0]})
    lay = tables.Layout("T", {"ρ": ("rho", "low", "high")}, decimals=2, notes=("n per row",))
    shown = tables.display_frame(f, lay)
    assert shown.columns == ["task", "ρ", "n"]
    assert shown["ρ"].to_list() == ["0.75 [0.61, 0.86]", ""]
    paths = tables.write_table(f, tmp_path / "t", lay)
    assert [Path(p).suffix for p in paths] == [".csv", ".md", ".html", ".tex"]
    back = pl.read_csv(paths[0])
    assert back["low"][0] == 0.6149  # CSV keeps the numbers, unformatted
    assert "0.75 [0.61, 0.86]" in Path(paths[2]).read_text() and "n per row" in Path(paths[1]).read_text()


def test_bad_input_errors(gated):
    with pytest.raises(ValueError, match="missing columns"):
        tables.drop_by_task_table(gated.drop("drop"))
    with pytest.raises(ValueError, match="not in the outcomes"):
        tables.recovery_table(gated, evictor="nope")
    with pytest.raises(TypeError):
        metrics.task_means({"drop": [1.0]})


def test_registry_entries_and_skips(tmp_path):
    syn = testing.synthetic_logs(**{**SMALL, "context_lengths": (4096,), "input_draws": (0,), "n_inputs": 4,
                                    "tasks": ("niah_multikey_3", "vt", "fwe")})
    logs = io.load([str(r) for r in syn.write(tmp_path / "logs")])
    entries = TABLES
    assert all(isinstance(e, report.Entry) and e.kind == "table" for e in entries)
    assert len({e.name for e in entries}) == len(entries)
    assert set(tables.LAYOUTS) == {e.name for e in entries}
    index = Path(report.build_report(logs, tmp_path / "out", entries=entries))
    meta = {o["name"]: o for o in json.loads((index.parent / "index.json").read_text())["outputs"]}
    skipped = {n for n, o in meta.items() if o["skipped"]}
    assert skipped == {"tab04_distractor_sweep", "tab21_preregistered", "tab30_draws", "tabN1_pilot_sensitivity",
                       "tabA31_k_sweep", "tab07_calibration", "tab20_cross_cell", "tab32_per_layer",
                       "tab31_random_control"}
    assert "needs the evictors snapkv-perlayer" in meta["tab32_per_layer"]["skipped"]
    assert "holds out 100 inputs per model" in meta["tabN1_pilot_sensitivity"]["skipped"]
    for name in ("tab07_calibration", "tab20_cross_cell"):  # 4 MK3 and 4 VT inputs; the paper's Eq. 5 takes 20 of each
        assert ("takes 20 capacity-bound (niah_multikey_3) and 20 dilution-prone (vt) inputs; this cell has 4 and 4"
                in meta[name]["skipped"])
    assert "context length" in meta["tab21_preregistered"]["skipped"] and "draws" in meta["tab30_draws"]["skipped"]
    assert all("\n" not in meta[n]["skipped"] for n in skipped)
    for n, o in meta.items():
        if n not in skipped:
            assert {Path(f).suffix for f in o["files"]} == {".csv", ".md", ".html"}, n


def test_per_layer_table_is_rho_of_each_arm_on_common_inputs():
    """Table 32 by hand: ρ (Eq. 1: the share of inputs whose best plain budget b < 1 beats the full
    cache) of each SnapKV arm on the inputs both hold, and their ratio."""
    from pagestats import replay, tables

    syn = testing.synthetic_logs(models={"m": (6, 3)}, evictors=("snapkv", "snapkv-perlayer"),
                                 tasks=("fwe", "vt"), n_inputs=30, budgets=(0.125, 0.5, 1.0), with_topk=False,
                                 with_text=False)
    gated = replay.gated_outcomes(syn, replay.FixedTau())
    out = tables.per_layer_table(gated)
    for r in out.iter_rows(named=True):
        for ev, col in (("snapkv", "rho_single"), ("snapkv-perlayer", "rho_per_layer")):
            sub = gated.filter((pl.col("evictor") == ev) & (pl.col("task") == r["task"])
                               & (pl.col("context_length") == r["context_length"]))
            best = sub.filter(pl.col("budget") < 1).group_by("run_id", "input_id").agg(
                (pl.col("score_plain").max() > pl.col("score_full").first()).alias("recovered"))
            assert r["n"] == best.height and r[col] == pytest.approx(best["recovered"].mean())
        if r["rho_single"]:
            assert r["rho_ratio"] == pytest.approx(r["rho_per_layer"] / r["rho_single"])
        else:
            assert r["rho_ratio"] is None


def test_remaining_deltas_table_by_brute_force(syn, gated):
    """Table 29: the capacity-bound rows are Table 28's cluster bootstrap per task (same rng draw),
    the calibrated rows Table 28's on the calibrated outcomes, the showcase rows the MK3 accuracy at
    b = 1/16 with statsmodels' Wilson interval, and p_adjusted is BH (statsmodels) across every
    bootstrap row."""
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.proportion import proportion_confint

    ev = "snapkv"
    table = tables.remaining_deltas_table(gated, gated, rng=np.random.default_rng(7), evictor=ev, budget=0.125,
                                          n_boot=200)
    assert list(dict.fromkeys(table["row"])) == ["calibrated τ (Table 20)", "capacity-bound anchor",
                                                 "showcase, plain at b = 0.125", "showcase, gated at b = 0.125"]
    sub = gated.filter((pl.col("evictor") == ev) & (pl.col("budget") < 1))
    ref = metrics.delta_bootstrap(metrics.relation(sub), by=["model", "context_length", "evictor"],
                                  rng=np.random.default_rng(7), n_boot=200).sort("model", "context_length")
    cal = table.filter(pl.col("row") == "calibrated τ (Table 20)")
    assert cal["estimate"].to_list() == pytest.approx(ref["delta"].to_list(), abs=1e-12)
    assert cal["low"].to_list() == pytest.approx(ref["low"].to_list(), abs=1e-12)
    show = table.filter(pl.col("row") == "showcase, gated at b = 0.125")
    for r in rows_of(show):
        cell = sub.filter((pl.col("model") == r["model"]) & (pl.col("context_length") == r["context_length"])
                          & (pl.col("task") == "niah_multikey_3") & (pl.col("budget") == 0.125))
        k, n = int(cell["score_gated"].sum()), cell.height
        low, high = proportion_confint(k, n, method="wilson")
        assert (r["estimate"], r["n_inputs"]) == (pytest.approx(k / n), n)
        assert (r["low"], r["high"]) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))
    tested = table.filter(pl.col("p_value").is_not_null() & pl.col("p_value").is_not_nan())
    assert tested["p_adjusted"].to_list() == pytest.approx(
        multipletests(tested["p_value"].to_numpy(), method="fdr_bh")[1].tolist(), abs=1e-12)


def test_cross_cell_with_a_cell_left_uncalibrated(syn, gated):
    """A cell the calibrated frame does not hold keeps its fixed-τ row and null calibrated columns;
    the other cells are compared on the calibrated frame's inputs."""
    from pagestats.replay.policies import Midpoint

    cal = replay.gated_outcomes(syn, Midpoint())
    cells = gated.select("model", "context_length").unique().sort("model", "context_length").rows()
    assert len(cells) >= 2
    dropped = cells[0]
    part = cal.filter((pl.col("model") != dropped[0]) | (pl.col("context_length") != dropped[1]))
    t = tables.cross_cell_table(gated, part)
    assert sorted((r["model"], r["context_length"]) for r in rows_of(t)) == sorted(cells)
    want = defaultdict(list)
    for r in rows_of(gated.filter(pl.col("evictor") == "snapkv")):
        if r["budget"] < 1:
            want[(r["model"], r["context_length"])].append(r["score_gated"] - r["score_plain"])
    for r in rows_of(t):
        k = (r["model"], r["context_length"])
        assert r["delta_fixed"] == pytest.approx(statistics.fmean(want[k]))
        assert (r["tau_calibrated"] is None) == (k == dropped)
        assert (r["delta_calibrated"] is None) == (k == dropped)
