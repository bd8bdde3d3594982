"""Issue 12, the reader: every bad input gets one named line and nothing corrupt passes.

Each test builds a small valid run (the builder of ``test_load_and_rules``: 2 tasks × 3 inputs, L = 6,
H = 4, k_max = 8), breaks it the way one example of the issue did, and checks that
:func:`pagestats.io.validate_paths` answers with a problem naming the right file, without an
exception. Files edited on purpose get a fresh manifest (``refresh_manifest``), so that the
content rules, not the sha256 check, must find the damage.
"""

from __future__ import annotations

import json
import os
import shutil

import polars as pl
import pyarrow.parquet as pq
import pytest

from pagestats.core import schema
from pagestats.io import ExclusionError, load, validate_paths
from pagestats.io.guard import MAX_JSON_DEPTH, MAX_MANIFEST_BYTES

from logbuild import H, K_MAX, L, N_INPUTS, TASKS, assert_problem, messages, refresh_manifest, write_run

N_INPUTS_ALL = len(TASKS) * N_INPUTS


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path)


def _manifest(run):
    return json.loads((run / "manifest.json").read_text())


def _write_manifest_text(run, text):
    (run / "manifest.json").write_text(text)


def _edit_topk(run, edit):
    f = run / "topk" / "part-0000.parquet"
    frame = pl.read_parquet(f)
    schema.write_parquet("topk", edit(frame), f)
    refresh_manifest(run)


# --------------------------------------------------------------------------- load-time tracebacks


def test_deeply_nested_manifest_is_one_problem(run):
    _write_manifest_text(run, "[" * 200_000)
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "manifest.json", None, f"deeper than {MAX_JSON_DEPTH}")


def test_nesting_inside_strings_is_not_depth(run):
    man = _manifest(run)
    man["software"]["note"] = "[" * 1000
    _write_manifest_text(run, json.dumps(man))
    assert validate_paths([str(run)]) == []


@pytest.mark.parametrize("where", ["context_length", "model.n_layers", "gate.bins", "seed"])
def test_integers_beyond_int64_in_the_manifest(run, where):
    text = json.dumps(_manifest(run))
    block, _, key = where.rpartition(".")
    man = json.loads(text)
    (man[block] if block else man)[key] = 0  # placeholder, replaced textually by a 401-digit integer
    text = json.dumps(man).replace(f'"{key}": 0', f'"{key}": {10**400}', 1)
    _write_manifest_text(run, text)
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, "outside the int64 range")


def test_nan_and_huge_floats_in_the_manifest(run):
    _write_manifest_text(run, json.dumps(_manifest(run)).replace('"seed": 0', '"seed": NaN'))
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, "NaN is not a JSON number")
    _write_manifest_text(run, json.dumps(_manifest_of(run)).replace('"seed": 0', '"seed": 1e400'))
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, "not finite")


def _manifest_of(run):
    return {**write_run.__globals__["manifest_for"]("r1"), "schema_version": 1}


def test_oversized_manifest(run):
    man = _manifest(run)
    man["software"]["padding"] = "x" * (MAX_MANIFEST_BYTES + 1)
    _write_manifest_text(run, json.dumps(man))
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, "larger than 16 MiB")


def test_manifest_symlinked_to_dev_zero(run):
    (run / "manifest.json").unlink()
    os.symlink("/dev/zero", run / "manifest.json")
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, "resolves outside its run directory")


def test_manifest_symlinked_outside_the_run_is_refused(run, tmp_path):
    outside = tmp_path / "elsewhere.json"
    shutil.move(run / "manifest.json", outside)
    os.symlink(outside, run / "manifest.json")
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "manifest.json", None, "resolves outside its run directory")
    assert not any(p.file == str(outside) for p in problems)


def test_manifest_symlinked_inside_the_run_is_read(run):
    shutil.move(run / "manifest.json", run / "real-manifest.json")
    os.symlink("real-manifest.json", run / "manifest.json")
    assert validate_paths([str(run)]) == []


def test_fifo_and_directory_named_like_parts(run):
    os.mkfifo(run / "inputs" / "part-0009.parquet")
    (run / "outcomes" / "part-0009.parquet").mkdir()
    problems = validate_paths([str(run)])  # would block for ever reading the FIFO
    assert_problem(problems, run / "inputs" / "part-0009.parquet", None, "is a FIFO, not a regular file")
    assert_problem(problems, run / "outcomes" / "part-0009.parquet", None, "is a directory, not a regular file")


