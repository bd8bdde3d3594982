"""The headline numbers a report leads with, per (model, context, evictor): the paper's defensible
quantities first (the harm on the capacity-bound anchor NIAH-MK3 at b = 1/16, Δ at matched memory, the
realized compression at b = 1/16 at batch 1 and under batching), then Δ at the nominal budget
(docs/DEFINITIONS.md; PAGE paper §4, Tables 2, 22, 23, 27, 28, N3), each sentence with the
paper's own value beside it (:mod:`pagestats.report.paper`)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import polars as pl

from pagestats import metrics
from pagestats.core import defaults
from pagestats.core.columns import MATRIX_CELL, MODEL_CELL, input_key, names_like
from pagestats.report.context import Context
from pagestats.report.paper import PAPER_VALUES

#: Columns of :func:`headline`.
HEADLINE_COLUMNS = (*MATRIX_CELL, "n_inputs", "n_capacity", "harm_plain", "harm_gated", "harm_reduction",
                    "harm_plain_all", "harm_gated_all",
                    "delta_matched", "matched_low", "matched_high", "matched_p", "delta", "low", "high", "p_adjusted",
                    "p_open", "kept_kv", "kept_kv_budget", "kept_open", "compression", "compression_batch")


def headline(ctx: Context) -> pl.DataFrame:
    """Per matrix cell, the paper's defensible quantities first (§4: Δ "is at matched nominal budget, not a
    compression win"; "the defensible headline is the harm reduction (Table 27) and the matched-cache
    frontier"): the harm rates of the plain and the gated arm on the capacity-bound anchor NIAH-MK3
    (:data:`~pagestats.core.defaults.ANCHOR_TASKS`; not the whole class: niah_multiquery is in none of the
    paper's tables) at b = :data:`~pagestats.core.defaults.HEADLINE_BUDGET` (Table 27's cell) and their difference, Δ at
    matched memory (Table N3, :func:`pagestats.metrics.matched_memory`) with its interval and
    BH-adjusted p, Δ at the nominal budget with the 95% cluster-bootstrap interval and BH-adjusted p
    (the same draw as Table 28: :data:`~pagestats.core.defaults.BOOTSTRAP_SEED`), p_open, and the realized
    compression at b = 1/16 at batch 1 (Table 22) and at batch :data:`~pagestats.core.defaults.HEADLINE_BATCH`
    (Table 23).

    Notes
    -----
    The evictors of a (model, context) on the same inputs as in Table 28
    (:func:`pagestats.metrics.equal_inputs`). Δ = mean(gated − plain) over the inputs and budgets
    b < 1; ``kept_kv`` = mean n_kept / n_tokens of the gated arm over the same rows (the memory the
    matched-memory Δ is matched at). At b = 1/16: ``n_capacity`` inputs of the anchor, harm = share
    of them with A(b, x) < A_full(x), per arm (Table 27); ``kept_kv_budget`` the gated arm's mean
    kept fraction and ``compression`` = 1 / kept_kv_budget (Table 22); ``kept_open`` the mean kept
    fraction of the open inputs and ``compression_batch`` = 1 / ((1 − p_open^B) + p_open^B ·
    kept_open) (Table 23, :func:`pagestats.metrics.static_batching`). A cell without b = 1/16 (or
    without the anchor's inputs) has those columns null. ``harm_plain_all`` and ``harm_gated_all``:
    the harm rates over every task and budget b < 1 (how much each evictor loses overall). p_open =
    share of the cell's inputs on which the gate opens.
    """
    # the columns the measures below read; the rows b < 1 as a relation over them (not a copy)
    read = ctx.gated.select(list(dict.fromkeys([
        *input_key(ctx.gated), *MATRIX_CELL, "task_class", "budget", "n_tokens", "gate_open", "score_full",
        "score_plain", "score_gated", "n_kept_plain", "n_kept_gated"])))
    rows = metrics.evicted_on_equal_inputs(read, by=list(MODEL_CELL))
    if not rows.limit(1).fetchall():
        return pl.DataFrame()

    def run(metric, relation, *args, **kwargs) -> pl.DataFrame:
        return metrics.on_rows(metric, relation, read, *args, **kwargs)

    by = list(MATRIX_CELL) + (["pair_draw"] if "pair_draw" in read.columns else [])
    boot = run(metrics.delta_bootstrap, rows.filter("pair_draw = 0") if "pair_draw" in read.columns else rows,
               list(MATRIX_CELL), rng=np.random.default_rng(defaults.BOOTSTRAP_SEED))

    def harm(relation, arm: str, name: str) -> pl.DataFrame:
        """The arm's harm rate (Table 27) over every budget of ``relation``: harmed rows / rows."""
        per_budget = run(metrics.harm_rate, relation, by, arm).group_by(by).agg(pl.col("k", "n").sum())
        return per_budget.select(*by, (pl.col("k") / pl.col("n")).alias(name), pl.col("n"))

    pooled = (run(metrics.kept_kv, rows, by).select(*by, "kept_kv")
              .join(harm(rows, "plain", "harm_plain_all").drop("n"), on=by)
              .join(harm(rows, "gated", "harm_gated_all").drop("n"), on=by))
    at_b = names_like(rows.filter(f"budget = {defaults.HEADLINE_BUDGET}").pl(), read)  # one budget's rows
    capacity_rows = metrics.relation(at_b.filter(metrics.capacity_side(defaults.ANCHOR_TASKS)))  # Table 27's cell
    capacity = (harm(capacity_rows, "plain", "harm_plain").rename({"n": "n_capacity"})
                .join(harm(capacity_rows, "gated", "harm_gated").drop("n"), on=by))
    memory = metrics.on_frame(metrics.kept_kv, at_b, by).select(*by, pl.col("kept_kv").alias("kept_kv_budget"),
                                                                pl.col("kept_kv_open").alias("kept_open"))
    opened = run(metrics.p_open, rows, by).select(*by, "p_open")
    per = (pooled.join(opened, on=by).join(capacity, on=by, how="left").join(memory, on=by, how="left")
           .with_columns(pl.col("n_capacity").fill_null(0)))
    if "pair_draw" in by:  # a head-pair replay: every value is the mean over the draws
        per = per.group_by(list(MATRIX_CELL)).agg(pl.col("n_capacity").first(), pl.col(
            "harm_plain", "harm_gated", "harm_plain_all", "harm_gated_all", "kept_kv", "kept_kv_budget", "kept_open",
            "p_open").mean())
    matched = ctx.matched_memory.select(*MATRIX_CELL, "delta_matched", pl.col("low").alias("matched_low"),
                                        pl.col("high").alias("matched_high"), pl.col("p_adjusted").alias("matched_p"))
    out = (boot.select(*MATRIX_CELL, "n_inputs", "delta", "low", "high", "p_adjusted")
           .join(per, on=list(MATRIX_CELL)).join(matched, on=list(MATRIX_CELL), how="left")
           .with_columns((pl.col("harm_plain") - pl.col("harm_gated")).alias("harm_reduction"),
                         (1.0 / pl.col("kept_kv_budget")).alias("compression")))
    # Table 23's provisioning at one batch size (no open input: nothing is kept below the full cache)
    batched = metrics.static_batching(out["p_open"].to_numpy(), out["kept_open"].fill_null(0.0).to_numpy(),
                                      batch_sizes=(defaults.HEADLINE_BATCH,))
    return (out.with_columns(pl.Series("compression_batch", batched["compression"].to_numpy()))
            .with_columns(pl.when(pl.col("kept_kv_budget").is_null()).then(None)
                          .otherwise(pl.col("compression_batch")).alias("compression_batch"))
            .select(HEADLINE_COLUMNS).sort(list(MATRIX_CELL)))


def headline_sentences(frame: pl.DataFrame, headline_evictor: str | None) -> list[str]:
    """One sentence per (model, context) cell of the headline evictor, the finding first.

    The gate "raises" (or "lowers") accuracy only where the Benjamini–Hochberg-adjusted p of
    the cell's Δ is below :data:`pagestats.core.defaults.FDR_Q` (Table 28); otherwise the sentence
    says that the change is not significant, whatever the sign of its point estimate. The harm
    verb follows the two harm rates (Table 27): "cuts", "raises" or "leaves".
    """
    out = []
    if frame.height == 0:
        return ["The logs hold no eviction budget b < 1: there is no gating effect to report."]
    sub = frame.filter(pl.col("evictor") == headline_evictor) if headline_evictor else frame
    b = _fraction(defaults.HEADLINE_BUDGET)
    for r in sub.iter_rows(named=True):
        parts = []
        plain, gated = r["harm_plain"], r["harm_gated"]
        if plain is not None:
            harm = (f"leaves the harm rate at {plain:.1%}" if f"{plain:.1%}" == f"{gated:.1%}" else
                    f"{'cuts' if gated < plain else 'raises'} the harm rate from {plain:.1%} to {gated:.1%}")
            parts.append(f"on the capacity-bound anchor {metrics.anchor_name()} at b = {b} ({r['n_capacity']} inputs) "
                         f"the gate {harm} "
                         f"(paper: {PAPER_VALUES['harm_plain'][0]} to {PAPER_VALUES['harm_gated'][0]}, Table 27)")
        if r.get("delta_matched") is not None:
            parts.append(f"at matched memory (plain eviction's frontier at the same {r['kept_kv']:.0%} of the KV "
                         f"cache) {_effect(r['delta_matched'], r['matched_low'], r['matched_high'], r['matched_p'])}")
        parts.append(f"at the same nominal budget {_effect(r['delta'], r['low'], r['high'], r['p_adjusted'])}")
        memory = f"It opens on {r['p_open']:.0%} of inputs"
        if r["compression"] is not None:
            memory += (f"; at b = {b} it keeps {r['kept_kv_budget']:.0%} of the KV cache, {r['compression']:.2f}× "
                       f"compression at batch 1 and {r['compression_batch']:.2f}× at batch {defaults.HEADLINE_BATCH} "
                       f"(paper: {PAPER_VALUES['compression'][0]} at batch 1, Table 22; "
                       f"{PAPER_VALUES['compression_batch'][0]} with the batch, Table 23)")
        out.append(f"{r['model']} at {r['context_length']} tokens, {r['evictor']}: {'; '.join(parts)}. {memory}.")
    return out


def _fraction(b: float) -> str:
    """1/16 for 0.0625: the budget as the paper writes it."""
    f = Fraction(b).limit_denominator(1024)
    return f"{f.numerator}/{f.denominator}" if f.denominator != 1 else str(f.numerator)


def _effect(delta, low, high, p) -> str:
    """'it raises accuracy by …' where BH rejects at :data:`~pagestats.core.defaults.FDR_Q`, else 'not significant'."""
    interval = f"{delta * 100:+.1f} pp [{low * 100:+.1f}, {high * 100:+.1f}]"
    if p is not None and p == p and p < defaults.FDR_Q and delta != 0:
        return f"it {'raises' if delta > 0 else 'lowers'} accuracy by {interval} over plain eviction ({_p_text(p)})"
    return f"its change in accuracy over plain eviction, {interval}, is not significant ({_p_text(p)})"


def _p_text(p) -> str:
    if p is None or p != p:
        return "no BH-adjusted p"
    return "BH-adjusted p < 0.001" if p < 0.001 else f"BH-adjusted p = {p:.3f}"  # as verdict.p_text
