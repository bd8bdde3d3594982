"""The report's names as categoricals (pagestats.io.categorical_names, LogDB.load(categorical=True),
columns.names_like), and the DuckDB reading of a categorical column that keeps the numbers the same."""

from __future__ import annotations

import uuid

import duckdb
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pagestats.core.columns import names_like
from pagestats.io import NAME_COLUMNS, categorical_names, index_logs, load
from pagestats.testing import synthetic_logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("categorical")
    s = synthetic_logs(models={"qwen-like": (6, 4)}, n_inputs=6, tasks=("niah_multikey_3", "vt"),
                       evictors=("snapkv", "h2o"), budgets=(0.25, 1.0), k_max=32, with_text=False, seed=3)
    return [str(r) for r in s.write(root / "logs")], root


def _as_text(frame):
    return frame.cast({c: pl.String for c, t in frame.schema.items() if isinstance(t, pl.Categorical)})


def test_only_the_name_columns_become_categorical_and_keep_their_values(runs):
    logs = load(runs[0])
    cat = categorical_names(logs)
    for table in ("inputs", "outcomes", "topk"):
        before, after = getattr(logs, table), getattr(cat, table)
        changed = {c for c in after.columns if after.schema[c] != before.schema[c]}
        assert changed == {c for c in NAME_COLUMNS if before.schema.get(c) == pl.String}
        assert all(isinstance(after.schema[c], pl.Categorical) for c in changed)
        assert_frame_equal(_as_text(after), before)
    assert categorical_names(cat) is cat  # nothing left to cast: the same object


def test_a_database_loads_categorical_tables_equal_to_its_text_tables(runs):
    paths, root = runs
    db = index_logs(paths, str(root / "logs.duckdb"))
    try:
        text, cat = db.load(), db.load(categorical=True)
    finally:
        db.close()
    for table in ("inputs", "outcomes", "topk"):
        assert_frame_equal(getattr(cat, table), getattr(categorical_names(text), table))


def test_duckdb_reads_a_categorical_as_text_in_text_order():
    """The categories first appear in reverse text order; SQL must still read and sort them as text
    (an ENUM would sort them in order of appearance and move every ORDER BY on a name)."""
    tag = uuid.uuid4().hex  # names no earlier test put in polars' category pool
    names = [f"zz-{tag}", f"aa-{tag}", f"mm-{tag}"]
    frame = pl.DataFrame({"name": names, "x": [1, 2, 3]}).with_columns(pl.col("name").cast(pl.Categorical))
    con = duckdb.connect()
    con.register("t", frame)
    assert con.sql("SELECT column_type FROM (DESCRIBE t) WHERE column_name = 'name'").fetchall()[0][0] == "VARCHAR"
    assert [r[0] for r in con.sql("SELECT name FROM t ORDER BY name").fetchall()] == sorted(names)
    assert con.sql("SELECT min(name) FROM t").fetchall()[0][0] == f"aa-{tag}"


def test_names_like_casts_only_name_columns_that_differ():
    like = pl.DataFrame({"task": ["b", "a"], "n": [1, 2]}).with_columns(pl.col("task").cast(pl.Categorical))
    small = pl.DataFrame({"task": ["a", "b"], "n": ["1", "2"], "rank": [0, 1]})
    got = names_like(small, like)
    assert isinstance(got.schema["task"], pl.Categorical)
    assert got.schema["n"] == pl.String  # a column of another kind is left alone
    assert like.join(got.drop("n"), on="task").sort("task")["rank"].to_list() == [0, 1]
    text = pl.DataFrame({"task": ["a"]})
    assert names_like(text, text) is text
