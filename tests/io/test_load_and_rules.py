"""Tests of pagestats.io: loading schema-v1 runs and every validation rule of docs/SCHEMA.md.

The fixture writes a small valid run with the shared writers of pagestats.core.schema (2 tasks ×
3 inputs × 2 evictors × the 9 budgets, L = 6, H = 4); each rule test breaks one thing and
checks that the problem names the file (and the row, where there is one). Expected row
numbers and counts are worked out here from how the fixture is built, not by the code
under test.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pagestats.core import defaults, profile, schema
from pagestats.io import FileRecord, LogError, Logs, Problem, load, upgrades, validate_paths

from logbuild import (  # noqa: F401  (the builders and constants the tests below use)
    BUDGETS, EVICTORS, H, K_MAX, L, N_INPUTS, TASKS, assert_problem, build_frames, input_row, manifest_for, messages,
    outcome_row, refresh_manifest, write_run,
)

@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path)


# --------------------------------------------------------------------------- valid run


def test_valid_run_loads_with_counts_and_dtypes(run):
    assert validate_paths([str(run)]) == []
    logs = load([str(run)])
    assert isinstance(logs, Logs)
    n_in = len(TASKS) * N_INPUTS
    assert logs.inputs.height == n_in
    assert logs.outcomes.height == n_in * len(EVICTORS) * len(BUDGETS)
    assert logs.topk is not None and logs.topk.height == n_in * L * H
    for name in ("input_id", "draw", "n_tokens", "context_length"):
        assert logs.inputs.schema[name] == pl.Int64
    for name in ("drop", "full_score", "prefill_ms", "gate_ms"):
        assert logs.inputs.schema[name] == pl.Float64
    assert logs.inputs.schema["agreement"] == pl.List(pl.Float32)
    assert logs.inputs.schema["pair_jaccard"] == pl.List(pl.Float32)
    assert logs.outcomes.schema["budget"] == pl.Float64
    assert logs.outcomes.schema["n_kept"] == pl.Int64
    assert logs.topk.schema["indices"] == pl.List(pl.Int32)
    # analysis columns leave out the heavy text
    for heavy in ("prompt", "full_prediction", "references"):
        assert heavy not in logs.inputs.columns
    assert "prediction" not in logs.outcomes.columns
    assert "_file" not in logs.inputs.columns and "_row" not in logs.outcomes.columns
    # task classes from the manifest
    classes = dict(logs.inputs.select("task", "task_class").unique().iter_rows())
    assert classes == {"niah_multikey_3": "capacity-bound", "vt": "dilution-prone"}
    assert set(logs.manifests) == {"r1"} and logs.manifests["r1"]["run_id"] == "r1"
    assert logs.problems == [] and logs.exclusions == []
    # values survive the round trip: drop reproduces Eq. 3 from the stored agreement
    ins, _, _ = build_frames()
    expected = {(r["task"], r["input_id"]): r["drop"] for r in ins}
    for task, input_id, drop in logs.inputs.select("task", "input_id", "drop").iter_rows():
        assert drop == expected[(task, input_id)]


def test_all_columns_keeps_text(run):
    logs = load([str(run)], columns="all")
    assert {"prompt", "full_prediction", "references"} <= set(logs.inputs.columns)
    assert "prediction" in logs.outcomes.columns
    assert logs.inputs.schema["references"] == pl.List(pl.String)
    with pytest.raises(ValueError, match="columns"):
        load([str(run)], columns="some")


def test_file_records_have_hashes_and_rows(run):
    logs = load([str(run)])
    import hashlib

    by_path = {f.path: f for f in logs.files}
    assert len(by_path) == 4
    rec = by_path[os.path.normpath(str(run / "outcomes" / "part-0001.parquet"))]
    assert isinstance(rec, FileRecord) and rec.table == "outcomes"
    assert rec.sha256 == hashlib.sha256((run / "outcomes" / "part-0001.parquet").read_bytes()).hexdigest()
    assert rec.rows == N_INPUTS * len(EVICTORS) * len(BUDGETS)
    # a file that could not be read is a problem, not a source of the loaded frames
    data = (run / "topk" / "part-0000.parquet").read_bytes()
    (run / "topk" / "part-0000.parquet").write_bytes(data[:50])
    logs = load([str(run)], strict=False)
    assert {f.table for f in logs.files} == {"inputs", "outcomes"}


def test_task_class_defaults_without_manifest_tasks(tmp_path):
    def mutate(ins, ocs, tks, man):
        man["tasks"] = list(TASKS)  # names only: classes come from defaults

    run = write_run(tmp_path, mutate=mutate)
    logs = load([str(run)])
    classes = dict(logs.inputs.select("task", "task_class").unique().iter_rows())
    assert classes == {t: defaults.default_task_class(t) for t in TASKS}


def test_manifest_task_classes_override_defaults(tmp_path):
    def mutate(ins, ocs, tks, man):
        man["tasks"] = {"niah_multikey_3": "dilution-prone", "vt": "capacity-bound"}

    logs = load([str(write_run(tmp_path, mutate=mutate))])
    classes = dict(logs.inputs.select("task", "task_class").unique().iter_rows())
    assert classes == {"niah_multikey_3": "dilution-prone", "vt": "capacity-bound"}


def test_loose_files_glob_and_directory_of_runs(tmp_path):
    r1 = write_run(tmp_path, "r1")
    r2 = write_run(tmp_path, "r2", seed=1)
    # a directory holding runs
    logs = load([str(tmp_path)])
    assert logs.inputs["run_id"].unique().sort().to_list() == ["r1", "r2"]
    assert logs.outcomes.height == 2 * len(TASKS) * N_INPUTS * len(EVICTORS) * len(BUDGETS)
    # globs and individual files; each file once even when named twice
    logs = load([str(tmp_path / "*" / "inputs" / "*.parquet"), str(tmp_path / "r*/outcomes/*.parquet"),
                 str(r1 / "inputs" / "part-0000.parquet")])
    assert logs.inputs.height == 2 * len(TASKS) * N_INPUTS
    assert logs.topk is None
    assert {f.table for f in logs.files} == {"inputs", "outcomes"}
    assert len(logs.files) == 6
    # loose files outside a run: table told from the columns
    loose = tmp_path / "loose"
    loose.mkdir()
    shutil.copy(r2 / "inputs" / "part-0000.parquet", loose / "a.parquet")
    shutil.copy(r2 / "outcomes" / "part-0000.parquet", loose / "b.parquet")
    shutil.copy(r2 / "outcomes" / "part-0001.parquet", loose / "c.parquet")
    logs = load([str(loose / "*.parquet")])
    assert logs.inputs.height == len(TASKS) * N_INPUTS
    assert logs.outcomes.height == len(TASKS) * N_INPUTS * len(EVICTORS) * len(BUDGETS)
    assert {f.path: f.table for f in logs.files}[os.path.normpath(str(loose / "a.parquet"))] == "inputs"


def test_jsonl_files_load_like_parquet(run, tmp_path):
    ref = load([str(run)])
    jdir = tmp_path / "jsonl"
    for table in ("inputs", "outcomes"):
        (jdir / table).mkdir(parents=True)
        frame = pl.concat([pl.read_parquet(f) for f in sorted((run / table).glob("*.parquet"))])
        with open(jdir / table / "all.jsonl", "w") as fh:
            for rec in frame.to_dicts():
                fh.write(json.dumps(rec) + "\n")
    assert validate_paths([str(jdir)]) == []
    logs = load([str(jdir / "*" / "*.jsonl")])
    assert logs.inputs.schema["agreement"] == pl.List(pl.Float32)
    assert logs.inputs.schema["full_score"] == pl.Float64  # JSON 0/1 integers are accepted as floats
    key = ["task", "input_id"]
    got = logs.inputs.sort(key).select("task", "input_id", "n_tokens", "drop", "agreement")
    want = ref.inputs.sort(key).select("task", "input_id", "n_tokens", "drop", "agreement")
    assert got.equals(want)
    assert logs.outcomes.sort(["task", "input_id", "evictor", "budget"]).equals(
        ref.outcomes.sort(["task", "input_id", "evictor", "budget"]).select(logs.outcomes.columns)
    )
    # task class: no manifest → defaults
    classes = dict(logs.inputs.select("task", "task_class").unique().iter_rows())
    assert classes == {t: defaults.default_task_class(t) for t in TASKS}


def test_jsonl_bad_line_is_named(tmp_path):
    d = tmp_path / "inputs"
    d.mkdir()
    (d / "x.jsonl").write_text('{"run_id": "r1"}\n{"run_id": \n')
    problems = validate_paths([str(d / "x.jsonl")])
    assert_problem(problems, d / "x.jsonl", None, "cannot read jsonl file")


# --------------------------------------------------------------------------- exclusions


def test_exclusions_are_applied_and_reported(tmp_path):
    write_run(tmp_path, "r1")
    write_run(tmp_path, "r2", seed=1)
    logs = load([str(tmp_path)], exclude=["r1/niah_multikey_3", "r2/vt/1", "r2/niah_multikey_3"])
    per_input_outcomes = len(EVICTORS) * len(BUDGETS)
    assert logs.exclusion_report() == [
        f"run r1 task niah_multikey_3: {N_INPUTS} inputs, {N_INPUTS * per_input_outcomes} outcomes, "
        f"{N_INPUTS * L * H} topk rows",
        f"run r2 task vt input 1: 1 inputs, {per_input_outcomes} outcomes, {L * H} topk rows",
        f"run r2 task niah_multikey_3: {N_INPUTS} inputs, {N_INPUTS * per_input_outcomes} outcomes, "
        f"{N_INPUTS * L * H} topk rows",
    ]
    kept = set(logs.inputs.select("run_id", "task", "input_id").iter_rows())
    assert kept == {("r1", "vt", i) for i in range(N_INPUTS)} | {("r2", "vt", 0), ("r2", "vt", 2)}
    for frame in (logs.outcomes, logs.topk):
        assert set(frame.select("run_id", "task", "input_id").unique().iter_rows()) == kept
    # a whole run
    logs = load([str(tmp_path)], exclude=["r2"])
    assert logs.inputs["run_id"].unique().to_list() == ["r1"]
    assert logs.exclusions[0].startswith(f"run r2: {len(TASKS) * N_INPUTS} inputs")


def test_exclusion_matching_nothing_is_an_error(run):
    for spec in ("nope", "r1/no_task", "r1/vt/99"):
        with pytest.raises(LogError, match="matches no"):
            load([str(run)], exclude=[spec])
        with pytest.raises(LogError, match="matches no"):
            load([str(run)], exclude=[spec], strict=False)
    with pytest.raises(LogError, match="not an integer"):
        load([str(run)], exclude=["r1/vt/x"])
    with pytest.raises(LogError):
        load([str(run)], exclude=["a/b/1/2"])


def test_exclusion_lets_a_bad_input_be_left_out(tmp_path):
    def mutate(ins, ocs, tks, man):
        ins[input_row(1, 2)]["full_score"] = 1.5

    run = write_run(tmp_path, mutate=mutate)
    with pytest.raises(LogError, match="full_score"):
        load([str(run)])
    # the 1.0 arms of that input now disagree with full_score too; excluding the input removes both
    logs = load([str(run)], exclude=["r1/vt/2"])
    assert logs.inputs.height == len(TASKS) * N_INPUTS - 1


# --------------------------------------------------------------------------- strict / lenient


def test_strict_raises_with_every_problem_and_lenient_returns_them(tmp_path):
    def mutate(ins, ocs, tks, man):
        ins[input_row(0, 1)]["drop"] = float("nan")
        ocs[outcome_row(0, 0, "h2o", 0.25)]["score"] = 2.0

    run = write_run(tmp_path, mutate=mutate)
    with pytest.raises(LogError) as info:
        load([str(run)])
    err = info.value
    assert isinstance(err, ValueError) and len(err.problems) >= 2
    assert all(isinstance(p, Problem) for p in err.problems)
    assert "drop is NaN" in str(err) and "score outside [0, 1]" in str(err)
    logs = load([str(run)], strict=False)
    assert logs.inputs.height == len(TASKS) * N_INPUTS  # rows with bad values are kept in lenient mode
    assert messages(logs.problems) == messages(err.problems)


def test_lenient_leaves_out_unreadable_files_and_names_them(run):
    bad = run / "outcomes" / "part-0001.parquet"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    logs = load([str(run)], strict=False)
    assert_problem(logs.problems, bad, None, "corrupt or truncated")
    assert logs.outcomes.height == N_INPUTS * len(EVICTORS) * len(BUDGETS)  # the other shard
    assert logs.outcomes["task"].unique().to_list() == [TASKS[0]]
    # the lost shard is reported once, not again as "input with no outcomes" for each of its inputs
    assert not any("no outcomes" in p.message for p in logs.problems)


def test_validate_reports_several_problems_at_once(tmp_path):
    def mutate(ins, ocs, tks, man):
        ins[input_row(0, 0)]["drop"] = float("inf")
        ins[input_row(1, 1)]["full_score"] = -0.5
        ocs[outcome_row(0, 2, "snapkv", 0.5)]["score"] = float("nan")
        tks[3]["indices"] = [0, 0, 1, 2, 3, 4, 5, 6]

    run = write_run(tmp_path, mutate=mutate)
    (run / "inputs" / "extra.parquet").write_bytes(b"PAR1 not really")
    problems = validate_paths([str(run)])
    inputs = run / "inputs" / "part-0000.parquet"
    assert_problem(problems, inputs, input_row(0, 0), "drop is NaN or infinite")
    assert_problem(problems, inputs, input_row(1, 1), "full_score outside [0, 1]")
    assert_problem(problems, run / "outcomes" / "part-0000.parquet", outcome_row(0, 2, "snapkv", 0.5), "score outside")
    assert_problem(problems, run / "topk" / "part-0000.parquet", 3, "topk indices repeat")
    assert_problem(problems, run / "inputs" / "extra.parquet", None, "corrupt or truncated")
    assert_problem(problems, run / "inputs" / "extra.parquet", None, "not listed in")


# --------------------------------------------------------------------------- rules, one by one


def test_missing_column(tmp_path, run):
    f = run / "outcomes" / "part-0001.parquet"
    pq.write_table(pq.read_table(f).drop(["score"]), f)
    refresh_manifest(run)
    problems = validate_paths([str(run)])
    assert_problem(problems, f, None, "missing column 'score'")


def test_wrong_types(run):
    f = run / "inputs" / "part-0000.parquet"
    t = pq.read_table(f)
    t = t.set_column(t.schema.get_field_index("n_tokens"), "n_tokens", t.column("n_tokens").cast(pa.float64()))
    t = t.set_column(t.schema.get_field_index("drop"), "drop", t.column("drop").cast(pa.string()))
    pq.write_table(t, f)
    refresh_manifest(run)
    problems = validate_paths([str(run)])
    assert_problem(problems, f, None, "column 'n_tokens'", "int column")
    assert_problem(problems, f, None, "column 'drop'", "float column")


def test_narrow_types_are_accepted(run):
    f = run / "outcomes" / "part-0000.parquet"
    t = pq.read_table(f)
    for name, typ in (("input_id", pa.int32()), ("n_kept", pa.int16()), ("score", pa.float32())):
        t = t.set_column(t.schema.get_field_index(name), name, t.column(name).cast(typ))
    pq.write_table(t, f)
    refresh_manifest(run)
    assert validate_paths([str(run)]) == []
    logs = load([str(run)])
    assert logs.outcomes.schema["n_kept"] == pl.Int64 and logs.outcomes.schema["score"] == pl.Float64


def test_duplicate_inputs(tmp_path):
    def mutate(ins, ocs, tks, man):
        ins.append(dict(ins[input_row(1, 0)]))

    run = write_run(tmp_path, mutate=mutate)
    f = run / "inputs" / "part-0000.parquet"
    p = assert_problem(validate_paths([str(run)]), f, len(TASKS) * N_INPUTS, "duplicate input")
    assert f"first at {os.path.normpath(str(f))}:row {input_row(1, 0)}" in p.message


def test_duplicate_outcome_rows_across_files(run):
    # the same rows of task 0 written again as a third shard
    src = run / "outcomes" / "part-0000.parquet"
    shutil.copy(src, run / "outcomes" / "part-0002.parquet")
    refresh_manifest(run)
    problems = validate_paths([str(run)])
    dup = run / "outcomes" / "part-0002.parquet"
    p = assert_problem(problems, dup, 0, "duplicate outcome row")
    assert f"first at {os.path.normpath(str(src))}:row 0" in p.message
    from pagestats.io.validation import MAX_ROWS_PER_RULE

    rest = N_INPUTS * len(EVICTORS) * len(BUDGETS) - MAX_ROWS_PER_RULE
    assert_problem(problems, dup, None, f"{rest} more rows with: duplicate outcome row")


def test_budget_grid_differs_between_arms(tmp_path):
    def mutate(ins, ocs, tks, man):
        # input (vt, 1), evictor h2o loses its 0.5 arm
        del ocs[len(TASKS[:1]) * N_INPUTS * len(EVICTORS) * len(BUDGETS) + outcome_row(1, 1, "h2o", 0.5)]

    run = write_run(tmp_path, mutate=mutate)
    f = run / "outcomes" / "part-0001.parquet"
    p = assert_problem(validate_paths([str(run)]), f, outcome_row(1, 1, "h2o", 0.0625), "budget grid differs")
    assert "missing [0.5]" in p.message and "'h2o'" in p.message


def test_budget_grid_without_manifest_uses_the_runs_usual_grid(tmp_path):
    def mutate(ins, ocs, tks, man):
        ocs.append({**ocs[0], "budget": 0.3})  # input (niah_multikey_3, 0), snapkv gets an extra arm

    run = write_run(tmp_path, mutate=mutate)
    (run / "manifest.json").unlink()
    problems = validate_paths([str(run)])
    p = assert_problem(problems, run / "outcomes" / "part-0000.parquet", 0, "budget grid differs")
    assert "extra [0.3]" in p.message and "the run's usual" in p.message


def test_evictor_set_differs_within_run(tmp_path):
    def mutate(ins, ocs, tks, man):
        ocs[:] = [r for r in ocs if not (r["task"] == "vt" and r["input_id"] == 2 and r["evictor"] == "snapkv")]

    run = write_run(tmp_path, mutate=mutate)
    f = run / "outcomes" / "part-0001.parquet"
    row = outcome_row(1, 2, "h2o", BUDGETS[0]) - len(BUDGETS)  # snapkv rows of input 2 removed before it
    p = assert_problem(validate_paths([str(run)]), f, row, "evictor set differs")
    assert "missing ['snapkv']" in p.message


def test_scores_outside_unit_interval(tmp_path):
    def mutate(ins, ocs, tks, man):
        ocs[outcome_row(0, 1, "snapkv", 0.125)]["score"] = 1.25
        ocs[outcome_row(0, 1, "snapkv", 0.25)]["score"] = float("nan")
        ins[input_row(0, 2)]["full_score"] = float("nan")

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    f = run / "outcomes" / "part-0000.parquet"
    assert_problem(problems, f, outcome_row(0, 1, "snapkv", 0.125), "score outside [0, 1] or NaN", "1.25")
    assert_problem(problems, f, outcome_row(0, 1, "snapkv", 0.25), "score outside [0, 1] or NaN")
    assert_problem(problems, run / "inputs" / "part-0000.parquet", input_row(0, 2), "full_score outside")


def test_nan_and_inf_drop(tmp_path):
    def mutate(ins, ocs, tks, man):
        ins[input_row(0, 0)]["drop"] = float("nan")
        ins[input_row(1, 2)]["drop"] = float("-inf")

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    f = run / "inputs" / "part-0000.parquet"
    assert_problem(problems, f, input_row(0, 0), "drop is NaN or infinite")
    assert_problem(problems, f, input_row(1, 2), "drop is NaN or infinite")


def test_null_values(tmp_path):
    def mutate(ins, ocs, tks, man):
        ocs[outcome_row(0, 0, "h2o", 0.75)]["n_kept"] = None

    run = write_run(tmp_path, mutate=mutate)
    assert_problem(validate_paths([str(run)]), run / "outcomes" / "part-0000.parquet",
                   outcome_row(0, 0, "h2o", 0.75), "'n_kept' is null")


def test_manifest_hash_mismatch(run):
    f = run / "topk" / "part-0000.parquet"
    t = pq.read_table(f)
    pq.write_table(t.slice(0, t.num_rows - 1), f)  # valid parquet, different bytes and rows
    problems = validate_paths([str(run)])
    assert_problem(problems, f, None, "sha256", "does not match the manifest")
    assert_problem(problems, f, None, f"{t.num_rows - 1} rows but the manifest says {t.num_rows}")


def test_manifest_row_count_mismatch(run):
    man = json.loads((run / "manifest.json").read_text())
    entry = next(e for e in man["files"] if e["path"] == "outcomes/part-0000.parquet")
    entry["rows"] += 1
    (run / "manifest.json").write_text(json.dumps(man))
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "outcomes" / "part-0000.parquet", None, "rows but the manifest says")
    assert not any("sha256" in p.message for p in problems)


def test_listed_file_missing_and_unlisted_file(run):
    (run / "outcomes" / "part-0001.parquet").rename(run / "outcomes" / "renamed.parquet")
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "manifest.json", None, "'outcomes/part-0001.parquet' is listed but missing")
    assert_problem(problems, run / "outcomes" / "renamed.parquet", None, "not listed in")
    (run / "outcomes" / "renamed.parquet").unlink()
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "manifest.json", None, "'outcomes/part-0001.parquet' is listed but missing")
    assert not any("no outcomes" in p.message for p in problems)


def test_manifest_path_escaping_run_dir(run, tmp_path):
    man = json.loads((run / "manifest.json").read_text())
    secret = tmp_path / "secret.parquet"
    shutil.copy(run / "inputs" / "part-0000.parquet", secret)
    man["files"].append({"path": "../secret.parquet", "sha256": "0", "rows": 1})
    man["files"].append({"path": "/etc/passwd", "sha256": "0", "rows": 1})
    man["files"].append({"path": "inputs/../../secret.parquet", "sha256": "0", "rows": 1})
    (run / "manifest.json").write_text(json.dumps(man))
    problems = validate_paths([str(run)])
    for i, path in ((4, "../secret.parquet"), (5, "/etc/passwd"), (6, "inputs/../../secret.parquet")):
        assert_problem(problems, run / "manifest.json", None, f"files[{i}].path {path!r} escapes the run directory")
    assert not any("secret" in p.file for p in problems)


def test_symlink_escaping_run_dir(run, tmp_path):
    outside = tmp_path / "outside.parquet"
    shutil.copy(run / "topk" / "part-0000.parquet", outside)
    (run / "topk" / "part-0000.parquet").unlink()
    os.symlink(outside, run / "topk" / "part-0000.parquet")
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "topk" / "part-0000.parquet", None, "resolves outside its run directory")


def test_unknown_schema_version_and_missing_manifest_keys(run):
    man = json.loads((run / "manifest.json").read_text())
    man["schema_version"] = 99
    del man["seed"]
    del man["model"]["dtype"]
    (run / "manifest.json").write_text(json.dumps(man))
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "manifest.json", None, "unknown schema_version 99")
    assert_problem(problems, run / "manifest.json", None, "missing keys ['seed']")
    assert_problem(problems, run / "manifest.json", None, "'model' is missing keys ['dtype']")
    logs = load([str(run)], strict=False)  # the run's files are not interpreted under an unknown version
    assert logs.inputs.height == 0


def test_older_schema_version_is_upgraded_on_read(run, monkeypatch):
    """A made-up version 0 without ``gate_ms``: readable, and upgraded by an UPGRADES step."""
    from pagestats import io

    for name in ("inputs/part-0000.parquet",):
        f = run / name
        pq.write_table(pq.read_table(f).drop(["gate_ms"]), f)
    refresh_manifest(run)
    man = json.loads((run / "manifest.json").read_text())
    man["schema_version"] = 0
    del man["protection"]  # v0 manifests had no protection block
    (run / "manifest.json").write_text(json.dumps(man))
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, "unknown schema_version 0")

    def manifest_v0(m):
        return {**m, "protection": {"n_sink": 4, "n_recent": 32}}

    def schema_v0(table, s):
        return s.append(pa.field("gate_ms", pa.float64())) if table == "inputs" else s

    def table_v0(table, frame):
        return frame.with_columns(pl.lit(float("nan")).alias("gate_ms")) if table == "inputs" else frame

    monkeypatch.setattr(schema, "READABLE_VERSIONS", (0, *schema.READABLE_VERSIONS))
    monkeypatch.setitem(upgrades.UPGRADES, 0, upgrades.Upgrade(manifest=manifest_v0, schema=schema_v0, table=table_v0))
    assert validate_paths([str(run)]) == []
    logs = load([str(run)])
    assert logs.inputs["gate_ms"].is_nan().all()
    assert logs.manifests["r1"]["schema_version"] == schema.SCHEMA_VERSION
    assert logs.manifests["r1"]["protection"]["n_sink"] == 4


def test_corrupt_manifest_json(run):
    (run / "manifest.json").write_text("{not json")
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, "cannot read manifest")


def test_agreement_length_vs_manifest(tmp_path):
    def mutate(ins, ocs, tks, man):
        r = ins[input_row(1, 0)]
        r["agreement"] = r["agreement"][:5]
        r["drop"] = float(profile.drop_from_agreement(np.array(r["agreement"], dtype=np.float32)))

    run = write_run(tmp_path, mutate=mutate)
    assert_problem(validate_paths([str(run)]), run / "inputs" / "part-0000.parquet", input_row(1, 0),
                   "agreement length differs", "5 layers; manifest model.n_layers 6")


def test_agreement_length_inconsistent_without_manifest(tmp_path):
    def mutate(ins, ocs, tks, man):
        r = ins[input_row(0, 2)]
        r["agreement"] = r["agreement"] + [0.5]
        r["drop"] = float(profile.drop_from_agreement(np.array(r["agreement"], dtype=np.float32)))

    run = write_run(tmp_path, mutate=mutate)
    (run / "manifest.json").unlink()
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "inputs" / "part-0000.parquet", input_row(0, 2), "agreement length differs",
                   "7 layers; the run's other inputs have 6")


def test_pair_jaccard_length(tmp_path):
    def mutate(ins, ocs, tks, man):
        ins[input_row(0, 1)]["pair_jaccard"] = ins[input_row(0, 1)]["pair_jaccard"][:-1]

    run = write_run(tmp_path, mutate=mutate)
    p = assert_problem(validate_paths([str(run)]), run / "inputs" / "part-0000.parquet", input_row(0, 1),
                       "pair_jaccard length")
    assert f"length {L * H * (H - 1) // 2 - 1}; expected L·H(H−1)/2 = {L * H * (H - 1) // 2}" in p.message


def test_pair_jaccard_length_against_manifest_heads(tmp_path):
    def mutate(ins, ocs, tks, man):
        man["model"]["n_heads"] = 5  # stored pairs are for H = 4

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    for t in range(len(TASKS)):
        for i in range(N_INPUTS):
            assert_problem(problems, run / "inputs" / "part-0000.parquet", input_row(t, i),
                           f"expected L·H(H−1)/2 = {L * 10}")
    # H = 5 also makes head 4 legal; no topk head problem is expected


def test_profile_values_outside_unit_interval(tmp_path):
    def mutate(ins, ocs, tks, man):
        ins[input_row(1, 1)]["pair_jaccard"][7] = 1.5

    run = write_run(tmp_path, mutate=mutate)
    assert_problem(validate_paths([str(run)]), run / "inputs" / "part-0000.parquet", input_row(1, 1),
                   "pair_jaccard has values outside [0, 1]")


def test_pair_jaccard_disagrees_with_agreement(tmp_path):
    """A pair Jaccard rewritten inside [0, 1] no longer averages to its layer's a_ℓ (found by the fuzz);
    a change below float32 rounding is accepted."""
    def mutate(ins, ocs, tks, man):
        row = ins[input_row(1, 2)]["pair_jaccard"]
        row[3] = 0.5 if abs(row[3] - 0.5) > 0.1 else 0.95
        small = ins[input_row(0, 0)]["pair_jaccard"]
        small[0] = float(np.nextafter(np.float32(small[0]), np.float32(2.0)))

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    p = assert_problem(problems, run / "inputs" / "part-0000.parquet", input_row(1, 2),
                       "agreement differs from the layer means of pair_jaccard")
    assert "max |a_ℓ − mean pair Jaccard|" in p.message
    assert [q for q in problems if "pair_jaccard" in q.message and q.row != input_row(1, 2)] == []


def test_drop_disagrees_with_agreement(tmp_path):
    def mutate(ins, ocs, tks, man):
        ins[input_row(0, 2)]["drop"] += 1e-4
        ins[input_row(1, 0)]["drop"] += 1e-8  # within tolerance

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    f = run / "inputs" / "part-0000.parquet"
    assert_problem(problems, f, input_row(0, 2), "drop disagrees with drop_from_agreement")
    assert not any(p.row == input_row(1, 0) for p in problems)


def test_drop_uses_manifest_bins(tmp_path):
    # drop logged with bin fraction 1/2; the manifest says so, so the run is valid ...
    def mutate(ins, ocs, tks, man):
        man["gate"]["bins"] = 0.5
        for r in ins:
            r["drop"] = float(profile.drop_from_agreement(np.array(r["agreement"], dtype=np.float32), 0.5))

    run = write_run(tmp_path, mutate=mutate)
    assert validate_paths([str(run)]) == []
    # ... and with the default bins in the manifest every input disagrees
    man = json.loads((run / "manifest.json").read_text())
    man["gate"]["bins"] = {"fraction": 1 / 3, "convention": "deployed"}
    (run / "manifest.json").write_text(json.dumps(man))
    a = np.array(build_frames()[0][0]["agreement"], dtype=np.float32)
    differs = abs(profile.drop_from_agreement(a, 0.5) - profile.drop_from_agreement(a)) > 1e-6
    problems = validate_paths([str(run)])
    assert any("drop disagrees" in p.message and p.row == 0 for p in problems) == bool(differs)


def test_outcomes_without_input_and_input_without_outcomes(tmp_path):
    def mutate(ins, ocs, tks, man):
        ins[:] = [r for r in ins if not (r["task"] == "vt" and r["input_id"] == 1)]
        tks[:] = [r for r in tks if not (r["task"] == "vt" and r["input_id"] == 1)]
        ocs[:] = [r for r in ocs if not (r["task"] == "niah_multikey_3" and r["input_id"] == 2)]

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "outcomes" / "part-0001.parquet", outcome_row(1, 1, "snapkv", BUDGETS[0]),
                   "outcomes whose input is missing", f"has {len(EVICTORS) * len(BUDGETS)} outcome rows")
    assert_problem(problems, run / "inputs" / "part-0000.parquet", input_row(0, 2), "input with no outcomes")


def test_budget_one_differs_from_full_kv(tmp_path):
    def mutate(ins, ocs, tks, man):
        r = ocs[outcome_row(0, 1, "h2o", 1.0)]
        r["score"] = 1.0 - ins[input_row(0, 1)]["full_score"] if ins[input_row(0, 1)]["full_score"] != 0.5 else 0.0
        ocs[outcome_row(0, 2, "snapkv", 1.0)]["n_kept"] -= 1

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    f = run / "outcomes" / "part-0000.parquet"
    assert_problem(problems, f, outcome_row(0, 1, "h2o", 1.0), "budget 1.0 outcome differs from the full-KV")
    assert_problem(problems, f, outcome_row(0, 2, "snapkv", 1.0), "budget 1.0 outcome differs", "n_kept")


def test_run_arms_differ_from_manifest_reported_once(tmp_path):
    def mutate(ins, ocs, tks, man):
        man["budgets"] = [*BUDGETS[:4], 0.4, *BUDGETS[4:]]  # no input has a 0.4 arm

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    p = assert_problem(problems, run / "outcomes" / "part-0000.parquet", 0, "usual arms of run 'r1' differ from the "
                       "manifest's evictors × budgets")
    assert "missing [('h2o', 0.4), ('snapkv', 0.4)]" in p.message
    assert len(problems) == 1


def test_grid_without_full_budget(tmp_path):
    def mutate(ins, ocs, tks, man):
        ocs[:] = [r for r in ocs if r["budget"] != 1.0]
        man["budgets"] = list(BUDGETS[:-1])

    run = write_run(tmp_path, mutate=mutate)
    assert_problem(validate_paths([str(run)]), run / "outcomes" / "part-0000.parquet", 0,
                   "has no budget 1.0 (full-cache audit) arm")


def test_n_kept_outside_range(tmp_path):
    def mutate(ins, ocs, tks, man):
        ocs[outcome_row(1, 0, "snapkv", 0.5)]["n_kept"] = 0
        ocs[len(ocs) // 2 + outcome_row(1, 0, "h2o", 0.5)]["n_kept"] = 10**6

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "outcomes" / "part-0000.parquet", outcome_row(1, 0, "snapkv", 0.5),
                   "n_kept outside [1, n_tokens]", "n_kept = 0")
    assert_problem(problems, run / "outcomes" / "part-0001.parquet", outcome_row(1, 0, "h2o", 0.5),
                   "n_kept outside [1, n_tokens]", "n_kept = 1000000")


def test_topk_indices_out_of_range_and_repeats(tmp_path):
    captured = {}

    def mutate(ins, ocs, tks, man):
        captured["n_tokens"] = ins[0]["n_tokens"]
        tks[5]["indices"][2] = ins[0]["n_tokens"]  # == n_tokens: out of range
        tks[9]["indices"][0] = -1
        tks[11]["indices"][1] = tks[11]["indices"][0]

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    f = run / "topk" / "part-0000.parquet"
    assert_problem(problems, f, 5, "topk indices outside [0, n_tokens)", f"n_tokens {captured['n_tokens']}")
    assert_problem(problems, f, 9, "topk indices outside [0, n_tokens)", "min -1")
    assert_problem(problems, f, 11, "topk indices repeat")


def test_topk_layer_head_range_and_orphans(tmp_path):
    def mutate(ins, ocs, tks, man):
        tks[0]["layer"] = L
        tks[1]["head"] = H
        tks.append({**tks[2], "input_id": 77})

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    f = run / "topk" / "part-0000.parquet"
    assert_problem(problems, f, 0, "topk layer out of range")
    assert_problem(problems, f, 1, "topk head out of range")
    assert_problem(problems, f, len(TASKS) * N_INPUTS * L * H, "topk rows whose input is missing")


def test_rows_from_another_run_and_manifest_mismatches(tmp_path):
    def mutate(ins, ocs, tks, man):
        ins[input_row(0, 0)]["model"] = "other-model"
        ins[input_row(0, 1)]["context_length"] = 4096

    run = write_run(tmp_path, mutate=mutate)
    f = run / "outcomes" / "part-0000.parquet"
    frame = pl.read_parquet(f).with_columns(
        pl.when(pl.int_range(pl.len()) == 3).then(pl.lit("r9")).otherwise(pl.col("run_id")).alias("run_id")
    )
    schema.write_parquet("outcomes", frame, f)
    refresh_manifest(run)
    problems = validate_paths([str(run)])
    assert_problem(problems, f, 3, "outcomes row from another run", "run_id r9")
    assert_problem(problems, run / "inputs" / "part-0000.parquet", input_row(0, 0), "model differs")
    assert_problem(problems, run / "inputs" / "part-0000.parquet", input_row(0, 1), "context_length differs")


def test_task_not_in_manifest(tmp_path):
    def mutate(ins, ocs, tks, man):
        man["tasks"] = {"niah_multikey_3": "capacity-bound"}

    run = write_run(tmp_path, mutate=mutate)
    assert_problem(validate_paths([str(run)]), run / "inputs" / "part-0000.parquet", input_row(1, 0),
                   "task not in the manifest tasks", "task vt (3 inputs)")


def test_corrupt_parquet_is_named_not_traced(run):
    f = run / "inputs" / "part-0000.parquet"
    data = bytearray(f.read_bytes())
    f.write_bytes(bytes(data[: len(data) - 20]))  # truncated: footer gone
    problems = validate_paths([str(run)])
    p = assert_problem(problems, f, None, "cannot read parquet file (corrupt or truncated?)")
    assert "Traceback" not in str(p) and "\n" not in str(p)


def test_corrupt_page_inside_valid_footer_is_named(run):
    # flip bytes in the data pages of one shard; the footer still parses
    f = run / "outcomes" / "part-0001.parquet"
    t = pq.read_table(f)
    pq.write_table(t, f, compression="zstd", use_dictionary=False)
    data = bytearray(f.read_bytes())
    meta = pq.ParquetFile(f).metadata
    start = meta.row_group(0).column(7).data_page_offset  # the score column chunk
    for i in range(start + 4, start + 60):
        data[i] ^= 0xFF
    f.write_bytes(bytes(data))
    refresh_manifest(run)
    problems = validate_paths([str(run)])
    bad = [p for p in problems if p.file == os.path.normpath(str(f))]
    assert bad, messages(problems)
    assert any("cannot read parquet file" in p.message for p in bad), messages(bad)
    assert all("\n" not in str(p) for p in problems)


def test_missing_paths_and_empty_globs(tmp_path):
    problems = validate_paths([str(tmp_path / "nope"), str(tmp_path / "*.parquet")])
    assert_problem(problems, tmp_path / "nope", None, "no such file")
    assert_problem(problems, tmp_path / "*.parquet", None, "glob matches no files")
    (tmp_path / "notes.txt").write_text("x")
    assert_problem(validate_paths([str(tmp_path / "notes.txt")]), tmp_path / "notes.txt", None, "not a log file")


def test_loose_file_of_unknown_table(tmp_path):
    f = tmp_path / "x.parquet"
    pq.write_table(pa.table({"a": [1]}), f)
    assert_problem(validate_paths([str(f)]), f, None, "cannot tell the table")


def test_loose_file_inside_run_is_checked_against_its_manifest(run):
    f = run / "inputs" / "part-0000.parquet"
    paths = [str(f), str(run / "outcomes" / "*.parquet")]
    assert validate_paths(paths) == []  # the run's topk file is not required
    man = json.loads((run / "manifest.json").read_text())
    assert man["files"][0]["path"] == "inputs/part-0000.parquet"
    man["files"][0]["sha256"] = "0" * 64
    (run / "manifest.json").write_text(json.dumps(man))
    assert_problem(validate_paths(paths), f, None, "does not match the manifest")


def test_duplicate_run_ids(tmp_path):
    write_run(tmp_path / "a", "r1")
    write_run(tmp_path / "b", "r1")
    problems = validate_paths([str(tmp_path / "a" / "r1"), str(tmp_path / "b" / "r1")])
    assert_problem(problems, tmp_path / "b" / "r1" / "manifest.json", None, "is also the run_id")


def test_many_bad_rows_are_summarised(tmp_path):
    def mutate(ins, ocs, tks, man):
        for r in ocs:
            r["decode_ms"] = 1.0
            if r["budget"] != 1.0:
                r["score"] = 3.0

    run = write_run(tmp_path, mutate=mutate)
    problems = validate_paths([str(run)])
    from pagestats.io.validation import MAX_ROWS_PER_RULE

    per_file = N_INPUTS * len(EVICTORS) * (len(BUDGETS) - 1)
    f = os.path.normpath(str(run / "outcomes" / "part-0000.parquet"))
    rows = [p for p in problems if p.file == f and "score outside" in p.message]
    assert len(rows) == MAX_ROWS_PER_RULE + 1
    assert rows[-1].row is None and rows[-1].message.startswith(f"{per_file - MAX_ROWS_PER_RULE} more rows")


def test_problem_str_format():
    assert str(Problem("a/b.parquet", 3, "bad")) == "a/b.parquet:row 3: bad"
    assert str(Problem("a/b.parquet", None, "bad")) == "a/b.parquet: bad"
