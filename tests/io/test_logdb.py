"""The replay out of core: a DuckDB database of views over the parquet files
(pagestats.io.index_logs / open_logs, ``pagestats index``), and the what-if computed in DuckDB
over it, against the in-memory path and an independent row-by-row loop."""

from __future__ import annotations

import csv
import io as stdio
import os
from contextlib import redirect_stdout

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pagestats.cli import main
from pagestats.io import LogDB, LogError, index_logs, load, open_logs
from pagestats.replay import CustomPolicy, FixedTau, Midpoint, ProfileSpec, TaskOracle, ZScored
from pagestats.testing import synthetic_logs
from pagestats.replay.whatif import WHATIF_COLUMNS, whatif_table

from brute import brute_whatif

KEY = ["run_id", "task", "input_id"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("logdb")
    s = synthetic_logs(models={"qwen-like": (6, 4), "llama-like": (8, 3)}, n_inputs=8,
                       tasks=("niah_multikey_3", "vt", "fwe"), evictors=("snapkv", "h2o"), budgets=(0.25, 0.5, 1.0),
                       k_max=32, with_text=False, seed=5)  # fmt: skip
    runs = [str(r) for r in s.write(root / "logs")]
    db = index_logs(runs, str(root / "logs.duckdb"))
    yield runs, load(runs), db
    db.close()


def _late_open(frame: pl.DataFrame):
    return (frame["agreement"].list.last() < 0.5).to_numpy()


CASES = [
    (FixedTau(0.05), ProfileSpec()),
    (FixedTau(-np.inf), ProfileSpec()),
    (TaskOracle(), ProfileSpec()),
    (ZScored(pilot_n=6), ProfileSpec()),
    (Midpoint(n=3), ProfileSpec(layers="every-2")),
    (FixedTau(0.03), ProfileSpec(pairs_fraction=0.5, pair_draws=3, seed=1)),
    (FixedTau(0.04), ProfileSpec(k=16)),
    (CustomPolicy(_late_open, "late<0.5"), ProfileSpec()),
]


@pytest.mark.parametrize("policy,profile", CASES, ids=[f"{p.name}|{s}" for p, s in CASES])
def test_whatif_out_of_core_equals_in_memory_and_brute_force(written, policy, profile):
    _, logs, db = written
    got = whatif_table(db, policy, profile)
    assert isinstance(db, LogDB) and got.columns == list(WHATIF_COLUMNS)
    assert_frame_equal(got, whatif_table(logs, policy, profile), abs_tol=1e-12, rel_tol=0)
    ref = brute_whatif(logs, policy, profile)
    assert got.height == len(ref) == 2 * 3 * 2 * 3  # models × tasks × evictors × budgets (one context)
    for row, exp in zip(got.rows(), ref):
        assert row[:6] == tuple(exp[:5]) + (int(exp[5]),)
        assert row[6:-1] == pytest.approx(exp[6:], abs=1e-12)


def test_logs_and_database_read_the_same_through_the_protocol(written):
    """io.LogTables: what the replay reads of in-memory logs and of the database's views is the same
    rows (the per-input rows with the lists asked for, the top-k rows, one evictor's outcome rows, a
    cursor's inputs and outcomes), whichever container holds them."""
    from pagestats.io import LogTables
    from pagestats.io.logs import INPUT_COLUMNS, OUTCOME_COLUMNS

    _, logs, db = written
    members = [m for m in vars(LogTables) if not m.startswith("_")]
    assert {"cursor", "relate_outcomes", "per_input", "outcome_rows", "exclusion_report", "typed_names"} <= set(members)
    for source in (logs, db):
        assert all(callable(getattr(source, m)) for m in members if callable(getattr(LogTables, m, None)))
        assert all(hasattr(source, a) for a in LogTables.__annotations__)  # manifests, files, mode, notes
    mem, out = logs.per_input(["agreement"], topk=True), db.per_input(["agreement"], topk=True)
    cols = [*INPUT_COLUMNS, "agreement"]
    assert_frame_equal(out.inputs.select(cols), mem.inputs.select(cols).sort(KEY))
    assert_frame_equal(out.topk, mem.topk.sort([*KEY, "layer", "head"]), check_column_order=False)
    assert out.outcomes.height == 0 and out.manifests == logs.manifests
    order = [*KEY, "evictor", "budget"]
    assert_frame_equal(db.outcome_rows("h2o"), logs.outcome_rows("h2o").select(OUTCOME_COLUMNS).sort(order))
    assert db.outcome_rows().height == logs.outcome_rows().height == logs.outcomes.height
    assert logs.exclusion_report() == db.exclusion_report() == []
    counts = []
    for source in (logs, db):
        con = source.cursor()
        try:
            source.relate_outcomes(con)
            counts.append(con.sql("SELECT (SELECT count(*) FROM inputs), (SELECT count(*) FROM outcomes)").fetchall())
        finally:
            con.close()
    assert counts[0] == counts[1] == [(logs.inputs.height, logs.outcomes.height)]


def test_database_load_equals_load_and_sets_spill(written):
    _, logs, db = written
    back = db.load()
    assert_frame_equal(back.inputs, logs.inputs.sort(KEY))
    assert_frame_equal(back.outcomes, logs.outcomes.sort([*KEY, "evictor", "budget"]))
    assert_frame_equal(back.topk, logs.topk.sort([*KEY, "layer", "head"]))
    assert back.manifests == logs.manifests
    assert sorted((os.path.abspath(f.path), f.sha256) for f in logs.files) == sorted((f.path, f.sha256) for f in db.files)
    cur = db.cursor()
    assert cur.sql("SELECT current_setting('temp_directory')").fetchall()[0][0].endswith("pagestats-duckdb")
    limit = cur.sql("SELECT current_setting('memory_limit')").fetchall()[0][0]
    assert limit.replace(" ", "").upper() in ("1.8GIB", "2.0GB", "1.86GIB"), limit


def test_categorical_load_in_small_batches_is_one_chunk_per_column(written, monkeypatch):
    """``load(categorical=True)`` reads the tables batch by batch; the frames it returns hold one
    chunk per column (the batches' oversized buffers let go) and equal the one-batch load."""
    import pagestats.io.database as database

    _, _, db = written
    whole = db.load(categorical=True)
    monkeypatch.setattr(database, "LOAD_BATCH_ROWS", 7)  # many batches, the last one short
    batched = db.load(categorical=True)
    for name in ("inputs", "outcomes", "topk"):
        frame = getattr(batched, name)
        assert frame.height > 7 * 3
        assert set(frame.n_chunks("all")) == {1}, name
        assert_frame_equal(frame, getattr(whole, name))
    assert batched.inputs["task"].dtype == pl.Categorical


def test_cli_index_and_whatif_db(tmp_path, written, capsys):
    runs, _, _ = written
    db = str(tmp_path / "cli.duckdb")
    assert main(["index", *runs, "--db", db, "--memory-limit", "512MB", "--temp-dir", str(tmp_path / "spill")]) == 0
    outs = []
    for argv in (["whatif", *runs], ["whatif", "--db", db, "--memory-limit", "512MB"]):
        buf = stdio.StringIO()
        with redirect_stdout(buf):
            assert main([*argv, "--policy", "z", "--pilot-n", "6", "--format", "csv"]) == 0
        outs.append(list(csv.reader(stdio.StringIO(buf.getvalue()))))
    assert outs[0][0] == outs[1][0] == list(WHATIF_COLUMNS) and len(outs[0]) == len(outs[1]) == 37
    for a, b in zip(outs[0][1:], outs[1][1:]):
        assert a[:6] == b[:6]
        assert [float(x) for x in a[6:-1]] == pytest.approx([float(x) for x in b[6:-1]], abs=1e-12) and a[-1] == b[-1]
    # usage errors: one line, exit 2
    capsys.readouterr()
    for argv in (["whatif", "--db", db, runs[0]], ["whatif", "--db", db, "--exclude", "r"], ["whatif"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), err


def test_changed_file_or_bad_logs_refused(tmp_path, capsys):
    s = synthetic_logs(models={"m": (6, 4)}, n_inputs=4, tasks=("niah_multikey_3", "vt"), evictors=("snapkv",),
                       budgets=(0.5, 1.0), with_topk=False, seed=2)  # fmt: skip
    run = s.write(tmp_path / "logs")[0]
    db = str(tmp_path / "x.duckdb")
    index_logs([str(run)], db).close()
    victim = sorted((run / "outcomes").glob("*.parquet"))[0]
    os.utime(victim, ns=(0, 0))
    with pytest.raises(LogError, match="changed since indexing"):
        open_logs(db)
    assert main(["whatif", "--db", db]) == 1
    assert "changed since indexing" in capsys.readouterr().err
    # invalid logs: nothing is written
    (run / "inputs" / "extra.parquet").write_bytes(b"not parquet")
    bad = str(tmp_path / "bad.duckdb")
    assert main(["index", str(run), "--db", bad]) == 1
    assert not os.path.exists(bad) and not os.path.exists(bad + ".tmp")
    with pytest.raises(LogError, match="no such database"):
        open_logs(bad)
    (tmp_path / "plain.duckdb").write_text("hello")
    with pytest.raises(LogError, match="cannot open|not a pagestats"):
        open_logs(str(tmp_path / "plain.duckdb"))


@pytest.mark.parametrize("by,profile", [(("model", "context_length", "evictor"), ProfileSpec()),
                                        (("task_class", "budget"), ProfileSpec(pairs_fraction=0.5, pair_draws=2))])
def test_tau_curve_out_of_core_equals_in_memory(written, by, profile):
    from pagestats.replay import tau_curve

    _, logs, db = written
    taus = [-np.inf, -0.01, 0.0, 0.02, 0.05, 0.1, np.inf]
    got, ref = tau_curve(db, taus, profile, by), tau_curve(logs, taus, profile, by)
    assert got.height == len(taus) * ref.select([*by, *(["pair_draw"] if profile.pairs_fraction else [])]).n_unique()
    assert_frame_equal(got, ref, abs_tol=1e-12, rel_tol=0)
    assert got["tau"].to_list()[: len(taus)] == taus  # the given order within a group


def test_index_validates_run_by_run(tmp_path):
    import shutil

    s = synthetic_logs(models={"a": (6, 4), "b": (6, 4)}, n_inputs=3, tasks=("niah_multikey_3", "vt"),
                       evictors=("snapkv",), budgets=(0.5, 1.0), with_topk=False, seed=4)  # fmt: skip
    runs = [str(r) for r in s.write(tmp_path / "logs")]
    copy = tmp_path / "copy" / "same"
    shutil.copytree(runs[0], copy)
    with pytest.raises(LogError, match="is also the run_id"):
        index_logs([*runs, str(copy)], str(tmp_path / "dup.duckdb"))
    # a broken row in the second run is reported with its file and row, as load reports it
    path = sorted((tmp_path / "logs").glob("*/outcomes/*.parquet"))[-1]
    frame = pl.read_parquet(path)
    frame.with_columns(pl.when(pl.int_range(pl.len()) == 1).then(1.5).otherwise(pl.col("score")).alias("score")).write_parquet(path)
    with pytest.raises(LogError) as err:
        index_logs(runs, str(tmp_path / "bad.duckdb"))
    with pytest.raises(LogError) as ref:
        load(runs)
    assert [str(p) for p in err.value.problems] == [str(p) for p in ref.value.problems]
    assert any(f"{path}:row 1: score outside [0, 1]" in str(p) for p in err.value.problems)


def test_validate_paths_run_by_run_finds_the_same_problems(tmp_path):
    from pagestats.io import validate_paths
    from pagestats.io.load import _load
    from pagestats.io.validate import _runs_apart

    s = synthetic_logs(models={"a": (6, 4), "b": (6, 4), "c": (6, 4)}, n_inputs=3, tasks=("niah_multikey_3", "vt"),
                       evictors=("snapkv",), budgets=(0.5, 1.0), with_topk=False, seed=6)  # fmt: skip
    runs = [str(r) for r in s.write(tmp_path)]
    for i, path in enumerate(sorted(tmp_path.glob("*/outcomes/*.parquet"))[:2]):
        frame = pl.read_parquet(path)
        bad = pl.when(pl.int_range(pl.len()) == i).then(-0.5).otherwise(pl.col("score")).alias("score")
        frame.with_columns(bad).write_parquet(path)
    assert _runs_apart(runs) is not None and _runs_apart(runs[:1]) is None
    apart = validate_paths(runs)
    together = _load(runs, (), "analysis")[1]
    assert sorted(map(str, apart)) == sorted(map(str, together))
    assert sum("score outside [0, 1]" in str(p) for p in apart) == 2
