"""The figure entries of the report: :data:`FIGURES`, one :class:`~pagestats.report.context.Entry`
per paper figure (docs/CLI.md ``pagestats report``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from pagestats import replay
from pagestats.core import defaults, formulas
from pagestats.core.columns import rows_where
from pagestats.figures import (
    accuracy_vs_budget,
    accuracy_vs_kept_kv,
    agreement_profile,
    cell_label,
    delta_matrix,
    delta_of_f,
    drop_by_task,
    recovery_distribution,
    recovery_fraction,
    rho_vs_headroom,
    tau_sensitivity,
)
from pagestats.report.decision import decision_figure
from pagestats.report.context import (
    Context,
    Entry,
    needs_agreement,
    needs_both_classes,
    needs_cache_size,
    needs_contexts,
    needs_dilution_headroom,
    needs_eviction_budgets,
)


def _per_cell(ctx: Context, frame: pl.DataFrame, keys: Sequence[str], draw) -> list[tuple[str, object]]:

    parts = []
    evicted = frame.lazy().filter(formulas.EVICTED) if "budget" in frame.columns else frame.lazy()
    for cell in evicted.select(keys).unique().sort(keys).collect().to_dicts():  # a full-KV-only cell has no curve
        part = cell_label(cell).replace(" ", "-")
        parts.append((part, draw(cell)))
    return parts


def _fig2(ctx):

    return drop_by_task(ctx.gate, tau=ctx.fixed_tau)


def _fig3(ctx):

    ev = ctx.headline_evictor
    sub = rows_where(ctx.gated, pl.col("evictor") == ev)
    return _per_cell(ctx, sub, ["model", "context_length"],
                     lambda c: accuracy_vs_budget(sub, model=c["model"], context_length=c["context_length"], evictor=ev))


def _fig4(ctx):

    ev = ctx.headline_evictor
    sub = rows_where(ctx.gated, pl.col("evictor") == ev)
    return _per_cell(ctx, sub, ["context_length"],
                     lambda c: accuracy_vs_kept_kv(sub, evictor=ev, context_length=c["context_length"]))


def _fig5(ctx):

    return agreement_profile(ctx.logs.inputs, bin_fraction=ctx.profile.bin_fraction,
                             convention=ctx.profile.convention)


def tau_grid() -> np.ndarray:
    """Thresholds of the τ-sensitivity curve (Fig. 6): :data:`pagestats.core.defaults.TAU_GRID`
    (start, stop, step; stop included), rounded to 6 decimals."""
    start, stop, step = defaults.TAU_GRID
    return np.round(np.arange(start, stop + step / 25, step), 6)


def _fig6(ctx):

    tau0 = ctx.fixed_tau if ctx.fixed_tau is not None else defaults.TAU
    taus = np.unique(np.r_[tau_grid(), tau0])
    curve = replay.paper_tau_curve(ctx.logs, taus, ctx.profile, by=("model", "context_length", "evictor"))
    curve = curve.filter(pl.col("evictor") == ctx.headline_evictor)
    return tau_sensitivity(curve, tau0=tau0)


def _needs_fig6_recipe(ctx) -> str | None:
    """Fig. 6's recipe reads the budgets {0.5, 0.25, 0.125, 0.0625}, NIAH-MK3 and one of VT, FWE, QA_1."""
    budgets = set(ctx.logs.outcomes["budget"].unique().to_list())
    tasks = set(ctx.logs.inputs["task"].unique().to_list())
    if not budgets & set(defaults.FIG6_BUDGETS):
        return f"needs a budget among {list(defaults.FIG6_BUDGETS)} (the paper's Fig. 6 budgets)"
    if not tasks & set(defaults.FIG6_FP_TASKS) or not tasks & set(defaults.FIG6_FN_TASKS):
        return (f"needs the capacity-bound anchor {', '.join(defaults.FIG6_FP_TASKS)} (its false-positive rate) and one of "
                f"{', '.join(defaults.FIG6_FN_TASKS)} (its false-negative rate)")
    return None


def _needs_anchor(ctx) -> str | None:
    """Fig. 7 splits the workload into the capacity-bound anchor (NIAH-MK3) and the rest."""
    missing = set(defaults.ANCHOR_TASKS) - set(ctx.logs.inputs["task"].unique().cast(pl.String).to_list())
    return f"needs the capacity-bound anchor {', '.join(sorted(missing))}; not in the logs" if missing else None


