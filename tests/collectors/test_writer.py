"""collectors.writer: atomic parts, resume after a crash, shard partition, refusal of another run.

Rows are fake (no model): a brute-force reference is the plain list of rows fed in.
"""

import json
import os
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq
import pytest

from collectors.writer import (
    CRASH_ENV,
    CRASH_EXIT_CODE,
    RunMismatchError,
    RunWriter,
    parse_shard,
    run_id_for,
    shard_items,
    work_items,
)
from pagestats.core import schema

TASKS = ("niah_single_1", "vt", "cwe")
PARAMS = {"model": {"name": "fake"}, "context_length": 128, "tasks": list(TASKS)}


def manifest(params=PARAMS):
    return {
        "run_id": run_id_for(params, label="fake-128"),
        "created_at": "2024-01-01T00:00:00+00:00",
        "model": {"name": "fake", "n_layers": 2, "n_heads": 3, "n_kv_heads": 1, "head_dim": 4,
                  "dtype": "float32", "attn_impl": "sdpa"},
        "device": "cpu", "context_length": 128, "tasks": {t: "dilution-prone" for t in TASKS},
        "evictors": ["snapkv"], "budgets": [0.5, 1.0], "gate": {"w": 32, "k": 32, "k_max_stored": 4, "bins": 1 / 3},
        "protection": {"n_sink": 4, "n_recent": 32}, "seed": 0, "software": {"python": "x"},
        "parameters": params,
    }


