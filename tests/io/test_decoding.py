"""Why decodes stopped (schema v2) and answers the decode limit cut.

* the collector records ``stop_reason`` / ``n_generated`` for every decode, and a reference longer
  than ``max_new_tokens`` ends in ``length`` and a validation warning (a tiny random Llama);
* the text readings of :mod:`pagestats.io.decoding` equal a brute-force Python reading of their
  definitions on random texts;
* a v1 log (no stop reasons) is upgraded on read as ``unknown`` and still gets the text check.
"""

import json
import random
import string

import polars as pl
import pyarrow.parquet as pq
import pytest

from collectors import cli as collect_cli
from pagestats import cli
from pagestats.core import schema
from pagestats.io import load
import re

from pagestats.io.decoding import LOOP_MIN_WORDS, decode_profile, flagged_tasks, limit_warnings, text_flags

ARGS = ["--tasks", "niah_single_1,niah_multikey_2", "--context-length", "640", "--n", "2", "--evictors", "snapkv",
        "--budgets", "0.5,1.0", "--part-size", "2", "--no-progress", "--k", "8", "--k-max", "16"]


def brute_cut(pred: str, refs: list[str]) -> bool:
    p = pred.lower()
    for r in (x.lower() for x in refs):
        if r in p:
            continue
        for k in range(2, len(r)):
            start = len(p) - k
            if p.endswith(r[:k]) and (start == 0 or not p[start - 1].isalnum()):
                return True
    return False


