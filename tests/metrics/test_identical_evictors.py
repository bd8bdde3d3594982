"""metrics.identical_evictors: the evictors whose outcomes equal one another's on every evicting row,
against a pairwise loop written here; a hash collision never makes two evictors identical; the tables
that show it (Tables 2, 13, 28) carry it beside their cells."""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations

import numpy as np
import polars as pl
import pytest

from pagestats import metrics, replay, tables, testing
from pagestats.replay.policies import FixedTau


@pytest.fixture(scope="module")
def gated():
    syn = testing.synthetic_logs(models={"m6": (6, 3)}, evictors=("snapkv", "h2o", "pyramidkv"),
                                 tasks=("niah_multikey_3", "vt", "fwe"), n_inputs=8, budgets=(0.0625, 0.25, 1.0),
                                 with_topk=False, with_text=False, context_lengths=(4096, 16384), seed=5)
    g = replay.gated_outcomes(syn, FixedTau())
    # H2O made a copy of SnapKV everywhere (the release's Qwen2.5-14B), PyramidKV at b = 1/16 only
    # (every evictor keeping the same protected positions)
    snap = g.filter(pl.col("evictor") == "snapkv")
    copy = snap.with_columns(pl.lit("h2o").alias("evictor"))
    pyr = g.filter(pl.col("evictor") == "pyramidkv")
    pyr = pl.concat([pyr.filter(pl.col("budget") != 0.0625),
                     snap.filter(pl.col("budget") == 0.0625).with_columns(pl.lit("pyramidkv").alias("evictor"))])
    return pl.concat([snap, copy, pyr]).sort("evictor", "run_id", "task", "input_id", "budget")


def brute(gated, by):
    rows = defaultdict(dict)
    for r in gated.to_dicts():
        if r["budget"] < 1:
            group = tuple(r[c] for c in by)
            rows[(group, r["evictor"])][(r["run_id"], r["task"], r["input_id"], r["budget"])] = (
                r["score_plain"], r["n_kept_plain"])
    same = defaultdict(set)
    for (ga, ea), (gb, eb) in combinations(sorted(rows), 2):
        if ga == gb and rows[(ga, ea)] == rows[(gb, eb)]:
            same[(ga, ea)].add(eb)
            same[(gb, eb)].add(ea)
    return {k: ", ".join(sorted(same[k])) or None for k in rows}


@pytest.mark.parametrize("by", [("model", "context_length"), ("model", "context_length", "budget")])
def test_identical_evictors_match_a_pairwise_loop(gated, by):
    got = metrics.identical_evictors(metrics.relation(gated), by=by)
    want = brute(gated, by)
    assert {(tuple(r[c] for c in by), r["evictor"]): r["same_as"] for r in got.to_dicts()} == want
    assert any(v for v in want.values()) and any(v is None for v in want.values())


def test_the_cases_planted(gated):
    cell = metrics.identical_evictors(metrics.relation(gated))
    assert set(cell.filter(pl.col("evictor") == "h2o")["same_as"]) == {"snapkv"}
    assert cell.filter(pl.col("evictor") == "pyramidkv")["same_as"].is_null().all()
    at_b = metrics.identical_evictors(metrics.relation(gated), by=("model", "context_length", "budget"))
    small = at_b.filter(pl.col("budget") == 0.0625)
    assert set(small.filter(pl.col("evictor") == "pyramidkv")["same_as"]) == {"h2o, snapkv"}


def test_one_changed_outcome_breaks_the_identity(gated):
    row = gated.with_row_index("_i").filter((pl.col("evictor") == "h2o") & (pl.col("budget") < 1))["_i"][3]
    changed = gated.with_row_index("_i").with_columns(
        pl.when(pl.col("_i") == row).then(1.0 - pl.col("score_plain")).otherwise(pl.col("score_plain"))
        .alias("score_plain")).drop("_i")
    out = metrics.identical_evictors(metrics.relation(changed))
    cell = changed.with_row_index("_i").filter(pl.col("_i") == row).select("model", "context_length").row(0)
    hit = out.filter((pl.col("model") == cell[0]) & (pl.col("context_length") == cell[1]))
    assert hit["same_as"].is_null().all()


def test_a_hash_collision_never_makes_two_evictors_identical(gated, monkeypatch):
    """Every row hashed to 0: every signature agrees, and the row-by-row comparison decides."""
    from pagestats.metrics import identity

    monkeypatch.setattr(identity, "_row_hash", lambda cols: "CAST(0 AS UBIGINT)")
    got = metrics.identical_evictors(metrics.relation(gated))
    want = brute(gated, ("model", "context_length"))
    assert {((r["model"], r["context_length"]), r["evictor"]): r["same_as"] for r in got.to_dicts()} == want


def test_tables_say_so_beside_the_cells(gated):
    t2 = tables.delta_matrix_table(gated)
    assert set(t2.filter(pl.col("evictor") == "snapkv")["same_as"]) == {"h2o"}
    assert t2.filter(pl.col("evictor") == "pyramidkv")["same_as"].is_null().all()
    t13 = tables.budget_axis_table(gated)
    small = t13.filter((pl.col("budget") == 0.0625) & (pl.col("evictor") == "snapkv"))
    assert set(small["same_as"]) == {"h2o, pyramidkv"}
    assert set(t13.filter((pl.col("budget") == 0.25) & (pl.col("evictor") == "snapkv"))["same_as"]) == {"h2o"}
    t28 = tables.bootstrap_table(gated, rng=np.random.default_rng(0), n_boot=50)
    assert set(t28.filter(pl.col("evictor") == "h2o")["same_as"]) == {"snapkv"}
