"""The report page a person reads: one plain verdict per (model, context) above the headline table (logs
outside the paper's setting exercise the toolchain and are not evidence for or against it), one way of
writing a p-value, no Python or JSON reprs, and tables that fit a 1024-px window (headless Chromium,
where it is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest

from pagestats import io, report, testing
from pagestats.report.html import P_COLUMNS, plain, write_index_html
from pagestats.report.verdict import p_text, verdict_lines


def _row(model="Qwen2.5-3B-Instruct", context_length=4096, harm_plain=0.7, harm_gated=0.05, delta=0.12,
         p_adjusted=0.001, evictor="snapkv"):
    return dict(model=model, context_length=context_length, evictor=evictor, harm_plain=harm_plain,
                harm_gated=harm_gated, delta=delta, p_adjusted=p_adjusted)


@pytest.mark.parametrize("row, verdict", [
    (_row(), "consistent with the paper"),
    (_row(harm_gated=0.8), "against the paper"),                        # the gate raises the harm
    (_row(delta=-0.03, p_adjusted=0.01), "against the paper"),           # Δ significantly below 0
    (_row(p_adjusted=0.2), "not settled by these logs"),                  # Δ > 0 but BH does not reject
    (_row(harm_plain=None, harm_gated=None), "not settled by these logs"),  # no anchor at b = 1/16
    (_row(model="SmolLM2-135M-Instruct", context_length=512),
     "exercises the toolchain, not evidence for or against the paper"),
    (_row(context_length=2048), "exercises the toolchain, not evidence for or against the paper"),  # < 4K
])
def test_one_verdict_per_model_and_context(row, verdict):
    frame = pl.DataFrame([row, {**row, "evictor": "h2o", "harm_gated": 0.9}])  # another evictor: not judged
    (line,) = verdict_lines(frame, "snapkv")
    assert line[0] == f"{row['model']}, {row['context_length']:,} tokens: {verdict}"
    assert f"Δ {row['delta'] * 100:+.1f} pp" in line[1] and line[1].startswith(("snapkv", "outside"))


def test_one_p_value_format():
    assert [p_text(p) for p in (0.00448, 0.8655, 0.0009, 1.0, None)] == ["0.004", "0.866", "<\u00a00.001", "1.000",
                                                                        "n/a"]


def test_appendix_values_are_not_reprs():
    assert plain({"tau": 0.07, "budgets": (0.0625, 0.5), "pilot": None, "by": {"vt": 20}}) == \
        "tau = 0.07; budgets = 0.0625, 0.5; pilot = none; by = vt = 20"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("page")
    syn = testing.synthetic_logs(models={"SmolLM2-135M-Instruct": (6, 3)}, evictors=("snapkv", "h2o"),
                                 tasks=("niah_multikey_3", "vt", "fwe"), context_lengths=(512, 1024), n_inputs=6,
                                 budgets=(0.0625, 0.5, 1.0), with_topk=False, with_text=False)
    logs = io.load([str(r) for r in syn.write(tmp / "logs")])
    return Path(report.build_report(logs, tmp / "out", formats=("png",))).with_name("index.html")


def test_the_page_leads_with_a_verdict_per_model_and_context(page):
    text = page.read_text()
    verdicts = re.findall(r'<p class="verdict"><b>([^<]*)</b>', text)
    assert verdicts == [f"SmolLM2-135M-Instruct, {c} tokens: exercises the toolchain, not evidence for or against "
                        "the paper." for c in ("512", "1,024")]
    assert text.index('class="verdict"') < text.index('class="finding"') < text.index('<table class="headline"')
    md = (page.parent / "index.md").read_text()
    assert md.count("exercises the toolchain, not evidence for or against the paper") == 2


def test_every_p_value_of_the_page_has_one_format(page):
    text = page.read_text()
    cells = []
    for table in re.findall(r"<table.*?</table>", text, re.S):
        heads = re.findall(r"<th[^>]*>(.*?)</th>", table)
        for row in re.findall(r"<tr>(.*?)</tr>", table):
            values = re.findall(r"<td[^>]*>(.*?)</td>", row)
            cells += [v for h, v in zip(heads, values) if h in ("p", "p (BH)", "matched p (BH)")]
    assert len(cells) > 10 and {c for c in cells if c != "–"} <= {c for c in cells if re.fullmatch(
        r"0\.\d{3}|1\.000|&lt;\xa00\.001|n/a", c)}, sorted(set(cells))[:20]
    sentences = json.loads((page.parent / "index.json").read_text())["headline_sentences"]
    assert all(re.fullmatch(r"0\.\d{3}|1\.000", p) for s in sentences for p in re.findall(r"p = ([\d.]+)", s))
    assert set(P_COLUMNS) >= {"p_value", "p_adjusted"}


def test_no_python_or_json_repr_on_the_page(page):
    text = page.read_text()
    appendix = text[text.index('id="appendix"'):]
    for repr_start in ("{&#x27;", "(&#x27;", "[&#x27;", "{&quot;", "&quot;: ", "': ", "{'", "('", "[0.0625,",
                       "(0.0625,"):
        assert repr_start not in appendix, repr_start


def _overflowing_tables(page: Path, width: int) -> dict:
    probe = page.with_name(f"probe_{width}.html")
    script = ("<script>addEventListener('load',()=>{const o={page:document.documentElement.scrollWidth,"
              "window:innerWidth,wide:[]};document.querySelectorAll('table').forEach((t,i)=>{"
              "if(t.scrollWidth>t.parentElement.clientWidth+1||t.getBoundingClientRect().right>innerWidth)"
              "o.wide.push(((t.closest('section')||{}).id||t.className||'table '+i)+': '+t.scrollWidth);});"
              "const p=document.createElement('pre');p.id='fit';p.textContent=JSON.stringify(o);"
              "document.body.appendChild(p);});</script>")
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    dom = subprocess.run([shutil.which("chromium"), "--headless=new", "--no-sandbox", "--disable-gpu",
                          f"--window-size={width},900", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=90).stdout
    return json.loads(re.search(r'<pre id="fit">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
@pytest.mark.parametrize("width", [1024, 1280])
def test_every_table_fits_the_window(page, width):
    fit = _overflowing_tables(page, width)
    assert fit["window"] == width and fit["page"] <= width and fit["wide"] == []


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
def test_a_table_too_wide_is_seen(page, tmp_path):
    """The check itself: a table of 60 long numbers does not fit 1024 px, and the probe says so."""
    index = json.loads((page.parent / "index.json").read_text())
    wide = tmp_path / "wide"
    shutil.copytree(page.parent, wide)
    html = (wide / "index.html").read_text()
    row = "".join(f"<td>{i}234567.891</td>" for i in range(60))
    (wide / "index.html").write_text(html.replace("</body>", f"<table><tr>{row}</tr></table></body>"))
    assert _overflowing_tables(wide / "index.html", 1024)["wide"] and index["headline"]
    write_index_html(index, wide)  # the page as the report writes it fits again
    assert _overflowing_tables(wide / "index.html", 1024)["wide"] == []


def test_a_model_and_context_without_the_headline_evictor_still_gets_its_verdict():
    """The paper's 14B cell has H2O and PyramidKV, no SnapKV: its line is judged on its first evictor."""
    frame = pl.DataFrame([_row(), _row(model="Qwen2.5-14B-Instruct", evictor="pyramidkv", p_adjusted=0.3),
                          _row(model="Qwen2.5-14B-Instruct", evictor="h2o")])
    lines = verdict_lines(frame, "snapkv")
    assert [v for v, _ in lines] == ["Qwen2.5-14B-Instruct, 4,096 tokens: consistent with the paper",
                                     "Qwen2.5-3B-Instruct, 4,096 tokens: consistent with the paper"]
    assert lines[0][1].startswith("h2o: ") and lines[1][1].startswith("snapkv: ")


