"""The paper's tables: one function per table returning a tidy polars frame of numbers, and
layouts that typeset them (great_tables; :data:`LAYOUTS` names each table's). Nothing here
imports :mod:`pagestats.report`.

Examples
--------
>>> from pagestats import io, replay, tables                      # doctest: +SKIP
>>> logs = io.load(["data/run"])                                  # doctest: +SKIP
>>> t1 = tables.recovery_table(replay.gated_outcomes(logs))       # doctest: +SKIP
>>> tables.write_table(t1, "out/table01", tables.LAYOUTS["tab01_recovery"])  # doctest: +SKIP
"""

from __future__ import annotations

from pagestats.core import defaults
from pagestats.tables._common import ordering_margin
from pagestats.tables._render import (
    Layout,
    display_frame,
    format_interval,
    markdown_table,
    to_gt,
    to_markdown,
    write_table,
)
from pagestats.tables.effects import (
    batching_table,
    best_evictor_table,
    budget_axis_table,
    compression_table,
    cross_cell_table,
    delta_by_task_table,
    delta_matrix_table,
    oracle_gap_table,
)
from pagestats.tables.intervals import bootstrap_table, draw_replicates_table, remaining_deltas_table
from pagestats.tables.partition import (
    MULTIKEY_TASKS,
    distractor_sweep_table,
    drop_by_task_table,
    harm_table,
    per_layer_table,
    random_control_table,
    prediction_band,
    preregistered_table,
    recovery_table,
    scaling_table,
)
from pagestats.tables.ablation import auc_table, signal_ablation_table
from pagestats.tables.calibration import calibration_table, tau_variants_table
from pagestats.tables.pilot import pilot_sensitivity_table
from pagestats.tables.conformance import conformance_table, paper_values
from pagestats.tables.subsampling import head_pair_table, k_sweep_table, layer_subset_table

__all__ = [
    "Layout", "LAYOUTS",
    "format_interval", "display_frame", "markdown_table", "to_gt", "to_markdown", "write_table",
    "ordering_margin",
    "recovery_table", "per_layer_table", "random_control_table", "remaining_deltas_table", "drop_by_task_table", "distractor_sweep_table", "scaling_table", "prediction_band", "preregistered_table",
    "harm_table", "delta_matrix_table", "delta_by_task_table", "budget_axis_table", "oracle_gap_table",
    "best_evictor_table", "cross_cell_table", "compression_table", "batching_table", "bootstrap_table",
    "draw_replicates_table", "auc_table", "signal_ablation_table", "tau_variants_table", "calibration_table", "head_pair_table", "k_sweep_table",
    "layer_subset_table", "pilot_sensitivity_table",
    "MULTIKEY_TASKS", "conformance_table", "paper_values",
]  # fmt: skip

_WILSON = f"Wilson {defaults.CONFIDENCE_LEVEL:.0%} intervals."
_DELTA = "Δ = mean over inputs and budgets b < 1 of gated − plain score."