def test_part_symlinked_to_a_device_inside_a_loose_directory(tmp_path, run):
    loose = tmp_path / "loose"
    loose.mkdir()
    os.symlink("/dev/zero", loose / "zero.parquet")
    assert_problem(validate_paths([str(loose)]), loose / "zero.parquet", None, "is a character device")


def _deny(monkeypatch, locked):
    """Refuse every access under ``locked`` with EACCES, as the kernel does for a mode-000
    directory to anyone but root (the suite may run as root, which reads anything)."""
    locked = os.path.realpath(locked)

    def guarded(fn):
        def call(path, *args, **kwargs):
            real = os.path.realpath(os.fspath(path)) if isinstance(path, (str, bytes, os.PathLike)) else None
            if real is not None and (real == locked or real.startswith(locked + os.sep)):
                if fn.__name__ != "stat" or real != locked:
                    raise PermissionError(13, "Permission denied", os.fspath(path))
            return fn(path, *args, **kwargs)

        return call

    for name in ("scandir", "stat", "open"):
        monkeypatch.setattr(os, name, guarded(getattr(os, name)))
    import builtins

    monkeypatch.setattr(builtins, "open", guarded(builtins.open))


@pytest.mark.parametrize("target", [".", "inputs", "topk"])
def test_unreadable_directories_are_named(run, monkeypatch, target):
    locked = run / target
    if os.geteuid() == 0:
        _deny(monkeypatch, locked)
    else:
        os.chmod(locked, 0o000)
    try:
        problems = validate_paths([str(run)])
    finally:
        monkeypatch.undo()
        os.chmod(locked, 0o755)
    assert_problem(problems, locked, None, "Permission denied")


# --------------------------------------------------------------------------- silently accepted


@pytest.mark.parametrize("length", [10, 200, 0])
def test_topk_lists_of_the_wrong_length(run, length):
    _edit_topk(run, lambda f: f.with_columns(
        pl.when(pl.int_range(pl.len()) == 5).then(pl.lit(list(range(length)), dtype=pl.List(pl.Int32)))
        .otherwise(pl.col("indices")).alias("indices")))
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "topk" / "part-0000.parquet", 5, "topk list of the wrong length",
                   f"{length} indices, expected min(k_max_stored = {K_MAX}")


def test_topk_missing_a_layer_or_a_head(run):
    _edit_topk(run, lambda f: f.filter(~((pl.col("input_id") == 1) & (pl.col("task") == TASKS[0])
                                         & (pl.col("layer") == 2))))
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "topk" / "part-0000.parquet", L * H, "topk rows missing for an input",
                   f"has {(L - 1) * H} topk rows; expected L × H = {L} × {H}")
    assert len(problems) == 1, messages(problems)
    _edit_topk(run, lambda f: f.filter(~((pl.col("input_id") == 0) & (pl.col("head") == 3))))
    problems = validate_paths([str(run)])
    assert sum("topk rows missing for an input" in p.message for p in problems) == 3, messages(problems)


def test_topk_part_deleted_or_empty(run):
    # a run whose top-k rows sit in two parts; one part is emptied, then deleted (manifest refreshed)
    f = run / "topk" / "part-0000.parquet"
    frame = pl.read_parquet(f)
    schema.write_parquet("topk", frame.filter(pl.col("task") == TASKS[0]), f)
    second = run / "topk" / "part-0001.parquet"
    schema.write_parquet("topk", frame.filter(pl.col("task") == TASKS[1]).head(0), second)
    refresh_manifest(run)
    problems = validate_paths([str(run)])
    for i in range(N_INPUTS):
        assert_problem(problems, run / "inputs" / "part-0000.parquet", N_INPUTS + i, "input without its topk rows",
                       f"has 0 topk rows; expected L × H = {L} × {H}")
    second.unlink()
    refresh_manifest(run)
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "inputs" / "part-0000.parquet", N_INPUTS, "input without its topk rows")
    f.unlink()
    refresh_manifest(run)
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "manifest.json", None, f"gate.k_max_stored is {K_MAX} but the run has no topk")


