"""The command line for people: ``--version``, help text with a default on every option, and
no citation of a document the repository does not hold (docs/CLI.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import pagestats
from pagestats.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"pagestats {pagestats.__version__}"


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices


def test_every_option_has_help_with_its_default():
    from collectors import cli as collect_cli

    for name, sub in [*_subparsers().items(), ("pagestats-collect", collect_cli.parser())]:
        formatter = sub._get_formatter()
        for action in sub._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, f"{name} {action.option_strings[0]} has no help"
            text = formatter._expand_help(action)
            if action.required:
                continue
            # an option that is off, unset or empty by default says what that means in its help
            assert "default" in text, f"{name} {action.option_strings[0]}: help does not state the default: {text!r}"


def test_help_runs_for_every_command(capsys):
    """Every command's --help exits 0 with its usage, here through main(); one through ``python -m
    pagestats`` in a process of its own (the module entry point, nothing imported before it)."""
    for name in _subparsers():
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        out, err = capsys.readouterr()
        assert exc.value.code == 0 and f"usage: pagestats {name}" in out, err
    out = subprocess.run([sys.executable, "-m", "pagestats", "report", "--help"], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0 and "usage: pagestats report" in out.stdout, out.stderr


def test_nothing_cites_a_document_outside_the_repo():
    hits = []
    for folder in ("pagestats", "collectors", "docs", "notebooks", "bench", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".md", ".ipynb"} and path.name != "test_cli.py":
                if re.search(r"\bDESIGN\b", path.read_text(encoding="utf-8", errors="replace")):
                    hits.append(str(path.relative_to(ROOT)))
    for name in ("README.md", "data/README.md"):
        if re.search(r"\bDESIGN\b", (ROOT / name).read_text()):
            hits.append(name)
    assert not hits, f"cite the docs/ page instead of DESIGN in {hits}"
    for page in ("SCHEMA.md", "DEFINITIONS.md", "CLI.md", "COLLECTION.md", "PERFORMANCE.md", "ARCHITECTURE.md"):
        assert (ROOT / "docs" / page).is_file(), page


def test_docs_links_resolve():
    for page in list((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to a missing {target}"


# --------------------------------------------------------------------------- whatif for people
import csv  # noqa: E402
import io as stdio  # noqa: E402
import json  # noqa: E402
from contextlib import redirect_stdout  # noqa: E402

import polars as pl  # noqa: E402

from pagestats import metrics
from pagestats.core import schema# noqa: E402
from pagestats.core.columns import MATRIX_CELL  # noqa: E402
from pagestats.io import load  # noqa: E402
from pagestats.replay import FixedTau, gated_outcomes  # noqa: E402
from pagestats.replay.whatif import WHATIF_COLUMNS, whatif_summary, whatif_table  # noqa: E402


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two synthetic runs (two models, two contexts, two evictors, three budgets)."""
    from pagestats.testing import synthetic_logs

    s = synthetic_logs(models={"m-a": (6, 4), "m-b": (8, 4)}, n_inputs=6, tasks=("niah_multikey_3", "vt", "fwe"),
                       evictors=("snapkv", "h2o"), context_lengths=(4096, 8192), budgets=(0.25, 0.5, 1.0),
                       with_topk=False, seed=3)
    return [str(p) for p in s.write(tmp_path_factory.mktemp("runs"))]


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_whatif_summary_is_the_matrix_delta(two_runs):
    logs = load(two_runs)
    table = whatif_table(logs, FixedTau(0.05))
    summary = whatif_summary(table)
    gated = gated_outcomes(logs, FixedTau(0.05))
    # mean over inputs and budgets b < 1 of gated − plain
    ref = metrics.delta(metrics.relation(gated), by=list(MATRIX_CELL))
    joined = summary.join(ref, on=list(MATRIX_CELL), suffix="_ref")
    assert joined.height == summary.height == ref.height == 8
    assert joined["delta"].to_numpy() == pytest.approx(joined["delta_ref"].to_numpy(), abs=1e-12)
    # p_open and the inputs counted once per cell, by brute force over the gated rows
    for row in summary.iter_rows(named=True):
        cell = gated.filter((pl.col("model") == row["model"]) & (pl.col("context_length") == row["context_length"])
                            & (pl.col("evictor") == row["evictor"]) & (pl.col("budget") < 1))
        per_input = cell.unique(subset=["run_id", "task", "input_id"])
        assert row["n_inputs"] == per_input.height
        assert row["p_open"] == pytest.approx(per_input["gate_open"].mean())
        assert row["kept_kv"] == pytest.approx((cell["n_kept_gated"] / cell["n_tokens"]).mean())
        assert row["harm_gated"] == pytest.approx((cell["score_gated"] < cell["score_full"]).mean())


