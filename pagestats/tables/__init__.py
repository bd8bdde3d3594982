"""The paper's tables: one function per table returning a tidy polars frame of numbers,
layouts that typeset them (great_tables), and the :data:`TABLES` registry read by
:func:`pagestats.report.build_report`.

Modules follow the data flow: :mod:`~pagestats.tables.partition` (ρ, D per task, scaling,
pre-registration, harm), :mod:`~pagestats.tables.effects` (Δ matrix, budgets, oracle,
compression, bootstrap, draws), :mod:`~pagestats.tables.signal` (signal ablation,
calibration, head-pair / layer subsampling, pilot sensitivity). :mod:`~pagestats.tables._render`
holds every formatting decision; :data:`LAYOUTS` names the layout of each table.

Examples
--------
>>> from pagestats import io, replay, tables                      # doctest: +SKIP
>>> logs = io.load(["data/run"])                                  # doctest: +SKIP
>>> t1 = tables.recovery_table(replay.gated_outcomes(logs))       # doctest: +SKIP
>>> tables.write_table(t1, "out/table01", tables.LAYOUTS["tab01_recovery"])  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats import defaults
from pagestats.tables._common import headline_evictor, ordering_margin, task_means
from pagestats.tables._render import Layout, display_frame, format_interval, to_gt, to_markdown, write_table
from pagestats.tables.effects import (
    BATCH_SIZES,
    batching_table,
    best_evictor_table,
    bootstrap_table,
    budget_axis_table,
    compression_table,
    cross_cell_table,
    delta_by_task_table,
    delta_matrix_table,
    draw_replicates_table,
    oracle_gap_table,
)
from pagestats.tables.partition import (
    MULTIKEY_TASKS,
    distractor_sweep_table,
    drop_by_task_table,
    harm_table,
    preregistered_table,
    recovery_table,
    scaling_table,
)
from pagestats.tables.signal import (
    PAIR_FRACTIONS,
    PILOT_SIZES,
    auc_table,
    calibration_table,
    head_pair_table,
    layer_subset_table,
    pilot_sensitivity_table,
    signal_ablation_table,
)

__all__ = [
    "Layout", "LAYOUTS", "TABLES", "BOOTSTRAP_SEED",
    "format_interval", "display_frame", "to_gt", "to_markdown", "write_table",
    "headline_evictor", "task_means", "ordering_margin",
    "recovery_table", "drop_by_task_table", "distractor_sweep_table", "scaling_table", "preregistered_table",
    "harm_table", "delta_matrix_table", "delta_by_task_table", "budget_axis_table", "oracle_gap_table",
    "best_evictor_table", "cross_cell_table", "compression_table", "batching_table", "bootstrap_table",
    "draw_replicates_table", "auc_table", "signal_ablation_table", "calibration_table", "head_pair_table",
    "layer_subset_table", "pilot_sensitivity_table",
    "MULTIKEY_TASKS", "BATCH_SIZES", "PAIR_FRACTIONS", "PILOT_SIZES",
]  # fmt: skip

#: Seed of the cluster bootstrap of the report's Tables 28–29 (recorded so a report is reproducible).
BOOTSTRAP_SEED = 0

_WILSON = f"Wilson {defaults.CONFIDENCE_LEVEL:.0%} intervals."
_DELTA = "Δ = mean over inputs and budgets b < 1 of gated − plain score."

#: The typeset layout of each table (rendering only; the frames hold the numbers).
LAYOUTS: dict[str, Layout] = {
    "tab01_recovery": Layout("Table 1 — per-input recovery rate ρ (Eq. 1)", {"ρ [95% CI]": ("rho", "low", "high")},
                             notes=(_WILSON, "ρ = Pr[max_{b<1} A_plain(b,x) > A_plain(1,x)]; dilution-prone iff ρ ≥ 0.05.",
                                    "Pooled rows: all cells of the class together (the contrast of §4).")),
    "tab02_delta_matrix": Layout("Table 2 — gating Δ per (model, context) × evictor", {},
                                 spanners={"Δ": ["delta", "delta_rest"]},
                                 notes=(_DELTA, "delta_rest excludes the capacity-bound tasks; identical = gate open on every "
                                        "other input, so gated ≡ plain there (the paper's †).")),
    "tab03_drop_by_task": Layout("Table 3 — mean D and gate-open fraction per task (deployed bins)",
                                 {"p_open [95% CI]": ("p_open", "low", "high")}, notes=(_WILSON,)),
    "tab04_distractor_sweep": Layout("Table 4 — distractor sweep along NIAH-MultiKey 1 → 2 → 3", {},
                                     notes=("monotone: mean D strictly decreasing along the gradient.",)),
    "tab05_06_signal_ablation": Layout("Tables 5–6 — gate-signal ablation", {"AUC [95% CI]": ("auc", "low", "high")},
                                       notes=("AUC per input, capacity-bound lower orientation, DeLong interval; p from a "
                                              f"two-sided Mann–Whitney test, Benjamini–Hochberg at q = {defaults.FDR_Q}.",
                                              "margin = min dilution-prone task mean − max capacity-bound task mean.")),
    "tab07_calibration": Layout("Table 7 — midpoint calibration (Eq. 5) vs fixed τ", {},
                                spanners={"Δ": ["delta_fixed", "delta_calibrated"]}, notes=(_DELTA,)),
    "tab09_head_pairs": Layout("Table 9 — head-pair subsampling", {}, decimals=4,
                               notes=("Random pair subsets per fraction; ordering = draws with a positive margin.",)),
    "tab10_layers": Layout("Table 10 — layer subsampling", {}, decimals=4,
                           notes=("margin > 0: a single threshold still separates the classes on task means.",)),
    "tab12_delta_by_task": Layout("Table 12 — per-task Δ for every matrix cell", {}, notes=(_DELTA,)),
    "tab13_budget_axis": Layout("Table 13 — plain vs gated accuracy per budget", {},
                                spanners={"accuracy": ["acc_full", "acc_plain", "acc_gated"]}),
    "tab14_oracle_gap": Layout("Table 14 — PAGE vs the task-label oracle", {}, notes=(_DELTA,)),
    "tab17_best_evictor": Layout("Table 17 — best plain vs best gated evictor", {},
                                 notes=("Accuracy = mean score over inputs and budgets b < 1.",)),
    "tab20_cross_cell": Layout("Table 20 — Δ across (model, context) cells, fixed and calibrated τ", {},
                               spanners={"fixed τ": ["tau_fixed", "delta_fixed", "p_open_fixed"],
                                         "calibrated τ (Eq. 5)": ["tau_calibrated", "delta_calibrated", "p_open_calibrated"]}),
    "tab21_preregistered": Layout("Table 21 — pre-registered predictions vs measurement",
                                  {"measured ρ [95% CI]": ("rho", "low", "high")}, hide=("sha256",),
                                  notes=("Band = ratio ρ/(1−A_full) range on the fitting contexts × measured headroom; "
                                         "frozen (sha256) before the measurement was read.",)),
    "tab22_compression": Layout("Table 22 — achieved compression of the gated deployment", {},
                                notes=("Empty budget = grid mean over the budgets b < 1.",)),
    "tab23_batching": Layout("Table 23 — compression under static batch provisioning", {},
                             notes=("provisioned(B) = (1 − p_open^B) + p_open^B · k_open.",)),
    "tab24_drop_by_task_strict": Layout("Table 24 — mean D per task (strict thirds)",
                                        {"p_open [95% CI]": ("p_open", "low", "high")}, notes=(_WILSON,)),
    "tab25_scaling": Layout("Table 25 — scaling verification ρ / (1 − A_full)", {"ρ [95% CI]": ("rho", "low", "high")},
                            notes=("slope: least squares through the origin of ρ on headroom over dilution-prone rows.",)),
    "tab27_harm": Layout("Table 27 — fixed-budget harm rate, gated / plain",
                         {"gated [95% CI]": ("harm_gated", "gated_low", "gated_high"),
                          "plain [95% CI]": ("harm_plain", "plain_low", "plain_high")}, notes=(_WILSON,)),
    "tab28_bootstrap": Layout("Table 28 — cluster-bootstrap intervals of the matrix Δ",
                              {"Δ [95% CI]": ("delta", "low", "high")}, decimals=4,
                              notes=(f"Cluster bootstrap over inputs ({defaults.N_BOOTSTRAP} replicates), 2.5–97.5 percentiles; "
                                     f"Benjamini–Hochberg at q = {defaults.FDR_Q} across cells.",)),
    "tab29_bootstrap_capacity": Layout("Table 29 — cluster-bootstrap intervals, capacity-bound tasks",
                                       {"Δ [95% CI]": ("delta", "low", "high")}, decimals=4,
                                       notes=(f"Cluster bootstrap over inputs, BH at q = {defaults.FDR_Q} across rows.",)),
    "tab30_draws": Layout("Table 30 — input-draw replicates of Δ", {}, notes=("SD with ddof = 1.",)),
    "tabN1_pilot_sensitivity": Layout("New — z-scored gate vs the pilot definition", {},
                                      notes=("closed_call: fewer than half of the task's inputs open; flips: differs from "
                                             "the reference pilot (first 100 inputs per model).",)),
}


# --------------------------------------------------------------------------- registry


def _typeset(name: str, frame: pl.DataFrame):
    return frame, to_gt(frame, LAYOUTS[name])


def _needs_tasks(*tasks: str):
    def check(ctx) -> str | None:
        have = set(ctx.logs.inputs["task"].unique().to_list())
        missing = [t for t in tasks if t not in have]
        return f"needs the tasks {', '.join(missing)}; not in the logs" if missing else None

    check.__name__ = "needs_tasks"
    return check


def _needs_pair_jaccard(ctx) -> str | None:
    inputs = ctx.logs.inputs
    if "pair_jaccard" not in inputs.columns or inputs.select(pl.col("pair_jaccard").list.len().min()).item() in (0, None):
        return "no per-pair Jaccards (pair_jaccard) in the inputs"
    return None


def _needs_prediction_fit(ctx) -> str | None:
    inputs = ctx.logs.inputs
    largest = max(ctx.context_lengths)
    fit = (inputs.filter(pl.col("context_length") < largest).group_by("model", "task")
           .agg((1.0 - pl.col("full_score").mean()).alias("h")).filter(pl.col("h") > 0))
    target = inputs.filter(pl.col("context_length") == largest).select("model", "task").unique()
    if fit.join(target, on=["model", "task"], how="semi").height == 0:
        return (f"no (model, task) has full-KV headroom > 0 below the largest context {largest} "
                "to fit the ratio band on")
    return None


def _needs_capacity(ctx) -> str | None:
    if defaults.CAPACITY_BOUND not in ctx.task_classes:
        return "no capacity-bound task in the logs"
    return None


def _entries():
    from pagestats import replay
    from pagestats.policies import Midpoint, TaskOracle
    from pagestats.report import (
        Entry,
        needs_agreement,
        needs_both_classes,
        needs_contexts,
        needs_dilution_headroom,
        needs_draws,
        needs_eviction_budgets,
    )

    def strict(ctx):
        spec = replay.ProfileSpec(**{**ctx.profile.__dict__, "convention": "strict"})
        return replay.gate(ctx.logs, ctx.policy, spec)

    def rng():
        return np.random.default_rng(BOOTSTRAP_SEED)

    ev, both = needs_eviction_budgets, needs_both_classes
    t = _typeset
    return (
        Entry("tab01_recovery", "table", "Table 1", lambda c: t("tab01_recovery", recovery_table(c.gated)), (ev,),
              "ρ with Wilson 95% intervals per task × cell; pooled capacity-bound vs dilution-prone contrast."),
        Entry("tab02_delta_matrix", "table", "Table 2", lambda c: t("tab02_delta_matrix", delta_matrix_table(c.gated)),
              (ev,), "Δ per (model, context, evictor), with and without capacity-bound tasks; identity marker."),
        Entry("tab03_drop_by_task", "table", "Table 3", lambda c: t("tab03_drop_by_task", drop_by_task_table(c.gate)),
              (needs_agreement,), "Mean D and gate-open fraction per task (deployed bins)."),
        Entry("tab04_distractor_sweep", "table", "Table 4",
              lambda c: t("tab04_distractor_sweep", distractor_sweep_table(c.gate)), (_needs_tasks(*MULTIKEY_TASKS),),
              "Mean D along NIAH-MultiKey 1 → 2 → 3 with a monotonicity flag."),
        Entry("tab05_06_signal_ablation", "table", "Tables 5–6",
              lambda c: t("tab05_06_signal_ablation", signal_ablation_table(c.logs, profile=c.profile)),
              (needs_agreement, both), "Separation, margin, AUC (BH), MK monotonicity and r with D per signal."),
        Entry("tab07_calibration", "table", "Table 7",
              lambda c: t("tab07_calibration", calibration_table(c.logs, profile=c.profile)), (ev, both),
              "Midpoint-calibrated τ (Eq. 5) vs the fixed τ per cell."),
        Entry("tab09_head_pairs", "table", "Table 9",
              lambda c: t("tab09_head_pairs", head_pair_table(c.logs, profile=c.profile)), (_needs_pair_jaccard, both),
              "Margin over 20 random head-pair subsets per fraction."),
        Entry("tab10_layers", "table", "Table 10",
              lambda c: t("tab10_layers", layer_subset_table(c.logs, profile=c.profile)), (needs_agreement, both),
              "Margin of D recomputed on layer subsets."),
        Entry("tab12_delta_by_task", "table", "Table 12",
              lambda c: t("tab12_delta_by_task", delta_by_task_table(c.gated)), (ev,),
              "Per-task Δ for every matrix cell with gate-open fractions."),
        Entry("tab13_budget_axis", "table", "Table 13",
              lambda c: t("tab13_budget_axis", budget_axis_table(c.gated)), (ev,), "Plain vs gated accuracy per budget."),
        Entry("tab14_oracle_gap", "table", "Table 14",
              lambda c: t("tab14_oracle_gap", oracle_gap_table(c.gated, replay.gated_outcomes(c.logs, TaskOracle(), c.profile))),
              (ev,), "Δ of the gate vs the task-label oracle."),
        Entry("tab17_best_evictor", "table", "Table 17",
              lambda c: t("tab17_best_evictor", best_evictor_table(c.gated)), (ev,),
              "Best plain vs best gated evictor per (model, context)."),
        Entry("tab20_cross_cell", "table", "Table 20",
              lambda c: t("tab20_cross_cell", cross_cell_table(c.gated, replay.gated_outcomes(c.logs, Midpoint(), c.profile),
                                                               evictor=c.headline_evictor)),
              (ev, both), "Δ per (model, context) at the fixed and the midpoint-calibrated τ."),
        Entry("tab21_preregistered", "table", "Table 21",
              lambda c: t("tab21_preregistered", preregistered_table(c.gated, c.logs.inputs, evictor=c.headline_evictor)),
              (ev, needs_contexts(2), _needs_prediction_fit),
              "Ratio-band predictions for the largest context, frozen by sha256, vs measured ρ."),
        Entry("tab22_compression", "table", "Table 22",
              lambda c: t("tab22_compression", compression_table(c.gated, evictor=c.headline_evictor)), (ev,),
              "Achieved kept-KV and compression per budget and grid mean."),
        Entry("tab23_batching", "table", "Table 23",
              lambda c: t("tab23_batching", batching_table(c.gated, evictor=c.headline_evictor)), (ev,),
              "Compression under static batch provisioning, batch sizes 1–32."),
        Entry("tab24_drop_by_task_strict", "table", "Table 24",
              lambda c: t("tab24_drop_by_task_strict", drop_by_task_table(strict(c))), (needs_agreement,),
              "Mean D per task with strict-thirds bins."),
        Entry("tab25_scaling", "table", "Table 25",
              lambda c: t("tab25_scaling", scaling_table(c.gated, evictor=c.headline_evictor)), (ev, needs_dilution_headroom),
              "ρ / (1 − A_full) per (model, context, task) and the through-origin slope."),
        Entry("tab27_harm", "table", "Table 27",
              lambda c: t("tab27_harm", harm_table(c.gated, evictor=c.headline_evictor)), (ev,),
              "Fixed-budget harm rate gated / plain per task and budget, pooled over cells."),
        Entry("tab28_bootstrap", "table", "Table 28",
              lambda c: t("tab28_bootstrap", bootstrap_table(c.gated, rng=rng())), (ev,),
              "Δ per matrix cell with cluster-bootstrap 95% intervals and BH-adjusted p."),
        Entry("tab29_bootstrap_capacity", "table", "Table 29",
              lambda c: t("tab29_bootstrap_capacity", bootstrap_table(
                  c.gated.filter(pl.col("task_class") == defaults.CAPACITY_BOUND), by=("model", "context_length", "evictor", "task"),
                  rng=rng())), (ev, _needs_capacity),
              "Δ on the capacity-bound tasks per cell with cluster-bootstrap intervals and BH-adjusted p."),
        Entry("tab30_draws", "table", "Table 30",
              lambda c: t("tab30_draws", draw_replicates_table(c.gated, c.logs.inputs.select("run_id", "draw").unique(),
                                                               evictor=c.headline_evictor)), (ev, needs_draws(2)),
              "Δ per input-draw replicate with mean, SD and range."),
        Entry("tabN1_pilot_sensitivity", "table", "New table",
              lambda c: t("tabN1_pilot_sensitivity", pilot_sensitivity_table(c.logs, evictor=c.headline_evictor, profile=c.profile)),
              (ev, needs_agreement), "z-scored gate under pilot first/random × per model/per cell × sizes; call flips."),
    )




def __getattr__(name):
    # TABLES is built on first access: it imports pagestats.report, which imports this module lazily.
    if name == "TABLES":
        value = _entries()
        globals()["TABLES"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