def brute_loop(pred: str) -> bool:
    """The last third of the words (the last word aside) adds no word the first two thirds lack."""
    words = re.findall(r"[a-z0-9]+", pred.lower())
    if len(words) < LOOP_MIN_WORDS:
        return False
    cut = -(-2 * len(words) // 3)  # ceil(2n/3)
    head, tail = words[:cut], words[cut:-1]
    return bool(tail) and all(re.fullmatch(r"[0-9]{1,2}", w) or w in head for w in tail)


@pytest.fixture(scope="module")
def cut_run(model_dir, tmp_path_factory):
    """Two tasks whose 7-digit references cannot fit 4 new tokens of a byte-level tokenizer."""
    out = tmp_path_factory.mktemp("cut") / "run"
    assert collect_cli.main(["--model", str(model_dir), "--out", str(out), *ARGS, "--max-new-tokens", "4",
                             "--allow-cut-answers"]) == 0
    return out


def test_every_decode_records_why_it_stopped(cut_run):
    inputs = [r for f in sorted((cut_run / "inputs").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    outcomes = [r for f in sorted((cut_run / "outcomes").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert len(inputs) == 4 and len(outcomes) == 8
    for r in inputs:
        assert r["full_stop_reason"] in schema.STOP_REASONS and 1 <= r["full_n_generated"] <= 4
        # a random model rarely emits its EOS: what did not stop at EOS stopped at the limit, after 4 tokens
        assert (r["full_stop_reason"] == "length") == (r["full_n_generated"] == 4)
    for r in outcomes:
        assert r["stop_reason"] in schema.STOP_REASONS and 1 <= r["n_generated"] <= 4
    assert sum(r["full_stop_reason"] == "length" for r in inputs) >= 3
    manifest = json.loads((cut_run / "manifest.json").read_text())
    assert manifest["schema_version"] == 2
    assert {t: o["max_new_tokens"] for t, o in manifest["task_options"].items()} == {"niah_single_1": 4, "niah_multikey_2": 4}


def test_a_limit_below_the_answer_is_refused_without_the_flag(model_dir, tmp_path, capsys):
    code = collect_cli.main(["--model", str(model_dir), "--out", str(tmp_path / "r"), *ARGS, "--max-new-tokens", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "max_new_tokens 4 cannot hold the answer" in err[0] and "--max-new-tokens niah_single_1=" in err[0]


def test_per_task_limits(model_dir, tmp_path):
    out = tmp_path / "r"
    assert collect_cli.main(["--model", str(model_dir), "--out", str(out), *ARGS, "--n", "1",
                             "--max-new-tokens", "niah_single_1=4", "--allow-cut-answers"]) == 0
    options = json.loads((out / "manifest.json").read_text())["task_options"]
    assert options["niah_single_1"]["max_new_tokens"] == 4 and options["niah_multikey_2"]["max_new_tokens"] == 128
    rows = [r for f in sorted((out / "inputs").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert {r["task"]: r["full_n_generated"] <= (4 if r["task"] == "niah_single_1" else 128) for r in rows} == {
        "niah_single_1": True, "niah_multikey_2": True}


def test_validate_warns_and_strict_fails(cut_run, capsys):
    assert cli.main(["validate", str(cut_run)]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert captured.out == ""
    assert any("run/niah_single_1:" in w and "stopped at the 4-token decode limit" in w for w in warnings)
    assert "| run " in captured.err and "niah_single_1" in captured.err  # the per (run, task, arm) table
    assert cli.main(["validate", str(cut_run), "--strict"]) == 1
    assert any(line.startswith("warning:") for line in capsys.readouterr().out.splitlines())


def test_whatif_and_report_warn_and_strict_fails(cut_run, tmp_path, capsys):
    assert cli.main(["whatif", str(cut_run), "--tau", "0.07"]) == 0  # both tasks flagged: one folded line
    assert "2 (run, task) cells hold full-KV answers the decode limit may have cut" in capsys.readouterr().err
    assert cli.main(["whatif", str(cut_run), "--tau", "0.07", "--strict"]) == 1
    assert "--strict" in capsys.readouterr().err
    assert cli.main(["report", str(cut_run), "--out", str(tmp_path / "rep"), "--strict"]) == 1
    assert not (tmp_path / "rep" / "index.html").exists()


def test_text_readings_equal_brute_force():
    rng = random.Random(7)
    alphabet = "ab1 .\n-xyz2"
    preds, refs = [], []
    for _ in range(400):
        unit = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
        body = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        pred = body + unit * rng.randint(0, 12) + unit[: rng.randint(0, len(unit))]
        ref = ["".join(rng.choice("ab1") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(0, 3))]
        if ref and rng.random() < 0.4:  # end inside a reference
            pred += " " + ref[0][: rng.randint(0, len(ref[0]))]
        preds.append(pred)
        refs.append(ref)
    got = text_flags(preds, refs)
    assert got["cut"].to_list() == [brute_cut(p, r) for p, r in zip(preds, refs)]
    assert got["looping"].to_list() == [brute_loop(p) for p in preds]
    assert 20 < sum(got["cut"]) < 380 and 20 < sum(got["looping"]) < 380  # both readings are exercised


def test_text_readings_on_shipped_shapes():
    got = text_flags(
        [" 4600fc33-f47f-4fc1-9338-7ebc8dcd572", " 4600fc33-f47f-4fc1-9338-7ebc8dcd5722.", "\n\n" + "hdeack " * 30 + "hde",
         ":\n1. 5781473\n2. 4679992\n3. 35369", "\n" + "The grass is green. There and back again.\n" * 4 + "The gr",
         ":\n1. 1575151\n2. 9407415\n3. 9572803\n4. 9572803\n5. 1575151\n6. 1575151\n7. 1575151\n8. 1575151\n9. 1575151\n"
         "10. 1575151\n11. 1575151\n12.",
         ":\n\nOne of the special magic numbers for gabby-echidna is: 2907437.\nThe grass is green.\nOne of the special "
         "magic numbers for gabby-echidna is: 8007210.\nThe grass is green.\nOne of the special magic numbers for "
         "gabby-echidna is: 2961563.\nThe gr"],
        [["4600fc33-f47f-4fc1-9338-7ebc8dcd5722"], ["4600fc33-f47f-4fc1-9338-7ebc8dcd5722"], ["hdeack", "acdqrp"],
         ["5781473", "3536964"], ["LPYEL"], ["1575151"], ["2907437"]])
    assert got["cut"].to_list() == [True, False, False, True, False, False, False]
    # a list repeating one value is a loop; one that still brings new values (2961563) is not
    assert got["looping"].to_list() == [False, False, True, False, True, True, False]


def test_v1_logs_are_upgraded_and_read_by_text(cut_run, tmp_path):
    """Drop the v2 columns and call the run v1: the reader upgrades it (reason unknown), the profile counts
    the unknown reasons and still finds the answers cut inside a reference by their text."""
    import shutil

    v1 = tmp_path / "v1"
    shutil.copytree(cut_run, v1)
    for table, cols in (("inputs", ["full_n_generated", "full_stop_reason"]), ("outcomes", ["n_generated", "stop_reason"])):
        for f in (v1 / table).glob("*.parquet"):
            t = pq.read_table(f)
            refs = t.column("references").to_pylist() if table == "inputs" else None
            t = t.drop(cols)
            if refs is not None:  # make every full-KV answer end inside its first reference
                t = t.set_column(t.schema.get_field_index("full_prediction"), "full_prediction",
                                 [[f"is {r[0][:-1]}" for r in refs]])
            pq.write_table(t, f)
    manifest = json.loads((v1 / "manifest.json").read_text())
    manifest["schema_version"] = 1
    for entry in manifest["files"]:
        entry["sha256"] = schema.sha256_file(v1 / entry["path"])
    (v1 / "manifest.json").write_text(json.dumps(manifest))
    logs = load([str(v1)])
    assert set(logs.inputs["full_stop_reason"]) == {schema.STOP_UNKNOWN}
    assert logs.inputs["full_n_generated"].null_count() == logs.inputs.height
    profile = decode_profile(logs.files)
    full = profile.filter(profile["arm"] == "full")
    assert full["n_unknown"].to_list() == full["n"].to_list() and full["n_cut"].to_list() == full["n"].to_list()
    flagged = flagged_tasks(profile)
    assert sorted(flagged["task"]) == ["niah_multikey_2", "niah_single_1"]
    # read beside a v2 run (one DuckDB view over both), the v1 rows still count as unknown reasons
    mixed = decode_profile([*logs.files, *load([str(cut_run)]).files])
    full_mixed = mixed.filter(mixed["arm"] == "full").group_by("run").agg(pl.col("n", "n_unknown").sum())
    by_run = {r["run"]: r for r in full_mixed.iter_rows(named=True)}
    assert by_run["v1"]["n_unknown"] == by_run["v1"]["n"] > 0 and by_run["run"]["n_unknown"] == 0
    assert all("the v1 log did not record why decodes stopped" in w for w in limit_warnings(profile))


def test_rambling_text_is_not_cut_text():
    assert not brute_cut("x " + "".join(random.Random(1).choice(string.ascii_lowercase) for _ in range(30)), ["zzzz"])
