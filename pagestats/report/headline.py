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
HEADLINE_COLUMNS = (*MATRIX_CELL, "n_inputs", "delta", "low", "high", "p_adjusted", "harm_plain", "harm_gated",
                    "harm_reduction", "p_open", "kept_kv", "compression")


def headline(ctx: Context) -> pl.DataFrame:
    """Per matrix cell: Δ with the 95% cluster-bootstrap interval and BH-adjusted p (the same
    draw as Table 28: :data:`~pagestats.defaults.BOOTSTRAP_SEED`), the harm rates of the plain
    and the gated arm, their difference, p_open, kept-KV and compression.

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
    return (boot.select(*MATRIX_CELL, "n_inputs", "delta", "low", "high", "p_adjusted")
            .join(per, on=list(MATRIX_CELL))
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
        interval = f"{r['delta'] * 100:+.1f} pp [{r['low'] * 100:+.1f}, {r['high'] * 100:+.1f}]"
        p = r["p_adjusted"]
        if p is not None and p < defaults.FDR_Q and r["delta"] != 0:
            effect = (f"the gate {'raises' if r['delta'] > 0 else 'lowers'} accuracy by {interval} over plain "
                      f"eviction ({_p_text(p)})")
        else:
            effect = (f"the gate's change in accuracy over plain eviction, {interval}, is not significant "
                      f"({_p_text(p)})")
        plain, gated = r["harm_plain"], r["harm_gated"]
        harm = (f"leaves the harm rate at {plain:.0%}" if f"{plain:.0%}" == f"{gated:.0%}" else
                f"{'cuts' if gated < plain else 'raises'} the harm rate from {plain:.0%} to {gated:.0%}")
        out.append(
            f"{r['model']} at {r['context_length']} tokens, {r['evictor']}: {effect}; it {harm}, "
            f"opens on {r['p_open']:.0%} of inputs and keeps {r['kept_kv']:.0%} of the KV cache "
            f"({r['compression']:.2f}× compression).")
    return out


def _p_text(p) -> str:
    if p is None or p != p:
        return "no BH-adjusted p"
    return "BH-adjusted p < 0.001" if p < 0.001 else f"BH-adjusted p = {p:.3g}"
