"""The calibrating policies decided in SQL (z-scored, recalibrated τ, midpoint): the pilot, its
moments and τ from :mod:`pagestats.replay.policies` against a brute-force loop over the rows
written here (BLAKE2b order, first-n order, Python means and sample SDs), on the in-memory
path (``policy.decide``) and out of core (:meth:`pagestats.replay.Replay.decisions_relation` on a LogDB,
where no per-input frame is read)."""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pagestats.core import defaults
from pagestats.io import load, logs_in_place
from pagestats.replay import (
    Midpoint,
    ProfileSpec,
    RecalibratedTau,
    Replay,
    ZScored,
    pilot_composition,
    pilot_mask,
    profile_drop,
)
from pagestats.testing import synthetic_logs
from pagestats.replay.whatif import whatif_table

KEY = ("run_id", "task", "input_id")


def _hash(seed, run_id, task, input_id) -> int:
    digest = hashlib.blake2b(f"{seed}/{run_id}/{task}/{input_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _frame(seed=0, pair_draws=0, n_inputs=7) -> pl.DataFrame:
    """Shuffled gate rows: 2 models × 2 contexts, 2 runs, 3 tasks whose input_ids tie across
    tasks and runs, optionally repeated per head-pair draw with a different D per draw."""
    rng = np.random.default_rng(seed)
    rows = []
    for model in ("a", "b"):
        for ctx in (4096, 8192):
            for run in (f"{model}{ctx}-r1", f"{model}{ctx}-r2"):
                for task in ("niah_multikey_3", "vt", "fwe"):
                    for i in range(n_inputs):
                        for d in range(max(pair_draws, 1)):
                            row = {"run_id": run, "task": task, "input_id": i, "model": model,
                                   "context_length": ctx, "task_class": defaults.default_task_class(task),
                                   "drop": float(rng.normal(0.05, 0.02)),
                                   "reference_drop": float(rng.normal(0.04, 0.01))}
                            if pair_draws:
                                row["pair_draw"] = d
                            rows.append(row)
    frame = pl.DataFrame(rows)
    return frame.sample(fraction=1.0, shuffle=True, seed=seed)


def _brute_pilot(rows, by, n, split, seed, key_only=False):
    """{(group, input key)} of the pilot: per group the n first inputs in (input_id, task, run_id)
    order, or the n of smallest seeded BLAKE2b hash."""
    units = defaultdict(set)
    for r in rows:
        units[tuple(r[c] for c in by)].add(tuple(r[c] for c in KEY))
    chosen = set()
    for g, us in units.items():
        order = sorted(us, key=lambda u: ((_hash(seed, *u),) if split != "first" else ()) + (u[2], u[1], u[0]))
        chosen |= {u if key_only else (g, u) for u in order[:n]}
    return chosen


def _brute_moments(rows, by, pilot, col):
    """Per (group, draw): mean and sample SD of ``col`` over the pilot rows."""
    vals = defaultdict(list)
    for r in rows:
        g = tuple(r[c] for c in by)
        if (g, tuple(r[c] for c in KEY)) in pilot:
            vals[(g, r.get("pair_draw"))].append(r[col])
    return {k: (statistics.fmean(v), statistics.stdev(v), len(v)) for k, v in vals.items()}


def _check_decided(out, frame, rows, tau_of, pilot_of):
    assert out.select(frame.columns).equals(frame)  # row order and columns kept
    assert out.columns == [*frame.columns, "in_pilot", "tau", "gate_open"]
    for r, tau, open_, in_pilot in zip(rows, out["tau"], out["gate_open"], out["in_pilot"]):
        want = tau_of(r)
        assert tau == pytest.approx(want, rel=1e-12, abs=0)
        assert open_ == (r["drop"] >= tau)
        assert in_pilot == pilot_of(r)


@pytest.mark.parametrize("split", ["first", "random", "held-out"])
@pytest.mark.parametrize("by", [("model",), ("model", "context_length")])
@pytest.mark.parametrize("pair_draws", [0, 3])
def test_zscored_pilot_and_moments_by_brute_force(split, by, pair_draws):
    frame = _frame(seed=len(by) + pair_draws, pair_draws=pair_draws)
    rows = frame.rows(named=True)
    policy = ZScored(theta_z=-0.69, pilot_n=9, pilot_by=by, pilot_split=split, seed=11)
    pilot = _brute_pilot(rows, by, 9, split, 11)
    assert len(pilot) == 9 * len({tuple(r[c] for c in by) for r in rows})
    moments = _brute_moments(rows, by, pilot, "drop")
    assert all(n == 9 for _, _, n in moments.values())

    def tau_of(r):
        mu, sd, _ = moments[(tuple(r[c] for c in by), r.get("pair_draw"))]
        return mu - 0.69 * sd

    def pilot_of(r):
        return (tuple(r[c] for c in by), tuple(r[c] for c in KEY)) in pilot

    _check_decided(policy.decide(frame), frame, rows, tau_of, pilot_of)
    assert pilot_mask(frame, by, 9, split, 11).to_list() == [pilot_of(r) for r in rows]
    # the same τ, bit for bit, whatever the row order
    again = policy.decide(frame.reverse())
    assert again.reverse()["tau"].equals(policy.decide(frame)["tau"])


def test_recalibrated_tau_by_brute_force():
    frame = _frame(seed=4, pair_draws=2)
    rows = frame.rows(named=True)
    policy = RecalibratedTau(tau=0.07, pilot_n=6, pilot_split="random", seed=5)
    pilot = _brute_pilot(rows, ("model",), 6, "random", 5)
    ref = _brute_moments(rows, ("model",), pilot, "reference_drop")
    new = _brute_moments(rows, ("model",), pilot, "drop")

    def tau_of(r):
        k = ((r["model"],), r["pair_draw"])
        theta = (0.07 - ref[k][0]) / ref[k][1]
        return new[k][0] + theta * new[k][1]

    _check_decided(policy.decide(frame), frame, rows, tau_of,
                   lambda r: ((r["model"],), tuple(r[c] for c in KEY)) in pilot)
    with pytest.raises(ValueError, match="reference_drop"):
        policy.decide(frame.drop("reference_drop"))


@pytest.mark.parametrize("split", ["first", "random"])
@pytest.mark.parametrize("pair_draws", [0, 2])
def test_midpoint_by_brute_force(split, pair_draws):
    frame = _frame(seed=7 + pair_draws, pair_draws=pair_draws)
    rows = frame.rows(named=True)
    by = ("model", "context_length")
    policy = Midpoint(n=4, by=by, pilot_split=split, seed=3, capacity_tasks=None, dilution_tasks=None)  # by class
    means, members = {}, set()
    for klass in (defaults.CAPACITY_BOUND, defaults.DILUTION_PRONE):
        part = [r for r in rows if r["task_class"] == klass]
        pilot = _brute_pilot(part, by, 4, split, 3)
        members |= {u for _, u in pilot}
        means[klass] = {k: v[0] for k, v in _brute_moments(part, by, pilot, "drop").items()}

    def tau_of(r):
        k = (tuple(r[c] for c in by), r.get("pair_draw"))
        return (means[defaults.CAPACITY_BOUND][k] + means[defaults.DILUTION_PRONE][k]) / 2

    _check_decided(policy.decide(frame), frame, rows, tau_of, lambda r: tuple(r[c] for c in KEY) in members)
    short = Midpoint(n=15, by=by, capacity_tasks=None, dilution_tasks=None).shortfall(frame)  # 14 capacity-bound inputs per cell (2 runs × 7)
    assert short.columns == [*by, "n_capacity", "n_dilution", "note"]
    assert short["n_capacity"].to_list() == [14] * 4 and short["n_dilution"].to_list() == [28] * 4
    assert short["note"][0] == ("the midpoint recipe (Eq. 5) takes 15 capacity-bound and 15 dilution-prone inputs; "
                                "this cell has 14 and 28")
    with pytest.raises(ValueError, match=r"this cell has 14 and 28 \(model=a, context_length=4096\) \(and 3 more\)"):
        Midpoint(n=15, by=by, capacity_tasks=None, dilution_tasks=None).decide(frame)


def test_pilot_of_exactly_n_inputs_and_held_out_n_plus_one():
    frame = _frame(seed=2, n_inputs=2)  # 12 inputs per (model, context), 24 per model
    rows = frame.rows(named=True)
    for split in ("first", "random"):  # a pilot of the whole group
        out = ZScored(pilot_n=24, pilot_split=split).decide(frame)
        assert out["in_pilot"].all()
        for m in ("a", "b"):
            d = [r["drop"] for r in rows if r["model"] == m]
            want = statistics.fmean(d) - 0.69 * statistics.stdev(d)
            assert out.filter(pl.col("model") == m)["tau"].to_list() == pytest.approx([want] * 24, rel=1e-12)
    with pytest.raises(ValueError, match=r"larger than the data: model=a has 24 input\(s\) and a held-out pilot "
                                         r"must leave one to evaluate"):
        ZScored(pilot_n=24, pilot_split="held-out").decide(frame)
    with pytest.raises(ValueError, match=r"pilot of 25 inputs is larger than the data: model=a has 24 input\(s\)$"):
        ZScored(pilot_n=25, pilot_split="first").decide(frame)
    out = ZScored(pilot_n=23, pilot_split="held-out", seed=1).decide(frame)
    left = out.filter(~pl.col("in_pilot"))
    assert left.height == 2 and sorted(left["model"].to_list()) == ["a", "b"]
    brute = _brute_pilot(rows, ("model",), 23, "held-out", 1)
    for r in left.rows(named=True):
        assert ((r["model"],), tuple(r[c] for c in KEY)) not in brute
    with pytest.raises(ValueError, match="fewer than 2 inputs"):
        ZScored(pilot_n=1, pilot_split="first").decide(frame)
    with pytest.raises(ValueError, match="grouping columns"):
        ZScored(pilot_by=("nope",)).decide(frame)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("policy_sql")
    s = synthetic_logs(models={"qwen-like": (6, 4), "llama-like": (8, 3)}, n_inputs=9,
                       tasks=("niah_multikey_3", "vt", "fwe"), evictors=("snapkv",), budgets=(0.5, 1.0),
                       k_max=32, with_topk=False, with_text=False, seed=8)  # fmt: skip
    runs = [str(r) for r in s.write(root / "logs")]
    db = logs_in_place(runs)
    yield load(runs), db
    db.close()


@pytest.mark.parametrize("policy", [ZScored(pilot_n=10, seed=4), RecalibratedTau(pilot_n=8, pilot_split="first"),
                                    Midpoint(n=4, pilot_split="random", seed=2, capacity_tasks=None, dilution_tasks=None)], ids=lambda p: p.name)
def test_out_of_core_decisions_read_no_per_input_frame(written, policy, monkeypatch):
    logs, db = written
    rows = logs.inputs.select(*KEY, "model", "context_length", "task_class", "drop").rows(named=True)
    if isinstance(policy, Midpoint):
        by, members, means = policy.by, set(), {}
        for klass in (defaults.CAPACITY_BOUND, defaults.DILUTION_PRONE):
            part = [r for r in rows if r["task_class"] == klass]
            pilot = _brute_pilot(part, by, 4, "random", 2)
            members |= {u for _, u in pilot}
            means[klass] = _brute_moments(part, by, pilot, "drop")
        taus = {g: (means[defaults.CAPACITY_BOUND][g][0] + means[defaults.DILUTION_PRONE][g][0]) / 2
                for g in means[defaults.CAPACITY_BOUND]}
    else:
        by = policy.pilot_by
        pilot = _brute_pilot(rows, by, policy.pilot_n, policy.pilot_split, policy.seed)
        members = {u for _, u in pilot}
        m = _brute_moments(rows, by, pilot, "drop")  # the default profile: reference D = D, so τ' = τ
        taus = {g: (mu + policy.theta_z * sd if isinstance(policy, ZScored) else policy.tau)
                for g, (mu, sd, _) in m.items()}

    def no_frame(*args, **kwargs):
        raise AssertionError("the per-input frame was read")

    monkeypatch.setattr(type(db), "per_input", no_frame)
    with Replay(db, policy) as session:
        assert session.decisions_relation() == []
        got = session.con.sql("SELECT * FROM decisions ORDER BY run_id, task, input_id").pl()
        held = set(session.con.sql("SELECT * FROM held_out").fetchall())
    assert held == (members if policy.held_out else set())
    want = [r for r in sorted(rows, key=lambda r: tuple(r[c] for c in KEY)) if tuple(r[c] for c in KEY) not in held]
    assert got.height == len(want)
    for r, g in zip(want, got.rows(named=True)):
        assert tuple(g[c] for c in KEY) == tuple(r[c] for c in KEY)
        assert g["tau"] == pytest.approx(taus[(tuple(r[c] for c in by), None)], rel=1e-12)
        assert g["gate_open"] == (r["drop"] >= g["tau"])
    # the what-if and the pilot composition out of core equal the in-memory path
    # (to 1e-12: DuckDB's parallel sums may order the additions differently from one call to the next)
    assert_frame_equal(whatif_table(db, policy), whatif_table(logs, policy), rel_tol=1e-12, abs_tol=1e-12)
    comp = pilot_composition(db, policy)
    assert comp.equals(pilot_composition(logs, policy))
    assert comp["n_pilot"].sum() == len(members)
    assert set(comp["tau"].to_list()) == set(got["tau"].to_list())  # each group's τ itself, not a float mean of copies


def test_head_pair_draws_out_of_core_equal_in_memory(written):
    logs, db = written
    policy, profile = ZScored(pilot_n=10, seed=1), ProfileSpec(pairs_fraction=0.5, pair_draws=3, seed=2)
    with Replay(db, policy, profile) as session:
        assert session.decisions_relation() == ["pair_draw"]
        got = session.con.sql("SELECT run_id, task, input_id, pair_draw, tau, gate_open FROM decisions "
                              "ORDER BY ALL").pl()
    from pagestats.replay import gate

    mem = gate(logs, policy, profile).select(*KEY, "pair_draw", "tau", "gate_open").sort(*KEY, "pair_draw")
    assert got.equals(mem)
    # τ per model and head-pair draw over the pilot inputs' D of that draw
    rows = profile_drop(logs, profile).join(logs.inputs.select(*KEY, "model"), on=KEY).rows(named=True)
    pilot = _brute_pilot(rows, ("model",), 10, "held-out", 1)
    moments = _brute_moments(rows, ("model",), pilot, "drop")
    assert len(moments) == 2 * 3
    model = dict(zip(logs.inputs.select(KEY).rows(), logs.inputs["model"]))
    for r in got.rows(named=True):
        mu, sd, n = moments[((model[tuple(r[c] for c in KEY)],), r["pair_draw"])]
        assert n == 10 and r["tau"] == pytest.approx(mu - 0.69 * sd, rel=1e-12)
