"""The report as one self-contained HTML page (``index.html``) and its Markdown twin
(``index.md``), both in the order a reader wants: the headline numbers first, then every
figure, then every table with its caption and a glossary of its columns, then the entries the
logs cannot support with the reason, and last the provenance (log files and their sha256,
exclusions, policy, profile, defaults).

Figures are embedded as PNG data URIs, so the page can be mailed or archived alone; its
only links are relative links to the CSV/Markdown/PDF files written beside it and anchors
within the page.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import polars as pl

from pagestats.core.escape import markdown as md
from pagestats.report.conformance import conformance_html, conformance_markdown
from pagestats.report.glossary import glossary, header
from pagestats.report.paper import PAPER_VALUES
from pagestats.report.verdict import p_text, verdict_lines

#: Headline columns shown, as (tidy name, header).
HEADLINE_SHOWN = (("model", "model"), ("context_length", "context"), ("evictor", "evictor"),
                  ("n_inputs", "n inputs"), ("harm_plain", "harm plain (capacity-bound, b = 1/16)"),
                  ("harm_gated", "harm gated (capacity-bound, b = 1/16)"), ("harm_reduction", "harm cut (pp)"),
                  ("matched_ci", "Δ at matched memory [95% CI]"), ("matched_p", "p (BH)"),
                  ("delta_ci", "Δ at nominal budget [95% CI]"), ("p_adjusted", "p (BH)"), ("p_open", "p_open"),
                  ("kept_kv", "kept KV (b < 1)"), ("compression", "compression at b = 1/16, batch 1"),
                  ("compression_batch", "compression at b = 1/16, batch 8"))


#: What the headline table's columns mean (HTML caption and index.md).
HEADLINE_CAPTION = (
    "With the policy of the appendix; the paper's defensible quantities first (§4). Harm: share of the "
    "capacity-bound inputs at b = 1/16 whose score falls below the full cache (Table 27's cell); harm cut: plain − "
    "gated, in pp. Δ at matched memory: gated accuracy − plain eviction's frontier accuracy at the same mean kept KV, "
    "over budgets b < 1 (Table N3). Δ at nominal budget: mean gated − plain accuracy at the same b, over budgets "
    "b < 1 (Table 28). Intervals: 95% cluster bootstrap; p: Benjamini–Hochberg. p_open: share of inputs whose gate "
    "opens. Kept KV: mean n_kept / n_tokens of the gated arm over b < 1. Compression at b = 1/16: 1 / the gated arm's "
    "kept KV at batch 1 (Table 22), and at batch 8 when one closed gate provisions the whole batch at the full cache "
    "(Table 23). Last row: the paper's values, from its models and lengths (a reference, not a target).")


def paper_row() -> dict:
    """The headline table's last row: the paper's value of each column where it gives one
    (:data:`pagestats.report.paper.PAPER_VALUES`), with where."""
    row = {c: PAPER_VALUES[c][0] if c in PAPER_VALUES else "–" for c, _ in HEADLINE_SHOWN}
    row.update(model="paper (Qwen2.5, Mistral-7B)", context_length="paper: 4K–16K", evictor="SnapKV",
               n_inputs="500 per task")
    return row


def paper_sources() -> str:
    """Where the paper gives each value of :func:`paper_row`."""
    return "; ".join(f"{header} {PAPER_VALUES[c][0]}: {PAPER_VALUES[c][1]}" for c, header in HEADLINE_SHOWN
                     if c in PAPER_VALUES)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1d1d1f;line-height:1.45}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
.meta{color:#555;font-size:.9em} .finding{font-size:1.05em;margin:.4em 0}
.verdict{font-size:1.05em;margin:.3em 0} .verdict b{font-size:1.1em}
table{border-collapse:collapse;font-size:.78em;margin:.5em 0;max-width:100%}
th,td{border-bottom:1px solid #e4e4e4;padding:.25em .4em;text-align:right;white-space:normal;vertical-align:top}
th{background:#f5f5f7;position:sticky;top:0;vertical-align:bottom}
td.text,th.text{text-align:left} td.text{overflow-wrap:anywhere;min-width:4em}
table.headline{font-size:.72em;width:100%} table.headline td{padding:.2em .3em} table.headline td.text{min-width:6.5em}
table.wide{font-size:.62em} table.wide td,table.wide th{padding:.15em .2em} table.wide th{overflow-wrap:anywhere}
table.headline tr:last-child td{font-style:italic;color:#555;border-top:2px solid #ccc}
.scroll{max-height:28em;overflow-y:auto;border:1px solid #eee;max-width:100%}
figure{margin:1.2em 0} figure img{max-width:100%;border:1px solid #eee}
figcaption,.caption{color:#333;font-size:.9em} .files{font-size:.8em;color:#666}
dl.glossary{font-size:.8em;color:#444;display:grid;grid-template-columns:max-content auto;gap:.1em 1em}
dl.glossary dt{font-weight:600} dl.glossary dd{margin:0}
nav ul{columns:2;font-size:.9em} .skipped li{margin:.2em 0} code{font-size:.9em}
"""


