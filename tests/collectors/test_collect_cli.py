"""pagestats-collect end to end on a tiny random model: kill-and-resume equals an uninterrupted run,
shards partition the work, a mismatched resume is refused, budget-1.0 rows equal the full arm.

The model is the conftest tiny Llama (random weights) saved with ``save_pretrained`` beside a
byte-level tokenizer with a small chat template, so nothing is downloaded and loading is fast.
"""

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from collectors import cli
from collectors.writer import CRASH_ENV, CRASH_EXIT_CODE
from pagestats.core import schema

TIMINGS = {"prefill_ms", "gate_ms", "decode_ms"}
ARGS = ["--tasks", "niah_single_1,niah_multikey_2", "--context-length", "640", "--n", "1",
        "--evictors", "snapkv,streamingllm", "--budgets", "0.25,0.5,1.0", "--max-new-tokens", "4", "--allow-cut-answers",
        "--part-size", "1", "--no-progress", "--k", "8", "--k-max", "16"]


def collect(model_dir, out, *extra):
    return cli.main(["--model", str(model_dir), "--out", str(out), *ARGS, *extra])


def rows(out, table):
    files = sorted((out / table).glob("*.parquet"))
    data = [{k: v for k, v in r.items() if k not in TIMINGS}
            for f in files for r in pq.read_table(f).to_pylist()]
    return sorted(data, key=lambda r: json.dumps(r, sort_keys=True, default=str))


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    assert collect(model_dir, out) == 0
    return out


def test_uninterrupted_run_is_schema_v1(reference):
    m = json.loads((reference / "manifest.json").read_text())
    assert set(schema.MANIFEST_KEYS) <= set(m)
    assert m["tasks"] == {"niah_single_1": "dilution-prone", "niah_multikey_2": "dilution-prone"}
    assert m["task_options"]["niah_multikey_2"]["haystack"] == "needle"
    assert m["prompt_style"] == m["parameters"]["prompt_style"] == "page"  # the authors' prompt, the default
    assert m["protection"] == {"n_sink": 4, "n_recent": 32, "budget_floor": "page"}
    assert m["model"]["n_layers"] == 4 and m["gate"]["k_max_stored"] == 16
    # the tiny model shares KV heads (4 query, 2 KV): its arms decode grouped, and the run id says so
    assert m["model"]["decode_attn_impl"] == m["parameters"]["model"]["decode_attn_impl"] == "pagestats_grouped_sdpa"
    for f in m["files"]:
        assert schema.sha256_file(reference / f["path"]) == f["sha256"]
        assert schema.schema_problems(f["path"].split("/")[0], pq.read_schema(reference / f["path"])) == []
    inputs, outcomes, topk = (rows(reference, t) for t in ("inputs", "outcomes", "topk"))
    assert len(inputs) == 2 and len(outcomes) == 2 * 2 * 3 and len(topk) == 2 * 4 * 4
    full = {(r["task"], r["input_id"]): r for r in inputs}
    for r in inputs:
        # niah_multikey_2's haystack is whole needles (RULER's): within one needle line (< 64 bytes) below
        assert (0.98 * 640 if r["task"] == "niah_single_1" else 640 - 64) <= r["n_tokens"] <= 640
        assert len(r["agreement"]) == 4 and len(r["pair_jaccard"]) == 4 * 6
    for o in outcomes:
        if o["budget"] == 1.0:  # the full-cache arm reproduces the full-KV outcome (docs/SCHEMA.md)
            assert o["prediction"] == full[(o["task"], o["input_id"])]["full_prediction"]
            assert o["score"] == full[(o["task"], o["input_id"])]["full_score"]
            assert o["n_kept"] == full[(o["task"], o["input_id"])]["n_tokens"]
        else:
            # the authors' floor, the default: max(40, floor(T·b))
            assert o["n_kept"] == max(int(o["budget"] * full[(o["task"], o["input_id"])]["n_tokens"]), 40)
    assert all(len(t["indices"]) == 16 for t in topk)


def test_validate_accepts_the_run(reference):
    pytest.importorskip("pagestats.io", reason="pagestats.io not available yet")
    from pagestats.cli import main as pagestats_main

    assert pagestats_main(["validate", str(reference)]) == 0


