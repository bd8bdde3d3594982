"""The report: every catalogue entry either writes its files or is skipped with a reason;
the index names every log file with its sha256 and rows, and the policy and defaults."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import polars as pl
import pytest
from matplotlib.figure import Figure

from pagestats import defaults, io, report, tables, testing
from pagestats.report.context import needs_agreement, needs_contexts, needs_draws, needs_topk
from pagestats.report.figure_entries import FIGURES
from pagestats.report.table_entries import TABLES

SMALL = dict(models={"tiny": (6, 3)}, evictors=("snapkv", "h2o"), tasks=("niah_multikey_3", "vt", "fwe"),
             n_inputs=4, budgets=(0.125, 0.5, 1.0), with_topk=False, with_text=False)


def _load(tmp_path, **kwargs):
    syn = testing.synthetic_logs(**{**SMALL, **kwargs})
    runs = syn.write(tmp_path / "logs")
    return io.load([str(r) for r in runs])


@pytest.fixture(scope="module")
def two_context(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    logs = _load(tmp, context_lengths=(4096, 16384))
    index = report.build_report(logs, tmp / "out", formats=("png",))  # PDF: see the single-context test
    return logs, Path(index)


def test_index_names_every_file_with_its_hash(two_context):
    logs, index = two_context
    meta = json.loads((index.parent / "index.json").read_text())
    assert len(meta["files"]) == len(logs.files) > 0
    text = index.read_text()
    for rec in meta["files"]:
        digest = hashlib.sha256(Path(rec["path"]).read_bytes()).hexdigest()
        assert rec["sha256"] == digest
        assert digest in text and rec["path"] in text
        assert rec["rows"] == pl.read_parquet(rec["path"]).height
    assert meta["policy"]["type"] == "FixedTau" and meta["policy"]["tau"] == defaults.TAU
    assert meta["defaults"]["tau"] == defaults.TAU
    assert meta["defaults"]["budgets"] == list(defaults.BUDGETS)
    assert meta["n_inputs"] == logs.inputs.height


def test_every_figure_written_or_skipped_with_reason(two_context):
    _, index = two_context
    meta = json.loads((index.parent / "index.json").read_text())
    names = [o["name"] for o in meta["outputs"]]
    assert [e.name for e in FIGURES] == [n for n in names if n.startswith("fig")]
    for o in meta["outputs"]:
        if o["skipped"]:
            assert o["files"] == [] and "\n" not in o["skipped"]
            continue
        assert o["files"], o["name"]
        for f in o["files"]:
            assert (index.parent / f).stat().st_size > 0
        if o["kind"] == "figure":
            assert {Path(f).suffix for f in o["files"]} == {".png"}
        else:
            assert {".csv", ".md"} <= {Path(f).suffix for f in o["files"]}
    # with two contexts, both classes and budgets < 1, no figure has a reason to be skipped
    assert not [o for o in meta["outputs"] if o["kind"] == "figure" and o["skipped"]]
    assert "fig09_rho_vs_headroom.png" in index.read_text()


def test_single_context_skips_fig9_with_reason(tmp_path):
    logs = _load(tmp_path, context_lengths=(4096,))
    entries = [e for e in FIGURES if e.name in ("fig08_delta_matrix", "fig09_rho_vs_headroom")]
    index = Path(report.build_report(logs, tmp_path / "out", entries=entries))
    meta = json.loads((index.parent / "index.json").read_text())
    out = {o["name"]: o for o in meta["outputs"]}
    assert out["fig08_delta_matrix"]["skipped"] is None
    assert [Path(f).suffix for f in out["fig08_delta_matrix"]["files"]] == [".png", ".pdf"]
    reason = out["fig09_rho_vs_headroom"]["skipped"]
    assert "context length" in reason and "4096" in reason
    assert f"SKIPPED: {reason}" in index.read_text()
    assert not list((index.parent / "figures").glob("fig09*"))


def test_one_class_skips_class_contrasts(tmp_path):
    logs = _load(tmp_path, tasks=("vt", "fwe"), context_lengths=(4096,))
    entries = [e for e in FIGURES if e.name in ("fig06_tau_sensitivity", "fig07_delta_of_f")]
    index = Path(report.build_report(logs, tmp_path / "out", entries=entries))
    meta = json.loads((index.parent / "index.json").read_text())
    for o in meta["outputs"]:
        assert "capacity-bound" in o["skipped"]


def test_requirements_on_context(tmp_path):
    logs = _load(tmp_path, context_lengths=(4096,))
    ctx = report.Context(logs)
    assert needs_topk(ctx)  # generated without top-k
    assert needs_draws(2)(ctx) and needs_draws(1)(ctx) is None
    assert needs_contexts(1)(ctx) is None
    assert needs_agreement(ctx) is None
    assert ctx.headline_evictor == "snapkv"


def test_empty_output_is_skipped_not_written(tmp_path):
    logs = _load(tmp_path, context_lengths=(4096,))
    empty_fig = report.Entry("x_empty", "figure", "none", lambda ctx: Figure().add_subplot())
    empty_tab = report.Entry("x_table0", "table", "none", lambda ctx: pl.DataFrame({"a": []}))
    table = report.Entry("x_table", "table", "Table X",
                         lambda ctx: ctx.gate.group_by("task").agg(pl.col("drop").mean()).sort("task"))
    index = Path(report.build_report(logs, tmp_path / "out", entries=[empty_fig, empty_tab, table]))
    meta = {o["name"]: o for o in json.loads((index.parent / "index.json").read_text())["outputs"]}
    assert "without data" in meta["x_empty"]["skipped"]
    assert "without rows" in meta["x_table0"]["skipped"]
    csv = pl.read_csv(index.parent / "tables" / "x_table.csv")
    assert csv["task"].to_list() == sorted(logs.inputs["task"].unique().to_list())
    md = (index.parent / "tables" / "x_table.md").read_text().splitlines()
    assert md[0] == "| task | drop |" and len(md) == 2 + csv.height


def test_markdown_table_formats():
    frame = pl.DataFrame({"a": [1, None], "b": [0.123456789, float("nan")], "c": ["x|y", "z"]})
    assert tables.markdown_table(frame).splitlines() == [
        "| a | b | c |", "|---|---|---|", "| 1 | 0.1235 | x\\|y |", "|  | NaN | z |"]


def test_report_is_byte_reproducible(two_context, tmp_path):
    """Two builds of the tables from the same logs write identical bytes (HTML ids included)."""
    logs, _ = two_context
    outs = [Path(report.build_report(logs, tmp_path / f"run{i}", entries=TABLES)).parent
            for i in (1, 2)]
    files = sorted(p.relative_to(outs[0]) for p in outs[0].rglob("*") if p.is_file())
    assert any(f.suffix == ".html" for f in files) and any(f.suffix == ".csv" for f in files)
    assert files == sorted(p.relative_to(outs[1]) for p in outs[1].rglob("*") if p.is_file())
    changed = [str(f) for f in files if (outs[0] / f).read_bytes() != (outs[1] / f).read_bytes()]
    assert changed == []
