"""The report's Conformance section: the paper's printed values beside ours (issue 40 §2).

:func:`conformance` computes :func:`pagestats.tables.conformance_table` on the report's logs at the
paper's own replay (the fixed τ = 0.07 on the logged D, whatever policy the report uses), writes
``tables/conformance.csv`` and returns what the index shows: one sentence that leads with the
finding, the counts per status and the rows the logs hold. On logs that are not the paper's (e.g.
the SmolLM2 logs shipped in ``data/``) every row is ``not-in-logs`` and the sentence says so; it
never presents another model's number as the paper's.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import polars as pl

from pagestats import replay
from pagestats.core import defaults
from pagestats.core.escape import markdown as md
from pagestats.replay import FixedTau, ProfileSpec
from pagestats.tables.conformance import COLUMNS, STATUSES, conformance_table
from pagestats.report.context import split_runs, first_draw

__all__ = ["conformance", "conformance_html", "conformance_markdown"]

#: Where the table is written, relative to the report folder.
CONFORMANCE_FILE = "tables/conformance.csv"

CAPTION = (
    "Each printed value of the paper (typed from the paper into pagestats/tables/paper_values.csv, with the table, "
    "section or figure that prints it) beside ours, computed with that table's recipe at the paper's replay "
    "(τ = 0.07 on the logged D: gated = plain where D ≥ τ, else the full-KV outcome). match: equal at the paper's "
    "printed precision (interval bounds: within 0.005); differs: not; not-in-logs: the files behind the paper's "
    "number are not among these logs (the row is kept, with no value).")


def _paper_gated(ctx) -> pl.DataFrame:
    """Gated outcomes at the paper's replay: the report's own when its policy is the fixed τ = 0.07 on
    the logged D, else a replay of the same logs at it."""
    if ctx.fixed_tau == defaults.TAU and ctx.profile == ProfileSpec() and ctx.unknown_full is None:
        return ctx.gated
    # every run, those without some full-KV outcomes included (Table 16's Yi-1.5-9B: no b = 1 rows), and
    # the plain arm of runs without D (RULER sweeps: Table 1's ρ)
    logs = first_draw(ctx.every_run)
    gated, sweeps = split_runs(logs, logs.inputs.filter(pl.col("drop").is_null())["run_id"])
    rows = replay.gated_outcomes(gated, FixedTau(defaults.TAU), ProfileSpec()) if gated.inputs.height else None
    plain = None if sweeps is None else replay.plain_outcomes(sweeps)
    return pl.concat([r for r in (rows, plain) if r is not None], how="vertical_relaxed")


def conformance(ctx, out) -> dict:
    """Compute the conformance table of the report's logs, write it under ``out`` and return the index entry:
    ``sentence``, ``counts`` (per status), ``file`` and ``rows`` (those with a value, as records)."""
    frame = conformance_table(_paper_gated(ctx), rng=np.random.default_rng(defaults.BOOTSTRAP_SEED))
    path = Path(out) / CONFORMANCE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.write_csv(path)
    counts = {s: int((frame["status"] == s).sum()) for s in STATUSES}
    held = frame.filter(pl.col("status") != "not-in-logs")
    return {"sentence": _sentence(counts, frame), "counts": counts, "file": CONFORMANCE_FILE,
            "rows": held.to_dicts(), "not_in_logs": _not_in_logs(frame) if held.height else ""}


def _not_in_logs(frame: pl.DataFrame) -> str:
    """The paper items whose cells these logs lack, each with the cells: "Table 2 (Qwen2.5-14B-Instruct
    snapkv); …" (every row of the file keeps its paper value)."""
    missing = frame.filter(pl.col("status") == "not-in-logs")
    parts = []
    for (item,), rows in missing.group_by(["item"], maintain_order=True):
        # a pooled row's label ("7 SnapKV cells") names its cells itself; a model's row adds its evictor
        labels = (m if m[:1].isdigit() else f"{m} {e}" for m, e in zip(rows["model"], rows["evictor"]))
        cells = list(dict.fromkeys(labels))
        parts.append(f"{item} ({', '.join(cells)})")
    return "; ".join(parts)


def _sentence(counts: dict, frame: pl.DataFrame) -> str:
    n = frame.height
    computed = counts["match"] + counts["differs"]
    if computed == 0:
        return (f"These logs are not the paper's: none of the paper's {n} printed values checked here comes from "
                "the models, contexts and evictors of these logs, so every row of the conformance table is "
                "not-in-logs (the paper's values are listed for reference, not compared).")
    differs = frame.filter(pl.col("status") == "differs")
    where = ", ".join(sorted(set(differs["item"].to_list())))
    tail = f" Where they differ: {where} (rows below)." if counts["differs"] else ""
    return (f"Of the paper's {n} printed values checked here, {computed} come from these logs: {counts['match']} "
            f"match at the printed precision and {counts['differs']} differ; {counts['not-in-logs']} need files "
            f"these logs do not hold.{tail}")


def _cell(column: str, value) -> str:
    if value is None:
        return "–"
    if column == "difference" and isinstance(value, float):
        return "0" if abs(value) < 5e-7 else f"{value:+.4f}"  # float noise is no difference
    if column in ("paper_value", "value") and isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def conformance_html(entry: dict | None) -> str:
    """The section of ``index.html``: the sentence, the rows the logs hold, the caption and the file."""
    if not entry:
        return ""
    parts = ['<h2 id="conformance">Conformance with the paper</h2>',
             f'<p class="finding">{html.escape(entry["sentence"])}</p>']
    if entry["rows"]:
        head = "".join(f'<th class="text">{html.escape(c)}</th>' for c in COLUMNS)
        body = "".join("<tr>" + "".join(f'<td class="text">{html.escape(_cell(c, r.get(c)))}</td>' for c in COLUMNS)
                       + "</tr>" for r in entry["rows"])
        parts.append(f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>')
    if entry.get("not_in_logs"):
        parts.append(f'<p class="caption">Not in these logs: {html.escape(entry["not_in_logs"])}.</p>')
    parts.append(f'<p class="caption">{html.escape(CAPTION)} <span class="files">'
                 f'<a href="{html.escape(entry["file"])}">{html.escape(Path(entry["file"]).name)}</a> (every row)'
                 "</span></p>")
    return "\n".join(parts)


def conformance_markdown(entry: dict | None) -> list[str]:
    """The same section as lines of ``index.md``."""
    if not entry:
        return []
    lines = ["## Conformance with the paper", "", md(entry["sentence"]), ""]
    if entry["rows"]:
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(md(_cell(c, r.get(c))) for c in COLUMNS) + " |" for r in entry["rows"]]
        lines.append("")
    if entry.get("not_in_logs"):
        lines += [md(f"Not in these logs: {entry['not_in_logs']}."), ""]
    lines += [md(CAPTION) + f" File (every row): [{Path(entry['file']).name}]({entry['file']})", ""]
    return lines