def _fig7(ctx):

    return delta_of_f(ctx.gated)


def _fig8(ctx):

    return delta_matrix(ctx.gated)


def _fig9(ctx):

    return rho_vs_headroom(rows_where(ctx.gated, pl.col("evictor") == ctx.headline_evictor), rule=ctx.dilution_rule)


def _fig10(ctx):

    return recovery_distribution(rows_where(ctx.gated, pl.col("evictor") == ctx.headline_evictor))


def _fig11(ctx):

    return recovery_fraction(rows_where(ctx.gated, pl.col("evictor") == ctx.headline_evictor))


FIGURES: tuple[Entry, ...] = (
    Entry("fig02_drop_by_task", "figure", "Figure 2", _fig2, (),
          "D per input by task; bars are per-task means; dashed line the fixed τ.", reads_gated=False),
    Entry("fig03_accuracy_vs_budget", "figure", "Figure 3", _fig3, (needs_eviction_budgets,),
          "Accuracy vs nominal KV budget, plain (solid) and gated (dashed), per task; one file per "
          "(model, context), headline evictor."),
    Entry("fig04_accuracy_vs_kept_kv", "figure", "Figure 4", _fig4, (needs_eviction_budgets,),
          "Accuracy vs achieved kept-KV fraction with the frontier; one file per context, headline evictor."),
    Entry("fig05_agreement_profile", "figure", "Figure 5", _fig5, (needs_agreement,),
          "Per-layer agreement a_ℓ averaged over inputs per task; shaded early/late bins.", reads_gated=False),
    Entry("fig06_tau_sensitivity", "figure", "Figure 6", _fig6, (needs_eviction_budgets, _needs_fig6_recipe),
          "Δ, FP and FN rates vs τ, the paper's recipe: budgets {0.5, 0.25, 0.125, 0.0625}, Δ the mean over (task, "
          "budget) cells, FP on NIAH-MK3, FN on VT/FWE/QA_1; shaded plateau |Δ − Δ_τ0| ≤ 1 pp and FP + FN ≤ 0.10; "
          "headline evictor.", reads_gated=False),
    Entry("fig07_delta_of_f", "figure", "Figure 7", _fig7, (needs_eviction_budgets, needs_both_classes, _needs_anchor),
          "Δ(f) = f·Δ_MK3 + (1 − f)·Δ_rest per matrix cell (grey) and their mean: Δ_MK3 over the capacity-bound "
          "anchor NIAH-MK3 alone (niah_multiquery is in Δ_rest, as every task but NIAH-MK3), f its share of the "
          "workload."),
    Entry("fig08_delta_matrix", "figure", "Figure 8", _fig8, (needs_eviction_budgets,),
          "Δ (gated − plain, budgets b < 1) per (model, context) × evictor cell, in pp; the colour scale runs "
          "from 0 when every Δ has one sign and is diverging, centred at 0, when signs differ."),
    Entry("fig09_rho_vs_headroom", "figure", "Figure 9", _fig9,
          (needs_eviction_budgets, needs_contexts(2), needs_dilution_headroom),
          "ρ vs headroom 1 − A_full per (model, context, task) with the through-origin slope; headline evictor."),
    Entry("fig10_recovery_distribution", "figure", "Figure 10", _fig10, (needs_eviction_budgets,),
          "Distribution of the per-input recovery indicator r(x) = sign(max_b A_gated(b, x) − A_plain(1, x)) "
          "∈ {−1, 0, +1} per task, pooled over cells: the maximum is over the budget sweep (b = 1.0 included) and "
          "A_plain(1, x) is the full-cache score of input x, so r(x) = +1 when some budget beats the full cache on x "
          "and 0 when none does; r = −1 is empty by construction (at b = 1.0 the gated arm keeps the full cache); "
          "headline evictor."),
    Entry("fig11_recovery_fraction", "figure", "Figure 11", _fig11, (needs_eviction_budgets,),
          "Share of inputs with r(x) > 0 (some budget of the sweep beats the full cache on the input; r(x) as in "
          "Figure 10) per task and (model, context) cell, Wilson 95% bars; headline evictor."),
    Entry("figN1_decision_frontier", "figure", "New figure", decision_figure, (needs_eviction_budgets, needs_cache_size),
          "The decision figure: gated accuracy vs kept KV over every threshold τ and budget b, one colour per "
          "evictor; the line is each evictor's frontier, open circles the points at the fixed τ, the star the "
          "full cache; top axis in GiB per sequence."),
)
