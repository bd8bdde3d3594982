"""The ``whatif`` summary as a text table that fits a terminal (docs/CLI.md).

Rates are shown as the report shows them: accuracies, harm rates, the gate-open share and the kept
KV cache in %, Δ in percentage points (pp). Model and context are headings, one block per
(model, context); the other group keys are the left columns. A table wider than ``width``
characters has its longest names shortened in the middle (``…``), and says so; ``whatif --wide``
prints every name whole.
"""

from __future__ import annotations

import textwrap

import polars as pl

from pagestats.core.escape import terminal

__all__ = ["COLUMN_HELP", "WIDTH", "summary_text"]

#: Characters of a terminal line the table fits by default (``whatif --wide`` lifts it).
WIDTH = 100
#: The shortest a name is cut to when the table must fit.
_MIN_NAME = 12

#: Value column → (upper header, lower header, format of one value).
_VALUES = {
    "n_inputs": ("", "n", lambda v: f"{v:d}"),
    "acc_plain": ("acc %", "plain", lambda v: f"{v * 100:.1f}"),
    "acc_gated": ("acc %", "gated", lambda v: f"{v * 100:.1f}"),
    "delta": ("Δ", "pp", lambda v: f"{v * 100:+.1f}"),
    "harm_plain": ("harm %", "plain", lambda v: f"{v * 100:.1f}"),
    "harm_gated": ("harm %", "gated", lambda v: f"{v * 100:.1f}"),
    "p_open": ("open", "%", lambda v: f"{v * 100:.1f}"),
    "kept_kv": ("kept", "KV %", lambda v: f"{v * 100:.1f}"),
}
#: What each column of the table means (``pagestats whatif --help`` prints it).
COLUMN_HELP = (
    "Columns of the table (means over the inputs and budgets b < 1 of each row's group; every budget "
    "when --by has budget): n = inputs; acc % plain / gated = mean score of plain eviction / of the "
    "gated arm (Eq. 2), in %; Δ pp = gated − plain accuracy in percentage points (Table 2); harm % "
    "plain / gated = share of inputs scored below the full cache (Table 27); open % = share of inputs "
    "whose gate opens (D ≥ τ); kept KV % = mean n_kept / n_tokens of the gated arm. One block per "
    "(model, context)."
)
_HEADINGS = ("model", "context_length")


def _heading(key: dict) -> str:
    parts = [terminal(key["model"])] if "model" in key else []
    if "context_length" in key:
        parts.append(f"context {key['context_length']:,} tokens")
    return ", ".join(parts)


def _shorten(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters in the middle (``…``), or as it is when it fits."""
    if len(text) <= n:
        return text
    head = n // 2
    return text[:head] + "…" + text[len(text) - (n - 1 - head):]


def summary_text(summary: pl.DataFrame, *, width: int | None = WIDTH) -> str:
    """``summary`` (:func:`pagestats.replay.whatif.whatif_summary`) as text: a heading per (model,
    context), then one row per group, at most ``width`` characters wide (``None``: no limit).

    Returns
    -------
    str
        The blocks, then lines on the units, on shortened names (when any) and on the per-cell table.
    """
    values = [c for c in _VALUES if c in summary.columns]
    heads = [k for k in _HEADINGS if k in summary.columns]
    keys = [c for c in summary.columns if c not in values and c not in heads]
    cells = {k: [terminal("–" if v is None else v) for v in summary[k].to_list()] for k in keys}
    cells |= {c: ["–" if v is None else _VALUES[c][2](v) for v in summary[c].to_list()] for c in values}
    upper = {k: "" for k in keys} | {c: _VALUES[c][0] for c in values}
    lower = {k: k for k in keys} | {c: _VALUES[c][1] for c in values}
    widths = {c: max(len(upper[c]), len(lower[c]), *map(len, cells[c]), 1) for c in [*keys, *values]}
    left = [k for k in keys if summary.schema[k] == pl.String]
    shortened = False
    while width is not None and sum(widths.values()) + 2 * (len(widths) - 1) > width:
        names = [k for k in left if widths[k] > max(_MIN_NAME, len(lower[k]))]
        if not names:
            break
        widest = max(names, key=widths.get)
        widths[widest] -= 1
        cells[widest] = [_shorten(v, widths[widest]) for v in cells[widest]]
        shortened = True

    def line(row: dict) -> str:
        return "  ".join(row[c].ljust(widths[c]) if c in left else row[c].rjust(widths[c])
                         for c in [*keys, *values]).rstrip()

    header = [line(upper), line(lower)]
    blocks: list[str] = []
    rows = range(summary.height)
    groups = summary.with_row_index("_row").group_by(heads, maintain_order=True).agg("_row") if heads else None
    for key, members in ([(dict(zip(heads, g[:-1])), g[-1]) for g in groups.iter_rows()] if heads else [({}, rows)]):
        if blocks:
            blocks.append("")
        if key:
            blocks.append(_heading(key))
        blocks += header + [line({c: cells[c][i] for c in [*keys, *values]}) for i in members]
    notes = ["acc, harm, open and kept KV in %, Δ in percentage points (pp); means over inputs and "
             + ("every budget" if "budget" in summary.columns else "budgets b < 1")
             + "; the columns: pagestats whatif --help"]
    if shortened:
        notes.append("names shortened in the middle (…) to fit; --wide prints them whole")
    notes.append("the per-cell table: --format csv or -o FILE")
    wrap = width or WIDTH
    return "\n".join([*blocks, *(w for n in notes for w in textwrap.wrap(n, wrap))])
