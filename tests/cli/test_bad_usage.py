"""Issue 12, the command line and the report: bad options and odd logs get one line, exit 2
for bad usage and 1 for bad logs, and ``report`` never crashes on logs that ``validate``
accepts, nor leaves a half-written report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

from pagestats import io, report, testing
from pagestats.core import schema
from pagestats.cli import main
from pagestats.cli.options import MAX_DRAWS
from pagestats.report.table_entries import TABLES

SMALL = dict(models={"m": (6, 3)}, context_lengths=(512,), tasks=("niah_multikey_3", "vt"), n_inputs=3,
             evictors=("snapkv", "h2o"), budgets=(0.25, 0.5, 1.0), with_topk=False, with_text=False, seed=1)


def _run(tmp_path, **kwargs) -> Path:
    return testing.synthetic_logs(**{**SMALL, **kwargs}).write(tmp_path / "logs", n_shards=2)[0]


def _refresh(run: Path) -> None:
    man = json.loads((run / "manifest.json").read_text())
    man.pop("files")
    schema.write_manifest(run, man)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("cli"))


def _one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("option", [
    ["--theta", "nan"], ["--theta", "inf"], ["--tau", "inf"], ["--tau", "1e400"], ["--tau", "1_0"],
    ["--tau", "0.0\u0667"], ["--layers", "\u0661,\u0662"], ["--layers", "99999999999999999999"],
    ["--pair-draws", "100000000"], ["--pair-draws", str(MAX_DRAWS + 1)], ["--pair-draws", "0"],
    ["--pairs-fraction", "nan"],
    ["--k", "1e3"], ["--seed", "-1"], ["--pilot-n", "\u0664"], ["--bins", "1_0/3"],
    ["--policy", "midpoint", "--midpoint-tasks", "vt,vt"], ["--ta", "0.1"], ["--form", "csv"],
])
def test_bad_whatif_options_exit_2_with_one_line(run, capsys, option):
    with pytest.raises(SystemExit) as exc:
        code = main(["whatif", str(run), *option])
        raise SystemExit(code)
    assert exc.value.code == 2, option
    assert "error" in _one_error_line(capsys)


def test_report_options_are_not_abbreviated(run, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["report", str(run), "--ou", str(tmp_path / "r")])
    assert exc.value.code == 2
    _one_error_line(capsys)


def test_good_numbers_are_still_read(run, capsys):
    assert main(["whatif", str(run), "--tau", "-0.05", "--format", "csv"]) == 0
    assert main(["whatif", str(run), "--tau", ".5e-1", "--pair-draws", "3", "--pairs-fraction", "0.5",
                 "--layers", "0:3,5", "--format", "csv"]) == 0
    capsys.readouterr()


def test_exclude_of_a_nonexistent_id_exits_2(run, capsys):
    run_id = json.loads((run / "manifest.json").read_text())["run_id"]
    assert main(["whatif", str(run), "--exclude", f"{run_id}/vt/99"]) == 2
    assert "matches no inputs" in _one_error_line(capsys)
    assert main(["whatif", str(run), "--exclude", "nope"]) == 2
    _one_error_line(capsys)


# --------------------------------------------------------------------------- bad logs: one line


def test_whatif_on_bad_logs_prints_one_line_with_the_count(tmp_path, capsys):
    run = _run(tmp_path)
    for f in (run / "outcomes").iterdir():
        frame = pl.read_parquet(f).with_columns(pl.lit(2.0).alias("score"))
        schema.write_parquet("outcomes", frame, f)
    _refresh(run)
    assert main(["whatif", str(run)]) == 1
    line = _one_error_line(capsys)
    n = len(io.validate_paths([str(run)]))
    assert n > 10
    assert line.startswith(f"error: {n} problems in the logs: ") and "pagestats validate" in line
    assert "score outside" in line


# --------------------------------------------------------------------------- report


def _index(out: Path) -> dict:
    return json.loads((out / "index.json").read_text())


def _skips(out: Path) -> dict:
    return {o["name"]: o["skipped"] for o in _index(out)["outputs"]}


SIGNAL_ENTRIES = [e for e in TABLES if e.name in ("tab05_06_signal_ablation", "tabN1_pilot_sensitivity")]


def test_report_skips_signals_missing_from_one_part_or_nan(tmp_path):
    run = _run(tmp_path)
    first = sorted((run / "inputs").iterdir())[0]
    n_first = pl.read_parquet(first).height  # the inputs of the first part lose their signals
    schema.write_parquet("inputs", pl.read_parquet(first).drop("signals"), first)
    _refresh(run)
    assert io.validate_paths([str(run)]) == []
    out = tmp_path / "out"
    report.build_report(io.load([str(run)]), out, entries=SIGNAL_ENTRIES, formats=("png",))
    assert f"signal 'attention_entropy' is missing or not finite for {n_first} of 6 inputs" in _skips(out)[
        "tab05_06_signal_ablation"]

    run = _run(tmp_path / "nan")
    frame = pl.read_parquet(first_nan := sorted((run / "inputs").iterdir())[0])
    frame = frame.with_columns(pl.col("signals").struct.with_fields(
        pl.when(pl.int_range(pl.len()) == 0).then(float("nan")).otherwise(pl.field("top1_mass")).alias("top1_mass")))
    schema.write_parquet("inputs", frame, first_nan)
    _refresh(run)
    assert io.validate_paths([str(run)]) == []
    report.build_report(io.load([str(run)]), out, entries=SIGNAL_ENTRIES, formats=("png",))
    assert "signal 'top1_mass' is missing or not finite for 1 of 6 inputs" in _skips(out)["tab05_06_signal_ablation"]


def test_report_on_one_input_skips_the_pilot_table(tmp_path):
    run = _run(tmp_path, tasks=("vt",), n_inputs=1)
    out = tmp_path / "out"
    report.build_report(io.load([str(run)]), out, entries=SIGNAL_ENTRIES, formats=("png",))
    assert "the z-scored pilot needs ≥ 2 inputs" in _skips(out)["tabN1_pilot_sensitivity"]


def test_report_on_zero_inputs_writes_an_index_of_skips(tmp_path):
    """Logs without inputs cannot come from the command line (a run without rows is refused, and so
    are exclusions that leave none), but ``build_report`` takes any Logs: every entry is skipped."""
    import dataclasses

    logs = io.load([str(_run(tmp_path))])
    empty = dataclasses.replace(logs, inputs=logs.inputs.head(0), outcomes=logs.outcomes.head(0),
                                topk=None if logs.topk is None else logs.topk.head(0))
    out = tmp_path / "out"
    report.build_report(empty, out, formats=("png",))
    skips = _skips(out)
    assert skips and all(reason == "the logs have no inputs (after exclusions)" for reason in skips.values())


def test_report_with_mathtext_in_names(tmp_path, capsys):
    run = _run(tmp_path, models={"$\\frac{a$": (6, 3)}, tasks=("niah_multikey_3", "$\\frac{b$"))
    out = tmp_path / "out"
    assert main(["report", str(run), "--out", str(out)]) == 0
    written = [o for o in _index(out)["outputs"] if o["kind"] == "figure" and not o["skipped"]]
    assert len(written) >= 5
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    capsys.readouterr()


@pytest.mark.parametrize("out", ["", "/dev/null/x", "FILE", "FOLDER"])
def test_bad_out_exits_2(run, tmp_path, capsys, out):
    if out == "FILE":
        (tmp_path / "file").write_text("keep me")
        out = str(tmp_path / "file")
    elif out == "FOLDER":
        (tmp_path / "folder").mkdir()
        (tmp_path / "folder" / "notes.txt").write_text("keep me")
        out = str(tmp_path / "folder")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["report", str(run), "--out", out]) == 2
    finally:
        os.chdir(cwd)
    assert _one_error_line(capsys).startswith("error: --out")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"file", "folder"} & {p.name for p in tmp_path.iterdir()})
    for keep in (tmp_path / "file", tmp_path / "folder" / "notes.txt"):
        if keep.exists():
            assert keep.read_text() == "keep me"


def test_a_failing_report_leaves_the_previous_one(run, tmp_path):
    out = tmp_path / "out"
    logs = io.load([str(run)])
    report.build_report(logs, out, entries=TABLES[:1], formats=("png",))
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))

    def boom(ctx):
        raise RuntimeError("an entry that fails")

    bad = [TABLES[1], report.Entry("boom", "table", "none", boom)]
    with pytest.raises(RuntimeError):
        report.build_report(logs, out, entries=bad, formats=("png",))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no partial folder left behind
    report.build_report(logs, out, entries=TABLES[1:2], formats=("png",))  # replaces the previous report
    assert _index(out)["outputs"][0]["name"] == TABLES[1].name
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


DECISION_ENTRIES = ("figN1_decision_frontier", "tabN2_decision_frontier")


def test_decision_entries_skip_runs_that_disagree_on_the_cache_layout(tmp_path):
    """Two runs of one (model, context_length) whose manifests give different KV layouts: each is
    valid, but the GiB axis has no single value; the entries are skipped with the reason (the
    decision figure raised before)."""
    syn = testing.synthetic_logs(**{**SMALL, "input_draws": (0, 1)})
    syn.inputs = syn.inputs.with_columns(pl.lit(0, dtype=syn.inputs.schema["draw"]).alias("draw"))  # one input set per cell: the report reads both runs
    for manifest in syn.manifests.values():
        manifest["draw"] = 0
    runs = syn.write(tmp_path / "logs")
    assert len(runs) == 2
    man = json.loads((runs[1] / "manifest.json").read_text())
    man["model"]["n_kv_heads"] = 1
    (runs[1] / "manifest.json").write_text(json.dumps(man))
    assert io.validate_paths([str(r) for r in runs]) == []
    out = tmp_path / "out"
    entries = [e for e in report.catalogue() if e.name in DECISION_ENTRIES]
    report.build_report(io.load([str(r) for r in runs]), out, entries=entries, formats=("png",))
    skips = _skips(out)
    assert all("disagree on the KV-cache layout" in (skips[name] or "") for name in DECISION_ENTRIES), skips


def test_report_no_pdf_writes_each_figure_once(run, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["report", str(run), "--out", str(out), "--no-pdf"]) == 0
    figures = [f for o in _index(out)["outputs"] if o["kind"] == "figure" for f in o["files"]]
    assert figures and all(f.endswith(".png") for f in figures)
    assert not list(out.rglob("*.pdf"))


def test_a_band_with_an_unreadable_frozen_at_is_a_preregistration_error():
    from pagestats.io.prereg import PreregistrationError, check_frozen_before

    with pytest.raises(PreregistrationError, match="frozen_at 'soon' is not an ISO 8601 time stamp"):
        check_frozen_before({"frozen_at": "soon"}, {"r": {"created_at": "2025-01-01T00:00:00Z"}}, ["r"])


@pytest.mark.parametrize("command", [["whatif"], ["whatif", "--format", "csv"], ["whatif", "--policy", "midpoint"],
                                     ["report", "--no-pdf", "--out"]])
def test_exclusions_that_leave_no_inputs_are_bad_usage(run, command, capsys, tmp_path):
    """Found by the fuzz's cli family: excluding every run gave an empty csv table (exit 0), an
    unrelated error for the summary or the midpoint pilot, and an empty report."""
    run_id = json.loads((run / "manifest.json").read_text())["run_id"]
    tail = [str(tmp_path / "r")] if command[0] == "report" else []
    assert main([command[0], str(run), "--exclude", run_id, *command[1:], *tail]) == 2
    assert "the exclusions leave no inputs" in _one_error_line(capsys)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("name", ["part-*.parquet", "part-?.parquet", "part-[0].parquet"])
def test_whatif_reads_a_part_with_glob_characters_literally(tmp_path, name, capsys):
    """Found by the long fuzz on the final code: whatif on parquet logs views the files in place
    through DuckDB, which read 'part-*.parquet' as a pattern matching both parts (duplicated
    inputs, different numbers, exit 0). Such names now go through the reader that takes them
    literally."""
    run = _run(tmp_path)
    assert main(["whatif", str(run), "--format", "csv"]) == 0
    clean = pl.read_csv(capsys.readouterr().out.encode())
    first = sorted((run / "inputs").iterdir())[0]
    first.rename(first.with_name(name))
    _refresh(run)
    assert main(["whatif", str(run), "--format", "csv"]) == 0
    assert pl.read_csv(capsys.readouterr().out.encode()).equals(clean)


def test_index_refuses_a_part_with_glob_characters(tmp_path, capsys):
    """A database views the files through read_parquet, which would read 'part-*.parquet' as a
    pattern: the index refuses it with one line naming the file (exit 1)."""
    run = _run(tmp_path)
    first = sorted((run / "inputs").iterdir())[0]
    first.rename(first.with_name("part-*.parquet"))
    _refresh(run)
    assert main(["index", str(run), "--db", str(tmp_path / "logs.db")]) == 1
    assert "part-*.parquet" in _one_error_line(capsys) and not (tmp_path / "logs.db").exists()
