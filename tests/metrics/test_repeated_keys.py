"""The duplicate-key check every measure runs on its frame (pagestats.core.columns.repeats_a_key),
against polars' own hash-table check, including the path a 64-bit hash collision takes; and the
sort-based distinct counts (key_codes, distinct_rows) against polars' n_unique and unique."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagestats import metrics
from pagestats.core.columns import distinct_rows, key_codes, repeats_a_key

rows = st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 3)), st.sampled_from(["a", "b", None]),
                          st.sampled_from([0.25, 0.5, 1.0])), max_size=30)
#: budgets with the floats a naive equality gets wrong: NaN (equal to itself), -0.0 (equal to 0.0), null
odd_rows = st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 3)), st.sampled_from(["a", "b", None]),
                              st.sampled_from([0.0, -0.0, float("nan"), None, 0.5])), max_size=30)


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
        metrics.delta(metrics.relation(frame))
    assert metrics.delta(metrics.relation(frame.head(1)))["delta"].item() == 1.0


def test_one_relation_is_checked_once_and_a_repeat_every_time(monkeypatch):
    """The metrics over one relation check its key once; a relation that repeats it is refused by
    every metric, and another relation of the same rows is checked again."""
    from pagestats.metrics import engine

    frame = pl.DataFrame({"run_id": ["r", "r"], "task": ["t", "t"], "input_id": [0, 1], "evictor": ["snapkv"] * 2,
                          "model": ["m"] * 2, "context_length": [4096] * 2, "budget": [0.5, 0.5], "n_tokens": [10, 10],
                          "score_full": [1.0, 1.0], "score_plain": [0.0, 1.0], "score_gated": [1.0, 1.0]})
    checks = []  # a whole frame's relation is checked on the frame (repeats_a_key), another in SQL
    query, on_frame = engine.query, engine.repeats_a_key
    monkeypatch.setattr(engine, "query", lambda rows, sql: (checks.append(sql) if "HAVING count(*) > 1" in sql
                                                             else None) or query(rows, sql))
    monkeypatch.setattr(engine, "repeats_a_key", lambda frame, key: checks.append(key) or on_frame(frame, key))
    rows = metrics.relation(frame)
    metrics.delta(rows)
    metrics.delta(rows, by=["model"])
    metrics.harm_rate(rows, by=["model"])
    assert len(checks) == 1
    metrics.delta(metrics.relation(frame))
    assert len(checks) == 2
    repeated = metrics.relation(frame.vstack(frame.head(1)))
    for _ in range(2):
        with pytest.raises(ValueError, match="duplicate rows"):
            metrics.delta(repeated)
    assert len(checks) == 4
    assert all(isinstance(c, list) for c in checks)  # each of them on the frame
    # rows of a relation (a filter in DuckDB) are checked in SQL, with the same answer
    for relation, refused in ((repeated.filter("budget < 1"), True), (rows.filter("budget < 1"), False)):
        if refused:
            with pytest.raises(ValueError, match="duplicate rows"):
                metrics.delta(relation)
        else:
            assert metrics.delta(relation)["delta"].item() == 0.5
    assert [isinstance(c, str) for c in checks[4:]] == [True, True]


KEYS = (["input_id"], ["task"], ["input_id", "task"], ["input_id", "task", "budget"], ["budget", "task"])


@settings(max_examples=300, deadline=None)
@given(odd_rows, st.booleans())
def test_key_codes_and_distinct_rows_agree_with_polars(values, categorical):
    frame = _frame(values)
    if categorical:
        frame = frame.with_columns(pl.col("task").cast(pl.Categorical))
    for key in KEYS:
        codes = key_codes(frame, key)
        assert codes.len() == frame.height
        # equal codes exactly where the key is equal: as many codes as distinct keys, and each key one code
        assert codes.n_unique() == (frame.select(key).n_unique() if frame.height else 0)
        if frame.height:
            assert frame.select(key).with_columns(codes).group_by(key).agg(pl.col("_key").n_unique())["_key"].max() == 1
        got = distinct_rows(frame, key)
        assert got.height == frame.select(key).unique().height
        assert got.columns == key and not got.is_duplicated().any()


def test_distinct_counts_per_group_as_a_measure_reads_them():
    """n_inputs of Δ: the distinct inputs of each group, whatever their budgets (brute force)."""
    frame = pl.DataFrame({"run_id": ["r"] * 6, "task": ["t", "t", "u", "u", "t", "t"], "input_id": [0, 0, 0, 1, 1, 1],
                          "evictor": ["snapkv"] * 6, "model": ["m", "m", "m", "m", "n", "n"],
                          "context_length": [4096] * 6, "budget": [0.25, 0.5, 0.25, 0.25, 0.25, 0.5],
                          "score_plain": [0.0] * 6, "score_gated": [1.0] * 6})
    got = dict(metrics.delta(metrics.relation(frame)).select("model", "n_inputs").iter_rows())
    brute = {}
    for row in frame.iter_rows(named=True):
        brute.setdefault(row["model"], set()).add((row["run_id"], row["task"], row["input_id"]))
    assert got == {m: len(s) for m, s in brute.items()} == {"m": 3, "n": 1}
