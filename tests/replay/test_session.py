"""pagestats.replay.Replay: one replay session computes D and the decisions once, whichever of
its products are read, and gives the same frames on in-memory logs and on a LogDB."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pagestats.io import load, logs_in_place
from pagestats.replay import (
    CustomPolicy,
    FixedTau,
    Midpoint,
    ProfileSpec,
    RecalibratedTau,
    Replay,
    TaskOracle,
    ZScored,
    gated_outcomes,
    pilot_composition,
    session as session_module,
    relations,
)
from pagestats.testing import synthetic_logs
from pagestats.replay.whatif import replay_whatif, whatif_table, whatif_with_pilot

POLICIES = [FixedTau(), TaskOracle(), ZScored(pilot_n=8, seed=3), RecalibratedTau(pilot_n=8, pilot_split="first"),
            Midpoint(n=4, pilot_split="random", seed=2, capacity_tasks=None, dilution_tasks=None),
            CustomPolicy(lambda f: (f["drop"] > 0.05).to_numpy(), name="above")]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("session")
    s = synthetic_logs(models={"qwen-like": (6, 4), "llama-like": (8, 3)}, n_inputs=9,
                       tasks=("niah_multikey_3", "vt", "fwe"), evictors=("snapkv", "h2o"), budgets=(0.25, 0.5, 1.0),
                       k_max=32, with_topk=False, with_text=False, seed=5)  # fmt: skip
    runs = [str(r) for r in s.write(root / "logs")]
    db = logs_in_place(runs)
    yield load(runs), db
    db.close()


@pytest.fixture
def counted(monkeypatch):
    """How often a policy's calibration runs (``relations.create_calibrated``), the one engine of every
    policy (a Python policy's function included)."""
    calls = []

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(relations, "create_calibrated", counting("sql", relations.create_calibrated))
    return calls


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_whatif_and_pilot_decide_once(written, policy, counted):
    logs, _ = written
    table, pilot = whatif_with_pilot(logs, policy)
    assert len(counted) == 1  # one decision step for the table and the pilot
    assert counted == ["sql"]
    counted.clear()
    assert table.equals(whatif_table(logs, policy))
    assert pilot.equals(pilot_composition(logs, policy))
    assert len(counted) == 2  # apart: one each
    if policy.has_pilot:
        assert pilot.height and pilot["n_pilot"].sum() > 0
    else:
        assert pilot.height == 0


def test_every_product_of_a_session_reads_one_decision(written, counted):
    logs, _ = written
    policy = ZScored(pilot_n=8, seed=3)
    with Replay(logs, policy) as session:
        for _ in range(2):
            replay_whatif(session)
            session.pilot_composition()
            assert session.decisions_relation() == []
        assert counted == ["sql"]
        gated = session.gated_outcomes()
        again = session.gated_outcomes(evictor="h2o", columns=["score_gated"])
        assert counted == ["sql"]  # the per-row frames read the same decisions
    assert again.equals(gated.filter(pl.col("evictor") == "h2o").select("score_gated"))
    assert gated.equals(gated_outcomes(logs, policy))


@pytest.mark.parametrize("profile", [ProfileSpec(), ProfileSpec(pairs_fraction=0.5, pair_draws=2, seed=1)], ids=str)
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_gated_relation_holds_the_rows_of_gated_outcomes(written, policy, profile):
    """The relation ``gated`` (SQL, what the what-if aggregates) and the per-row frame of
    gated_outcomes (polars, at the edge) are one definition of Eq. 2: the same rows and values."""
    logs, db = written
    for source in (logs, db):
        with Replay(source, policy, profile) as session:
            frame = session.gated_outcomes()
            draw = session.gated_relation()
            order = ", ".join(["run_id", "task", "input_id", *draw, "evictor", "budget"])
            rows = session.con.sql(f"SELECT {', '.join(frame.columns)} FROM gated ORDER BY {order}").pl()
        assert rows.height == frame.height > 0
        assert rows.equals(frame.cast({c: pl.String for c, t in frame.schema.items() if t == pl.Categorical}))
        # Eq. 2 by hand on the rows: the plain outcome where the gate opens, else the full-KV one
        by_hand = [(p if o else f, kp if o else t) for p, f, o, kp, t in
                   rows.select("score_plain", "score_full", "gate_open", "n_kept_plain", "n_tokens").iter_rows()]
        assert by_hand == list(rows.select("score_gated", "n_kept_gated").iter_rows())


def test_custom_policy_runs_its_function_once(written):
    logs, _ = written
    seen = []

    def fn(frame):
        seen.append(frame.height)
        return (frame["drop"] >= 0.05).to_numpy()

    with Replay(logs, CustomPolicy(fn)) as session:
        replay_whatif(session)
        session.pilot_composition()
        session.gated_outcomes()
    assert len(seen) == 1


@pytest.mark.parametrize("profile", [ProfileSpec(), ProfileSpec(layers="second-half"),
                                     ProfileSpec(pairs_fraction=0.5, pair_draws=2, seed=1)], ids=str)
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_in_memory_and_database_give_the_same_frames(written, policy, profile):
    logs, db = written
    with Replay(logs, policy, profile) as mem, Replay(db, policy, profile) as out:
        assert type(mem.logs) is not type(out.logs)  # in memory, and views over the files
        assert mem.decision_frame().equals(out.decision_frame())
        assert mem.gated_outcomes().equals(out.gated_outcomes())
        assert mem.pilot_composition().equals(out.pilot_composition())
        # DuckDB's sums over the database's views may run on several threads: equal to 1e-12
        assert_frame_equal(replay_whatif(mem), replay_whatif(out), rel_tol=1e-12, abs_tol=1e-12)


def test_decisions_are_the_gate_with_its_held_out_pilot(written):
    logs, _ = written
    from pagestats.replay import gate

    policy = ZScored(pilot_n=8, seed=3)
    with Replay(logs, policy) as session:
        decided = session.decision_frame()
    assert decided.filter(~pl.col("held_out")).drop("held_out").equals(gate(logs, policy))
    assert decided["held_out"].sum() == pilot_composition(logs, policy)["n_pilot"].sum()


def test_connection_is_made_on_first_use_and_closed(written):
    logs, _ = written
    session = Replay(logs, FixedTau())
    assert session._con is None
    session.gated_outcomes()
    assert session._con is not None  # the per-row frames read the decisions in SQL
    session.close()
    assert session._con is None
    with session:
        assert session.drops_relation() == []
        assert session.con.sql("SELECT count(*) FROM drops").fetchall()[0][0] == logs.inputs.height
    assert session._con is None
    assert replay_whatif(session).height  # a closed session opens a new connection when asked again
    session.close()


def test_bad_arguments(written):
    logs, _ = written
    with pytest.raises(TypeError, match="profile must be a ProfileSpec"):
        Replay(logs, FixedTau(), "layers")
    with pytest.raises(TypeError, match="policy must be one of"):
        Replay(logs, "z").decision_frame()
    with pytest.raises(ValueError, match="FixedTau.tau must be a number"):
        whatif_with_pilot(logs, FixedTau(float(np.nan)))


def test_pilot_composition_of_in_memory_logs_registers_no_outcome_rows(written):
    logs, _ = written
    with Replay(logs, ZScored(pilot_n=8, seed=3)) as session:
        assert session.pilot_composition().height
        names = {r[0] for r in session._connection().sql("SHOW TABLES").fetchall()}
        assert "inputs" in names and "outcomes" not in names
        assert replay_whatif(session).height  # the what-if asks for them: registered then
        assert "outcomes" in {r[0] for r in session.con.sql("SHOW TABLES").fetchall()}