def _number(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        return f"{value:.4g}"
    return str(value)


#: Tables with more columns than this are set in smaller type (``table.wide``) to fit a 1024-px window.
WIDE_TABLE = 16
#: Columns that hold p-values: every one is written as :func:`p_text` writes it.
P_COLUMNS = ("p_value", "p_adjusted", "matched_p")


def plain(value) -> str:
    """A value of the appendix as text, never a Python or JSON repr: a list joined by commas, a
    mapping as ``key = value`` pairs, nothing as "none"."""
    if isinstance(value, dict):
        return "; ".join(f"{k} = {plain(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(plain(v) for v in value) or "none"
    return "none" if value is None else _number(value)


def decode_limited_note(cells) -> str:
    """The mark of a table whose rows draw on (model/context/task) cells the decode limit may have cut."""
    return ("Its rows draw on " + ", ".join(cells) + ", whose full-KV answers stopped at the decode limit without "
            "looping or ended inside a reference: there the numbers measure the decode limit as well as eviction.")


def headline_rows(frame: pl.DataFrame) -> list[dict]:
    """The headline table as display strings (percentages, intervals), one dict per row."""
    rows = []
    for r in frame.iter_rows(named=True):
        rows.append({
            "model": r["model"], "evictor": r["evictor"],
            "context_length": str(r["context_length"]) + (" †" if r.get("decode_limited") else ""),
            "n_inputs": str(r["n_inputs"]),
            "delta_ci": f"{r['delta'] * 100:+.1f} pp [{r['low'] * 100:+.1f}, {r['high'] * 100:+.1f}]",
            "matched_ci": ("–" if r.get("delta_matched") is None else
                           f"{r['delta_matched'] * 100:+.1f} pp [{r['matched_low'] * 100:+.1f}, "
                           f"{r['matched_high'] * 100:+.1f}]"),
            "matched_p": "–" if r.get("matched_p") is None else p_text(r["matched_p"]),
            "p_adjusted": p_text(r["p_adjusted"]),
            "harm_plain": _share(r["harm_plain"]), "harm_gated": _share(r["harm_gated"]),
            "harm_reduction": "–" if r["harm_reduction"] is None else f"{r['harm_reduction'] * 100:+.1f} pp",
            "p_open": f"{r['p_open']:.1%}", "kept_kv": f"{r['kept_kv']:.1%}",
            "compression": _times(r["compression"]), "compression_batch": _times(r["compression_batch"]),
        })
    return rows


def _share(value) -> str:
    return "–" if value is None else f"{value:.1%}"


def _times(value) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _html_table(columns: list[str], rows: list[list[str]], text_columns=(), css_class: str = "") -> str:
    head = "".join(f'<th class="{"text" if c in text_columns else ""}">{html.escape(c)}</th>' for c in columns)
    body = "".join("<tr>" + "".join(
        f'<td class="{"text" if columns[i] in text_columns else ""}">{html.escape(v)}</td>' for i, v in enumerate(row))
        + "</tr>" for row in rows)
    attr = f' class="{css_class}"' if css_class else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _read_table(out: Path, path: str) -> pl.DataFrame:
    return pl.read_csv(out / path, infer_schema_length=None)


def _table_html(name: str, frame: pl.DataFrame) -> str:
    text = {header(name, c) for c, dtype in frame.schema.items() if dtype == pl.String}
    columns = [header(name, c) for c in frame.columns]
    shown = [p_text if c in P_COLUMNS else _number for c in frame.columns]
    rows = [[f(v) for f, v in zip(shown, row)] for row in frame.iter_rows()]
    wide = "wide" if len(columns) > WIDE_TABLE else ""  # smaller type, so that it fits 1024 px
    return f'<div class="scroll">{_html_table(columns, rows, text, css_class=wide)}</div>'


def _glossary_html(name: str, columns) -> str:
    items = "".join(f"<dt>{html.escape(h)}</dt><dd><code>{html.escape(c)}</code>{' — ' + html.escape(m) if m else ''}</dd>"
                    for h, c, m in glossary(name, columns))
    return f'<dl class="glossary">{items}</dl>'


def _links(files) -> str:
    return " · ".join(f'<a href="{html.escape(f)}">{html.escape(Path(f).name)}</a>' for f in files)


def write_index_html(index: dict, out) -> str:
    """Write ``out/index.html`` from the report's ``index`` (the content of ``index.json``,
    with ``headline`` records and ``headline_sentences``); return its path."""
    out = Path(out)
    figures = [o for o in index["outputs"] if o["kind"] == "figure" and not o["skipped"]]
    tables = [o for o in index["outputs"] if o["kind"] == "table" and not o["skipped"]]
    skipped = [o for o in index["outputs"] if o["skipped"]]
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>pagestats report</title>"
             f"<style>{CSS}</style></head><body>",
             "<h1>pagestats report</h1>",
             f'<p class="meta">{html.escape(_meta_line(index))}</p>',
             *(f'<p class="finding">See also: <a href="{html.escape(link["href"])}">{html.escape(link["text"])}</a></p>'
               for link in index.get("see_also", [])),
             '<h2 id="headline">Headline</h2>']
    parts += [f'<p class="verdict"><b>{html.escape(v)}.</b> {html.escape(m)}.</p>' for v, m in _verdicts(index)]
    parts += [f'<p class="finding">{html.escape(s)}</p>' for s in index.get("headline_sentences", [])]
    if index.get("headline"):
        hl = pl.DataFrame(index["headline"])
        rows = headline_rows(hl)
        shown = [(c, h) for c, h in HEADLINE_SHOWN if not (c == "model" and hl["model"].n_unique() == 1)]
        if len(shown) < len(HEADLINE_SHOWN):
            parts.append(f"<p class=\"caption\">Model: {html.escape(str(hl['model'][0]))}.</p>")
        table_rows = [[r[c] for c, _ in shown] for r in [*rows, paper_row()]]
        parts.append(_html_table([h for _, h in shown], table_rows, {"model", "evictor"},  # every row, no inner scroll
                                 css_class="headline"))
        parts.append(f'<p class="caption">{html.escape(HEADLINE_CAPTION)} Sources: {html.escape(paper_sources())}.</p>')
    parts.append(conformance_html(index.get("conformance")))
    parts.append("<nav><ul>" + "".join(f'<li><a href="#{o["name"]}">{html.escape(o["source"])} — '
                                       f'{html.escape(o["name"])}</a></li>' for o in figures + tables)
                 + ('<li><a href="#conformance">Conformance with the paper</a></li>' if index.get("conformance") else "")
                 + '<li><a href="#skipped">Not produced</a></li><li><a href="#appendix">Appendix</a></li></ul></nav>')
    parts.append('<h2 id="figures">Figures</h2>')
    for o in figures:
        pngs = [f for f in o["files"] if f.endswith(".png")]
        imgs = "".join(f'<img alt="{html.escape(Path(f).stem)}" src="data:image/png;base64,'
                       f'{base64.b64encode((out / f).read_bytes()).decode()}">' for f in pngs)
        parts.append(f'<figure id="{o["name"]}">{imgs}<figcaption><b>{html.escape(o["source"])}</b> '
                     f'({html.escape(o["name"])}). {html.escape(o["caption"])} '
                     f'<span class="files">{_links(o["files"])}</span></figcaption></figure>')
    parts.append('<h2 id="tables">Tables</h2>')
    for o in tables:
        parts.append(f'<section id="{o["name"]}"><h3>{html.escape(o["source"])} ({html.escape(o["name"])})</h3>'
                     f'<p class="caption">{html.escape(o["caption"])} <span class="files">{_links(o["files"])}</span></p>')
        if o.get("decode_limited"):
            parts.append(f'<p class="caption decode-limited">† {html.escape(decode_limited_note(o["decode_limited"]))}</p>')
        columns: list[str] = []
        for f in (f for f in o["files"] if f.endswith(".csv")):
            frame = _read_table(out, f)
            columns += [c for c in frame.columns if c not in columns]
            parts.append(_table_html(o["name"], frame))
        parts.append(_glossary_html(o["name"], columns) + "</section>")
    parts.append('<h2 id="skipped">Not produced</h2><ul class="skipped">')
    parts += [f"<li><b>{html.escape(o['source'])}</b> ({html.escape(o['name'])}): {html.escape(o['skipped'])}</li>"
              for o in skipped] or ["<li>no entry was skipped: the logs support every entry</li>"]
    parts += [f"<li><b>{html.escape(x['source'])}</b> (paper item without an entry): {html.escape(x['reason'])}</li>"
              for x in index.get("not_reproduced", [])]
    parts.append("</ul>")
    parts.append('<h2 id="appendix">Appendix: provenance</h2>')
    parts.append("<h3>Exclusions</h3><ul>" + ("".join(f"<li>{html.escape(e)}</li>" for e in index["exclusions"])
                                              or "<li>none</li>") + "</ul>")
    parts.append(f"<h3>Policy and profile</h3><p>collection mode: {html.escape(str(index.get('mode')))}<br>"
                 f"policy: {html.escape(plain(index['policy']))}<br>"
                 f"profile: {html.escape(plain(index['profile']))}</p>")
    parts.append("<h3>Calibration pilots and pre-registration</h3><ul>"
                 + "".join(f"<li>{html.escape(line)}</li>" for line in calibration_lines(index)) + "</ul>")
    parts.append("<h3>Defaults (pagestats.core.defaults)</h3>" + _html_table(
        ["name", "value"], [[k, plain(v)] for k, v in index["defaults"].items()], {"name", "value"}))
    parts.append("<h3>Log files</h3>" + (_html_table(
        ["path", "table", "sha256", "rows"], [[f["path"], f["table"], f["sha256"], str(f["rows"])] for f in index["files"]],
        {"path", "table", "sha256"}) if index["files"] else "<p>The logs were not read from files: no hashes.</p>"))
    parts.append("</body></html>\n")
    path = out / "index.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return str(path)


def calibration_lines(index: dict) -> list[str]:
    """One line per calibration pilot of the report (τ, inputs per task, context and run; held out
    or not) and one for Table 21's band (frozen, or a post-hoc illustration)."""
    lines = []
    for p in index.get("pilots", []):
        if "unavailable" in p:
            lines.append(f"{p['pilot']} {p['policy']}: not computed ({p['unavailable']})")
            continue
        held = "held out of the evaluation" if p["held_out"] else "evaluated with the rest"
        lines.append(f"{p['pilot']} {p['policy']}, {p['model']}: {_taus(p)}; "
                     f"{p['n_inputs']} inputs, {held}; per task {plain(p['by_task'])}; per context "
                     f"{plain(p['by_context_length'])}; per run {plain(p['by_run_id'])}")
    if not index.get("pilots"):
        lines.append("no calibration pilot")
    band = index.get("prereg")
    lines.append("Table 21: post-hoc illustration, not a pre-registration" if band is None else
                 f"Table 21: band frozen {band['frozen_at']} for {band['target_context']} tokens ({band['evictor']}), "
                 "sha256 checked, frozen before the target outcome runs were created")
    return lines


def _verdicts(index: dict) -> list[tuple[str, str]]:
    """The verdict lines above the headline table (:func:`pagestats.report.verdict.verdict_lines`)."""
    if not index.get("headline"):
        return []
    return verdict_lines(pl.DataFrame(index["headline"]), index.get("headline_evictor"))


def _taus(pilot: dict) -> str:
    """A pilot's τ labelled with the contexts it gates: one per context (the midpoint recipe, Eq. 5),
    or one for the contexts it pools (the z-scored pilot, App. A.3.4)."""
    by = pilot.get("tau_by_context_length") or {}
    values = lambda taus: ", ".join(f"{t:.6g}" for t in taus)  # noqa: E731
    if len({tuple(t) for t in by.values()}) > 1:
        return "τ = " + "; ".join(f"{values(t)} at {int(c):,} tokens" for c, t in by.items())
    pooled = f" ({', '.join(f'{int(c):,}' for c in by)} tokens pooled)" if len(by) > 1 else \
        (f" ({int(next(iter(by))):,} tokens)" if by else "")
    return f"τ = {values(pilot['tau'])}{pooled}"


def _meta_line(index: dict) -> str:
    return (f"pagestats {index['pagestats_version']}; log schema {index['schema_version'] or '?'}; "
            f"{index['n_inputs']} inputs, {index['n_outcomes']} outcome rows, {len(index['runs'])} run(s); "
            f"headline evictor {index['headline_evictor']}.")


def index_markdown(index: dict, out) -> str:
    """``index.md``: the content of ``index.html`` in the same order, linking the files in ``out``.

    Every text that can hold a name from the logs (model, task, evictor, run, file) passes
    :func:`pagestats.core.escape.markdown`, as the HTML page passes :func:`html.escape`."""
    lines = ["# pagestats report", "", md(_meta_line(index)), ""]
    lines += [f"See also: [{md(link['text'])}]({link['href'].replace(' ', '%20')})" for link in index.get("see_also", [])]
    lines += ["", "## Headline", ""]
    lines += [f"**{md(v)}.** {md(m)}.  " for v, m in _verdicts(index)] + ([""] if _verdicts(index) else [])
    lines += [f"- {md(s)}" for s in index.get("headline_sentences", [])]
    if index.get("headline"):
        rows = headline_rows(pl.DataFrame(index["headline"]))
        lines += ["", "| " + " | ".join(h for _, h in HEADLINE_SHOWN) + " |",
                  "|" + "---|" * len(HEADLINE_SHOWN)]
        lines += ["| " + " | ".join(md(r[c]) for c, _ in HEADLINE_SHOWN) + " |" for r in [*rows, paper_row()]]
        lines += ["", md(f"{HEADLINE_CAPTION} Sources: {paper_sources()}.")]
    lines += ["", *conformance_markdown(index.get("conformance"))]
    lines += ["", "## Figures", ""]
    for o in (o for o in index["outputs"] if o["kind"] == "figure" and not o["skipped"]):
        lines += [f"### {o['source']} ({o['name']})", "", md(o["caption"]), ""]
        lines += [f"![{Path(f).stem}]({f})" for f in o["files"] if f.endswith(".png")]
        lines += ["", "Files: " + ", ".join(f"[{Path(f).name}]({f})" for f in o["files"]), ""]
    lines += ["## Tables", ""]
    for o in (o for o in index["outputs"] if o["kind"] == "table" and not o["skipped"]):
        lines += [f"### {o['source']} ({o['name']})", "", md(o["caption"]), ""]
        lines += [f"† {md(decode_limited_note(o['decode_limited']))}", ""] if o.get("decode_limited") else []
        lines += ["Files: " + ", ".join(f"[{Path(f).name}]({f})" for f in o["files"]), ""]
        columns = []
        for f in (f for f in o["files"] if f.endswith(".csv")):
            with open(Path(out) / f, encoding="utf-8") as fh:
                columns += [c for c in fh.readline().strip().split(",") if c not in columns]
        lines += ["Columns: " + "; ".join(f"**{h}** (`{c}`){': ' + m if m else ''}"
                                          for h, c, m in glossary(o["name"], columns)), ""]
    lines += ["## Not produced", ""]
    lines += [f"- **{o['source']}** `{o['name']}` — SKIPPED: {md(o['skipped'])}" for o in index["outputs"]
              if o["skipped"]] or ["- no entry was skipped: the logs support every entry"]
    lines += [f"- **{x['source']}** (paper item without an entry): {md(x['reason'])}"
              for x in index.get("not_reproduced", [])]
    lines += ["", "## Appendix: provenance", "", "### Exclusions", ""]
    lines += [f"- {md(e)}" for e in index["exclusions"]] or ["none"]
    lines += ["", "### Policy and profile", "", f"- collection mode: {index.get('mode')}",
              f"- policy: {md(plain(index['policy']))}",
              f"- profile: {md(plain(index['profile']))}", "",
              "### Calibration pilots and pre-registration", ""]
    lines += [f"- {md(line)}" for line in calibration_lines(index)]
    lines += ["", "### Defaults (pagestats.core.defaults)", ""]
    lines += [f"- {k} = {md(plain(v))}" for k, v in index["defaults"].items()]
    lines += ["", "### Log files", ""]
    if index["files"]:
        lines += ["| path | table | sha256 | rows |", "|---|---|---|---|"]
        lines += [f"| {md(f['path'])} | {f['table']} | {f['sha256']} | {f['rows']} |" for f in index["files"]]
    else:
        lines.append("(the logs were not read from files: no hashes to report)")
    return "\n".join(lines) + "\n"
