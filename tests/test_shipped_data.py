"""The real logs shipped in ``data/`` are valid schema-v1 runs and replay consistently."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pagestats import io, profile, replay

DATA = Path(__file__).resolve().parents[1] / "data"
RUNS = sorted(str(m.parent) for m in DATA.glob("*/manifest.json"))


def test_data_ships_runs():
    assert RUNS, f"no run (manifest.json) under {DATA}"


@pytest.mark.parametrize("run", RUNS, ids=[Path(r).name for r in RUNS])
def test_shipped_run_validates(run):
    assert io.validate_paths([run]) == []


@pytest.fixture(scope="module")
def logs():
    return io.load(RUNS)


def test_logged_drop_is_the_replayed_drop(logs):
    # The collector's D and the offline replay's D are the same number, bit for bit.
    replayed = replay.profile_drop(logs).join(logs.inputs.select("run_id", "task", "input_id", "drop"),
                                              on=["run_id", "task", "input_id"], suffix="_logged")
    assert replayed.height == logs.inputs.height
    assert (replayed["drop"] == replayed["drop_logged"]).all()


def test_stored_topk_reproduces_stored_pair_jaccard(logs):
    # Independent path: Jaccards from the stored top-k_max lists truncated to k = 32 (Python sets)
    # against the logged pair_jaccard, for a few inputs of each run.
    for run_id in logs.inputs["run_id"].unique().sort():
        row = logs.inputs.filter(pl.col("run_id") == run_id).row(0, named=True)
        top = logs.topk.filter((pl.col("run_id") == run_id) & (pl.col("task") == row["task"])
                               & (pl.col("input_id") == row["input_id"])).sort("layer", "head")
        n_layers = len(row["agreement"])
        n_heads = top.height // n_layers
        sets = [[set(top.row(layer * n_heads + h, named=True)["indices"][:32]) for h in range(n_heads)]
                for layer in range(n_layers)]
        expected = [len(a & b) / len(a | b) for layer in sets
                    for i, a in enumerate(layer) for b in layer[i + 1:]]
        np.testing.assert_allclose(np.asarray(row["pair_jaccard"], dtype=np.float64), expected, atol=1e-7)
        assert profile.n_pairs(n_heads) * n_layers == len(expected)


def test_gate_identities_on_real_rows(logs):
    # τ = −∞: gated ≡ plain; τ = +∞: gated ≡ full with n_kept = n_tokens (Eq. 2).
    open_all = replay.gated_outcomes(logs, policy=replay.FixedTau(-np.inf))
    assert (open_all["score_gated"] == open_all["score_plain"]).all()
    assert (open_all["n_kept_gated"] == open_all["n_kept_plain"]).all()
    closed = replay.gated_outcomes(logs, policy=replay.FixedTau(np.inf))
    assert (closed["score_gated"] == closed["score_full"]).all()
    assert (closed["n_kept_gated"] == closed["n_tokens"]).all()