def test_kill_and_resume_equals_uninterrupted(model_dir, reference, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, CRASH_ENV: "1"}
    cmd = [sys.executable, "-m", "collectors", "--model", str(model_dir), "--out", str(out), *ARGS]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr[-2000:]
    assert len(list((out / "inputs").glob("*.parquet"))) == 1
    assert len(list((out / "outcomes").glob("*.parquet"))) == 2  # half-written second part
    assert collect(model_dir, out) == 0
    for table in schema.TABLES:
        assert rows(out, table) == rows(reference, table), table
    m = json.loads((out / "manifest.json").read_text())
    assert {f["path"] for f in m["files"]} == {f"{t}/{p.name}" for t in schema.TABLES for p in (out / t).glob("*.parquet")}
    assert m["run_id"] == json.loads((reference / "manifest.json").read_text())["run_id"]


def test_shards_partition_and_rerun_is_a_no_op(model_dir, reference, tmp_path):
    out = tmp_path / "run"
    assert collect(model_dir, out, "--shard", "0/2") == 0
    first = rows(out, "inputs")
    assert collect(model_dir, out, "--shard", "1/2") == 0
    for table in schema.TABLES:
        assert rows(out, table) == rows(reference, table), table
    assert {(r["task"], r["input_id"]) for r in first} == {("niah_single_1", 0)}
    n_files = len(list(out.rglob("*.parquet")))
    assert collect(model_dir, out) == 0  # everything finished: nothing new
    assert len(list(out.rglob("*.parquet"))) == n_files


def test_mismatched_resume_refused(model_dir, reference, tmp_path, capsys):
    out = tmp_path / "run"
    assert collect(model_dir, out, "--shard", "0/2") == 0
    capsys.readouterr()
    assert cli.main(["--model", str(model_dir), "--out", str(out), *ARGS, "--budgets", "0.5,1.0"]) == 2
    err = capsys.readouterr().err
    assert "refusing to resume" in err and "budgets" in err


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for action in cli.parser()._actions:
        for opt in action.option_strings:
            assert opt in text
        assert action.help, action.dest
    for opt in ("--model", "--tasks", "--context-length", "--n", "--seed", "--draw", "--evictors", "--budgets",
                "--out", "--shard", "--device", "--dtype", "--attn-impl", "--k-max", "--max-new-tokens",
                "--haystack-file", "--qa-file", "--task-classes", "--prompt-style", "--budget-floor"):
        assert opt in text


def test_bad_options_exit_with_a_message(capsys):
    assert cli.main(["--tasks", "niah_single_1", "--context-length", "100", "--n", "1", "--out", "x",
                     "--evictors", "nope"]) == 2
    assert "unknown evictor" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--tasks", "niah_single_1", "--context-length", "100", "--n", "1", "--out", "x", "--shard", "2/2"])


# ------------------------------------------------------------------ one-line errors (exit 2, no traceback)

ERROR_ARGS = ["--tasks", "niah_single_1", "--context-length", "300", "--n", "1", "--no-progress"]


def _model_dir_variant(model_dir, tmp_path, *, drop=(), config=None):
    import shutil

    d = tmp_path / "variant"
    shutil.copytree(model_dir, d)
    for name in drop:
        (d / name).unlink()
    if config:
        c = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**c, **config}))
    return d


@pytest.mark.parametrize("case", ["missing-path", "no-tokenizer", "unknown-type", "not-causal", "cuda",
                                  "too-long", "flash-attention", "unknown-kernel", "no-sdpa-in-class"])
