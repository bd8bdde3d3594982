"""``pagestats-collect --ray`` on a local Ray cluster (CPU, the conftest tiny random model).

The rows of a Ray run equal those of an unsharded run exactly (timings aside); a shard whose worker
dies mid-part on its first attempt is retried and the run still equals the unsharded one; a shard
failing in its own code is not retried. Ray start-up is slow, so there are three runs in all.
"""

from __future__ import annotations

import json
import pathlib

import pyarrow.parquet as pq
import pytest
import ray

from collectors import cli
from collectors.ray_launcher import launch
from collectors.writer import CRASH_ENV, RunMismatchError
from pagestats.core import schema

ROOT = str(pathlib.Path(__file__).resolve().parents[2])  # Ray workers import this checkout's collectors
TIMINGS = {"prefill_ms", "gate_ms", "decode_ms"}
RUN = ["--tasks", "niah_single_1,niah_multikey_2", "--context-length", "640", "--n", "3",
       "--evictors", "snapkv,streamingllm", "--budgets", "0.25,1.0", "--max-new-tokens", "4", "--allow-cut-answers",
       "--part-size", "1", "--no-progress", "--k", "8", "--k-max", "16"]


def rows(out, table):
    data = [{k: v for k, v in r.items() if k not in TIMINGS}
            for f in sorted((out / table).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    return sorted(data, key=lambda r: json.dumps(r, sort_keys=True, default=str))


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    assert cli.main(["--model", str(model_dir), "--out", str(out), *RUN]) == 0
    return out


def assert_same_run(out, reference):
    for table in schema.TABLES:
        assert rows(out, table) == rows(reference, table), table
    assert json.loads((out / "manifest.json").read_text())["run_id"] == \
        json.loads((reference / "manifest.json").read_text())["run_id"]


def test_cli_retries_a_shard_killed_mid_run(model_dir, reference, tmp_path, monkeypatch, capsys):
    token = tmp_path / "kill-once"
    token.touch()  # the first shard attempt to reach its second part deletes it and dies mid-part
    monkeypatch.setenv(CRASH_ENV, f"1@{token}")
    monkeypatch.setenv("PYTHONPATH", ROOT)
    # the local instance the CLI starts has one CPU (Ray reads its resources from this variable): the shards
    # queue on one worker process at a time, two in all with the retry's, where two CPUs started three
    monkeypatch.setenv("RAY_OVERRIDE_RESOURCES", json.dumps({"CPU": 1}))
    out = tmp_path / "run"
    assert not ray.is_initialized()
    code = cli.main(["--model", str(model_dir), "--out", str(out), *RUN,
                     "--ray", "--shards", "2", "--gpus-per-shard", "0"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert not token.exists() and not ray.is_initialized()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["inputs"] == 6 and summary["collected"] == 6 and summary["shards"] == 2
    assert summary["failures_retried"] == 1 and "WorkerCrashedError" in summary["retried"][0]
    assert "6 inputs valid" in captured.err and "1 failure retried" in captured.err
    assert_same_run(out, reference)


@pytest.fixture
def local_ray():
    """A running local cluster of one CPU: its shards queue on one worker process, which imports torch and the
    collector once for all of them (a second CPU started a second worker: ~5 s of CPU more, on a 2-core machine)."""
    ray.init(num_cpus=1, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    yield
    ray.shutdown()


def test_launch_on_a_running_cluster_equals_unsharded_and_does_not_retry_bad_runs(model_dir, reference, tmp_path,
                                                                                   local_ray):
    out = tmp_path / "run"
    cfg = cli.config_from_args(cli.parser().parse_args(["--model", str(model_dir), "--out", str(out), *RUN]))
    summary = launch(cfg, shards=3, progress=False)
    assert ray.is_initialized()  # a connection the caller opened stays open
    assert (summary.inputs, summary.collected, summary.failures_retried) == (6, 6, 0)
    assert_same_run(out, reference)
    again = launch(cfg, shards=3, progress=False)  # everything finished: nothing to do
    assert (again.inputs, again.collected) == (6, 0)
    other = cli.config_from_args(cli.parser().parse_args(
        ["--model", str(model_dir), "--out", str(out), *RUN, "--budgets", "0.5,1.0"]))
    with pytest.raises(RunMismatchError, match="refusing to resume"):
        launch(other, shards=2, progress=False, max_retries=3)
    assert_same_run(out, reference)