def test_whatif_k_after_topk_damage_names_a_file(run, capsys):
    from pagestats.cli import main

    _edit_topk(run, lambda f: f.with_columns(pl.col("indices").list.head(3)))
    assert main(["whatif", str(run), "--k", "4"]) == 1
    err = capsys.readouterr().err
    assert os.path.normpath(str(run / "topk" / "part-0000.parquet")) in err


@pytest.mark.parametrize(("where", "value", "kind"), [
    ("context_length", "1024", "an integer"),
    ("context_length", 1024.5, "an integer"),
    ("model.name", 5, "a string"),
    ("model.n_kv_heads", "2", "an integer"),
    ("gate.k_max_stored", True, "an integer"),
    ("protection.n_sink", -1, "an integer ≥ 0"),
    ("created_at", None, "a string"),
])
def test_manifest_types(run, where, value, kind):
    man = _manifest(run)
    block, _, key = where.rpartition(".")
    (man[block] if block else man)[key] = value
    _write_manifest_text(run, json.dumps(man))
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, f"manifest {where} ", f"is not {kind}")


def test_zero_rows_say_the_run_has_no_inputs(run):
    for table in ("inputs", "outcomes", "topk"):
        for f in (run / table).iterdir():
            schema.write_parquet(table, pl.read_parquet(f).head(0), f)
    refresh_manifest(run)
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "manifest.json", None, "the logs have no inputs")


# --------------------------------------------------------------------------- wrongly rejected


@pytest.mark.parametrize("name", ["part-*.parquet", "part-000?.parquet", "part-000[01].parquet", "p{a,b} \\x.parquet"])
def test_glob_characters_in_file_names_are_literal(run, name):
    clean = load([str(run)])
    for table in ("inputs", "outcomes", "topk"):
        (run / table / "part-0000.parquet").rename(run / table / name)
    refresh_manifest(run)
    assert validate_paths([str(run)]) == []
    logs = load([str(run)])
    for table in ("inputs", "outcomes", "topk"):
        key = list(schema.TOPK_KEY if table == "topk" else schema.OUTCOME_KEY if table == "outcomes"
                   else schema.INPUT_KEY)
        assert getattr(logs, table).sort(key).equals(getattr(clean, table).sort(key)), table


def test_jsonl_with_glob_characters_in_its_name(run, tmp_path):
    loose = tmp_path / "loose" / "inputs"
    loose.mkdir(parents=True)
    pl.read_parquet(run / "inputs" / "part-0000.parquet").drop("signals").write_ndjson(loose / "in[1]*.jsonl")
    pl.read_parquet(run / "inputs" / "part-0000.parquet").head(0).drop("signals").write_ndjson(loose / "in1x.jsonl")
    logs = load([str(loose / "in[[]1]*.jsonl")], strict=False)  # a glob naming the one file
    assert logs.inputs.height == N_INPUTS_ALL


# --------------------------------------------------------------------------- forged or unnamable output


def _rename_task(run, old, new):
    for table in ("inputs", "outcomes", "topk"):
        for f in (run / table).iterdir():
            frame = pl.read_parquet(f).with_columns(pl.col("task").replace(old, new))
            schema.write_parquet(table, frame, f)
    man = _manifest(run)
    man["tasks"][new] = man["tasks"].pop(old)
    man.pop("files")
    schema.write_manifest(run, man)


def test_newline_in_a_task_name_cannot_forge_lines(run, capsys):
    from pagestats.cli import main

    _rename_task(run, "vt", "vt\n/etc/passwd: ok")
    assert main(["validate", str(run)]) == 1
    out = capsys.readouterr().out
    assert not any(line.startswith("/etc/passwd") for line in out.splitlines()), out
    assert "vt\\n/etc/passwd" in out


def test_names_with_a_slash_are_refused(run):
    _rename_task(run, "vt", "a/b")
    problems = validate_paths([str(run)])
    assert_problem(problems, run / "inputs" / "part-0000.parquet", N_INPUTS, "task is empty or contains '/'")
    assert_problem(problems, run / "manifest.json", None, "task names ['a/b'] contain '/'")


