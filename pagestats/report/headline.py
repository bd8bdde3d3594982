"""The headline numbers a report leads with: per (model, context, evictor), the gating Δ with
its cluster-bootstrap interval, the harm rates with and without the gate, the gate-open share
and the memory kept (docs/DEFINITIONS.md; PAGE paper §4, Tables 2, 22, 27, 28)."""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats import defaults, metrics
from pagestats.columns import MATRIX_CELL, MODEL_CELL
from pagestats.report.context import Context

#: Columns of :func:`headline`.
HEADLINE_COLUMNS = (*MATRIX_CELL, "n_inputs", "harm_plain", "harm_gated", "harm_reduction", "delta_matched",
                    "matched_low", "matched_high", "matched_p", "delta", "low", "high", "p_adjusted", "p_open", "kept_kv",
                    "compression")


def headline(ctx: Context) -> pl.DataFrame:
    """Per matrix cell, the paper's defensible quantities first (§4: Δ "is at matched nominal budget, not a
    compression win"; "the defensible headline is the harm reduction (Table 27) and the matched-cache
    frontier"): the harm rates of the plain and the gated arm and their difference, Δ at matched memory
    (Table N3, :func:`pagestats.metrics.matched_memory`) with its interval and BH-adjusted p, then Δ at
    the nominal budget with the 95% cluster-bootstrap interval and BH-adjusted p (the same draw as
    Table 28: :data:`~pagestats.defaults.BOOTSTRAP_SEED`), p_open, kept-KV and compression.

    Notes
    -----
    Over the cell's inputs and budgets b < 1, the evictors of a (model, context) on the same inputs
    as in Table 28 (:func:`pagestats.metrics.equal_inputs`): Δ = mean(gated − plain); harm = share of
    (input, b) with A(b, x) < A_full(x), per arm (Table 27, pooled over b); kept_kv = mean
    n_kept / n_tokens of the gated arm and compression = 1 / kept_kv (Table 22); p_open =
    share of the cell's inputs on which the gate opens.
    """
    rows = ctx.gated.filter(pl.col("budget") < 1.0)
    if rows.height == 0:
        return pl.DataFrame()
    rows, _ = metrics.equal_inputs(rows, by=list(MODEL_CELL))
    by = list(MATRIX_CELL) + (["pair_draw"] if "pair_draw" in rows.columns else [])
    boot = metrics.delta_bootstrap(rows.filter(pl.col("pair_draw") == 0) if "pair_draw" in rows.columns else rows,
                                   list(MATRIX_CELL), rng=np.random.default_rng(defaults.BOOTSTRAP_SEED))
    pooled = rows.group_by(by).agg(
        (pl.col("score_plain") < pl.col("score_full")).mean().alias("harm_plain"),
        (pl.col("score_gated") < pl.col("score_full")).mean().alias("harm_gated"),
        (pl.col("n_kept_gated") / pl.col("n_tokens")).mean().alias("kept_kv"),
    )
    opened = metrics.p_open(rows, by).select(*by, "p_open")
    per = pooled.join(opened, on=by)
    if "pair_draw" in by:  # a head-pair replay: every value is the mean over the draws
        per = per.group_by(list(MATRIX_CELL)).agg(pl.col("harm_plain", "harm_gated", "kept_kv", "p_open").mean())
    matched = ctx.matched_memory.select(*MATRIX_CELL, "delta_matched", pl.col("low").alias("matched_low"),
                                        pl.col("high").alias("matched_high"), pl.col("p_adjusted").alias("matched_p"))
    return (boot.select(*MATRIX_CELL, "n_inputs", "delta", "low", "high", "p_adjusted")
            .join(per, on=list(MATRIX_CELL)).join(matched, on=list(MATRIX_CELL), how="left")
            .with_columns((pl.col("harm_plain") - pl.col("harm_gated")).alias("harm_reduction"),
                          (1.0 / pl.col("kept_kv")).alias("compression"))
            .select(HEADLINE_COLUMNS).sort(list(MATRIX_CELL)))


def headline_sentences(frame: pl.DataFrame, headline_evictor: str | None) -> list[str]:
    """One sentence per (model, context) cell of the headline evictor, the finding first.

    The gate "raises" (or "lowers") accuracy only where the Benjamini–Hochberg-adjusted p of
    the cell's Δ is below :data:`pagestats.defaults.FDR_Q` (Table 28); otherwise the sentence
    says that the change is not significant, whatever the sign of its point estimate. The harm
    verb follows the two harm rates (Table 27): "cuts", "raises" or "leaves".
    """
    out = []
    if frame.height == 0:
        return ["The logs hold no eviction budget b < 1: there is no gating effect to report."]
    sub = frame.filter(pl.col("evictor") == headline_evictor) if headline_evictor else frame
    for r in sub.iter_rows(named=True):
        plain, gated = r["harm_plain"], r["harm_gated"]
        harm = (f"leaves the harm rate at {plain:.0%}" if f"{plain:.0%}" == f"{gated:.0%}" else
                f"{'cuts' if gated < plain else 'raises'} the harm rate from {plain:.0%} to {gated:.0%}")
        parts = [f"the gate {harm}"]
        if r.get("delta_matched") is not None:
            parts.append(f"at matched memory (plain eviction's frontier at the same {r['kept_kv']:.0%} of the KV "
                         f"cache) {_effect(r['delta_matched'], r['matched_low'], r['matched_high'], r['matched_p'])}")
        parts.append(f"at the same nominal budget {_effect(r['delta'], r['low'], r['high'], r['p_adjusted'])}")
        out.append(
            f"{r['model']} at {r['context_length']} tokens, {r['evictor']}: {'; '.join(parts)}. It opens on "
            f"{r['p_open']:.0%} of inputs ({r['compression']:.2f}× compression at batch 1).")
    return out


def _effect(delta, low, high, p) -> str:
    """'it raises accuracy by …' where BH rejects at :data:`~pagestats.defaults.FDR_Q`, else 'not significant'."""
    interval = f"{delta * 100:+.1f} pp [{low * 100:+.1f}, {high * 100:+.1f}]"
    if p is not None and p == p and p < defaults.FDR_Q and delta != 0:
        return f"it {'raises' if delta > 0 else 'lowers'} accuracy by {interval} over plain eviction ({_p_text(p)})"
    return f"its change in accuracy over plain eviction, {interval}, is not significant ({_p_text(p)})"


def _p_text(p) -> str:
    if p is None or p != p:
        return "no BH-adjusted p"
    return "BH-adjusted p < 0.001" if p < 0.001 else f"BH-adjusted p = {p:.3g}"