def test_whatif_prints_the_summary_by_default(two_runs, capsys):
    rc, out, err = _run(["whatif", *two_runs, "--tau", "0.05"], capsys)
    assert rc == 0
    lines = out.splitlines()
    # one block per (model, context) under its heading, one row per evictor
    headings = [ln for ln in lines if ln.startswith("m-")]
    assert headings == [f"{m}, context {c:,} tokens" for m in ("m-a", "m-b") for c in (4096, 8192)]
    assert len([ln for ln in lines if ln.split(" ")[0] in ("snapkv", "h2o")]) == 8
    assert lines[1].split() == ["acc", "%", "acc", "%", "Δ", "harm", "%", "harm", "%", "open", "kept"]
    assert lines[2].split() == ["evictor", "n", "plain", "gated", "pp", "plain", "gated", "%", "KV", "%"]
    assert max(map(len, lines)) <= 100
    rc, out, _ = _run(["whatif", *two_runs, "--by", "evictor,task", "--evictor", "h2o"], capsys)
    assert rc == 0 and len([ln for ln in out.splitlines() if ln.startswith("h2o ")]) == 3


def test_whatif_table_in_percent_and_pp(two_runs, capsys):
    """The table shows rates in % and Δ in pp, as the report does: each number is the summary's
    value × 100 (the csv's fraction), Δ with its sign; the legend says so and --help names every column."""
    rc, out, _ = _run(["whatif", two_runs[0], "--tau", "0.05", "--context", "4096", "--evictor", "h2o"], capsys)
    assert rc == 0
    row = next(ln for ln in out.splitlines() if ln.startswith("h2o ")).split()
    logs = load([two_runs[0]])
    ref = whatif_summary(whatif_table(logs, FixedTau(0.05))).filter(
        (pl.col("context_length") == 4096) & (pl.col("evictor") == "h2o")).row(0, named=True)
    assert int(row[1]) == ref["n_inputs"]
    shown = dict(zip(["acc_plain", "acc_gated", "delta", "harm_plain", "harm_gated", "p_open", "kept_kv"],
                     row[2:]))
    for name, text in shown.items():
        assert float(text) == pytest.approx(ref[name] * 100, abs=0.05), name
    assert shown["delta"][0] in "+-"
    assert "in %, Δ in percentage points (pp)" in out
    helped = subprocess.run([sys.executable, "-m", "pagestats", "whatif", "--help"], capture_output=True, text=True,
                            cwd=ROOT).stdout
    for word in ("acc % plain / gated", "Δ pp", "harm %", "open %", "kept KV %", "--wide"):
        assert word in " ".join(helped.split()), word


