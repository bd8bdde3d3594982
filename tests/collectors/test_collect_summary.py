"""The end of ``pagestats-collect``: one line for people on what was collected, then the run validated
(exit 1 with one line naming ``pagestats validate`` when it does not); a shard of several says how to
validate the whole run. The JSON line of the run stays on stdout for programs."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from collectors import cli

ARGS = ["--tasks", "niah_single_1", "--context-length", "640", "--n", "2", "--evictors", "snapkv",
        "--budgets", "0.5,1.0", "--max-new-tokens", "4", "--allow-cut-answers", "--no-progress", "--k", "8",
        "--k-max", "16"]


def _collect(model_dir, out, capsys, *extra):
    code = cli.main(["--model", str(model_dir), "--out", str(out), *ARGS, *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def test_a_run_ends_with_a_summary_and_is_validated(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = _collect(model_dir, out, capsys)
    assert code == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["written"] == 2 and summary["out"] == str(out)
    assert err[-2].startswith(f"collected 2 input(s) in ") and f"into {out} (run {summary['run_id']})" in err[-2]
    assert err[-1] == f"valid; next: pagestats whatif {out}  (or pagestats report {out} --out DIR)"

    # a score out of [0, 1] planted in the written outcomes: the resumed run (nothing left to collect) fails validation
    part = sorted((out / "outcomes").glob("*.parquet"))[0]
    table = pq.read_table(part)
    scores = table.column("score").to_pylist()
    pq.write_table(table.set_column(table.schema.get_field_index("score"), "score",
                                    pa.array([2.0, *scores[1:]], pa.float64())), part)
    code, _, err = _collect(model_dir, out, capsys)
    assert code == 1
    assert err[-2].startswith("collected 0 input(s)") and ", 2 there before" in err[-2]
    assert err[-1].startswith("error: the run does not validate: ")
    assert f"`pagestats validate {out}` lists them" in err[-1]


def test_a_shard_says_how_to_validate_the_whole_run(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = _collect(model_dir, out, capsys, "--shard", "0/2")
    assert code == 0, err
    assert ", shard 0/2)" in err[-2] and err[-1] == f"once all 2 shards have finished: pagestats validate {out}"
