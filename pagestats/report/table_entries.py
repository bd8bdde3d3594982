"""The table entries of the report: :data:`TABLES`, one :class:`~pagestats.report.context.Entry`
per paper table, typeset with the table's layout (docs/CLI.md ``pagestats report``).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats import metrics, replay
from pagestats.core import defaults
from pagestats.core.columns import with_task_class
from pagestats.io.decoding import decode_profile, flagged_tasks
from pagestats.replay.policies import Midpoint
from pagestats.core.schema import INPUT_KEY
from pagestats.stats.power import straddles
from pagestats.report.decision import decision_table
from pagestats.report.paper import PAPER_VALUES
from pagestats.report.context import (
    Entry,
    needs_agreement,
    needs_both_classes,
    needs_cache_size,
    needs_contexts,
    needs_dilution_headroom,
    needs_draws,
    needs_eviction_budgets,
    needs_full_budget,
    needs_pilot_groups,
    needs_topk,
    needs_signals,
    needs_controls,
)
from pagestats.tables import (
    LAYOUTS,
    MULTIKEY_TASKS,
    batching_table,
    best_evictor_table,
    bootstrap_table,
    budget_axis_table,
    calibration_table,
    compression_table,
    cross_cell_table,
    delta_by_task_table,
    delta_matrix_table,
    distractor_sweep_table,
    draw_replicates_table,
    drop_by_task_table,
    harm_table,
    head_pair_table,
    k_sweep_table,
    layer_subset_table,
    oracle_gap_table,
    pilot_sensitivity_table,
    preregistered_table,
    per_layer_table,
    random_control_table,
    remaining_deltas_table,
    recovery_table,
    scaling_table,
    signal_ablation_table,
    tau_variants_table,
)



#: How the captions name the capacity-bound anchor the paper's tables read (:data:`pagestats.core.defaults.ANCHOR_TASKS`).
_ANCHOR = f"the capacity-bound anchor {metrics.anchor_name()} (the paper's NIAH-MK3; niah_multiquery is not in it)"


def _under_powered(frame: pl.DataFrame, threshold: float) -> pl.DataFrame:
    """``frame`` with ``under_powered``: its interval (``low``, ``high``) straddles ``threshold``
    (:func:`pagestats.stats.power.straddles`; issue 43)."""
    return frame.with_columns(pl.Series("under_powered", straddles(frame["low"].to_numpy(), frame["high"].to_numpy(),
                                                                   threshold)))


def _paper(column: str) -> str:
    """"Paper: VALUE (WHERE)." for a caption (:data:`pagestats.report.paper.PAPER_VALUES`)."""
    value, where = PAPER_VALUES[column]
    return f"Paper: {value} ({where})."

def _typeset(name: str, frame: pl.DataFrame):
    return frame, LAYOUTS[name]


def _needs_logged(what: str, *names: str):
    """A requirement: every one of ``names`` is logged — ``what`` is "tasks" (the inputs' ``task``) or
    "evictors" (the outcomes' ``evictor``)."""
    table, column = {"tasks": ("inputs", "task"), "evictors": ("outcomes", "evictor")}[what]

    def check(ctx) -> str | None:
        have = set(getattr(ctx.logs, table)[column].unique().to_list())
        missing = [n for n in names if n not in have]
        return f"needs the {what} {', '.join(missing)}; not in the logs" if missing else None

    check.__name__ = f"needs_{what}"
    return check


#: The anchor's tasks are logged (Tables 5–6, 9, 10 and the k sweep contrast them with the other tasks).
_needs_anchor = _needs_logged("tasks", *defaults.ANCHOR_TASKS)


def _needs_pair_jaccard(ctx) -> str | None:
    inputs = ctx.logs.inputs
    if "pair_jaccard" not in inputs.columns or inputs.select(pl.col("pair_jaccard").list.len().min()).item() in (0, None):
        return "no per-pair Jaccards (pair_jaccard) in the inputs"
    if inputs["pair_jaccard"].null_count():
        return (f"{inputs['pair_jaccard'].null_count()} of {inputs.height} inputs have no per-pair Jaccards "
                "(runs imported from a release that does not record them)")
    return None


def _needs_prediction_fit(ctx) -> str | None:
    inputs = ctx.logs.inputs
    largest = max(ctx.context_lengths)
    fit = metrics.on_frame(metrics.full_accuracy, inputs.filter(pl.col("context_length") < largest),
                           by=["model", "task"], column="full_score").filter(pl.col("acc_full") < 1)
    target = inputs.filter(pl.col("context_length") == largest).select("model", "task").unique()
    if fit.join(target, on=["model", "task"], how="semi").height == 0:
        return (f"no (model, task) has full-KV headroom > 0 below the largest context {largest} "
                "to fit the ratio band on")
    return None


def _needs_pilot(ctx) -> str | None:
    sizes = ctx.logs.inputs.group_by("model").agg(pl.struct(*INPUT_KEY).n_unique().alias("n"))
    small = sizes.filter(pl.col("n") <= defaults.PILOT_N)
    if small.height:
        return (f"the reference z-scored pilot holds out {defaults.PILOT_N} inputs per model; "
                f"{small['model'][0]} has only {small['n'][0]}")
    return None


def _needs_capacity(ctx) -> str | None:
    if defaults.CAPACITY_BOUND not in ctx.task_classes:
        return "no capacity-bound task in the logs"
    return None


def _needs_midpoint_cell(ctx) -> str | None:
    """The paper's midpoint recipe (Eq. 5) takes 20 NIAH-MK3 and 20 VT inputs per (model, context):
    at least one cell must hold them (the others are listed with the reason in Tables 7 and 20)."""
    short = Midpoint().shortfall(with_task_class(ctx.logs.inputs))
    if short["note"].null_count() == 0:
        row = short.row(0, named=True)
        return f"{row['note']} ({row['model']}, {row['context_length']} tokens)" + (
            f", and so do the other {short.height - 1} cells" if short.height > 1 else "")
    return None


def _tab29(ctx, rng):
    """Table 29 from the report's gated outcomes and, where the midpoint sample exists, Table 20's."""
    calibrated, _ = ctx.midpoint_outcomes()
    return remaining_deltas_table(ctx.gated, calibrated, rng=rng, evictor=ctx.headline_evictor)


def _tab30(ctx):
    """Table 30 on every input draw, its rows marked where the decode limit may have cut a draw's full-KV
    answers (:func:`pagestats.io.decoding.flagged_tasks` over the inputs files of every draw)."""
    logs = ctx.all_logs
    files = [f for f in logs.files if f.table == "inputs"]
    limited = flagged_tasks(decode_profile(files, arms=False)).select("run_id", "task") if files else None
    return draw_replicates_table(replay.gated_outcomes(logs, ctx.policy, ctx.profile, evictor=ctx.headline_evictor),
                                 logs.inputs.select("run_id", "draw").unique(), evictor=ctx.headline_evictor,
                                 decode_limited=limited)


def _tab20(ctx):
    calibrated, short = ctx.midpoint_outcomes()  # the paper's recipe: 20 NIAH-MK3 and 20 VT inputs per cell
    return cross_cell_table(ctx.gated, calibrated, evictor=ctx.headline_evictor, notes=short)


def _tab21(ctx) -> pl.DataFrame:
    if ctx.prereg is None:
        return preregistered_table(ctx.gated, ctx.logs.inputs, evictor=ctx.headline_evictor)
    meta, band = ctx.prereg
    gated = replay.gated_outcomes(ctx.logs, replay.FixedTau(), ctx.profile)  # ρ reads the plain arm only
    return preregistered_table(gated, ctx.logs.inputs, band=band, status=f"pre-registered (frozen {meta['frozen_at']})")


def _entries() -> tuple[Entry, ...]:
    def strict(ctx):
        spec = replay.ProfileSpec(**{**ctx.profile.__dict__, "convention": "strict"})
        return replay.gate(ctx.logs, ctx.policy, spec)

    def rng():
        return np.random.default_rng(defaults.BOOTSTRAP_SEED)

    ev, both = needs_eviction_budgets, needs_both_classes
    t = _typeset
    return (
        Entry("tab01_recovery", "table", "Table 1",
              lambda c: t("tab01_recovery", _under_powered(recovery_table(c.gated), defaults.RHO_THRESHOLD)), (ev,),
              f"ρ with Wilson 95% intervals per task × cell; the pooled contrast of {_ANCHOR} against the "
              "dilution-prone tasks (Table 1: 2/526 NIAH-MK3 inputs recover); under-powered where the interval "
              "straddles 0.05."),
        Entry("tab02_delta_matrix", "table", "Table 2", lambda c: t("tab02_delta_matrix", delta_matrix_table(c.gated)),
              (ev,), f"Δ per (model, context, evictor), with and without {_ANCHOR} (Table 2: \"excluding NIAH-MK3\"); "
              "gated ≡ plain where the gate opens on every other input (the paper's †); 'same as' names the evictors "
              "whose outcomes equal the row's on every evicting row (b < 1): those cells agree by construction, not as "
              "a finding."),
        Entry("tab03_drop_by_task", "table", "Table 3", lambda c: t("tab03_drop_by_task", drop_by_task_table(c.gate)),
              (needs_agreement,), "Mean D and gate-open fraction per task (deployed bins).", reads_gated=False),
        Entry("tab04_distractor_sweep", "table", "Table 4",
              lambda c: t("tab04_distractor_sweep", distractor_sweep_table(c.gate)), (_needs_logged("tasks", *MULTIKEY_TASKS),),
              "Mean D along NIAH-MultiKey 1 → 2 → 3 with a monotonicity flag.", reads_gated=False),
        Entry("tab05_06_signal_ablation", "table", "Tables 5–6",
              lambda c: t("tab05_06_signal_ablation", signal_ablation_table(c.logs, profile=c.profile)),
              (needs_agreement, both, needs_signals, _needs_anchor),
              f"Separation of {_ANCHOR} from the dilution-prone tasks per signal: task means, margin, per-input AUC "
              "(BH), MK monotonicity (either direction) and r with D.", reads_gated=False),
        Entry("tab07_calibration", "table", "Table 7",
              lambda c: t("tab07_calibration", calibration_table(
                  c.logs, profile=c.profile)), (ev, both, _needs_midpoint_cell),
              "Midpoint-calibrated τ (Eq. 5, the paper's recipe: the first 20 NIAH-MK3 and the first 20 VT inputs "
              "per cell) vs the fixed τ per cell.", reads_gated=False),
        Entry("tab08_tau_variants", "table", "Table 8", lambda c: t("tab08_tau_variants", tau_variants_table()), (),
              "The τ variants pagestats implements, what each needs besides D, and where the report applies it.", reads_gated=False),
        Entry("tab09_head_pairs", "table", "Table 9",
              lambda c: t("tab09_head_pairs", head_pair_table(c.logs, profile=c.profile)),
              (_needs_pair_jaccard, both, _needs_anchor),
              f"Margin (smallest dilution-prone task mean of D minus that of {_ANCHOR}) over 20 random head-pair "
              "subsets per fraction.", reads_gated=False),
        Entry("tab10_layers", "table", "Table 10",
              lambda c: t("tab10_layers", layer_subset_table(c.logs, profile=c.profile)),
              (needs_agreement, both, _needs_anchor),
              f"Margin of D recomputed on layer subsets: the smallest mean D among the other tasks minus that of "
              f"{_ANCHOR} (Table 10).", reads_gated=False),
        Entry("tabA31_k_sweep", "table", "App. A.3.1", lambda c: t("tabA31_k_sweep", k_sweep_table(c.logs, profile=c.profile)),
              (needs_agreement, both, needs_topk, _needs_anchor),
              f"Margin of D recomputed at each top-k ({_ANCHOR} against the dilution-prone tasks), with the "
              "gate-open fraction at τ recalibrated with k.", reads_gated=False),
        Entry("tab12_delta_by_task", "table", "Table 12",
              lambda c: t("tab12_delta_by_task", delta_by_task_table(c.gated)), (ev,),
              f"Per-task Δ for every matrix cell with gate-open fractions; gated ≡ plain (cell) where the gate opens on "
              f"every input outside {_ANCHOR}."),
        Entry("tab13_budget_axis", "table", "Table 13",
              lambda c: t("tab13_budget_axis", budget_axis_table(c.gated)), (ev,),
              "Plain vs gated accuracy, each row one budget; 'same as' names the evictors whose outcomes equal the "
              "row's on every input at that budget (e.g. every evictor that keeps only the protected positions where "
              "⌊b·T⌋ is below them)."),
        Entry("tab14_oracle_gap", "table", "Table 14",
              lambda c: t("tab14_oracle_gap", oracle_gap_table(c.gated, metrics.task_oracle(c.gated.select(
                  [n for n in (*replay.DELTA_COLUMNS, "score_full") if n in c.gated.columns])))),
              (ev,), f"Δ of the gate vs the task-label oracle that closes on {_ANCHOR} and opens elsewhere (Table 14)."),
        Entry("tab17_best_evictor", "table", "Table 17",
              lambda c: t("tab17_best_evictor", best_evictor_table(c.gated)), (ev,),
              "Best plain vs best gated evictor per (model, context)."),
        Entry("tab20_cross_cell", "table", "Table 20",
              lambda c: t("tab20_cross_cell", _tab20(c)),
              (ev, both, _needs_midpoint_cell), "Δ per (model, context) at the fixed and the midpoint-calibrated τ (the "
              "paper's recipe: 20 NIAH-MK3 + 20 VT inputs per cell); a cell without them says why in its note."),
        Entry("tab21_preregistered", "table", "Table 21", lambda c: t("tab21_preregistered", _tab21(c)),
              (ev, needs_contexts(2), _needs_prediction_fit),
              "Ratio-band predictions vs measured ρ: the frozen band of --prereg, else a post-hoc illustration, "
              "not a pre-registration. The band spans the ratios ρ / (1 − A_full) of the fitting contexts: fitted on "
              "one context it has zero width (ratio low = ratio high), as its note says, and 'inside' then asks for "
              "ρ to equal the prediction exactly."),
        Entry("tab22_compression", "table", "Table 22",
              lambda c: t("tab22_compression", compression_table(c.gated, evictor=c.headline_evictor)), (ev,),
              "Achieved kept-KV and compression per budget and grid mean. " + _paper("compression")),
        Entry("tab23_batching", "table", "Table 23",
              lambda c: t("tab23_batching", batching_table(c.gated, evictor=c.headline_evictor)), (ev,),
              "Compression under static batch provisioning, batch sizes 1–32."),
        Entry("tab24_drop_by_task_strict", "table", "Table 24",
              lambda c: t("tab24_drop_by_task_strict", drop_by_task_table(strict(c))), (needs_agreement,),
              "Mean D per task with strict-thirds bins.", reads_gated=False),
        Entry("tab25_scaling", "table", "Table 25",
              lambda c: t("tab25_scaling", scaling_table(c.gated, evictor=c.headline_evictor, rule=c.dilution_rule)), (ev, needs_dilution_headroom),
              "ρ / (1 − A_full) per (model, context, task) and the through-origin slope. " + _paper("slope")),
        Entry("tab27_harm", "table", "Table 27",
              lambda c: t("tab27_harm", harm_table(c.gated, evictor=c.headline_evictor)), (ev,),
              "Fixed-budget harm rate gated / plain per task and budget, pooled over cells; the paper's capacity-bound "
              "row is NIAH-MK3 alone. Paper, NIAH-MK3 at b = 1/16: "
              f"plain {PAPER_VALUES['harm_plain'][0]}, gated {PAPER_VALUES['harm_gated'][0]} "
              f"({PAPER_VALUES['harm_gated'][1]})."),
        Entry("tab28_bootstrap", "table", "Table 28",
              lambda c: t("tab28_bootstrap", _under_powered(bootstrap_table(c.gated, rng=rng()), 0.0)), (ev,),
              "Δ per matrix cell with cluster-bootstrap 95% intervals and BH-adjusted p; under-powered where the "
              "interval straddles 0; 'same as' names the evictors whose outcomes equal the row's on every evicting "
              "row (b < 1)."),
        Entry("tab29_remaining_deltas", "table", "Table 29", lambda c: t("tab29_remaining_deltas", _tab29(c, rng())),
              (ev, _needs_capacity),
              "The remaining headline numbers of the headline evictor with 95% intervals: Δ at the midpoint τ per "
              f"cell (Table 20's rows) and Δ on each task of {_ANCHOR} (cluster bootstrap, BH across them), and the "
              "NIAH-MK3 showcase, plain and gated accuracy at b = 1/16 (Wilson; the paper: 0.00 and 0.89 on Mistral "
              "4K). The paper's cross-architecture and DBTrimKV rows need models and an arm these logs lack."),
        Entry("tab30_draws", "table", "Table 30", lambda c: t("tab30_draws", _tab30(c)), (ev, needs_draws(2)),
              f"Δ per input-draw replicate with mean, SD and range, over all tasks and over {_ANCHOR} (the paper's "
              "lower block); 'decode-limited' names a draw's tasks whose full-KV answers the decode limit may have cut "
              "(e.g. a draw collected with the first 32-token limit): there Δ measures the limit as well as eviction.",
              reads_gated=False),
        Entry("tab31_random_control", "table", "Table 31",
              lambda c: t("tab31_random_control", random_control_table(c.control_outcomes)), (needs_controls,),
              "Plain SnapKV against uniform-random scoring on the same inputs at every budget: accuracy and ρ. "
              "Paper: random scoring destroys accuracy long before the budget is aggressive; ρ 0.027 under random "
              "vs 0.013 under SnapKV (App. B, Table 31).", reads_gated=False),
        Entry("tab32_per_layer", "table", "Table 32", lambda c: t("tab32_per_layer", per_layer_table(c.gated)),
              (ev, _needs_logged("evictors", "snapkv", "snapkv-perlayer")),
              "ρ (Eq. 1) of per-layer vs single-mask SnapKV per (model, context, task), Wilson intervals, and their "
              "ratio."),
        Entry("tabN1_pilot_sensitivity", "table", "New table",
              lambda c: t("tabN1_pilot_sensitivity", pilot_sensitivity_table(c.logs, evictor=c.headline_evictor, profile=c.profile)),
              (ev, needs_agreement, needs_pilot_groups, _needs_pilot),
              "z-scored gate under pilot first/random/held-out × per model/per cell × sizes; call flips.", reads_gated=False,
              beside=("tab09_head_pairs", "tab10_layers")),
        Entry("tabN2_decision_frontier", "table", "New table", decision_table, (ev, needs_cache_size),
              "The accuracy–memory frontier over τ and budgets per evictor: kept KV as a fraction and in GiB "
              "per sequence."),
        Entry("tabN3_matched_memory", "table", "New table", lambda c: t("tabN3_matched_memory", c.matched_memory),
              (ev, needs_full_budget), "Δ at matched memory per (model, context, evictor): the gated arm's accuracy against plain "
              "eviction's frontier at the same mean kept KV, with a cluster-bootstrap interval and BH (the paper's "
              "'matched-cache frontier', §4; Δ at nominal budget beside it)."),
    )


#: The table entries, in paper order (read by :func:`pagestats.report.catalogue`).
TABLES: tuple[Entry, ...] = _entries()
