"""One plain verdict line per (model, context), above the report's headline table.

A (model, context) outside the paper's setting — its models at 4K tokens and more (PAGE paper §4,
Table 2; App. A.6) — exercises the toolchain and is not evidence for or against the paper, whatever
its numbers; the line says so, then what was measured. Inside it, the verdict weighs the paper's two
claims on the headline evictor: the gate cuts the harm on the capacity-bound anchor at b = 1/16
(Table 27), and it raises accuracy at the same nominal budget (Table 2, Table 28; BH at
:data:`pagestats.core.defaults.FDR_Q`). Both hold: consistent with the paper; the harm rises or Δ is
significantly negative: against it; else not settled by these logs.
"""

from __future__ import annotations

import polars as pl

from pagestats import metrics
from pagestats.core import defaults

__all__ = ["PAPER_MODELS", "PAPER_MIN_CONTEXT", "in_paper_setting", "p_text", "verdict_lines"]

#: The paper's models (§4, App. A.6: Qwen2.5 1.5B/3B/14B, Mistral-7B, Llama-3.1-8B, Yi-1.5-9B, Qwen3-4B),
#: as the start of a model name, case aside.
PAPER_MODELS = ("qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-14b", "mistral-7b", "llama-3.1-8b", "yi-1.5-9b", "qwen3-4b")
#: The paper's shortest context (§4, Table 2: 4K and 16K tokens).
PAPER_MIN_CONTEXT = 4096


def p_text(value) -> str:
    """The report's one way of writing a p-value: three decimals, or "< 0.001"."""
    if value is None or value != value:
        return "n/a"
    return "<\u00a00.001" if value < 0.001 else f"{value:.3f}"  # a no-break space: one token in a table cell


def in_paper_setting(model: str, context_length: int) -> bool:
    """Whether (model, context) is one of the paper's models at one of its lengths (≥ 4K tokens)."""
    name = str(model).lower().rpartition("/")[2]
    return context_length >= PAPER_MIN_CONTEXT and name.startswith(PAPER_MODELS)


def _measured(r: dict) -> str:
    b = "1/16" if defaults.HEADLINE_BUDGET == 0.0625 else f"{defaults.HEADLINE_BUDGET:g}"
    parts = []
    if r.get("harm_plain") is not None:
        parts.append(f"harm on {metrics.anchor_name()} at b = {b} {r['harm_plain']:.0%} → {r['harm_gated']:.0%}")
    p = p_text(r.get("p_adjusted"))
    parts.append(f"Δ {r['delta'] * 100:+.1f} pp at the same budget (BH p {p if p.startswith('<') else '= ' + p})")
    return ", ".join(parts)


def _judged(r: dict) -> str:
    significant = r.get("p_adjusted") is not None and r["p_adjusted"] < defaults.FDR_Q
    harm_known = r.get("harm_plain") is not None
    if (harm_known and r["harm_gated"] > r["harm_plain"]) or (significant and r["delta"] < 0):
        return "against the paper"
    if harm_known and r["harm_gated"] < r["harm_plain"] and significant and r["delta"] > 0:
        return "consistent with the paper"
    return "not settled by these logs"


def verdict_lines(headline: pl.DataFrame, headline_evictor: str | None) -> list[tuple[str, str]]:
    """One line per (model, context) of ``headline`` (:func:`pagestats.report.headline.headline`), as
    (the verdict, what was measured), on the headline evictor's row, or where a (model, context) lacks
    that evictor, on its first evictor by name (the line names it)."""
    if headline.height == 0:
        return []
    first = (pl.col("evictor") != headline_evictor) if headline_evictor else pl.lit(True)
    rows = (headline.sort("model", "context_length", first, "evictor")
            .unique(["model", "context_length"], keep="first", maintain_order=True))
    lines = []
    for r in rows.iter_rows(named=True):
        cell = f"{r['model']}, {r['context_length']:,} tokens"
        if in_paper_setting(r["model"], r["context_length"]):
            lines.append((f"{cell}: {_judged(r)}", f"{r['evictor']}: {_measured(r)}"))
        else:
            lines.append((f"{cell}: exercises the toolchain, not evidence for or against the paper",
                          f"outside its models at {PAPER_MIN_CONTEXT // 1024}K tokens and more; "
                          f"{r['evictor']}: {_measured(r)}"))
    return lines