def fake_rows(run_id, task, input_id, L=2, H=3):
    key = {"run_id": run_id, "task": task, "input_id": input_id}
    x = float(input_id) + len(task) / 100
    inputs = {**key, "model": "fake", "context_length": 128, "draw": 0, "n_tokens": 100, "drop": x / 10,
              "agreement": [x / 10] * L, "pair_jaccard": [0.5] * (L * H * (H - 1) // 2),
              "signals": {"entropy": x, "sink_mass": 0.25}, "prompt": f"prompt {task} {input_id}",
              "references": ["a", "b"], "full_prediction": "a b", "full_score": 1.0, "prefill_ms": 1.0, "gate_ms": 0.1,
              "full_n_generated": 3, "full_stop_reason": "eos"}
    outcomes = [{**key, "evictor": "snapkv", "budget": b, "n_kept": int(100 * b), "prediction": "a",
                 "score": 0.5 if b < 1 else 1.0, "decode_ms": 2.0,
                 "n_generated": 3, "stop_reason": "eos"} for b in (0.5, 1.0)]
    topk = [{**key, "layer": l, "head": h, "indices": [3, 1, 2, 0]} for l in range(L) for h in range(H)]
    return {"inputs": [inputs], "outcomes": outcomes, "topk": topk}


def read(out, table):
    files = sorted((out / table).glob("*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in r))


def write_all(out, items, shard=(0, 1), part_size=2):
    m = manifest()
    w = RunWriter(out, m, shard=shard, part_size=part_size)
    done = w.open()
    for it in shard_items(items, shard):
        if (it.task, it.input_id) not in done:
            w.add(fake_rows(m["run_id"], it.task, it.input_id))
    w.close()
    return w


def test_work_items_are_input_major_and_stable_when_n_grows():
    items = work_items(TASKS, 3)
    assert [(i.index, i.task, i.input_id) for i in items[:4]] == [
        (0, "niah_single_1", 0), (1, "vt", 0), (2, "cwe", 0), (3, "niah_single_1", 1)]
    more = work_items(TASKS, 5)
    assert more[: len(items)] == items


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_shards_partition_the_work(n):
    items = work_items(TASKS, 5)
    parts = [shard_items(items, (i, n)) for i in range(n)]
    flat = [it for p in parts for it in p]
    assert sorted(it.index for it in flat) == list(range(len(items)))  # disjoint and complete
    for i, p in enumerate(parts):
        assert all(it.index % n == i for it in p)


@pytest.mark.parametrize("bad", ["1/1", "3", "a/b", "-1/2", "0/0"])
def test_parse_shard_rejects_bad_specs(bad):
    with pytest.raises(ValueError, match="shard"):
        parse_shard(bad)


def test_run_id_is_deterministic_and_parameter_sensitive():
    assert run_id_for(PARAMS, label="x") == run_id_for(json.loads(json.dumps(PARAMS)), label="x")
    assert run_id_for(PARAMS, label="x") != run_id_for({**PARAMS, "context_length": 256}, label="x")


def test_round_trip_schema_and_manifest(tmp_path):
    out = tmp_path / "run"
    items = work_items(TASKS, 3)
    write_all(out, items, part_size=4)
    m = json.loads((out / "manifest.json").read_text())
    assert set(schema.MANIFEST_KEYS) <= set(m)
    assert m["schema_version"] == schema.SCHEMA_VERSION
    # 9 inputs in parts of 4 → 3 parts per table
    assert len(list((out / "inputs").glob("*.parquet"))) == 3
    for f in m["files"]:
        path = out / f["path"]
        assert schema.sha256_file(path) == f["sha256"]
        assert pq.ParquetFile(path).metadata.num_rows == f["rows"]
        table = f["path"].split("/")[0]
        assert schema.schema_problems(table, pq.read_schema(path)) == []
    inputs = read(out, "inputs")
    assert sorted((r["task"], r["input_id"]) for r in inputs) == sorted((i.task, i.input_id) for i in items)
    assert len(read(out, "outcomes")) == 2 * len(items)
    assert len(read(out, "topk")) == 6 * len(items)


def test_resume_skips_finished_and_never_duplicates(tmp_path):
    out = tmp_path / "run"
    items = work_items(TASKS, 2)
    write_all(out, items[:4])
    again = RunWriter(out, manifest(), part_size=2)
    assert again.open() == {(i.task, i.input_id) for i in items[:4]}
    with pytest.raises(ValueError, match="already written"):
        again.add(fake_rows(manifest()["run_id"], items[0].task, items[0].input_id))
    write_all(out, items)  # finishes the rest
    ref = tmp_path / "ref"
    write_all(ref, items)
    for table in schema.TABLES:
        assert read(out, table) == read(ref, table)


def test_shards_written_into_one_directory_equal_one_run(tmp_path):
    items = work_items(TASKS, 3)
    write_all(tmp_path / "one", items)
    for i in range(3):
        write_all(tmp_path / "sharded", items, shard=(i, 3))
    for table in schema.TABLES:
        assert read(tmp_path / "sharded", table) == read(tmp_path / "one", table)
    m = json.loads((tmp_path / "sharded" / "manifest.json").read_text())
    assert len(m["files"]) == sum(len(list((tmp_path / "sharded" / t).glob("*.parquet"))) for t in schema.TABLES)


def test_refuses_another_run(tmp_path):
    out = tmp_path / "run"
    write_all(out, work_items(TASKS, 1))
    other = manifest({**PARAMS, "context_length": 256})
    with pytest.raises(RunMismatchError, match=r"context_length: existing 128 vs requested 256"):
        RunWriter(out, other).open()


def test_refuses_parts_without_manifest(tmp_path):
    out = tmp_path / "run"
    write_all(out, work_items(TASKS, 1))
    (out / "manifest.json").unlink()
    with pytest.raises(RunMismatchError, match="no manifest"):
        RunWriter(out, manifest()).open()


CRASH_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from test_writer import TASKS, manifest, fake_rows
    from collectors.writer import RunWriter, work_items
    m = manifest()
    w = RunWriter({out!r}, m, part_size=2)
    done = w.open()
    for it in work_items(TASKS, 3):
        if (it.task, it.input_id) not in done:
            w.add(fake_rows(m["run_id"], it.task, it.input_id))
    w.close()
    """
)


def test_crash_mid_part_then_resume_equals_uninterrupted(tmp_path):
    out = tmp_path / "run"
    script = CRASH_SCRIPT.format(tests=os.path.dirname(__file__), out=str(out))
    env = {**os.environ, CRASH_ENV: "2"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr
    # 2 complete parts (4 inputs) + the third part's topk/outcomes but no inputs file
    assert len(list((out / "inputs").glob("*.parquet"))) == 2
    assert len(list((out / "outcomes").glob("*.parquet"))) == 3
    stray = out / "inputs" / "part-0000-of-0001-000003.parquet.tmp-999999"
    stray.write_bytes(b"half a file")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not stray.exists()
    ref = tmp_path / "ref"
    write_all(ref, work_items(TASKS, 3), part_size=2)
    for table in schema.TABLES:
        assert read(out, table) == read(ref, table)
    keys = [(r["task"], r["input_id"]) for r in read(out, "inputs")]
    assert len(keys) == len(set(keys)) == 9
    m = json.loads((out / "manifest.json").read_text())
    listed = {f["path"] for f in m["files"]}
    on_disk = {f"{t}/{f.name}" for t in schema.TABLES for f in (out / t).glob("*.parquet")}
    assert listed == on_disk


def test_open_only_cleans_its_own_shard(tmp_path):
    out = tmp_path / "run"
    write_all(out, work_items(TASKS, 1), shard=(0, 2))
    # shard 1/2 is mid-part: its outcomes file exists, its inputs file not yet
    busy = out / "outcomes" / "part-0001-of-0002-000001.parquet"
    busy.write_bytes(b"being written by another process")
    RunWriter(out, manifest(), shard=(0, 2)).open()
    assert busy.exists()
    w = RunWriter(out, manifest(), shard=(1, 2))
    w.open()
    assert not busy.exists() and "outcomes/part-0001-of-0002-000001.parquet" in w.removed