#: The typeset layout of each table (rendering only; the frames hold the numbers).
LAYOUTS: dict[str, Layout] = {
    "tab01_recovery": Layout("Table 1 — per-input recovery rate ρ (Eq. 1)", {"ρ [95% CI]": ("rho", "low", "high")},
                             notes=(_WILSON, "ρ = Pr[max_{b<1} A_plain(b,x) > A_plain(1,x)]; dilution-prone iff ρ ≥ 0.05.",
                                    "Pooled rows: all cells together, of the capacity-bound anchor NIAH-MK3 and of the "
                                    "dilution-prone tasks (the contrast of §4; niah_multiquery has cell rows only).")),
    "tab02_delta_matrix": Layout("Table 2 — gating Δ per (model, context) × evictor", {},
                                 spanners={"Δ": ["delta", "delta_rest"]},
                                 notes=(_DELTA, "delta_rest excludes the capacity-bound anchor NIAH-MK3 (the paper's "
                                        "\"excluding NIAH-MK3\"); identical = gate open on every other input, so gated ≡ "
                                        "plain there (the paper's †).",
                                        "same_as: the evictors whose outcomes equal the row's on every evicting row (b < 1): "
                                        "those cells agree by construction, not as a finding.")),
    "tab03_drop_by_task": Layout("Table 3 — mean D and gate-open fraction per task (deployed bins)",
                                 {"p_open [95% CI]": ("p_open", "low", "high")}, notes=(_WILSON,)),
    "tab04_distractor_sweep": Layout("Table 4 — distractor sweep along NIAH-MultiKey 1 → 2 → 3", {},
                                     notes=("monotone: mean D strictly decreasing along the gradient.",)),
    "tab05_06_signal_ablation": Layout("Tables 5–6 — gate-signal ablation", {"AUC [95% CI]": ("auc", "low", "high")},
                                       notes=("AUC per input of NIAH-MK3 against the pooled dilution-prone tasks, NIAH-MK3 "
                                              "lower orientation, DeLong interval; p from a two-sided Mann–Whitney test, "
                                              f"Benjamini–Hochberg at q = {defaults.FDR_Q}.",
                                              "margin = min dilution-prone task mean − the NIAH-MK3 task mean; mk_monotone: "
                                              "task means strictly monotone, either direction, along MK1 → MK2 → MK3.",
                                              "tau_gate, p_open: the gate on the statistic at τ = 0.07 recalibrated to it "
                                              "(App. A.3.1); degenerate: it opens on none or all inputs.")),
    "tab07_calibration": Layout("Table 7 — midpoint calibration (Eq. 5) vs fixed τ", {},
                                spanners={"Δ": ["delta_fixed", "delta_calibrated"]}, notes=(_DELTA,)),
    "tab09_head_pairs": Layout("Table 9 — head-pair subsampling", {}, decimals=4,
                               notes=("Random pair subsets per fraction; margin = min dilution-prone task mean of D − "
                                      "the NIAH-MK3 task mean; ordering = draws with a positive margin.",)),
    "tab10_layers": Layout("Table 10 — layer subsampling", {}, decimals=4,
                           notes=("margin = min task mean of D among the other tasks − the NIAH-MK3 task mean; margin > 0: "
                                  "NIAH-MK3 still ranks below every other task.",
                                  "tau_gate, p_open: the gate at τ = 0.07 recalibrated to the subset (App. A.3.1); "
                                  "degenerate: it opens on none or all inputs.")),
    "tabA31_k_sweep": Layout("App. A.3.1 — the k sweep, τ recalibrated with k", {}, decimals=4,
                             notes=("D recomputed from the stored top-k indices; the gate at τ = 0.07 carried to each k "
                                    "by its z-position in the held-out pilot; degenerate: it opens on none or all "
                                    "inputs.",)),
    "tab12_delta_by_task": Layout("Table 12 — per-task Δ for every matrix cell", {}, notes=(_DELTA,)),
    "tab13_budget_axis": Layout("Table 13 — plain vs gated accuracy per budget", {},
                                spanners={"accuracy": ["acc_full", "acc_plain", "acc_gated"]},
                                notes=("Each row is one budget b: Δ = gated − plain at that budget.",
                                       "same_as: the evictors whose outcomes equal the row's on every input at that "
                                       "budget (e.g. all that keep only the protected positions where ⌊b·T⌋ is below "
                                       "them).")),
    "tab14_oracle_gap": Layout("Table 14 — PAGE vs the task-label oracle", {},
                               notes=(_DELTA, "The oracle closes on NIAH-MK3 and opens elsewhere (Table 14).")),
    "tab17_best_evictor": Layout("Table 17 — best plain vs best gated evictor", {},
                                 notes=("Accuracy = mean score over inputs and budgets b < 1.",)),
    "tab20_cross_cell": Layout("Table 20 — Δ across (model, context) cells, fixed and calibrated τ", {},
                               spanners={"fixed τ": ["tau_fixed", "delta_fixed", "p_open_fixed"],
                                         "calibrated τ (Eq. 5)": ["tau_calibrated", "delta_calibrated", "p_open_calibrated"]}),
    "tab21_preregistered": Layout("Table 21 — predicted ρ band vs measurement",
                                  {"measured ρ [95% CI]": ("rho", "low", "high")},
                                  notes=("Band = ratio ρ/(1−A_full) range on the fitting contexts × the target's full-KV "
                                         "headroom. status says whether it was frozen (pagestats prereg freeze, sha256, "
                                         "before the target outcomes' runs were created) or formed post hoc from the same "
                                         "logs, which is an illustration and not a pre-registration.",
                                         "Fitted on one context, the band has zero width (ratio low = ratio high): note "
                                         "says so, and inside then asks for ρ to equal the prediction.")),
    "tab22_compression": Layout("Table 22 — achieved compression of the gated deployment", {},
                                notes=("Empty budget = grid mean over the budgets b < 1.",)),
    "tab23_batching": Layout("Table 23 — compression under static batch provisioning", {},
                             notes=("provisioned(B) = (1 − p_open^B) + p_open^B · k_open.",)),
    "tab24_drop_by_task_strict": Layout("Table 24 — mean D per task (strict thirds)",
                                        {"p_open [95% CI]": ("p_open", "low", "high")}, notes=(_WILSON,)),
    "tab25_scaling": Layout("Table 25 — scaling verification ρ / (1 − A_full)", {"ρ [95% CI]": ("rho", "low", "high")},
                            notes=("slope: binomial GLM (identity link) through the origin of ρ on headroom, fitted on the rows each "
                                   "rule calls dilution-prone (task class; measured ρ ≥ 0.05); rows of zero headroom are "
                                   "left out and counted (zero_headroom_*).",)),
    "tab27_harm": Layout("Table 27 — fixed-budget harm rate, gated / plain",
                         {"gated [95% CI]": ("harm_gated", "gated_low", "gated_high"),
                          "plain [95% CI]": ("harm_plain", "plain_low", "plain_high")}, notes=(_WILSON,)),
    "tab28_bootstrap": Layout("Table 28 — cluster-bootstrap intervals of the matrix Δ",
                              {"Δ [95% CI]": ("delta", "low", "high")}, decimals=4,
                              notes=(f"Cluster bootstrap over inputs ({defaults.N_BOOTSTRAP} replicates), 2.5–97.5 percentiles; "
                                     f"Benjamini–Hochberg at q = {defaults.FDR_Q} across cells.",)),
    "tab29_remaining_deltas": Layout("Table 29 — 95% intervals for the remaining headline numbers",
                                     {"estimate [95% CI]": ("estimate", "low", "high")}, decimals=4,
                                     notes=(f"Δ rows: cluster bootstrap over inputs, BH at q = {defaults.FDR_Q} across "
                                            "the bootstrap rows; showcase rows: accuracy with a Wilson interval.",)),
    "tab30_draws": Layout("Table 30 — input-draw replicates of Δ", {},
                          notes=("SD with ddof = 1. Lower block: NIAH-MK3 only, as the paper's.",
                                 "decode_limited: tasks of the draw whose full-KV answers the decode limit may have cut "
                                 "(a draw collected with the first 32-token limit): Δ there measures the limit too.")),
    "tabN1_pilot_sensitivity": Layout("New — z-scored gate vs the pilot definition", {},
                                      notes=("closed_call: fewer than half of the task's inputs open; flips: differs from "
                                             "the reference pilot (100 inputs per model, held out); every definition is "
                                             "evaluated on the same inputs, those no held-out pilot takes (n_evaluated; "
                                             "n_left_out: the definition's other inputs).",)),
    "tabN2_decision_frontier": Layout(
        "New — the accuracy–memory frontier over τ and budgets, per evictor", {}, decimals=4,
        notes=("Each row is one (τ, b) operating point on its evictor's frontier: no other (τ, b) keeps at most as "
               "much cache with at least the accuracy; τ from … τ to is the range of thresholds giving it "
               "(τ = −inf is plain eviction, +inf the full cache).",
               "kv_gib = kept_kv × the full cache of one sequence: 2 × layers × KV heads × head_dim × dtype bytes × "
               "mean prompt tokens, from the run manifests.")),
    "tab08_tau_variants": Layout("Table 8 — the τ variants, their label requirements, and where each is applied", {},
                                 notes=("Read from the policy classes of pagestats.replay (their name, rule, labels "
                                        "and used_in).",)),
    "tab32_per_layer": Layout(
        "Table 32 — ρ of per-layer vs single-mask SnapKV",
        {"single mask ρ [95% CI]": ("rho_single", "single_low", "single_high"),
         "per layer ρ [95% CI]": ("rho_per_layer", "per_layer_low", "per_layer_high")},
        notes=(_WILSON, "rho_ratio = per-layer ρ / single-mask ρ (null when the single mask's ρ is 0).")),
    "tab31_random_control": Layout(
        "Table 31 — SnapKV vs uniform-random scoring at matched budget",
        {"SnapKV ρ [95% CI]": ("rho_snapkv", "snapkv_low", "snapkv_high"),
         "random ρ [95% CI]": ("rho_random", "random_low", "random_high")},
        notes=(_WILSON, "Accuracies: plain eviction, mean over the budgets b < 1 (both arms at every budget).")),
    "tabN3_matched_memory": Layout(
        "New — Δ at matched memory: the gated arm against plain eviction keeping as much KV",
        {"Δ at matched memory [95% CI]": ("delta_matched", "low", "high")}, decimals=4,
        notes=("Per budget b < 1: plain eviction's accuracy on its frontier over every logged budget (its Pareto "
               "points in (mean kept KV, accuracy), b = 1 the full cache, joined by straight lines: the mean a mix of "
               "two budgets over the inputs reaches) at the gated arm's mean kept KV; Δ matched is the gated "
               "accuracy minus it, averaged over b < 1. delta_nominal is Δ at the same nominal budget (Table 28).",
               f"Cluster bootstrap over inputs ({defaults.N_BOOTSTRAP} replicates, the frontier recomputed on each), "
               f"2.5–97.5 percentiles; Benjamini–Hochberg at q = {defaults.FDR_Q} across cells.")),
}