def test_each_calibrated_tau_names_the_contexts_it_gates(tmp_path):
    """The appendix's pilots: a τ per context is labelled with its context (the midpoint recipe), one τ
    pooled over contexts says which (a z-scored pilot per model)."""
    from pagestats.replay import ZScored
    from pagestats.report.build import _pilots
    from pagestats.report.context import Context
    from pagestats.report.html import _taus, calibration_lines

    assert _taus({"tau": [0.1, 0.2], "tau_by_context_length": {"512": [0.1], "1024": [0.2]}}) == \
        "τ = 0.1 at 512 tokens; 0.2 at 1,024 tokens"
    syn = testing.synthetic_logs(models={"m": (6, 3)}, evictors=("snapkv",), tasks=("niah_multikey_3", "vt"),
                                 context_lengths=(512, 1024), n_inputs=6, budgets=(0.5, 1.0), with_topk=False,
                                 with_text=False)
    logs = io.load([str(r) for r in syn.write(tmp_path / "logs")])
    (z,) = [p for p in _pilots(Context(logs, policy=ZScored(pilot_n=8, pilot_split="first"))) if "tau" in p
            and p["pilot"] == "report policy"]
    assert z["tau_by_context_length"] == {"512": z["tau"], "1024": z["tau"]} and len(z["tau"]) == 1
    assert f"τ = {z['tau'][0]:.6g} (512, 1,024 tokens pooled)" in calibration_lines({"pilots": [z]})[0]