def test_whatif_summary_fits_100_columns_and_wide_prints_long_names_whole(tmp_path, capsys):
    """A kvpress evictor with its parameters and a long model name: by default the table fits 100
    columns, the name shortened in the middle and the table saying so; --wide prints it whole."""
    from pagestats.testing import synthetic_logs

    name = "kvpress:ObservedAttentionPress:window_size=32:compression_ratio=0.5"
    s = synthetic_logs(models={"m": (4, 2)}, n_inputs=4, tasks=("niah_multikey_3", "vt"), evictors=("snapkv", name),
                       budgets=(0.5, 1.0), with_topk=False, with_text=False)
    runs = [str(p) for p in s.write(tmp_path / "logs")]
    rc, out, _ = _run(["whatif", *runs, "--by", "evictor,task"], capsys)
    assert rc == 0
    assert max(map(len, out.splitlines())) <= 100
    rows = [ln for ln in out.splitlines() if ln.startswith("kvpress:")]
    assert len(rows) == 2 and all("…" in ln and name not in ln for ln in rows)
    assert "--wide prints them whole" in out
    rc, out, _ = _run(["whatif", *runs, "--by", "evictor,task", "--wide"], capsys)
    rows = [ln for ln in out.splitlines() if ln.startswith("kvpress:")]
    assert rc == 0 and len(rows) == 2 and all(ln.startswith(name + " ") for ln in rows)
    assert "…" not in out and "..." not in out


