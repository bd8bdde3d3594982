"""Tables of the gate signal and its calibration: the signal ablation (Tables 5–6), the
midpoint calibration (Table 7), head-pair and layer subsampling (Tables 9–10), and a table
the paper lacks — the sensitivity of the z-scored gate to the pilot definition.

These tables replay the logs (:mod:`pagestats.replay`) under several profile specs or
policies, so they take :class:`pagestats.io.Logs` first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl
from scipy import stats as _sps

from pagestats import defaults, metrics, replay, stats
from pagestats.columns import MODEL_CELL
from pagestats.replay.pilot import PILOT_SPLITS, pilot_mask
from pagestats.replay.policies import FixedTau, Midpoint, ZScored
from pagestats.replay.spec import resolve_layers
from pagestats.schema import INPUT_KEY
from pagestats.tables._common import (
    LogsView,
    as_list,
    group_tau,
    logged_evictor,
    ordering_margin,
    task_means,
)

__all__ = [
    "k_sweep_table",
    "auc_table",
    "signal_ablation_table",
    "calibration_table",
    "head_pair_table",
    "layer_subset_table",
    "pilot_sensitivity_table",
]



def _by_statistic(logs, statistic: str, profile: replay.ProfileSpec) -> pl.DataFrame:
    """The gate frame of ``logs`` with ``drop`` holding ``statistic`` (the policy is irrelevant)."""
    spec = replay.ProfileSpec(**{**profile.__dict__, "statistic": statistic})
    return replay.gate(logs, FixedTau(), spec)


def _gate_at(logs, spec: replay.ProfileSpec, recalibrate: str, tau: float, pilot_n: int) -> pl.DataFrame:
    """Per (model, context): the threshold and gate-open fraction of the fixed τ carried to the
    statistic of ``spec`` (:func:`pagestats.replay.recalibrate`, App. A.3.1), and ``degenerate``
    (the gate opens on none or all of the cell's inputs). ``recalibration`` names what was done;
    when a model has too few inputs for the pilot the numbers are null and it says why."""
    sizes = logs.inputs.group_by("model").agg(pl.struct("run_id", "task", "input_id").n_unique().alias("n"))
    cells = logs.inputs.select(*MODEL_CELL).unique()
    small = sizes.filter(pl.col("n") <= pilot_n) if recalibrate == "z" else sizes.head(0)
    out = []
    if small.height < sizes.height:
        policy = replay.recalibrate(FixedTau(tau), recalibrate, pilot_n=pilot_n)
        fit = logs if small.height == 0 else LogsView(logs.inputs.join(small.select("model"), on="model", how="anti"),
                                                      getattr(logs, "topk", None))
        # draw by draw (head-pair draws, Table 9): per cell the sums that τ's mean and p_open need
        t = pl.col("tau")
        sums = pl.concat([g.group_by(list(MODEL_CELL)).agg(
            t.sum().alias("_tau_sum"), t.min().alias("_tau_min"), t.max().alias("_tau_max"),
            pl.len().alias("_n"), pl.col("gate_open").sum().alias("_open"),
        ) for g in replay.gate_by_draw(fit, policy, spec)]).group_by(list(MODEL_CELL)).agg(
            pl.col("_tau_sum", "_n", "_open").sum(), pl.col("_tau_min").min(), pl.col("_tau_max").max())
        out.append(sums.select(
            *MODEL_CELL,  # τ of the cell: its value when constant (group_tau), else the mean over inputs and draws
            pl.when(pl.col("_tau_min") == pl.col("_tau_max")).then(pl.col("_tau_min"))
            .otherwise(pl.col("_tau_sum") / pl.col("_n")).alias("tau_gate"),
            (pl.col("_open") / pl.col("_n")).alias("p_open"),
        ).with_columns(((pl.col("p_open") == 0) | (pl.col("p_open") == 1)).alias("degenerate"),
                       pl.lit(f"{recalibrate} (fixed τ = {tau})" if recalibrate != "none" else f"none (fixed τ = {tau})")
                       .alias("recalibration")))
    if small.height:
        out.append(cells.join(small.select("model"), on="model").with_columns(
            pl.lit(None, pl.Float64).alias("tau_gate"), pl.lit(None, pl.Float64).alias("p_open"),
            pl.lit(None, pl.Boolean).alias("degenerate"),
            pl.format("not computed: the held-out pilot of {} inputs needs more than the model's {}",
                      pl.lit(pilot_n), pl.col("model").replace_strict(small["model"], small["n"], return_dtype=pl.Int64))
            .alias("recalibration")))
    return pl.concat(out, how="vertical_relaxed").select(*MODEL_CELL, "tau_gate", "p_open", "degenerate", "recalibration")


def k_sweep_table(logs, *, ks=defaults.K_SWEEP, recalibrate: str = "z", tau: float = defaults.TAU,
                  pilot_n: int = defaults.PILOT_N, profile: replay.ProfileSpec = replay.ProfileSpec()) -> pl.DataFrame:
    """The k sweep of App. A.3.1: D recomputed from the stored top-k indices at each k ≤ k_max,
    its class ordering margin, and — because "any sweep of a parameter that rescales D must
    recalibrate τ alongside it" — the gate-open fraction at the recalibrated τ with a
    ``degenerate`` flag ("we report gate-open fractions beside every Δ in the sweep").

    Returns
    -------
    polars.DataFrame
        ``k, model, context_length``, :func:`~pagestats.tables._common.ordering_margin`
        columns (``capacity_max, dilution_min, margin, ordered``), ``tau_gate``, ``p_open``,
        ``degenerate`` and ``recalibration`` (``recalibrate="none"`` keeps the fixed τ).
    """
    k_max = int(logs.topk["indices"].list.len().min())
    parts = []
    for k in (k for k in ks if k <= k_max):
        spec = replay.ProfileSpec(**{**profile.__dict__, "k": int(k)})
        margins = ordering_margin(task_means(replay.gate(logs, FixedTau(), spec), "drop"))
        parts.append(margins.join(_gate_at(logs, spec, recalibrate, tau, pilot_n), on=list(MODEL_CELL), how="left")
                     .with_columns(pl.lit(int(k), pl.Int64).alias("k")))
    if not parts:
        raise ValueError(f"k_sweep_table: no k of {list(ks)} is ≤ the logged k_max {k_max}")
    return pl.concat(parts).select("k", *MODEL_CELL, "capacity_max", "dilution_min", "margin", "ordered", "tau_gate",
                                   "p_open", "degenerate", "recalibration").sort(["k", *MODEL_CELL])


def signal_names(logs) -> list[str]:
    """The profile statistics of App. A.3.3 plus every logged ``signals`` field."""
    names = list(replay.STATISTICS)
    inputs = logs.inputs
    if "signals" in inputs.columns and isinstance(inputs.schema["signals"], pl.Struct):
        names += [f.name for f in inputs.schema["signals"].fields]
    return names


def auc_table(frames: Mapping[str, pl.DataFrame], by=MODEL_CELL, *, q: float = defaults.FDR_Q,
              confidence_level: float = defaults.CONFIDENCE_LEVEL) -> pl.DataFrame:
    """Per-input AUC of several gate signals with multiplicity-corrected p-values (BH).

    Parameters
    ----------
    frames : mapping
        Signal name → per-input frame whose ``drop`` column holds the signal (e.g.
        :func:`pagestats.replay.gate` under ``ProfileSpec(statistic=...)``, or any frame
        with ``run_id, task, input_id, task_class`` and ``drop``: a custom signal).
    by : sequence of str
        Groups (default the (model, context) cell).

    Returns
    -------
    polars.DataFrame
        ``statistic``, ``by``, ``auc``, ``low``, ``high`` (DeLong; :func:`pagestats.metrics.auc_by_signal`,
        capacity-bound lower orientation), ``auc_oriented`` = max(auc, 1 − auc) (Table 5:
        "oriented per signal"), ``n_capacity``, ``n_dilution``, ``p_value`` (two-sided
        Mann–Whitney test of AUC = 0.5), ``p_adjusted`` and ``rejected`` (Benjamini–Hochberg
        at ``q`` across every (signal, group) row, :func:`pagestats.stats.bh`).

    Notes
    -----
    The Mann–Whitney p-value is the one statistic here that the engine lacks: it is
    ``scipy.stats.mannwhitneyu(dilution, capacity, alternative="two-sided")`` (asymptotic
    with tie correction when the samples are large, exact otherwise), the test of the
    same U of which the AUC is U/(n₁n₂). Two-sided because the orientation of a signal is
    chosen after looking (Table 5), which the family-wise BH correction then covers.
    """
    by = as_list(by)
    parts = []
    for name, frame in frames.items():
        a = metrics.auc_by_signal(frame, "drop", by=by, confidence_level=confidence_level)
        pvals = []
        for row in a.iter_rows(named=True):
            if row["auc"] is None:
                pvals.append(None)
                continue
            part = frame.filter(pl.all_horizontal(pl.col(c) == row[c] for c in by)) if by else frame
            part = part.unique(subset=["run_id", "task", "input_id"], keep="first")
            cap = (part["task_class"] == defaults.CAPACITY_BOUND).to_numpy()
            x = part["drop"].to_numpy()
            pvals.append(float(_sps.mannwhitneyu(x[~cap], x[cap], alternative="two-sided").pvalue))
        parts.append(a.with_columns(pl.lit(name).alias("statistic"), pl.Series("p_value", pvals, dtype=pl.Float64)))
    out = pl.concat(parts, how="vertical_relaxed")
    adj = stats.bh(out["p_value"].fill_null(np.nan).to_numpy(), q=q)
    out = out.with_columns(
        pl.max_horizontal(pl.col("auc"), 1.0 - pl.col("auc")).alias("auc_oriented"),
        pl.Series("p_adjusted", adj.adjusted).fill_nan(None), pl.Series("rejected", adj.rejected),
    )
    return out.select("statistic", *by, "auc", "low", "high", "auc_oriented", "n_capacity", "n_dilution",
                      "p_value", "p_adjusted", "rejected")


def _mk_monotone(means: pl.DataFrame, by: list[str], tasks: Sequence[str]) -> pl.DataFrame:
    sub = means.filter(pl.col("task").is_in(list(tasks)))
    order = pl.DataFrame({"task": list(tasks), "_pos": list(range(len(tasks)))})
    sub = sub.join(order, on="task").sort([*by, "_pos"])
    steps = pl.col("mean").diff().drop_nulls()
    out = sub.group_by(by).agg(pl.len().alias("_n"), (steps > 0).all().alias("_up"), (steps < 0).all().alias("_down"))
    return out.select(*by, pl.when(pl.col("_n") == len(tasks)).then(pl.col("_up") | pl.col("_down"))
                      .otherwise(None).alias("mk_monotone"))


def signal_ablation_table(logs, *, statistics: Sequence[str] | None = None, profile: replay.ProfileSpec = replay.ProfileSpec(),
                          exclude_from_margin: Sequence[str] = ("niah_multivalue",),
                          mk_tasks: Sequence[str] = ("niah_multikey_1", "niah_multikey_2", "niah_multikey_3"),
                          q: float = defaults.FDR_Q, recalibrate: str = "z", tau: float = defaults.TAU,
                          pilot_n: int = defaults.PILOT_N) -> pl.DataFrame:
    """Tables 5–6: gate-signal ablation over the profile statistics and the logged ``signals``.

    For every statistic and (model, context) cell: does a single threshold separate the
    capacity-bound task means from the dilution-prone ones, by what margin, how well does
    it separate inputs (AUC), is it monotone along MK1 → MK2 → MK3, and how does it
    correlate with D.

    Returns
    -------
    polars.DataFrame
        ``statistic, model, context_length, n_inputs``, ``separated`` (task means on
        either side: Table 5's "Sep."), ``below`` (capacity-bound means strictly below every
        dilution-prone mean: Table 6's "sep."), ``margin`` (:func:`~pagestats.tables._common.ordering_margin`,
        capacity-lower orientation), ``margin_minus`` (tasks of ``exclude_from_margin``
        left out: Table 6's "margin−"), the :func:`auc_table` columns (``auc`` … ``rejected``),
        ``mk_monotone`` (null when an MK task is missing), ``pearson_r`` (per-input
        Pearson correlation with D; NaN for a constant signal), and the gate on the statistic at
        τ recalibrated to it (App. A.3.1; ``recalibrate="none"`` keeps the fixed τ, on the
        statistic's own scale): ``tau_gate``, ``p_open``, ``degenerate``, ``recalibration``.

    References
    ----------
    PAGE §3 "Gate signal", App. A.3.1–A.3.3, Tables 5–6.
    """
    names = list(statistics) if statistics is not None else signal_names(logs)
    by = list(MODEL_CELL)
    base = _by_statistic(logs, "drop", profile).select("run_id", "task", "input_id", pl.col("drop").alias("_d"))
    frames = {s: _by_statistic(logs, s, profile) for s in names}
    aucs = auc_table(frames, by=by, q=q)
    rows = []
    for s, frame in frames.items():
        means = task_means(frame, "drop", by=by)
        below = ordering_margin(means, by=by)
        above = ordering_margin(means.with_columns(-pl.col("mean")), by=by).select(*by, pl.col("ordered").alias("_above"))
        minus = ordering_margin(means, by=by, exclude=exclude_from_margin).select(*by, pl.col("margin").alias("margin_minus"))
        mono = _mk_monotone(means, by, mk_tasks)
        joined = frame.join(base, on=["run_id", "task", "input_id"])
        corr = []
        for (model, ctx), part in joined.group_by(by, maintain_order=True):
            x, y = part["drop"].to_numpy(), part["_d"].to_numpy()
            r = float(np.corrcoef(x, y)[0, 1]) if part.height > 1 and x.std() > 0 and y.std() > 0 else float("nan")
            corr.append({"model": model, "context_length": ctx, "pearson_r": r, "n_inputs": part.height})
        corr = pl.DataFrame(corr, schema={"model": frame.schema["model"], "context_length": frame.schema["context_length"],
                                          "pearson_r": pl.Float64, "n_inputs": pl.Int64})
        part = below.join(above, on=by).join(minus, on=by).join(mono, on=by, how="left").join(corr, on=by)
        spec = replay.ProfileSpec(**{**profile.__dict__, "statistic": s})
        part = part.join(_gate_at(logs, spec, recalibrate, tau, pilot_n), on=by, how="left")
        part = part.with_columns(pl.lit(s).alias("statistic"),
                                 (pl.col("ordered") | pl.col("_above")).fill_null(False).alias("separated"),
                                 pl.col("ordered").fill_null(False).alias("below"))
        rows.append(part)
    out = pl.concat(rows, how="vertical_relaxed").join(aucs, on=["statistic", *by], how="left")
    order = pl.DataFrame({"statistic": names, "_order": list(range(len(names)))})
    out = out.join(order, on="statistic").sort(["_order", *by])
    return out.select("statistic", *by, "n_inputs", "separated", "below", "margin", "margin_minus", "auc", "low",
                      "high", "auc_oriented", "n_capacity", "n_dilution", "p_value", "p_adjusted", "rejected",
                      "mk_monotone", "pearson_r", "tau_gate", "p_open", "degenerate", "recalibration")


def calibration_table(logs, *, tau: float = defaults.TAU, n: int = defaults.MIDPOINT_N,
                      capacity_tasks: Sequence[str] | None = defaults.MIDPOINT_TASKS[:1],
                      dilution_tasks: Sequence[str] | None = defaults.MIDPOINT_TASKS[1:],
                      evictor: str | None = None, profile: replay.ProfileSpec = replay.ProfileSpec()) -> pl.DataFrame:
    """Table 7: the 40-input midpoint recipe (Eq. 5) vs the fixed τ per (model, context) cell.

    Returns
    -------
    polars.DataFrame
        ``model, context_length, evictor, mean_drop_capacity`` (D̄_C over the pilot of
        ``n`` capacity-bound inputs), ``mean_drop_dilution`` (D̄_D), ``tau_calibrated``
        (= (D̄_C + D̄_D)/2), ``tau_fixed``, ``delta_fixed``, ``delta_calibrated``,
        ``p_open_fixed``, ``p_open_calibrated``, ``winner`` ("calibrated", "fixed" or "tie"),
        ``note``: a cell with fewer than ``n`` inputs of a class is not calibrated (the recipe
        takes ``n`` of each, :meth:`pagestats.replay.Midpoint.shortfall`); its row says why and
        its numbers are null.

    References
    ----------
    PAGE App. A.3.4 "Calibration recipe" (Eq. 5), Table 7 (D̄_C on 20 NIAH-MK3, D̄_D on 20 VT).
    """
    mid = Midpoint(n=n, by=MODEL_CELL, capacity_tasks=None if capacity_tasks is None else tuple(capacity_tasks),
                   dilution_tasks=None if dilution_tasks is None else tuple(dilution_tasks))
    logs, short = mid.applicable(logs)
    cols = [*MODEL_CELL, "evictor", "mean_drop_capacity", "mean_drop_dilution", "tau_calibrated", "tau_fixed",
            "delta_fixed", "delta_calibrated", "p_open_fixed", "p_open_calibrated", "winner", "note"]
    skipped = short.select(*MODEL_CELL, "note")
    if logs.inputs.height == 0:
        raise ValueError(f"calibration_table: no cell holds the midpoint recipe's samples; {skipped['note'][0]}")
    # the columns Δ and p_open read, so that the two replays' rows are held narrow
    ev = logged_evictor(logs, evictor)
    fixed = replay.gated_outcomes(logs, FixedTau(tau), profile, evictor=ev, columns=replay.DELTA_COLUMNS)
    cal = replay.gated_outcomes(logs, mid, profile, evictor=ev, columns=replay.DELTA_COLUMNS)
    (fixed, cal), _ = metrics.same_inputs(fixed, cal)  # both τ on the same inputs
    gate = replay.gate(logs, mid, profile)
    pilots = []
    for label, tasks, klass in (("mean_drop_capacity", capacity_tasks, defaults.CAPACITY_BOUND),
                                ("mean_drop_dilution", dilution_tasks, defaults.DILUTION_PRONE)):
        part = gate.filter(pl.col("task").is_in(list(tasks)) if tasks is not None else pl.col("task_class") == klass)
        part = part.filter(pilot_mask(part, MODEL_CELL, n, mid.pilot, mid.seed))
        pilots.append(part.group_by(list(MODEL_CELL)).agg(pl.col("drop").mean().alias(label)))
    out = pilots[0].join(pilots[1], on=list(MODEL_CELL))
    for frame, suffix in ((fixed, "fixed"), (cal, "calibrated")):
        d = metrics.delta(frame, by=MODEL_CELL).select(*MODEL_CELL, pl.col("delta").alias(f"delta_{suffix}"))
        po = metrics.p_open(frame, by=MODEL_CELL).select(*MODEL_CELL, pl.col("p_open").alias(f"p_open_{suffix}"))
        out = out.join(d, on=list(MODEL_CELL)).join(po, on=list(MODEL_CELL))
    taus = gate.group_by(list(MODEL_CELL)).agg(pl.col("tau").first().alias("tau_calibrated"))
    out = out.join(taus, on=list(MODEL_CELL)).with_columns(
        pl.lit(ev).alias("evictor"), pl.lit(float(tau)).alias("tau_fixed"),
        pl.when(pl.col("delta_calibrated") > pl.col("delta_fixed")).then(pl.lit("calibrated"))
        .when(pl.col("delta_calibrated") < pl.col("delta_fixed")).then(pl.lit("fixed")).otherwise(pl.lit("tie"))
        .alias("winner"),
    )
    out = out.with_columns(pl.lit(None, pl.String).alias("note")).select(cols)
    skipped = skipped.with_columns(pl.lit(ev).alias("evictor"), pl.lit(float(tau)).alias("tau_fixed"))
    return pl.concat([out, skipped], how="diagonal_relaxed").select(cols).sort(list(MODEL_CELL))


def _pairs_per_layer(logs) -> pl.DataFrame:
    inputs = logs.inputs
    return inputs.group_by("model").agg(
        (pl.col("pair_jaccard").list.len().first() // pl.col("agreement").list.len().first()).cast(pl.Int64).alias("n_pairs"))


def head_pair_table(logs, *, fractions: Sequence[float] = defaults.PAIR_FRACTIONS, draws: int = defaults.PAIR_DRAWS, seed: int = 0,
                    profile: replay.ProfileSpec = replay.ProfileSpec(), recalibrate: str = "z", tau: float = defaults.TAU,
                    pilot_n: int = defaults.PILOT_N) -> pl.DataFrame:
    """Table 9: head-pair subsampling — margin over ``draws`` random pair subsets per fraction.

    Returns
    -------
    polars.DataFrame
        ``model, context_length, pairs_fraction, n_pairs`` (P per layer), ``n_pairs_kept``
        (m = max(1, round(f·P)), as :func:`pagestats.replay.pair_subsets`), ``n_draws``,
        ``margin_mean``, ``margin_min``, ``margin_max`` and ``n_ordered`` (draws whose margin
        stayed positive: Table 9's "ordering"), margin as
        :func:`~pagestats.tables._common.ordering_margin` (capacity-bound below dilution-prone),
        and the gate at τ recalibrated to each subsample (App. A.3.1, :func:`pagestats.replay.recalibrate`;
        ``recalibrate="none"`` keeps the fixed τ): ``tau_gate`` (mean over draws), ``p_open``
        (over inputs and draws), ``degenerate`` (opens on none or all) and ``recalibration``.

    References
    ----------
    PAGE App. A.3.5 "How many head pairs does D need?", Table 9 (20 draws per fraction).
    """
    pairs = _pairs_per_layer(logs)
    parts = []
    for f in fractions:
        spec = replay.ProfileSpec(**{**profile.__dict__, "pairs_fraction": float(f), "draws": int(draws), "seed": int(seed)})
        by = [*MODEL_CELL, "pair_draw"]  # one draw's gate rows at a time: its margin per cell
        margins = pl.concat([ordering_margin(task_means(gate, "drop", by=by), by=by)
                             for gate in replay.gate_by_draw(logs, FixedTau(), spec)]).sort(by)
        parts.append(margins.group_by(list(MODEL_CELL)).agg(
            pl.len().cast(pl.Int64).alias("n_draws"), pl.col("margin").mean().alias("margin_mean"),
            pl.col("margin").min().alias("margin_min"), pl.col("margin").max().alias("margin_max"),
            pl.col("ordered").sum().cast(pl.Int64).alias("n_ordered"),
        ).join(_gate_at(logs, spec, recalibrate, tau, pilot_n), on=list(MODEL_CELL), how="left")
            .with_columns(pl.lit(float(f)).alias("pairs_fraction")))
    out = pl.concat(parts).join(pairs, on="model", how="left")
    out = out.with_columns(pl.max_horizontal(pl.lit(1), (pl.col("pairs_fraction") * pl.col("n_pairs") + 0.5).floor()
                                             .cast(pl.Int64)).alias("n_pairs_kept"))
    return out.select(*MODEL_CELL, "pairs_fraction", "n_pairs", "n_pairs_kept", "n_draws", "margin_mean",
                      "margin_min", "margin_max", "n_ordered", "tau_gate", "p_open", "degenerate",
                      "recalibration").sort([*MODEL_CELL, "pairs_fraction"])


def layer_subset_table(logs, *, subsets: Sequence = replay.LAYER_SUBSETS,
                       profile: replay.ProfileSpec = replay.ProfileSpec(), recalibrate: str = "z",
                       tau: float = defaults.TAU, pilot_n: int = defaults.PILOT_N) -> pl.DataFrame:
    """Table 10: layer subsampling — the class ordering margin of D recomputed on layer subsets.

    Returns
    -------
    polars.DataFrame
        ``layers`` (subset name), ``model, context_length, n_layers`` (kept), ``margin``,
        ``ordered`` (a separating threshold still exists), ``capacity_max``,
        ``dilution_min`` and ``note`` (why a subset could not be computed for a model, e.g.
        it keeps fewer than 2 layers; its numbers are then null), and the gate at τ
        recalibrated to the subset (App. A.3.1; ``recalibrate="none"`` keeps the fixed τ):
        ``tau_gate``, ``p_open``, ``degenerate`` (opens on none or all) and ``recalibration``.

    References
    ----------
    PAGE App. A.3.5 "How many layers does D need?", Table 10.
    """
    inputs = logs.inputs
    widths = inputs.group_by("model").agg(pl.col("agreement").list.len().first().alias("L"))
    cells = inputs.select(*MODEL_CELL).unique()
    parts = []
    for s in subsets:
        name = s if isinstance(s, str) else ",".join(map(str, s))
        for model, n_layers in widths.sort("model").iter_rows():
            spec = replay.ProfileSpec(**{**profile.__dict__, "layers": s})
            cell = cells.filter(pl.col("model") == model)
            try:
                kept = len(resolve_layers(spec, n_layers))
                sub = LogsView(inputs.filter(pl.col("model") == model), getattr(logs, "topk", None))
                margins = ordering_margin(task_means(replay.gate(sub, FixedTau(), spec), "drop"))
                part = margins.with_columns(pl.lit(kept, pl.Int64).alias("n_layers"), pl.lit(None, pl.String).alias("note"))
                part = part.join(_gate_at(sub, spec, recalibrate, tau, pilot_n), on=list(MODEL_CELL), how="left")
            except ValueError as err:
                part = cell.with_columns(pl.lit(None, pl.Int64).alias("n_layers"), pl.lit(str(err)).alias("note"),
                                         *(pl.lit(None, pl.Float64).alias(c) for c in ("capacity_max", "dilution_min", "margin")),
                                         pl.lit(None, pl.Boolean).alias("ordered"),
                                         pl.lit(None, pl.Float64).alias("tau_gate"), pl.lit(None, pl.Float64).alias("p_open"),
                                         pl.lit(None, pl.Boolean).alias("degenerate"), pl.lit(None, pl.String).alias("recalibration"))
            parts.append(part.with_columns(pl.lit(name).alias("layers")).select(
                "layers", *MODEL_CELL, "n_layers", "margin", "ordered", "capacity_max", "dilution_min", "note",
                "tau_gate", "p_open", "degenerate", "recalibration"))
    return pl.concat(parts, how="vertical_relaxed")


def _pilot_label(by: Sequence[str]) -> str:
    return "×".join(by)


def _fits(logs, pilot_by: Sequence[str], n: int, split: str) -> bool:
    """Whether every pilot group of the logs has the inputs a pilot of ``n`` needs."""
    need = n + 1 if split == "held-out" else n
    sizes = logs.inputs.group_by(list(pilot_by)).agg(pl.struct("run_id", "task", "input_id").n_unique().alias("n"))
    return bool((sizes["n"] >= need).all())


def pilot_sensitivity_table(logs, *, pilots: Sequence[str] = PILOT_SPLITS,
                            pilot_by: Sequence[Sequence[str]] = (("model",), ("model", "context_length")),
                            pilot_sizes: Sequence[int] = defaults.PILOT_SIZES, theta_z: float = defaults.THETA_Z,
                            seed: int = 0, evictor: str | None = None,
                            reference: ZScored | None = None,
                            profile: replay.ProfileSpec = replay.ProfileSpec()) -> pl.DataFrame:
    """NEW (not in the paper): sensitivity of the z-scored gate to the pilot definition.

    The paper leaves the unlabelled pilot of the z-scored gate (App. A.3.4) undefined and
    notes (§4.1) that its Llama NIAH-MK3 call "flips under three of four plausible
    definitions of the unlabeled pilot". This table replays every definition — pilot
    ``"first"`` vs ``"random"`` vs ``"held-out"`` (:func:`pagestats.replay.pilot_mask`) ×
    pooled per model vs per (model, context) × pilot sizes — and reports, per cell and task,
    τ, the gate-open fraction, the gate's *call* on the task (closed iff fewer than half of
    its inputs open) and whether that call flips relative to the ``reference`` definition
    (default :class:`~pagestats.replay.policies.ZScored` with the library defaults: a
    held-out pilot of 100 inputs per model). A definition whose pilot is larger than one of
    its groups (for ``"held-out"``: not smaller) is left out.

    Every definition is evaluated on the same inputs: those that no held-out pilot of the
    table (nor the reference's) takes (:func:`pagestats.metrics.same_inputs`), so that a
    flipped call is never a difference of inputs; ``n_left_out`` counts, per definition, cell
    and task, the inputs it could have evaluated but that another definition's held-out
    pilot takes; a task all of whose inputs some held-out pilot takes keeps its row, with
    ``n_evaluated`` 0 and null rates.

    Returns
    -------
    polars.DataFrame
        ``pilot, pilot_by, pilot_n, model, context_length, task, task_class, evictor, tau``,
        ``n_evaluated`` (inputs of the task evaluated, the same for every definition),
        ``n_left_out``, ``p_open`` (of the evaluated inputs), ``closed_call``, ``flips`` (call
        differs from the reference), ``n_flipping_definitions`` (over all definitions, per
        cell and task), ``delta_task`` and ``delta_cell`` (Δ of the headline evictor,
        :func:`pagestats.metrics.delta`).
    """
    reference = reference if reference is not None else ZScored(theta_z=theta_z)
    by_task = [*MODEL_CELL, "task", "task_class"]
    unit = [*MODEL_CELL, "task", *(c for c in INPUT_KEY if c != "task")]
    ev = logged_evictor(logs, evictor)
    # the evictor's input keys and outcome rows: the units a replay of that evictor evaluates, less its held-out pilot
    ev_outcomes = logs.outcomes.filter(pl.col("evictor") == ev)
    logged = ev_outcomes.select(INPUT_KEY).unique()

    def summary(full, sub, ev, left):
        # every (cell, task) of the definition keeps its row: one whose inputs all lie in some held-out
        # pilot has n_evaluated 0 and null rates; τ is the definition's, set on its own pilot
        po = metrics.p_open(sub, by=by_task).select(*by_task, "p_open", pl.col("n").alias("n_evaluated"))
        tau = full.group_by(list(MODEL_CELL)).agg(group_tau())
        d_task = metrics.delta(sub, by=by_task).select(*by_task, pl.col("delta").alias("delta_task"))
        d_cell = metrics.delta(sub, by=MODEL_CELL).select(*MODEL_CELL, pl.col("delta").alias("delta_cell"))
        out = full.select(by_task).unique().join(left, on=[*MODEL_CELL, "task"], how="left")
        out = out.join(po, on=by_task, how="left").join(d_task, on=by_task, how="left")
        out = out.join(d_cell, on=list(MODEL_CELL), how="left").join(tau, on=list(MODEL_CELL), how="left")
        out = out.with_columns(pl.col("n_left_out").fill_null(0), pl.col("n_evaluated").fill_null(0).cast(pl.Int64))
        return out.with_columns((pl.col("p_open") < 0.5).alias("closed_call"), pl.lit(ev).alias("evictor"))

    definitions = []
    for pilot in pilots:
        for grp in pilot_by:
            for n in pilot_sizes:
                if not _fits(logs, grp, int(n), pilot):
                    continue
                definitions.append((pilot, _pilot_label(grp), int(n),
                                    ZScored(theta_z=theta_z, pilot_n=int(n), pilot_by=tuple(grp), pilot=pilot, seed=seed)))
    if not definitions:
        raise ValueError("pilot_sensitivity_table: no pilot definition fits the logs")
    # two passes, so that one replay's gated rows are held at a time: every definition decided once (D computed
    # once for all), keeping its decisions and the inputs it evaluates (one row per input); the definitions put
    # on their common inputs; then each replay's gated rows of the evictor, on those inputs
    policies = [reference, *(policy for *_, policy in definitions)]
    decided_cols = ["tau", "gate_open", "held_out"]
    base, decisions, units = None, [], []
    for decided in replay.decide_each(logs, policies, profile):
        if base is None:
            base = decided.drop(decided_cols)
        elif not decided.select(unit).equals(base.select(unit)):  # pragma: no cover - decide keeps the row order
            raise AssertionError("pilot_sensitivity_table: the decisions of two definitions are not in one row order")
        decisions.append(decided.select(decided_cols))
        units.append(decided.filter(~pl.col("held_out")).select(unit).unique().join(logged, on=list(INPUT_KEY),
                                                                                      how="semi"))
    common, left = metrics.same_inputs(*units, by=[*MODEL_CELL, "task"])
    common = common[0].select(INPUT_KEY)
    del units

    def summarised(i, lo):
        full = replay.gated_from_decisions(ev_outcomes, pl.concat([base, decisions[i]], how="horizontal"),
                                            replay.DELTA_COLUMNS)
        return summary(full, full.join(common, on=list(INPUT_KEY), how="semi"), ev, lo)

    ref = summarised(0, left[0]).select(*by_task, pl.col("closed_call").alias("_ref"))
    parts = [
        summarised(i, lo).with_columns(pl.lit(pilot).alias("pilot"), pl.lit(label).alias("pilot_by"),
                                       pl.lit(n, pl.Int64).alias("pilot_n"))
        for i, ((pilot, label, n, _), lo) in enumerate(zip(definitions, left[1:]), start=1)
    ]
    out = pl.concat(parts).join(ref, on=by_task, how="left")
    out = out.with_columns((pl.col("closed_call") != pl.col("_ref")).alias("flips"))
    out = out.with_columns(pl.col("flips").sum().over(by_task).cast(pl.Int64).alias("n_flipping_definitions"))
    return out.select("pilot", "pilot_by", "pilot_n", *by_task, "evictor", "tau", "n_evaluated", "n_left_out", "p_open",
                      "closed_call",
                      "flips", "n_flipping_definitions", "delta_task", "delta_cell").sort(
                          ["pilot", "pilot_by", "pilot_n", *by_task])


def tau_variants_table() -> pl.DataFrame:
    """Table 8: the τ variants, what each needs besides D, and where the report applies it — read from the
    policies themselves (their ``name``, rule, ``labels`` and ``used_in``).

    References
    ----------
    PAGE Table 8 ("The three τ variants used in the paper, their label requirements, and where each is
    applied"), §3 "Calibration", App. A.3.4.
    """
    from pagestats.replay.policies import RecalibratedTau, TaskOracle

    variants = (FixedTau(), ZScored(), Midpoint(), RecalibratedTau(), TaskOracle())
    return pl.DataFrame({
        "policy": [type(p).__name__ for p in variants],
        "name": [p.name for p in variants],
        "rule": [" ".join((type(p).__doc__ or "").strip().split("\n\n")[0].split()) for p in variants],
        "labels": [p.labels for p in variants],
        "used_in": [p.used_in for p in variants],
    })