def test_exclusion_of_a_nonexistent_id_is_a_usage_error(run):
    with pytest.raises(ExclusionError):
        load([str(run)], exclude=["r1/vt/99"])
    for spec in ("r1/vt/1_0", "r1/vt/\u0661", "r1/vt/" + "9" * 30):  # read as 10, as 1, beyond int64
        with pytest.raises(ExclusionError, match="is not an integer"):
            load([str(run)], exclude=[spec])
    assert load([str(run)], exclude=["r1/vt/1"]).inputs.height == N_INPUTS_ALL - 1


@pytest.mark.parametrize(("table", "column"), [("topk", "indices"), ("inputs", "agreement"),
                                               ("inputs", "pair_jaccard")])
def test_null_elements_inside_lists(run, table, column):
    f = run / table / "part-0000.parquet"
    frame = pl.read_parquet(f)
    values = list(frame[column][2])
    values[1] = None
    frame = frame.with_columns(pl.when(pl.int_range(pl.len()) == 2).then(
        pl.lit(pl.Series([values], dtype=frame.schema[column]))).otherwise(pl.col(column)).alias(column))
    schema.write_parquet(table, frame, f)
    refresh_manifest(run)
    assert_problem(validate_paths([str(run)]), f, 2, f"{table} column {column!r} has null elements",
                   f"1 of {len(values)} elements null")


def test_one_draw_per_run(run):
    """A replicate is a run (App. A.7.3): a second draw inside a run made report's draw table
    pair every input with both draws (found by the fuzz test)."""
    f = run / "inputs" / "part-0000.parquet"
    frame = pl.read_parquet(f).with_columns(
        pl.when(pl.int_range(pl.len()) == 4).then(-(2**40)).otherwise(pl.col("draw")).alias("draw"))
    schema.write_parquet("inputs", frame, f)
    refresh_manifest(run)
    assert_problem(validate_paths([str(run)]), f, 4, "draw differs within the run",
                   f"draw {-(2**40)} but the run's usual draw is 1000")
    man = _manifest(run)
    man["draw"] = 7
    _write_manifest_text(run, json.dumps(man))
    problems = validate_paths([str(run)])
    assert sum("draw 1000 but the manifest's draw is 7" in p.message for p in problems) == N_INPUTS_ALL - 1


# --------------------------------------------------------------------------- values the analysis interprets


@pytest.mark.parametrize("dtype", ["bfloAt16", "bf16", "torch.float32", "float64", "q4", ""])
def test_an_unknown_model_dtype_is_refused(run, dtype, capsys):
    """model.dtype sets the KV bytes per token (the decision figure's GiB axis); the fourth long
    fuzz turned 'bfloat16' into 'bfloAt16', which validate accepted and report crashed on."""
    from pagestats.cli import main

    man = _manifest(run)
    man["model"]["dtype"] = dtype
    _write_manifest_text(run, json.dumps(man))
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, "manifest model.dtype",
                   "is not one of ['float32', 'float16', 'bfloat16']")
    assert main(["validate", str(run)]) == 1
    out, _ = capsys.readouterr()
    assert len(out.strip().splitlines()) == 1 and "model.dtype" in out


def test_every_dtype_the_collector_writes_is_known():
    from collectors.model.load import _DTYPES

    assert set(_DTYPES) == set(schema.MODEL_DTYPE_BYTES)


@pytest.mark.parametrize("n_kv_heads", [3, 8])
def test_n_kv_heads_must_divide_n_heads(run, n_kv_heads):
    man = _manifest(run)
    man["model"]["n_kv_heads"] = n_kv_heads
    _write_manifest_text(run, json.dumps(man))
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None,
                   f"model.n_kv_heads {n_kv_heads} does not divide model.n_heads {H}")


@pytest.mark.parametrize("where", ["head_dim", "n_kv_heads"])
def test_architecture_numbers_at_the_int64_edge_are_refused(run, where):
    """2⁶² passes the loader's int64 bound, but 2·L·H_kv·d·bytes then overflows int64 in the
    decision figure: the architecture fields are bounded by MODEL_SIZE_MAX."""
    man = _manifest(run)
    man["model"][where] = 2**62
    _write_manifest_text(run, json.dumps(man))
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, f"manifest model.{where} ",
                   f"is not an integer ≥ 1 and ≤ {schema.MODEL_SIZE_MAX}")