@pytest.mark.parametrize("argv, needle", [
    (["--by", "evictor,colour"], "--by takes distinct keys"),
    (["--evictor", "snapkv,quest"], "no evictor quest in the logs; they hold h2o, snapkv"),
    (["--task", "qa_1"], "no task qa_1"),
    (["--context", "4096,2048"], "no context_length 2048"),
    (["--context", "4k"], "--context: cannot read"),
    (["-o", "table.xlsx"], "the extension must be one of .csv, .parquet, .json"),
])
def test_whatif_bad_rows_or_output_exit_2(two_runs, capsys, tmp_path, argv, needle):
    argv = [a if a != "table.xlsx" else str(tmp_path / a) for a in argv]
    rc, out, err = _run(["whatif", *two_runs, *argv], capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_whatif_filters_and_output_files(two_runs, capsys, tmp_path):
    rc, out, _ = _run(["whatif", *two_runs, "--format", "csv", "--evictor", "snapkv", "--context", "8192",
                       "--task", "vt,fwe"], capsys)
    assert rc == 0
    rows = list(csv.DictReader(stdio.StringIO(out)))
    assert tuple(rows[0].keys()) == WHATIF_COLUMNS  # exactly the contract's columns
    full = whatif_table(load(two_runs))
    expected = full.filter((pl.col("evictor") == "snapkv") & (pl.col("context_length") == 8192)
                           & pl.col("task").is_in(["vt", "fwe"]))
    assert len(rows) == expected.height == 2 * 2 * 3  # models × tasks × budgets
    written = {}
    for ext in ("csv", "parquet", "json"):
        path = tmp_path / f"w.{ext}"
        rc, out, err = _run(["whatif", *two_runs, "-o", str(path)], capsys)
        assert rc == 0 and f"wrote {full.height} rows × 15 columns to {path}" in err
        assert "m-a, context 4,096 tokens" in out  # the summary still goes to stdout
        written[ext] = {"csv": pl.read_csv, "parquet": pl.read_parquet, "json": pl.read_json}[ext](path)
    for ext, frame in written.items():
        assert frame.columns == list(WHATIF_COLUMNS), ext
        assert frame.height == full.height
        assert frame["delta"].to_list() == full["delta"].to_list(), ext  # full precision in every format
    assert json.loads((tmp_path / "w.json").read_text())[0]["model"] == full["model"][0]


# --------------------------------------------------------------------------- show, compact, --exclude
DATA = ROOT / "data"
SMALL = DATA / "smollm2-512-draw1-snapkv"  # 30 inputs (niah_multikey_3, vt × 15) written as 8 parts per table
SMALL_RUN = "SmolLM2-135M-Instruct-512-6008265466671415"  # its run_id
needs_data = pytest.mark.skipif(not (SMALL / "manifest.json").is_file(), reason="shipped logs not present")


@needs_data
def test_show_one_input(capsys):
    logs = load([str(SMALL)], columns="all")
    row = logs.inputs.filter((pl.col("task") == "vt") & (pl.col("input_id") == 3)).row(0, named=True)
    rc, out, err = _run(["show", str(SMALL), "--input", f"{SMALL.name}/vt/3"], capsys)  # the directory name
    assert rc == 0, err
    assert out.startswith(f"input {row['run_id']}/vt/3\n")
    lines = row["prompt"].splitlines()
    assert f"  | {lines[0]}\n  | {lines[1]}\n" in out and f"  | {lines[-1]}\n" in out  # head and tail
    assert all(repr(r) in out for r in row["references"])
    assert f"D = {row['drop']:.4f}" in out
    assert ("gate open" in out) == (row["drop"] >= 0.07)
    from pagestats.cli.show import sparkline

    assert sparkline(row["agreement"]) in out and len(sparkline(row["agreement"])) == len(row["agreement"])
    arms = logs.outcomes.filter((pl.col("task") == "vt") & (pl.col("input_id") == 3))
    assert sum(1 for line in out.splitlines() if line.startswith("snapkv ")) == arms.height
    rc, out2, _ = _run(["show", str(SMALL), "--input", f"{row['run_id']}/vt/3"], capsys)  # the run_id
    assert rc == 0 and out2 == out


@needs_data
@pytest.mark.parametrize("spec, needle", [
    ("nope/vt/3", "no run 'nope'; the runs are"), ("smollm2-512-draw1-snapkv/qa_1/0", "has no task 'qa_1'"),
    ("smollm2-512-draw1-snapkv/vt/99", "no input 99"), ("smollm2-512-draw1-snapkv/vt", "RUN/TASK/ID"),
])
def test_show_bad_input_exit_2(capsys, spec, needle):
    rc, out, err = _run(["show", str(SMALL), "--input", spec], capsys)
    assert rc == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1


def test_sparkline_scales_min_to_max():
    from pagestats.cli.show import BLOCKS, sparkline

    assert sparkline([0.0, 0.5, 1.0]) == BLOCKS[0] + BLOCKS[4] + BLOCKS[-1]  # 0.5·7 = 3.5 rounds to 4
    assert sparkline([2.0, 2.0]) == BLOCKS[0] * 2


@needs_data
def test_compact_keeps_every_row_and_the_whatif(tmp_path, capsys):
    before = json.loads((SMALL / "manifest.json").read_text())
    assert len([f for f in before["files"] if f["path"].startswith("inputs/")]) > 1
    out = tmp_path / "compacted"
    rc, _, err = _run(["compact", str(SMALL), "--out", str(out)], capsys)
    assert rc == 0 and "validated" in err
    after = json.loads((out / "manifest.json").read_text())
    assert sorted(f["path"].split("/")[0] for f in after["files"]) == ["inputs", "outcomes", "topk"]
    for table in ("inputs", "outcomes", "topk"):
        assert sum(f["rows"] for f in after["files"] if f["path"].startswith(table)) == \
            sum(f["rows"] for f in before["files"] if f["path"].startswith(table))
    # a v1 run is written in the current schema version (upgraded as on read); every other key is kept
    assert after["schema_version"] == schema.SCHEMA_VERSION
    assert {k: v for k, v in after.items() if k not in ("files", "compacted_from", "schema_version")} == \
        {k: v for k, v in before.items() if k not in ("files", "schema_version")}
    assert after["compacted_from"]["files"] == len(before["files"])
    a, b = load([str(SMALL)], columns="all"), load([str(out)], columns="all")
    for name in ("inputs", "outcomes", "topk"):
        assert getattr(a, name).equals(getattr(b, name)), name  # every row, in order, every column
    tables = []
    for run in (SMALL, out):
        rc, text, _ = _run(["whatif", str(run), "--format", "csv"], capsys)
        assert rc == 0
        tables.append(pl.read_csv(stdio.StringIO(text)))
    # the same rows and keys; the values equal up to the whatif query's parallel summation order
    # (two runs of the query on the same files may differ in the last bit)
    assert tables[0].columns == tables[1].columns and tables[0].height == tables[1].height
    keys = ["model", "context_length", "evictor", "task", "budget", "n_inputs"]
    assert tables[0].select(keys).equals(tables[1].select(keys))
    for c in tables[0].columns[len(keys):]:
        assert tables[0][c].to_numpy() == pytest.approx(tables[1][c].to_numpy(), rel=1e-14, abs=1e-15), c
    # parts of a chosen size; an existing target is refused; bad logs are exit 1
    rc, _, _ = _run(["compact", str(SMALL), "--out", str(tmp_path / "parts"), "--rows", "25"], capsys)
    parts = json.loads((tmp_path / "parts" / "manifest.json").read_text())["files"]
    assert rc == 0 and [f["rows"] for f in parts if f["path"].startswith("inputs/")] == [25, 5]
    rc, _, err = _run(["compact", str(SMALL), "--out", str(out)], capsys)
    assert rc == 2 and "exists" in err


def test_compact_refuses_bad_logs(two_runs, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(two_runs[0], bad)
    victim = next((bad / "outcomes").glob("*.parquet"))
    victim.write_bytes(victim.read_bytes()[:-20])
    rc, out, err = _run(["compact", str(bad), "--out", str(tmp_path / "x")], capsys)
    assert rc == 1 and "problem" in err and not (tmp_path / "x").exists()
    assert not list(tmp_path.glob(".x.compact-*"))
    rc, out, err = _run(["compact", str(tmp_path), "--out", str(tmp_path / "y")], capsys)
    assert rc == 2 and "not a run directory" in err


@needs_data
def test_exclude_takes_the_directory_name(capsys):
    logs = load([str(DATA)], exclude=["smollm2-512-draw1-snapkv/vt"])
    assert f"run {SMALL_RUN}" in logs.exclusions[0]
    assert logs.inputs.filter((pl.col("run_id") == SMALL_RUN) & (pl.col("task") == "vt")).height == 0
    assert logs.inputs.filter((pl.col("run_id") == SMALL_RUN) & (pl.col("task") == "niah_multikey_3")).height == 15
    rc, out, err = _run(["whatif", str(DATA), "--exclude", "smollm2-51"], capsys)
    assert rc == 2 and "the runs are" in err and "(directory smollm2-512)" in err


@needs_data
@pytest.mark.parametrize("bad", [["--by", "nosuch"], ["--context", "x"]])
def test_bad_usage_after_an_exclusion_is_one_line(bad, capsys):
    """An option refused after the logs were read gives its one error line and nothing else
    (the fuzz found the "excluded:" line printed before the error: two lines)."""
    rc, out, err = _run(["whatif", str(SMALL), "--exclude", "smollm2-512-draw1-snapkv/vt", *bad], capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: "), err
    rc, out, err = _run(["whatif", str(SMALL), "--exclude", "smollm2-512-draw1-snapkv/vt"], capsys)
    assert rc == 0 and f"excluded: run {SMALL_RUN}" in err


@needs_data
def test_report_prereg_options_are_checked_before_reading(tmp_path, capsys):
    rc, out, err = _run(["report", str(SMALL), "--exclude", "smollm2-512-draw1-snapkv/vt", "--prereg", "band.json",
                         "--out", str(tmp_path / "r")], capsys)
    assert rc == 2 and err == "error: --prereg and --prereg-sha256 go together\n"


def test_out_of_memory_is_one_line_exit_3(tmp_path, capsys):
    """DuckDB running out of memory (here: a 1 MB limit) is one line naming the way out, exit 3,
    not a traceback."""
    from pagestats.cli import main
    from pagestats.testing import synthetic_logs

    s = synthetic_logs(models={"m": (4, 2)}, n_inputs=4, tasks=("niah_multikey_3", "vt"), evictors=("snapkv",),
                       budgets=(0.5, 1.0), with_topk=False, with_text=False)
    (run,) = s.write(tmp_path / "logs")
    assert main(["whatif", str(run), "--memory-limit", "1MB", "--format", "csv"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: out of memory (") and "--memory-limit" in err[0]


def test_decode_limit_warnings_fold_into_one_line_naming_validate():
    from pagestats.cli.logs import folded_warnings

    one = ["warning: run/vt: 3 of 5 full-KV answers stopped at the 64-token decode limit"]
    assert folded_warnings(one, ["run"]) == one
    many = [*one, "warning: run/fwe: 2 of 5 ...", "warning: other/vt: 4 of 5 ..."]
    folded = folded_warnings(many, ["run", "other"])
    assert len(folded) == 1 and folded[0].startswith("warning: 3 (run, task) cells")
    assert "`pagestats validate run other` lists them" in folded[0]
    long_names = [f"data/a-very-long-run-directory-name-{i}/" for i in range(4)]
    assert "`pagestats validate` on the same LOGS lists them" in folded_warnings(many, long_names)[0]
    assert "`pagestats validate` on the logs the database was indexed from" in folded_warnings(many, [])[0]  # --db


def test_whatif_on_shipped_runs_folds_their_warnings_and_validate_lists_them():
    """Two shipped runs whose full-KV answers the decode limit cut: whatif prints one warning line that
    names the validate command; that command prints both warnings."""
    runs = [str(ROOT / "data" / r) for r in ("smollm2-512-vt-ruler-limits", "smollm2-512-fwe-ruler-limits")]
    if not all(Path(r, "manifest.json").is_file() for r in runs):
        pytest.skip("the shipped runs are not in data/")
    env_cmd = [sys.executable, "-m", "pagestats"]
    out = subprocess.run([*env_cmd, "whatif", *runs], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    warnings = [ln for ln in out.stderr.splitlines() if ln.startswith("warning:") and "decode limit" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("warning: 2 (run, task) cells")
    assert "`pagestats validate` on the same LOGS lists them" in warnings[0]
    listed = subprocess.run([*env_cmd, "validate", *runs], capture_output=True, text=True, cwd=ROOT)
    assert listed.returncode == 0
    listed = [ln for ln in listed.stderr.splitlines() if ln.startswith("warning:")]
    assert len(listed) == 2 and all("decode limit" in ln for ln in listed)


def test_calibrated_tau_is_labelled_with_its_model_and_context(tmp_path, capsys):
    """--policy midpoint sets one τ per (model, context) (Eq. 5): one stderr line each, naming its
    context, with τ = (mean D of the 20 NIAH-MK3 + mean D of the 20 VT inputs) / 2 computed here;
    the z-scored pilot sets one τ per model: one line naming the contexts it pools."""
    from pagestats.testing import synthetic_logs

    s = synthetic_logs(models={"m": (6, 4)}, n_inputs=20, tasks=("niah_multikey_3", "vt"), evictors=("snapkv",),
                       context_lengths=(4096, 8192), budgets=(0.5, 1.0), with_topk=False, with_text=False, seed=5)
    runs = [str(p) for p in s.write(tmp_path / "logs")]
    inputs = load(runs).inputs
    rc, _, err = _run(["whatif", *runs, "--policy", "midpoint"], capsys)
    assert rc == 0
    lines = [ln for ln in err.splitlines() if ln.startswith("pilot ")]
    assert len(lines) == 2
    for line, context in zip(lines, (4096, 8192)):
        d = inputs.filter(pl.col("context_length") == context).group_by("task").agg(pl.col("drop").mean())
        tau = d["drop"].sum() / 2
        assert line.startswith(f"pilot m, context {context:,} tokens: τ = {tau:.6g};"), line
    rc, _, err = _run(["whatif", *runs, "--policy", "z", "--pilot-n", "10"], capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("pilot ")]
    assert rc == 0 and len(lines) == 1 and lines[0].startswith("pilot m, context 4,096, 8,192 tokens pooled: τ = ")
