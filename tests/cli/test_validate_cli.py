"""`pagestats validate LOGS...` (docs/CLI.md): exit 0 when valid, else exit 1 and one line per
problem naming the file (and row)."""

from __future__ import annotations

import os
import subprocess
import sys

from pagestats.cli import main

from logbuild import input_row, outcome_row, write_run


def test_validate_ok_exit_zero(tmp_path, capsys):
    run = write_run(tmp_path)
    assert main(["validate", str(run)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "ok" in err


def test_validate_prints_one_line_per_problem(tmp_path, capsys):
    def mutate(ins, ocs, tks, man):
        ins[input_row(1, 1)]["drop"] = float("nan")
        ocs[outcome_row(0, 0, "h2o", 0.25)]["score"] = -1.0

    run = write_run(tmp_path, mutate=mutate)
    assert main(["validate", str(run)]) == 1
    lines = capsys.readouterr().out.splitlines()
    inputs = os.path.normpath(str(run / "inputs" / "part-0000.parquet"))
    outcomes = os.path.normpath(str(run / "outcomes" / "part-0000.parquet"))
    assert any(line.startswith(f"{inputs}:row {input_row(1, 1)}: drop is NaN") for line in lines), lines
    assert any(line.startswith(f"{outcomes}:row {outcome_row(0, 0, 'h2o', 0.25)}: score outside") for line in lines)
    assert len(lines) == 2


def test_validate_subprocess(tmp_path):
    good = write_run(tmp_path / "good")
    bad = write_run(tmp_path / "bad", "r2")
    f = bad / "outcomes" / "part-0001.parquet"
    f.write_bytes(f.read_bytes()[:100])
    cmd = [sys.executable, "-m", "pagestats", "validate"]
    ok = subprocess.run([*cmd, str(good)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    res = subprocess.run([*cmd, str(good), str(tmp_path / "bad" / "*")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    name = os.path.normpath(str(f))
    assert any(line.startswith(f"{name}: cannot read parquet file") for line in lines), res.stdout
    assert any(line.startswith(f"{name}: sha256") for line in lines)
    assert "Traceback" not in res.stdout + res.stderr
    assert len(lines) == 2  # unreadable, sha256 (its row count cannot be read)
