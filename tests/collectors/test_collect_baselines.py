"""pagestats-collect with the per-head baselines and their recorded parameters, end to end on the
tiny random Llama of the ``model_dir`` fixture in conftest (nothing is downloaded)."""

import json

import pyarrow.parquet as pq

from collectors import cli
from pagestats.cli import main as pagestats_main

ARGS = ["--tasks", "niah_single_1", "--context-length", "640", "--n", "1", "--budgets", "0.25,1.0",
        "--max-new-tokens", "4", "--allow-cut-answers", "--part-size", "1", "--no-progress", "--k", "8", "--k-max", "16"]


def _rows(out, table):
    return [r for f in sorted((out / table).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_perhead_evictors_collect_and_record_their_window(model_dir, tmp_path):
    out = tmp_path / "run"
    evictors = "snapkv,snapkv-perhead,h2o,h2o-perhead,snapkv-perlayer"
    assert cli.main(["--model", str(model_dir), "--out", str(out), *ARGS, "--evictors", evictors,
                     "--snapkv-window", "16", "--snapkv-pool", "3"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["evictor_parameters"] == {"snapkv_window": 16, "pool_kernel": 3}
    assert manifest["parameters"]["evictor_parameters"] == manifest["evictor_parameters"]
    assert manifest["evictors"] == evictors.split(",")
    (inp,) = _rows(out, "inputs")
    outcomes = _rows(out, "outcomes")
    assert sorted({o["evictor"] for o in outcomes}) == sorted(evictors.split(","))
    for o in outcomes:
        expected = inp["n_tokens"] if o["budget"] == 1.0 else max(int(0.25 * inp["n_tokens"]), 40)
        assert o["n_kept"] == expected
    assert pagestats_main(["validate", str(out)]) == 0
    # another window is another run: resuming into the same directory is refused
    assert cli.main(["--model", str(model_dir), "--out", str(out), *ARGS, "--evictors", evictors]) == 2


def test_bad_snapkv_options_exit_2(model_dir, tmp_path, capsys):
    base = ["--model", str(model_dir), "--out", str(tmp_path / "x"), *ARGS, "--evictors", "snapkv-perhead"]
    assert cli.main([*base, "--snapkv-pool", "4"]) == 2
    assert "pool_kernel" in capsys.readouterr().err
    assert cli.main([*base, "--snapkv-window", "0"]) == 2
    assert "snapkv_window" in capsys.readouterr().err


def test_split_prompt_cuts_at_the_question(model_dir):
    from transformers import AutoTokenizer

    from collectors import tasks as T

    tok = AutoTokenizer.from_pretrained(model_dir)
    for task in ("niah_single_1", "niah_multikey_3", "niah_multiquery", "fwe"):
        ti = T.make_input(task, tokenizer=tok, context_length=1500, input_id=0, draw=0)
        ids, n_context = T.split_prompt(tok, ti)
        assert ids == T.tokenize_prompt(tok, ti.prompt) and 0 < n_context < len(ids)
        question = ti.prompt[ti.question_start:]
        # the authors' prompt: a blank line, then the question as RULER words it
        assert ti.prompt[:ti.question_start].endswith("\n\n") and question.startswith(("Question", "What"))
        # byte-level tokens: the context part decodes to exactly the prompt before the question
        assert tok.decode(ids[:n_context]) == ti.prompt[: ti.question_start]
        assert tok.decode(ids[n_context:]) == question


def test_query_agnostic_collect_records_the_mode(model_dir, tmp_path):
    from transformers import AutoTokenizer

    from collectors import tasks as T
    from collectors.evictors import n_kept

    out = tmp_path / "run"
    assert cli.main(["--model", str(model_dir), "--out", str(out), *ARGS, "--evictors", "snapkv,h2o-perhead",
                     "--mode", "query-agnostic"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mode"] == manifest["parameters"]["mode"] == "query-agnostic"
    (inp,) = _rows(out, "inputs")
    tok = AutoTokenizer.from_pretrained(model_dir)
    ti = T.make_input("niah_single_1", tokenizer=tok, context_length=640, input_id=0, draw=0)
    ids, n_context = T.split_prompt(tok, ti)
    assert inp["n_tokens"] == len(ids)
    for o in _rows(out, "outcomes"):
        assert o["n_kept"] == n_kept(n_context, o["budget"], budget_floor="page") + len(ids) - n_context
    assert pagestats_main(["validate", str(out)]) == 0
    # the default mode is query-aware, recorded too
    aware = tmp_path / "aware"
    assert cli.main(["--model", str(model_dir), "--out", str(aware), *ARGS, "--evictors", "snapkv"]) == 0
    assert json.loads((aware / "manifest.json").read_text())["mode"] == "query-aware"


def test_ruler_prompt_and_protected_floor_are_recorded(model_dir, tmp_path):
    """--prompt-style ruler --budget-floor protected: RULER's prompt, the 36-position floor, both in the manifest."""
    from transformers import AutoTokenizer

    from collectors import tasks as T

    out = tmp_path / "run"
    assert cli.main(["--model", str(model_dir), "--out", str(out), *ARGS, "--evictors", "snapkv",
                     "--budgets", "0.05,1.0", "--prompt-style", "ruler", "--budget-floor", "protected"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["prompt_style"] == manifest["parameters"]["prompt_style"] == "ruler"
    assert manifest["protection"]["budget_floor"] == manifest["parameters"]["protection"]["budget_floor"] == "protected"
    (inp,) = _rows(out, "inputs")
    tok = AutoTokenizer.from_pretrained(model_dir)
    ti = T.make_input("niah_single_1", tokenizer=tok, context_length=640, input_id=0, draw=0, prompt_style="ruler")
    assert inp["prompt"] == ti.prompt and "Answer the question concisely." not in inp["prompt"]
    low = [o for o in _rows(out, "outcomes") if o["budget"] == 0.05]
    assert [o["n_kept"] for o in low] == [36] and int(0.05 * inp["n_tokens"]) < 36