@pytest.mark.parametrize("stamp", ["yesterday", "2000-13-01", "2025-01-01T25:00:00Z", ""])
def test_created_at_must_be_an_iso_time_stamp(run, stamp):
    """created_at is compared with a band's frozen_at (report --prereg)."""
    man = _manifest(run)
    man["created_at"] = stamp
    _write_manifest_text(run, json.dumps(man))
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, "manifest created_at",
                   "is not an ISO 8601 time stamp")


def test_an_unknown_gate_convention_is_refused(run):
    man = _manifest(run)
    man["gate"]["convention"] = "strikt"
    _write_manifest_text(run, json.dumps(man))
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, "manifest gate.convention 'strikt'")
    man["gate"]["bins"] = "deployed"
    man["gate"]["convention"] = "strict"
    _write_manifest_text(run, json.dumps(man))
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, "contradicts gate.bins")


def test_the_gate_convention_the_collector_writes_is_the_one_d_is_checked_with(tmp_path):
    """The collector writes gate.convention beside a numeric gate.bins. With L = 10 the strict late
    bin [6, 10) differs from the deployed [7, 10): D computed with strict thirds is accepted when the
    manifest says strict, and refused when it says deployed (the reader used to ignore the key)."""
    import numpy as np

    from pagestats import testing
    from pagestats.core import profile

    run = testing.synthetic_logs(models={"m": (10, 3)}, context_lengths=(512,), tasks=("vt",), n_inputs=4,
                                 evictors=("snapkv",), budgets=(0.5, 1.0), with_topk=False, with_text=False,
                                 seed=0).write(tmp_path / "logs")[0]
    gap = 0.0
    for f in sorted((run / "inputs").glob("*.parquet")):
        frame = pl.read_parquet(f)
        strict = [float(profile.drop_from_agreement(np.asarray(a, dtype=np.float32), 1 / 3, "strict"))
                  for a in frame["agreement"].to_list()]
        gap = max(gap, *(abs(s - d) for s, d in zip(strict, frame["drop"])))
        schema.write_parquet("inputs", frame.with_columns(pl.Series("drop", strict)), f)
    assert gap > 1e-3
    man = _manifest(run)
    man["gate"]["convention"] = "strict"
    man.pop("files")
    schema.write_manifest(run, man)
    assert validate_paths([str(run)]) == []
    man = _manifest(run)
    man["gate"]["convention"] = "deployed"
    _write_manifest_text(run, json.dumps(man))
    assert_problem(validate_paths([str(run)]), f, 0, "deployed")  # the last part's first row


def test_a_flipped_bit_in_a_parquet_footer_is_a_problem_not_a_traceback(tmp_path):
    """A bit flipped in a part's footer (Thrift metadata) can leave pyarrow's schema read intact but
    fail DuckDB's view over the file ("TProtocolException: Invalid data", found by the long fuzz
    campaign): validate names the file as unreadable, whatever byte of the footer is hit."""
    import numpy as np

    from pagestats import testing

    run = testing.synthetic_logs(models={"m": (6, 3)}, context_lengths=(512,), tasks=("niah_multikey_3", "vt"),
                                 n_inputs=3, evictors=("snapkv", "h2o"), budgets=(0.25, 0.5, 1.0), k_max=32,
                                 with_text=False, seed=3).write(tmp_path / "logs", n_shards=2)[0]
    part = sorted((run / "outcomes").iterdir())[1]
    clean = part.read_bytes()
    footer = int.from_bytes(clean[-8:-4], "little")
    start = len(clean) - 8 - footer
    positions = sorted({*np.linspace(start, len(clean) - 9, 16).astype(int).tolist(), 1674})
    failed_in_duckdb = 0
    for i in positions:
        for bit in (0, 4):
            data = bytearray(clean)
            data[i] ^= 1 << bit
            part.write_bytes(bytes(data))
            problems = validate_paths([str(run)])  # raises nothing: every outcome is a list of problems
            assert problems and any(str(part) == p.file for p in problems)
            failed_in_duckdb += any("cannot read parquet file" in p.message for p in problems)
    part.write_bytes(clean)
    assert validate_paths([str(run)]) == []
    assert failed_in_duckdb > 0  # the kind the campaign found is among them
