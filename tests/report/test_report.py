"""The report: every catalogue entry either writes its files or is skipped with a reason;
the index names every log file with its sha256 and rows, and the policy and defaults."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from matplotlib.figure import Figure
from polars.testing import assert_frame_equal

from pagestats import io, replay, report, tables, testing
from pagestats.core import defaults
from pagestats.replay import FixedTau
from pagestats.report.build import _run_entry, run_order
from pagestats.report.context import needs_agreement, needs_contexts, needs_draws, needs_topk
from pagestats.report.figure_entries import FIGURES
from pagestats.report.table_entries import TABLES

SMALL = dict(models={"tiny": (6, 3)}, evictors=("snapkv", "h2o"), tasks=("niah_multikey_3", "vt", "fwe"),
             n_inputs=4, budgets=(0.0625, 0.5, 1.0), with_topk=False, with_text=False)


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


def test_matched_memory_resampled_beside_the_entries_is_the_one_thread_table(tmp_path):
    """Context.start_matched_memory reads Table N3's rows at once and resamples them on a second
    thread: the table is bit for bit the one computed in line; close() stops a resampling under way."""
    from concurrent.futures import CancelledError

    import numpy as np

    from pagestats import metrics

    logs = _load(tmp_path, context_lengths=(4096, 16384))
    in_line = report.Context(logs).matched_memory
    ctx = report.Context(logs)
    ctx.start_matched_memory()
    assert in_line.height == 4 and ctx._matched is not None
    assert_frame_equal(ctx.matched_memory, in_line)
    cells = metrics.matched_cells(metrics.relation(report.Context(logs).gated))
    stop = threading.Event()
    stop.set()  # what Context.close does
    with pytest.raises(CancelledError):
        cells.resample(rng=np.random.default_rng(0), n_boot=10, stop=stop)


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


# --------------------------------------------------------------------------- the HTML page
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
from html.parser import HTMLParser  # noqa: E402


class _Page(HTMLParser):
    """Every id, link, image source and heading of a page, in document order."""

    def __init__(self):
        super().__init__()
        self.ids, self.hrefs, self.images, self.headings, self._h = set(), [], [], [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and "href" in a:
            self.hrefs.append(a["href"])
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag in ("h2", "h3"):
            self._h = ""

    def handle_data(self, data):
        if self._h is not None:
            self._h += data

    def handle_endtag(self, tag):
        if tag in ("h2", "h3") and self._h is not None:
            self.headings.append(self._h.strip())
            self._h = None


def _page(index: Path) -> tuple[_Page, str]:
    text = (index.parent / "index.html").read_text(encoding="utf-8")
    page = _Page()
    page.feed(text)
    return page, text


def test_html_page_embeds_every_figure_and_has_no_broken_link(two_context):
    _, index = two_context
    meta = json.loads((index.parent / "index.json").read_text())
    page, text = _page(index)
    pngs = [f for o in meta["outputs"] if o["kind"] == "figure" for f in o["files"] if f.endswith(".png")]
    assert len(pngs) >= 10 and len(page.images) == len(pngs)
    for src, f in zip(page.images, pngs):
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]) == (index.parent / f).read_bytes()  # the very file
    assert page.hrefs
    for href in page.hrefs:
        if href.startswith("#"):
            assert href[1:] in page.ids, href
        else:
            assert "://" not in href and (index.parent / href).is_file(), href
    assert "src=\"http" not in text and "<link" not in text  # self-contained: nothing fetched


def test_html_page_reads_finding_first_provenance_last(two_context):
    logs, index = two_context
    meta = json.loads((index.parent / "index.json").read_text())
    page, text = _page(index)
    order = [page.headings.index(h) for h in ("Headline", "Figures", "Tables", "Not produced", "Appendix: provenance")]
    assert order == sorted(order)
    appendix = text.index('id="appendix"')
    for rec in meta["files"]:
        assert text.index(rec["sha256"]) > appendix  # hashes only in the appendix
    # the headline: one row per matrix cell, Δ and its interval equal Table 28's
    boot = pl.read_csv(index.parent / "tables" / "tab28_bootstrap.csv")
    head = pl.DataFrame(meta["headline"])
    assert head.height == boot.height
    joined = head.join(boot, on=["model", "context_length", "evictor"], suffix="_t28")
    for c in ("delta", "low", "high", "p_adjusted"):
        assert joined[c].to_list() == pytest.approx(joined[f"{c}_t28"].to_list(), abs=1e-12)
    gated = report.Context(logs).gated.filter(pl.col("budget") < 1)
    t22 = pl.read_csv(index.parent / "tables" / "tab22_compression.csv").filter(pl.col("budget") == 0.0625)
    for r in head.iter_rows(named=True):
        cell = gated.filter((pl.col("model") == r["model"]) & (pl.col("context_length") == r["context_length"])
                            & (pl.col("evictor") == r["evictor"]))
        at = cell.filter(pl.col("budget") == 0.0625)  # Table 27's cell: the capacity-bound class at b = 1/16
        cap = at.filter(pl.col("task_class") == defaults.CAPACITY_BOUND)
        assert r["n_capacity"] == cap.height > 0
        assert r["harm_plain"] == pytest.approx((cap["score_plain"] < cap["score_full"]).mean())
        assert r["harm_gated"] == pytest.approx((cap["score_gated"] < cap["score_full"]).mean())
        assert r["kept_kv"] == pytest.approx((cell["n_kept_gated"] / cell["n_tokens"]).mean())
        kept = (at["n_kept_gated"] / at["n_tokens"]).to_numpy()
        p, k_open = at["gate_open"].mean(), kept[at["gate_open"].to_numpy()].mean()
        assert r["compression"] == pytest.approx(1 / kept.mean())
        assert r["compression_batch"] == pytest.approx(1 / ((1 - p ** 8) + p ** 8 * k_open))
        if r["evictor"] == "snapkv":  # Table 22's b = 1/16 row of the headline evictor
            row = t22.filter((pl.col("model") == r["model"]) & (pl.col("context_length") == r["context_length"]))
            assert row["compression"].item() == pytest.approx(r["compression"], rel=1e-12)
    assert meta["headline_sentences"] and meta["headline_sentences"][0] in text.replace("&#x27;", "'")
    # index.md keeps the same order
    md = index.read_text()
    positions = [md.index(h) for h in ("## Headline", "## Figures", "## Tables", "## Not produced", "## Appendix")]
    assert positions == sorted(positions)
    assert min(md.index(rec["sha256"]) for rec in meta["files"]) > md.index("## Appendix")


def test_every_table_column_has_a_human_header_and_a_gloss(two_context):
    from pagestats.report.glossary import BY_TABLE, COLUMNS, glossary, header

    _, index = two_context
    meta = json.loads((index.parent / "index.json").read_text())
    page, text = _page(index)
    for o in meta["outputs"]:
        for f in (f for f in o["files"] if f.endswith(".csv")):
            columns = pl.read_csv(index.parent / f, n_rows=1).columns
            for c in columns:
                assert c in COLUMNS or c in BY_TABLE.get(o["name"], {}), f"{o['name']}: no header for {c!r}"
                assert all(meaning for _, _, meaning in glossary(o["name"], columns))
    assert header("tab01_recovery", "k") == "n recovered"  # a count, not the top-k size
    t1 = text[text.index('id="tab01_recovery"'):]
    assert "<th" in t1 and ">n recovered</th>" in t1[: t1.index("</table>")]


def test_decision_frontier_is_the_pareto_set_of_every_tau_and_budget(two_context):
    from pagestats import metrics, replay
    from pagestats.figures.accuracy import PARETO_ATOL
    from pagestats.report.decision import decision_data, decision_taus

    logs, _ = two_context
    ctx = report.Context(logs)
    data = decision_data(ctx)
    gated_all = ctx.gated
    taus = decision_taus(defaults.TAU)
    gib = metrics.full_cache_gib(logs.inputs, logs.manifests)
    for cell in data.select("model", "context_length", "evictor").unique().to_dicts():
        sub = data.filter((pl.col("model") == cell["model"]) & (pl.col("context_length") == cell["context_length"])
                          & (pl.col("evictor") == cell["evictor"]))
        assert sub.height == len(taus) * sub["budget"].n_unique()
        g = gated_all.filter((pl.col("model") == cell["model"]) & (pl.col("context_length") == cell["context_length"])
                             & (pl.col("evictor") == cell["evictor"]))
        full = float(gib.filter((pl.col("model") == cell["model"])
                                & (pl.col("context_length") == cell["context_length"]))["full_gib"][0])
        for tau in (taus[1], defaults.TAU, taus[-2]):  # brute force: replay the gate at τ, budget by budget
            at = replay.gated_outcomes(logs, replay.FixedTau(float(tau))).filter(
                (pl.col("model") == cell["model"]) & (pl.col("context_length") == cell["context_length"])
                & (pl.col("evictor") == cell["evictor"]) & (pl.col("budget") < 1))
            for b in at["budget"].unique().to_list():
                rows = at.filter(pl.col("budget") == b)
                point = sub.filter((pl.col("tau") == tau) & (pl.col("budget") == b))
                assert point["accuracy"][0] == pytest.approx(rows["score_gated"].mean(), abs=1e-12)
                kept = (rows["n_kept_gated"] / rows["n_tokens"]).mean()
                assert point["kept_kv"][0] == pytest.approx(kept, abs=1e-12)
                assert point["kv_gib"][0] == pytest.approx(kept * full, rel=1e-12)
        # τ = +∞ keeps the full cache; the frontier is exactly the non-dominated points (by brute force)
        assert sub.filter(pl.col("tau") == float("inf"))["kept_kv"].to_list() == pytest.approx([1.0] * sub["budget"].n_unique())
        # (equal up to PARETO_ATOL: two means of the same scores summed in another order are equal)
        pts = list(zip(sub["kept_kv"], sub["accuracy"], sub["on_frontier"]))
        tol = PARETO_ATOL
        for c, a, flag in pts:
            assert flag == (not any(c2 <= c + tol and a2 >= a - tol and (c2 < c - tol or a2 > a + tol)
                                    for c2, a2, _ in pts))
        assert len(g) > 0


def test_full_cache_gib_from_the_manifest():
    from pagestats import metrics

    model = {"n_layers": 30, "n_kv_heads": 3, "head_dim": 64, "dtype": "bfloat16"}
    assert metrics.kv_bytes_per_token(model) == 2 * 30 * 3 * 64 * 2
    with pytest.raises(ValueError, match="unknown dtype"):
        metrics.kv_bytes_per_token({**model, "dtype": "q4"})
    inputs = pl.DataFrame({"run_id": ["r", "r"], "model": ["m", "m"], "context_length": [8, 8], "n_tokens": [100, 300]})
    gib = metrics.full_cache_gib(inputs, {"r": {"model": model}})
    assert gib["full_gib"][0] == pytest.approx(2 * 30 * 3 * 64 * 2 * 200 / 2**30)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium installed (apt-get install chromium)")
def test_html_page_renders_in_headless_chromium(two_context, tmp_path):
    """A real browser loads the page: every embedded figure decodes (naturalWidth > 0)."""
    _, index = two_context
    page = tmp_path / "page.html"
    probe = ("<script>addEventListener('load',()=>{const i=[...document.images];document.body.dataset.ok="
             "i.filter(x=>x.complete&&x.naturalWidth>0).length+'/'+i.length})</script></body>")
    page.write_text((index.parent / "index.html").read_text(encoding="utf-8").replace("</body>", probe))
    dom = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    ok = re.search(r'data-ok="(\d+)/(\d+)"', dom)
    assert ok, dom[-500:]
    assert ok.group(1) == ok.group(2) and int(ok.group(2)) >= 10


def test_decision_entries_skip_an_unknown_dtype(two_context, tmp_path, monkeypatch):
    """A manifest whose model dtype is unknown (found by the fuzz: a flipped byte gave 'bfloAt16') skips the
    decision figure and table with a reason instead of a traceback; the rest of the report is written."""
    from pagestats.report.context import needs_cache_size

    logs, _ = two_context
    ctx = report.Context(logs)
    assert needs_cache_size(ctx) is None
    run_id = sorted(logs.manifests)[0]
    # monkeypatch puts the manifest back: the logs are the module's fixture, shared with later tests
    monkeypatch.setitem(logs.manifests, run_id, {**logs.manifests[run_id],
                                                 "model": {**logs.manifests[run_id]["model"], "dtype": "bfloAt16"}})
    reason = needs_cache_size(report.Context(logs))
    assert reason and "bfloAt16" in reason and run_id in reason
    index = json.loads((Path(report.build_report(logs, tmp_path / "r", formats=("png",))).parent
                        / "index.json").read_text())  # PDF copies: test_single_context_skips_fig9_with_reason
    skipped = {o["name"]: o["skipped"] for o in index["outputs"]}
    assert "bfloAt16" in skipped["figN1_decision_frontier"] and "bfloAt16" in skipped["tabN2_decision_frontier"]
    assert skipped["tab02_delta_matrix"] is None


def test_report_db_equals_report_of_the_logs(tmp_path):
    """The report of a database (``pagestats report --db FILE``: :meth:`LogDB.load`) writes the
    same tables and headline as the report of the logs it indexes: every cell equal, numbers to
    1e-12 (a sum computed by DuckDB, as the τ curve of Table N2, follows the row order, which is
    the files' order in one and the key order in the other, so it may differ in the last bit)."""
    from polars.testing import assert_frame_equal

    syn = testing.synthetic_logs(**{**SMALL, "context_lengths": (4096, 16384)})
    runs = [str(r) for r in syn.write(tmp_path / "logs")]
    db = io.index_logs(runs, str(tmp_path / "logs.duckdb"))
    try:
        outs = [Path(report.build_report(logs, tmp_path / name, entries=TABLES)).parent
                for name, logs in (("mem", io.load(runs)), ("db", db.load()))]
    finally:
        db.close()
    mem, back = outs
    csvs = sorted(p.relative_to(mem) for p in (mem / "tables").rglob("*.csv"))
    assert len(csvs) > 10 and csvs == sorted(p.relative_to(back) for p in (back / "tables").rglob("*.csv"))
    for f in csvs:
        assert_frame_equal(pl.read_csv(mem / f), pl.read_csv(back / f), abs_tol=1e-12, rel_tol=0)
    meta = [json.loads((d / "index.json").read_text()) for d in outs]
    assert pl.DataFrame(meta[0]["headline"]).height > 0
    assert_frame_equal(pl.DataFrame(meta[0]["headline"]), pl.DataFrame(meta[1]["headline"]), abs_tol=1e-12, rel_tol=0)
    assert [o["skipped"] for o in meta[0]["outputs"]] == [o["skipped"] for o in meta[1]["outputs"]]


def _headline_row(**over):
    row = {"model": "m", "context_length": 512, "evictor": "snapkv", "n_inputs": 40, "delta": 0.094, "low": 0.0,
           "high": 0.281, "p_adjusted": 0.65, "harm_plain": 0.12, "harm_gated": 0.03, "harm_reduction": 0.09,
           "delta_matched": 0.012, "matched_low": -0.01, "matched_high": 0.03, "matched_p": 0.4,
           "p_open": 0.75, "kept_kv": 0.58, "n_capacity": 20, "kept_kv_budget": 0.3, "kept_open": 0.0625,
           "compression": 1 / 0.3, "compression_batch": 1.1}
    return {**row, **over}


@pytest.mark.parametrize("over, says, never", [
    # a positive point estimate whose BH-adjusted p is 0.65 is not a rise, even with low ≥ 0
    ({}, "on the capacity-bound anchor niah_multikey_3 at b = 1/16 (20 inputs) the gate cuts the harm rate from 12.0% to 3.0% "
         "(paper: 75% to 2.6%, Table 27); at matched memory (plain eviction's frontier at the same 58% "
         "of the KV cache) its change in accuracy over plain eviction, +1.2 pp [-1.0, +3.0], is not significant "
         "(BH-adjusted p = 0.400); at the same nominal budget its change in accuracy over plain eviction, +9.4 pp "
         "[+0.0, +28.1], is not significant (BH-adjusted p = 0.650)", "raises accuracy"),
    ({"low": 0.02, "p_adjusted": 0.2}, "is not significant (BH-adjusted p = 0.200)", "raises accuracy"),
    ({"low": 0.05, "p_adjusted": 0.0004, "matched_low": 0.002, "matched_p": 0.01},
     "at the same nominal budget it raises accuracy by +9.4 pp [+5.0, +28.1] over plain eviction (BH-adjusted "
     "p < 0.001)", "not significant"),
    ({"delta": -0.05, "low": -0.09, "high": -0.01, "p_adjusted": 0.01, "harm_gated": 0.2},
     "the gate raises the harm rate from 12.0% to 20.0% (paper: 75% to 2.6%, Table 27); at matched memory", "cuts"),
    ({"delta": -0.05, "low": -0.09, "high": -0.01, "p_adjusted": 0.01},
     "at the same nominal budget it lowers accuracy by -5.0 pp [-9.0, -1.0] over plain eviction (BH-adjusted "
     "p = 0.010)", "raises accuracy"),
    ({"harm_gated": 0.12}, "the gate leaves the harm rate at 12.0%", "cuts"),
    ({}, "at b = 1/16 it keeps 30% of the KV cache, 3.33× compression at batch 1 and 1.10× at batch 8 (paper: "
         "1.8–3.4× (mean 2.9×) at batch 1, Table 22", "n/a"),
    ({"harm_plain": None, "harm_gated": None, "harm_reduction": None, "n_capacity": 0},
     "m at 512 tokens, snapkv: at matched memory", "harm rate"),
    ({"p_adjusted": None}, "is not significant (no BH-adjusted p)", "raises accuracy"),
])
def test_headline_sentence_claims_an_effect_only_where_bh_rejects(over, says, never):
    """The sentence a reader sees first follows the BH decision (q = FDR_Q), not the interval's sign."""
    from pagestats.report.headline import headline_sentences

    frame = pl.DataFrame([_headline_row(**over)])
    (sentence,) = headline_sentences(frame, "snapkv")
    assert says in sentence and never not in sentence
    assert sentence.startswith("m at 512 tokens, snapkv: ")


def test_decision_figure_names_an_evictor_logged_in_one_cell_only(two_context):
    """The shipped 1,024-token run has kvpress's SnapKVPress, the 512-token run has not: the
    legend drew its entries from the first panel and left that evictor's colour unnamed."""
    from pagestats.figures import decision_frontier
    from pagestats.report.decision import decision_data

    logs, _ = two_context
    data = decision_data(report.Context(logs))
    second = data.select("model", "context_length").unique().sort("model", "context_length").row(1, named=True)
    only_there = data.filter((pl.col("model") == second["model"]) & (pl.col("context_length") == second["context_length"])
                             & (pl.col("evictor") == "snapkv")).with_columns(
        pl.lit("late-evictor").cast(data.schema["evictor"]).alias("evictor"))  # the report's names are categorical
    fig = decision_frontier(pl.concat([data, only_there]), tau=defaults.TAU)
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert {*data["evictor"].unique().to_list(), "late-evictor"} <= set(labels)
    colours = {line.get_label(): line.get_color() for axis in fig.axes for line in axis.get_lines()
               if line.get_label() == "late-evictor"}
    handle = next(h for legend in fig.legends for h, t in zip(legend.legend_handles, legend.get_texts())
                  if t.get_text() == "late-evictor")
    assert colours["late-evictor"] == handle.get_color()  # the entry has the colour the panel drew it in


def test_one_input_set_per_cell_and_every_draw_in_table30(tmp_path):
    """Two input draws of one cell: every entry but Table 30 reads the first draw only, so the n of a
    cell is the headline's in every table with an n column; Table 30 compares both draws."""
    logs = _load(tmp_path, context_lengths=(4096,), input_draws=(0, 1), n_inputs=6)
    assert set(logs.inputs["draw"]) == {0, 1}
    ctx = report.context.Context(logs)
    assert set(ctx.logs.inputs["draw"]) == {0}
    assert_frame_equal(ctx.all_logs.inputs, io.categorical_names(logs).inputs)  # every draw, names categorical
    kept = set(ctx.logs.inputs.select("run_id", "task", "input_id").iter_rows())
    assert set(ctx.logs.outcomes.select("run_id", "task", "input_id").iter_rows()) == kept
    index = Path(report.build_report(logs, tmp_path / "out", formats=("png",)))
    meta = json.loads((index.parent / "index.json").read_text())
    n_cell = {r["evictor"]: r["n_inputs"] for r in meta["headline"]}
    assert set(n_cell.values()) == {6 * 3}  # 6 inputs × 3 tasks of draw 0
    checked = 0
    for o in meta["outputs"]:
        if o["kind"] != "table" or o["skipped"] or o["name"] == "tab30_draws":
            continue
        for f in (f for f in o["files"] if f.endswith(".csv")):
            frame = pl.read_csv(index.parent / f, infer_schema_length=None)
            if {"n_inputs", "evictor"} <= set(frame.columns) and "task" not in frame.columns:
                rows = frame.filter(pl.col("evictor").is_in(list(n_cell)))
                assert rows.height and set(rows["n_inputs"].to_list()) <= {6 * 3}, (o["name"], rows["n_inputs"])
                checked += 1
    assert checked >= 3
    draws = pl.read_csv(index.parent / "tables" / "tab30_draws.csv", infer_schema_length=None)
    assert set(draws["draw"].drop_nulls().to_list()) == {0, 1}


def test_every_numbered_paper_item_is_an_entry_or_says_why_not():
    """Tables 1–32 and Figures 1–11 of the paper: each is the source of an entry, or listed in
    NOT_REPRODUCED with its reason — never silently absent."""
    import re

    from pagestats.report.build import NOT_REPRODUCED, catalogue

    covered = set()
    for e in catalogue():
        m = re.fullmatch(r"(Tables?|Figures?) (\d+)(?:–(\d+))?", e.source)
        if m:
            kind = "Table" if m.group(1).startswith("Table") else "Figure"
            covered |= {f"{kind} {i}" for i in range(int(m.group(2)), int(m.group(3) or m.group(2)) + 1)}
    wanted = {f"Table {i}" for i in range(1, 33)} | {f"Figure {i}" for i in range(1, 12)}
    assert not covered & set(NOT_REPRODUCED), "an item is both reproduced and listed as not"
    assert wanted - covered == set(NOT_REPRODUCED), sorted(wanted - covered - set(NOT_REPRODUCED))
    assert all(len(reason) > 20 for reason in NOT_REPRODUCED.values())



_NAMED = [("tab14_oracle_gap", "gap"), ("tab27_harm", "harm_ratio"), ("headline", "harm_reduction"),
          ("headline", "compression"), ("tab22_compression", "compression"), ("tab23_batching", "provisioned"),
          ("tab25_scaling", "ratio"), ("tab13_budget_axis", "delta"), ("tab01_recovery", "rho")]


def test_every_glossary_formula_holds_on_the_reports_own_rows(two_context):
    """A derived column's glossary formula, evaluated on each row of the report's CSV files and of
    its headline, equals the column, and the glossary prints that formula (Table 14's gap and
    Table 27's harm ratio were once described as another formula). The shipped logs' report is
    checked the same way in test_shipped_data.py."""
    from pagestats.report.glossary import formula_checks, glossary

    _, index = two_context
    checks = formula_checks(index.parent)
    assert [c[:3] for c in checks if not c[3]] == []
    assert set(_NAMED) <= {(t, c) for t, c, _, _ in checks}
    assert len(checks) >= 25
    for table, column, f, _ in checks:
        if table != "headline":
            columns = pl.read_csv(index.parent / "tables" / f"{table}.csv", n_rows=0).columns
            meaning = {c: m for _, c, m in glossary(table, columns)}[column]
            assert meaning.endswith(f"(= {f})") or meaning == f"= {f}"


def test_a_wrong_formula_is_caught(two_context, monkeypatch):
    """The check can fail: with Table 14's old glossary (oracle − gate) and the harm ratio read as
    a difference, the rows disagree (the shipped logs' report, where the gate and the oracle differ)."""
    from pagestats.report import glossary

    _, index = two_context
    monkeypatch.setitem(glossary.FORMULAS, "harm_ratio", "harm_plain - harm_gated")
    monkeypatch.setitem(glossary.FORMULAS_BY_TABLE["headline"], "compression", "kept_kv_budget")
    bad = {(t, c) for t, c, _, holds in glossary.formula_checks(index.parent) if not holds}
    assert ("tab27_harm", "harm_ratio") in bad and ("headline", "compression") in bad


def test_report_policy_and_headline_evictor_options(tmp_path, capsys):
    """`report --headline-evictor E --tau X` leads with E and gates at X (as `whatif --tau X`);
    an evictor the logs lack, or a midpoint sample they do not hold, exits 2 with one line."""
    from pagestats.cli import main

    syn = testing.synthetic_logs(**SMALL)  # 4 inputs per task: fewer than the midpoint sample
    runs = [str(r) for r in syn.write(tmp_path / "logs")]
    logs = io.load(runs)
    tau = float(round(logs.inputs["drop"].median(), 6))  # half the inputs open
    out = tmp_path / "out"
    assert main(["report", *runs, "--out", str(out), "--no-pdf", "--headline-evictor", "h2o", "--tau", str(tau)]) == 0
    index = json.loads((out / "index.json").read_text())
    assert index["headline_evictor"] == "h2o" and index["policy"]["tau"] == tau
    assert all(", h2o:" in s for s in index["headline_sentences"] if "tokens," in s)
    gated = replay.gated_outcomes(logs, FixedTau(tau)).filter((pl.col("evictor") == "h2o") & (pl.col("budget") < 1))
    assert 0 < gated["gate_open"].mean() < 1
    want = gated.group_by("budget").agg(pl.col("score_gated").mean()).sort("budget")
    got = pl.read_csv(out / "tables" / "tab13_budget_axis.csv").filter(pl.col("evictor") == "h2o").sort("budget")
    assert got["acc_gated"].to_list() == pytest.approx(want["score_gated"].to_list(), abs=1e-12)
    t03 = pl.read_csv(out / "tables" / "tab03_drop_by_task.csv")
    assert t03["tau"].unique().to_list() == [tau]
    capsys.readouterr()
    assert main(["report", *runs, "--out", str(tmp_path / "o2"), "--headline-evictor", "nosuch"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --headline-evictor 'nosuch' is not logged; the logs hold h2o, snapkv")
    assert main(["report", *runs, "--out", str(tmp_path / "o3"), "--policy", "midpoint"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: the midpoint recipe (Eq. 5) takes 20 capacity-bound (niah_multikey_3) and 20 dilution-prone (vt)")
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


def test_headline_shows_the_papers_values_with_their_sources(two_context):
    """Beside the reproduced headline numbers: the paper's own values, from one table, each citing where."""
    from pagestats.report.paper import PAPER_VALUES

    _, index = two_context
    md_text = index.read_text()
    row = next(line for line in md_text.splitlines() if line.startswith("| paper (Qwen2.5, Mistral-7B)"))
    for column in ("harm_plain", "harm_gated", "compression", "delta_ci", "matched_ci"):
        assert PAPER_VALUES[column][0] in row
    assert "Sources: " in md_text and PAPER_VALUES["compression"][1] in md_text
    assert all(any(k in where for k in ("§", "Table", "Fig.", "App.")) for _, where in PAPER_VALUES.values())
    meta = json.loads(index.with_name("index.json").read_text())
    assert all("(paper: 75% to 2.6%, Table 27)" in s for s in meta["headline_sentences"] if "harm rate" in s)
    t25 = next(o for o in meta["outputs"] if o["name"] == "tab25_scaling")
    assert "Paper: 0.34 (App. A.6.4" in t25["caption"]
    page = index.with_name("index.html").read_text()
    head = page[page.index('id="headline"'):page.index("<nav>")]
    assert 'class="scroll"' not in head  # every headline row shows, no inner scroll box


def test_table31_reads_the_control_run_alone(tmp_path):
    """A run with the uniform-random control (SnapKV beside `random` on the same inputs) gives Table 31,
    equal to a brute-force count on its rows, and changes no other entry: every other table of the
    report is byte-identical to the report without it. Without one, Table 31 says what is missing."""
    syn = testing.synthetic_logs(**SMALL)
    main_runs = [str(r) for r in syn.write(tmp_path / "main")]
    control = testing.synthetic_logs(**{**SMALL, "models": {"tiny-control": (6, 3)}, "evictors": ("snapkv", "random"),
                                        "seed": 5})  # its own run ids
    control_runs = [str(r) for r in control.write(tmp_path / "control")]
    without = report.build_report(io.load(main_runs), tmp_path / "a", formats=("png",), entries=TABLES)
    with_ = report.build_report(io.load(main_runs + control_runs), tmp_path / "b", formats=("png",), entries=TABLES)
    a, b = Path(without).parent, Path(with_).parent
    skipped = {o["name"]: o["skipped"] for o in json.loads((a / "index.json").read_text())["outputs"]}
    assert skipped["tab31_random_control"].startswith("needs a uniform-random scoring arm beside SnapKV")
    for csv in sorted((a / "tables").glob("*.csv")):
        assert (b / "tables" / csv.name).read_bytes() == csv.read_bytes(), csv.name
    assert json.loads((a / "index.json").read_text())["headline"] == json.loads((b / "index.json").read_text())["headline"]
    assert [e for e in json.loads((b / "index.json").read_text())["exclusions"] if "control run" in e] == [
        "set apart as a control run (uniform-random arm; read by Table 31 alone): syn-tiny-control-4096-d0 (12 inputs)"]
    t31 = pl.read_csv(b / "tables" / "tab31_random_control.csv")
    rows = replay.gated_outcomes(io.load(control_runs), FixedTau()).filter(pl.col("budget") < 1)
    for r in t31.iter_rows(named=True):
        cell = rows.filter((pl.col("task") == r["task"]) & (pl.col("context_length") == r["context_length"]))
        for arm in ("snapkv", "random"):
            sub = cell.filter(pl.col("evictor") == arm)
            assert r[f"acc_{arm}"] == pytest.approx(sub["score_plain"].mean(), abs=1e-12)
            best = sub.group_by("run_id", "input_id").agg(pl.col("score_plain").max(), pl.col("score_full").first())
            assert r[f"rho_{arm}"] == pytest.approx((best["score_plain"] > best["score_full"]).mean(), abs=1e-12)
            assert r["n"] == best.height


def test_a_very_long_model_name_still_makes_file_names(tmp_path):
    """A 300-letter model name (found by the long fuzz campaign: `File name too long` in Fig. 3's
    per-cell file) gives figure files under 255 bytes, distinct per cell."""
    name = "x" * 300
    syn = testing.synthetic_logs(**{**SMALL, "context_lengths": (4096, 8192)})
    logs = io.load([str(r) for r in syn.write(tmp_path / "logs")])
    logs = dataclasses.replace(logs, **{t: getattr(logs, t).with_columns(pl.lit(name).alias("model"))
                                        for t in ("inputs", "outcomes")})  # relabelled, as the campaign did
    index = report.build_report(logs, tmp_path / "out",
                                formats=("png",), entries=[e for e in FIGURES if e.name == "fig03_accuracy_vs_budget"])
    files = json.loads(Path(index).with_name("index.json").read_text())["outputs"][0]["files"]
    assert len(files) == 2 and len(set(files)) == 2
    assert all(len(Path(f).name.encode()) < 255 for f in files)


class _NoGatedRows(report.Context):
    """A context whose gated rows (and what is made from them) raise when read."""

    @property
    def gated(self):
        raise AssertionError("read the gated rows")


def test_entries_that_say_they_never_read_the_gated_rows_do_not(tmp_path):
    """Entry.reads_gated=False is what lets the report run an entry before the gated rows exist
    (run_order): each such entry runs on a context where reading them fails."""
    logs = _load(tmp_path, context_lengths=(4096, 16384), input_draws=(0, 1), with_topk=True,
                 tasks=("niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "vt", "fwe"), n_inputs=25)
    ctx = _NoGatedRows(logs)
    free = [e for e in report.catalogue() if not e.reads_gated]
    assert {"tabN1_pilot_sensitivity", "tab07_calibration", "fig06_tau_sensitivity"} <= {e.name for e in free}
    ran = []
    for entry in free:
        outcome = _run_entry(entry, ctx, tmp_path / "out", ("png",))
        if outcome.skipped is None:
            ran.append(entry.name)
    # 25 inputs per task and cell: Table 7's midpoint sample (20 + 20) and N1's reference pilot (100 per model)
    # fit; only Table 31 is skipped, for want of a control run (it reads Context.control_outcomes)
    assert sorted({e.name for e in free} - set(ran)) == ["tab31_random_control"]
    with pytest.raises(AssertionError, match="gated rows"):
        _run_entry(next(e for e in report.catalogue() if e.name == "tab02_delta_matrix"), ctx, tmp_path / "out2",
                   ("png",))


def test_run_order_puts_the_entries_without_gated_rows_first_and_the_index_keeps_catalogue_order(two_context):
    entries = report.catalogue()
    order = run_order(entries)
    assert sorted(order) == list(range(len(entries)))
    flags = [entries[i].reads_gated for i in order]
    assert flags == sorted(flags) and not flags[0] and flags[-1]
    first = [i for i in order if not entries[i].reads_gated]
    assert first == sorted(first)  # catalogue order within each group
    _, index = two_context
    meta = json.loads((index.parent / "index.json").read_text())
    assert [o["name"] for o in meta["outputs"]] == [e.name for e in entries]


def test_a_table_run_beside_others_on_a_second_thread_writes_the_files_of_the_one_thread_report(tmp_path):
    """Entry.beside: Table N1 runs on a second thread while the main thread runs Tables 9 and 10, and
    every other entry runs before it starts or after it ends (it is submitted as Table 9's requirements
    are checked, so it may start before Table 9's own computation does); every file of the report, the index
    included, is that of the report that runs them all on one thread."""

    logs = _load(tmp_path, context_lengths=(4096, 16384), with_topk=True,
                 tasks=("niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "vt", "fwe"), n_inputs=25)
    spans: dict[str, tuple[str, float, float]] = {}

    def traced(entry):
        def make(ctx):
            start = time.perf_counter()
            try:
                return entry.make(ctx)
            finally:
                spans[entry.name] = (threading.current_thread().name, start, time.perf_counter())
        return dataclasses.replace(entry, make=make)

    entries = [traced(e) for e in report.catalogue() if not e.reads_gated or e.name == "tab02_delta_matrix"]
    assert {e.name: e.beside for e in entries if e.beside} == {
        "tabN1_pilot_sensitivity": ("tab09_head_pairs", "tab10_layers")}
    two = Path(report.build_report(logs, tmp_path / "two", formats=("png",), entries=entries)).parent
    thread, start, end = spans.pop("tabN1_pilot_sensitivity")
    assert thread.startswith("pagestats-beside")
    assert {t for t, _, _ in spans.values()} == {"MainThread"}
    for name, (_, s, e) in spans.items():  # nothing but Tables 9 and 10 overlaps it
        assert name in ("tab09_head_pairs", "tab10_layers") or e <= start or s >= end, name
    outputs = {o["name"]: o for o in json.loads((two / "index.json").read_text())["outputs"]}
    assert all(outputs[n]["files"] and outputs[n]["skipped"] is None
               for n in ("tabN1_pilot_sensitivity", "tab09_head_pairs", "tab10_layers"))
    one = Path(report.build_report(logs, tmp_path / "one", formats=("png",),
                                   entries=[dataclasses.replace(e, beside=()) for e in entries])).parent
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file() and p.suffix != ".png")
    assert files == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file() and p.suffix != ".png")
    assert len(files) > 20
    for f in files:
        assert (two / f).read_bytes() == (one / f).read_bytes(), f


def test_only_a_table_without_gated_rows_runs_beside_others_and_only_beside_such_entries(tmp_path):
    make = lambda ctx: pl.DataFrame({"a": [1]})  # noqa: E731
    logs = _load(tmp_path)
    with pytest.raises(ValueError, match="only a table that does not read the gated rows runs beside others"):
        report.Entry("f", "figure", "Figure 1", make, reads_gated=False, beside=("t",))
    with pytest.raises(ValueError, match="only a table that does not read the gated rows runs beside others"):
        report.Entry("t", "table", "Table 1", make, beside=("u",))
    entries = [report.Entry("t", "table", "Table 1", make, reads_gated=False, beside=("g",)),
               report.Entry("g", "table", "Table 2", make)]
    with pytest.raises(ValueError, match="entry t runs beside g, which reads the gated rows"):
        report.build_report(logs, tmp_path / "out", entries=entries)
    assert not (tmp_path / "out").exists()
    entries = [report.Entry("t", "table", "Table 1", make, reads_gated=False, beside=("u",)),
               report.Entry("u", "table", "Table 2", make, reads_gated=False, beside=("v",)),
               report.Entry("v", "table", "Table 3", make, reads_gated=False)]
    with pytest.raises(ValueError, match="entry t runs beside u, which runs beside others itself"):
        report.build_report(logs, tmp_path / "out", entries=entries)
    assert not (tmp_path / "out").exists()


def test_an_entry_beside_others_without_them_runs_in_its_place(tmp_path):

    threads = []

    def make(ctx):
        threads.append(threading.current_thread().name)
        return pl.DataFrame({"a": [1]})

    entries = [report.Entry("t", "table", "Table 1", make, reads_gated=False, beside=("absent",))]
    index = report.build_report(_load(tmp_path), tmp_path / "out", entries=entries)
    assert threads == ["MainThread"]
    assert json.loads(Path(index).with_name("index.json").read_text())["outputs"][0]["files"] == [
        "tables/t.csv", "tables/t.md"]


def test_an_entry_beside_that_fails_fails_the_report_and_leaves_no_report(tmp_path):
    logs = _load(tmp_path)

    def boom(ctx):
        raise RuntimeError("boom beside")

    make = lambda ctx: pl.DataFrame({"a": [1]})  # noqa: E731
    entries = [report.Entry("beside_boom", "table", "Table 1", boom, reads_gated=False, beside=("main_1",)),
               report.Entry("main_1", "table", "Table 2", make, reads_gated=False),
               report.Entry("main_2", "table", "Table 3", make, reads_gated=False)]
    with pytest.raises(RuntimeError, match="boom beside"):
        report.build_report(logs, tmp_path / "out", entries=entries)
    assert not (tmp_path / "out").exists()


def test_a_failed_report_waits_for_the_entry_beside_and_starts_no_other(tmp_path):
    """The main thread's error ends the report once the entry running beside has ended (it writes
    into the staged report, which the failure removes); the entries waiting to run beside never start."""

    logs = _load(tmp_path)
    started, ran = threading.Event(), []

    def slow(ctx):
        started.set()
        time.sleep(1.0)
        ran.append("slow")
        return pl.DataFrame({"a": [1]})

    def queued(ctx):
        ran.append("queued")
        return pl.DataFrame({"a": [1]})

    def boom(ctx):
        assert started.wait(10)
        raise RuntimeError("boom main")

    entries = [report.Entry("slow", "table", "Table 1", slow, reads_gated=False, beside=("boom",)),
               report.Entry("queued", "table", "Table 2", queued, reads_gated=False, beside=("boom",)),
               report.Entry("boom", "table", "Table 3", boom, reads_gated=False)]
    with pytest.raises(RuntimeError, match="boom main"):
        report.build_report(logs, tmp_path / "out", entries=entries)
    assert ran == ["slow"]
    assert not (tmp_path / "out").exists()