def test_collector_errors_are_one_line(case, model_dir, tmp_path, capsys):
    """In process: an exception escaping cli.main would fail the test, so exit 2 with one line means no traceback."""
    import torch

    out = tmp_path / "out"
    model, extra, expect = str(model_dir), [], None
    if case == "missing-path":
        model, expect = str(tmp_path / "nonexistent"), "model path not found"
    elif case == "no-tokenizer":
        model = str(_model_dir_variant(model_dir, tmp_path, drop=("tokenizer.json", "tokenizer_config.json")))
        expect = "has no tokenizer files"
    elif case == "unknown-type":
        model, expect = str(_model_dir_variant(model_dir, tmp_path, config={"model_type": "nosuchmodel"})), "unknown to transformers"
    elif case == "not-causal":
        model, expect = str(_model_dir_variant(model_dir, tmp_path, config={"model_type": "t5"})), "has no causal-LM class"
    elif case == "cuda":
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
        extra, expect = ["--device", "cuda"], "asks for CUDA"
    elif case == "too-long":  # the tiny model has 4,096 positions
        extra, expect = ["--context-length", "100000"], "max_position_embeddings = 4096"
    elif case == "flash-attention":
        extra, expect = ["--attn-impl", "flash_attention_2"], "flash_attention_2"
    elif case == "unknown-kernel":
        extra, expect = ["--attn-impl", "nosuchkernel"], "not a transformers attention kernel"
    elif case == "no-sdpa-in-class":  # transformers' Gemma2 implements eager attention only
        gemma2 = {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "head_dim": 16}
        model, expect = str(_model_dir_variant(model_dir, tmp_path, config=gemma2)), "Gemma2ForCausalLM has no sdpa kernel"
    code = cli.main(["--model", model, "--out", str(out), *ERROR_ARGS, *extra])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], lines
    assert not out.exists()  # refused before any work


def test_missing_model_is_one_line_in_a_fresh_process(tmp_path):
    """What a user sees from the command: one stderr line, exit 2, no transformers traceback."""
    proc = subprocess.run([sys.executable, "-m", "collectors", "--model", str(tmp_path / "nonexistent"),
                           "--out", str(tmp_path / "out"), *ERROR_ARGS], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: model path not found: {tmp_path / 'nonexistent'}"]


def test_model_name_labels_rows_and_manifest(model_dir, tmp_path):
    out = tmp_path / "run"
    assert cli.main(["--model", str(model_dir), "--out", str(out), *ARGS, "--n", "1", "--tasks", "niah_single_1",
                     "--model-name", "tiny-llama"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["model"]["name"] == "tiny-llama" and m["run_id"].startswith("tiny-llama-640-")
    assert m["model"]["source"] == str(model_dir.resolve())
    assert {r["model"] for r in pq.read_table(out / "inputs").to_pylist()} == {"tiny-llama"}


def test_local_model_is_labelled_by_its_directory_name(reference, model_dir):
    m = json.loads((reference / "manifest.json").read_text())
    assert m["model"]["name"] == model_dir.name


def test_slurm_array_script_collects_the_same_run(model_dir, reference, tmp_path):
    """docs/slurm_collect.sh, run as array tasks 0 and 1 of 2 (CPU, the tiny model), equals one process."""
    script = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "docs", "slurm_collect.sh")
    out = tmp_path / "run"
    for index in (0, 1):
        env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(index), "SLURM_ARRAY_TASK_COUNT": "2",
               "PYTHON": sys.executable, "MODEL": str(model_dir), "OUT": str(out), "DEVICE": "cpu", "DTYPE": "float32"}
        proc = subprocess.run(["bash", script, *ARGS], env=env, capture_output=True, text=True, timeout=100)
        assert proc.returncode == 0, proc.stderr[-2000:]
    for table in schema.TABLES:
        assert rows(out, table) == rows(reference, table), table


@pytest.mark.parametrize("progress", [False, True])
def test_no_progress_silences_transformers_bars_while_loading(model_dir, tmp_path, capfd, progress):
    """``--no-progress`` also keeps transformers' "Loading weights" bar off stderr (a batch log
    would otherwise hold one redraw per tensor), and leaves transformers' switch as it found it."""
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    argv = ["--model", str(model_dir), "--out", str(tmp_path / "run"), *ARGS]
    if progress:
        argv.remove("--no-progress")
    assert cli.main(argv) == 0
    err = capfd.readouterr().err
    assert ("Loading weights" in err) == progress
    assert hf_logging.is_progress_bar_enabled()


@pytest.mark.parametrize("progress", [False, True])
def test_no_progress_silences_the_gguf_readers_own_bar(capfd, progress):
    """The GGUF reader's "Converting and de-quantizing" bar is a plain tqdm outside transformers'
    logging switch: ``--no-progress`` silences it too while the model loads, and puts it back."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from collectors.hf import hf_progress

    original = gguf_utils.tqdm
    with hf_progress(progress):
        list(gguf_utils.tqdm(range(3), desc="de-quantizing probe"))
    assert ("de-quantizing probe" in capfd.readouterr().err) == progress
    assert gguf_utils.tqdm is original
