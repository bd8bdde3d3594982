"""The duplicate-key check every measure runs on its frame (pagestats.columns.repeats_a_key),
against polars' own hash-table check, including the path a 64-bit hash collision takes."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagestats import metrics
from pagestats.columns import repeats_a_key

rows = st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 3)), st.sampled_from(["a", "b", None]),
                          st.sampled_from([0.25, 0.5, 1.0])), max_size=30)


def _frame(values) -> pl.DataFrame:
    return pl.DataFrame(values, schema={"input_id": pl.Int64, "task": pl.String, "budget": pl.Float64},
                        orient="row")


@settings(max_examples=200, deadline=None)
@given(rows)
def test_agrees_with_is_duplicated(values):
    frame = _frame(values)
    for key in (["input_id"], ["input_id", "task"], ["input_id", "task", "budget"]):
        assert repeats_a_key(frame, key) == frame.select(key).is_duplicated().any()


@pytest.mark.parametrize("categorical", [False, True])
def test_a_hash_collision_is_not_a_repeat(monkeypatch, categorical):
    """Every row hashed alike: each is a candidate, and only the key comparison decides."""
    frame = _frame([(1, "a", 0.5), (2, "a", 0.5), (1, "b", 0.5)])
    if categorical:
        frame = frame.with_columns(pl.col("task").cast(pl.Categorical))
    monkeypatch.setattr(pl.DataFrame, "hash_rows", lambda self, *a, **k: pl.Series([7] * self.height, dtype=pl.UInt64))
    assert not repeats_a_key(frame, ["input_id", "task", "budget"])
    assert repeats_a_key(frame.vstack(frame.head(1)), ["input_id", "task", "budget"])
    assert repeats_a_key(frame, ["task", "budget"])  # (a, 0.5) twice


def test_a_measure_still_rejects_repeated_rows():
    frame = pl.DataFrame({"run_id": ["r", "r"], "task": ["t", "t"], "input_id": [0, 0], "evictor": ["snapkv"] * 2,
                          "model": ["m"] * 2, "context_length": [4096] * 2, "budget": [0.5, 0.5],
                          "score_plain": [0.0, 1.0], "score_gated": [1.0, 1.0]})
    with pytest.raises(ValueError, match="duplicate rows"):
        metrics.delta(frame)
    assert metrics.delta(frame.head(1))["delta"].item() == 1.0
