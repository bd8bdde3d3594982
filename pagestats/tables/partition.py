"""Tables of the partition and its scaling: ρ (Table 1), D per task (Tables 3, 24), the
distractor sweep (Table 4), the scaling verification (Table 25), the pre-registered test
(Table 21) and the fixed-budget harm rate (Table 27).

Each function takes a replay frame (:func:`pagestats.replay.gate` or
:func:`pagestats.replay.gated_outcomes`) first and returns a tidy polars frame of numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from pagestats import metrics, stats
from pagestats.core import defaults, formulas
from pagestats.core.columns import MODEL_CELL, input_key, names_like, require_columns
from pagestats.core.schema import INPUT_KEY
from pagestats.tables._common import as_list, group_tau, one_evictor

__all__ = [
    "recovery_table",
    "drop_by_task_table",
    "distractor_sweep_table",
    "scaling_table",
    "prediction_band",
    "preregistered_table",
    "harm_table",
    "MULTIKEY_TASKS",
]

#: The NIAH-MultiKey distractor gradient of Table 4 (0, 1, 2 near-tie distractors).
MULTIKEY_TASKS = ("niah_multikey_1", "niah_multikey_2", "niah_multikey_3")


def recovery_table(gated: pl.DataFrame, *, evictor: str | None = None,
                   confidence_level: float = defaults.CONFIDENCE_LEVEL,
                   anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> pl.DataFrame:
    """Table 1: per-input recovery rate ρ (Eq. 1) with Wilson intervals, per task × cell,
    and the pooled contrast of the capacity-bound anchor (NIAH-MK3) against the dilution-prone tasks.

    Parameters
    ----------
    gated : polars.DataFrame
        :func:`pagestats.replay.gated_outcomes` (ρ reads the plain arm only, so the policy
        does not matter).
    evictor : str, optional
        The evictor whose plain arm defines ρ (the paper: SnapKV; default
        :func:`~pagestats.core.columns.headline_evictor`).
    anchor : sequence of str or None
        The capacity-bound side of the pooled contrast (default NIAH-MK3, the paper's: "only 2/526
        NIAH-MK3 inputs recover"; ``None``: the capacity-bound class).

    Returns
    -------
    polars.DataFrame
        ``scope`` ("cell" rows per (model, context_length, task); two "pooled" rows over all
        cells, the contrast on which §4's claim rests: the anchor's inputs, with ``task`` naming
        the anchor (null for the class), and the inputs of the dilution-prone tasks outside it, with a null ``task``),
        ``model``, ``context_length``, ``task``, ``task_class``, ``evictor``, ``k``, ``n``,
        ``rho``, ``low``, ``high``, ``dilution_prone`` (ρ ≥ 0.05). Pooled rows have null model
        and context. A capacity-bound task outside the anchor (niah_multiquery) has cell rows
        only.

    References
    ----------
    PAGE §4 "The partition", Table 1 (pooled NIAH-MK3: 2/526, ρ = 0.004, Wilson [0.001, 0.014]).
    """
    sub, ev = one_evictor(gated, evictor)
    cells = metrics.on_frame(metrics.recovery_rate, sub, by=("model", "context_length", "task_class", "task"),
                             confidence_level=confidence_level)
    side = (pl.when(metrics.capacity_side(anchor)).then(pl.lit(defaults.CAPACITY_BOUND))
            .when(metrics.dilution_side(anchor)).then(pl.lit(defaults.DILUTION_PRONE)).alias("_side"))
    read = list(dict.fromkeys([*input_key(sub), "evictor", "task_class", "budget", "score_plain", "score_full"]))
    # the rows of neither side form a group of their own, dropped after: a filter would copy the rows
    sided = sub.select(read).with_columns(side)
    pooled = metrics.on_frame(metrics.recovery_rate, sided, by=("_side",), confidence_level=confidence_level).filter(
        pl.col("_side").is_not_null()).rename({"_side": "task_class"})
    cells = cells.with_columns(pl.lit("cell").alias("scope"))
    pooled = pooled.with_columns(
        pl.lit("pooled").alias("scope"), pl.lit(None, pl.String).alias("model"),
        pl.lit(None, pl.Int64).alias("context_length"),
        pl.when(pl.col("task_class") == defaults.CAPACITY_BOUND)
        .then(pl.lit(None if anchor is None else metrics.anchor_name(anchor), pl.String)).otherwise(None).alias("task"),
    )
    cols = ["scope", "model", "context_length", "task", "task_class", "k", "n", "rho", "low", "high", "dilution_prone"]
    out = pl.concat([cells.select(cols), pooled.select(cols)], how="vertical_relaxed")
    return out.with_columns(pl.lit(ev).alias("evictor")).select(*cols[:5], "evictor", *cols[5:])


def drop_by_task_table(gate: pl.DataFrame, *, confidence_level: float = defaults.CONFIDENCE_LEVEL) -> pl.DataFrame:
    """Tables 3 and 24: per-task mean head-agreement drop D and gate-open fraction per cell.

    Call it on the gate frame of the deployed bins (Table 3, App. F) or of the strict
    thirds (``ProfileSpec(convention="strict")``, Table 24).

    Returns
    -------
    polars.DataFrame
        ``model, context_length, task, task_class, n, mean_drop, sd_drop, p_open, low, high``
        (Wilson interval of p_open, :func:`pagestats.metrics.p_open`), ``tau`` (mean
        threshold of the cell's inputs; null for threshold-free policies), ``rank`` (1 =
        smallest mean D of the cell; Table 24 bolds it) and ``smallest`` (rank == 1).

    References
    ----------
    PAGE §4 "Boundary and Confound Analysis", Table 3; App. A.3.3, Table 24 (strict thirds).
    """
    require_columns(gate, [*MODEL_CELL, "task", "task_class", "drop", "gate_open", "tau"], "drop_by_task_table")
    means = metrics.on_frame(metrics.task_means, gate, "drop").rename({"mean": "mean_drop", "sd": "sd_drop"})
    opened = metrics.on_frame(metrics.p_open, gate, by=(*MODEL_CELL, "task"), confidence_level=confidence_level)
    taus = gate.group_by([*MODEL_CELL, "task"]).agg(group_tau())
    out = means.join(opened.select(*MODEL_CELL, "task", "p_open", "low", "high"), on=[*MODEL_CELL, "task"])
    out = out.join(taus, on=[*MODEL_CELL, "task"], how="left")
    out = out.with_columns(pl.col("mean_drop").rank("min").over(MODEL_CELL).cast(pl.Int64).alias("rank"))
    out = out.with_columns((pl.col("rank") == 1).alias("smallest"))
    return out.select(*MODEL_CELL, "task", "task_class", "n", "mean_drop", "sd_drop", "p_open", "low", "high",
                      "tau", "rank", "smallest").sort([*MODEL_CELL, "task"])


def distractor_sweep_table(gate: pl.DataFrame, tasks: Sequence[str] = MULTIKEY_TASKS) -> pl.DataFrame:
    """Table 4: mean D along the NIAH-MultiKey distractor gradient, with a monotonicity flag.

    Parameters
    ----------
    gate : polars.DataFrame
        :func:`pagestats.replay.gate` output.
    tasks : sequence of str
        The gradient in order of increasing near-tie distractors (MK1 → MK2 → MK3).

    Returns
    -------
    polars.DataFrame
        ``model, context_length, task, distractors`` (position in ``tasks``), ``n``,
        ``mean_drop``, ``sd_drop``, ``p_open``, and per cell ``monotone`` (mean D strictly
        decreasing along the gradient) and ``ratio_first_last`` (mean D of the first task
        / mean D of the last; the paper's "~3.5× from 0 → 2 distractors"). Cells lacking
        a task of the gradient are left out.

    References
    ----------
    PAGE §4 "Boundary and Confound Analysis", App. A.2.4, Table 4.
    """
    tasks = list(tasks)
    if len(tasks) < 2:
        raise ValueError("distractor_sweep_table: the gradient needs at least 2 tasks")
    require_columns(gate, [*MODEL_CELL, "task", "drop", "gate_open"], "distractor_sweep_table")
    sub = gate.filter(pl.col("task").is_in(tasks))
    means = metrics.on_frame(metrics.task_means, sub, "drop").rename({"mean": "mean_drop", "sd": "sd_drop"})
    opened = metrics.on_frame(metrics.p_open, sub, by=(*MODEL_CELL, "task")).select(*MODEL_CELL, "task", "p_open")
    order = names_like(pl.DataFrame({"task": tasks, "distractors": list(range(len(tasks)))},
                                    schema={"task": pl.String, "distractors": pl.Int64}), sub)
    out = means.join(order, on="task").join(opened, on=[*MODEL_CELL, "task"]).sort([*MODEL_CELL, "distractors"])
    out = out.with_columns(pl.len().over(MODEL_CELL).alias("_n_tasks")).filter(pl.col("_n_tasks") == len(tasks))
    step = pl.col("mean_drop").diff().over(MODEL_CELL)
    out = out.with_columns(
        (step.drop_nulls() < 0).all().over(MODEL_CELL).alias("monotone"),
        (pl.col("mean_drop").first() / pl.col("mean_drop").last()).over(MODEL_CELL).alias("ratio_first_last"),
    )
    return out.select(*MODEL_CELL, "task", "distractors", "n", "mean_drop", "sd_drop", "p_open", "monotone", "ratio_first_last")


def scaling_table(gated: pl.DataFrame, *, evictor: str | None = None, rule: str = defaults.DILUTION_RULE) -> pl.DataFrame:
    """Table 25: scaling verification ρ/(1 − A_full) per (model, context, task), with the slope
    of ρ on headroom through the origin (Eq. 4; Fig. 9: ≈ 0.34) under both selection rules.

    The slope is a binomial GLM with an identity link (:func:`pagestats.metrics.scaling_fit`),
    fitted on the rows each rule calls dilution-prone (``"task-class"``: the task's class;
    ``"rho"``: measured ρ ≥ 0.05), rows of zero headroom left out and counted.

    Returns
    -------
    polars.DataFrame
        :func:`pagestats.metrics.scaling_rows` columns plus ``evictor`` and, for each rule
        (``task_class`` and ``rho`` suffixes): ``slope_*``, ``slope_se_*``, ``slope_ls_*`` (the
        paper's own estimator on the same rows: unweighted least squares of ρ on headroom through
        the origin, :func:`pagestats.stats.through_origin_fit`; docs/decisions.md says why the
        report leads with the GLM), ``fit_n_*``,
        ``zero_headroom_*`` (rows of the rule left out for zero headroom) and ``in_fit_*``
        (the row is in that fit); a slope is NaN when its rule selects no row with a
        recovery. ``fitted_rho`` = slope × headroom under ``rule``.

    References
    ----------
    PAGE §5 (Eq. 4), App. A.6.4, Table 25.
    """
    sub, ev = one_evictor(gated, evictor)
    rows = metrics.on_frame(metrics.scaling_rows, sub).with_columns(pl.lit(ev).alias("evictor"))
    for name in metrics.DILUTION_RULES:
        suffix = name.replace("-", "_")
        chosen = metrics.in_fit(name) & pl.col("rho").is_not_null()
        usable = rows.filter(chosen & (pl.col("headroom") > 0))
        if usable.height and int(usable["k"].sum()) > 0:
            fit = metrics.scaling_fit(rows, rule=name)
            slope, se, n, zero = fit.slope, fit.se, fit.n, fit.n_excluded
            ls = stats.through_origin_fit(usable["headroom"].to_numpy(), usable["rho"].to_numpy()).slope
        else:
            slope, se, n, zero = float("nan"), float("nan"), usable.height, rows.filter(chosen & (pl.col("headroom") <= 0)).height
            ls = float("nan")
        rows = rows.with_columns(
            pl.lit(slope, pl.Float64).alias(f"slope_{suffix}"), pl.lit(se, pl.Float64).alias(f"slope_se_{suffix}"),
            pl.lit(ls, pl.Float64).alias(f"slope_ls_{suffix}"),
            pl.lit(n, pl.Int64).alias(f"fit_n_{suffix}"), pl.lit(zero, pl.Int64).alias(f"zero_headroom_{suffix}"),
            (chosen & (pl.col("headroom") > 0)).fill_null(False).alias(f"in_fit_{suffix}"),
        )
    return rows.with_columns((pl.col(f"slope_{rule.replace('-', '_')}") * pl.col("headroom")).alias("fitted_rho"))


#: Table 21's ``status`` when the band was not frozen beforehand.
POST_HOC = "post-hoc illustration, not a pre-registration"
#: Table 21's ``note`` on a band fitted on one row.
ZERO_WIDTH = ("zero-width band: fitted on one context's row, so ratio low = ratio high and the band is one "
              "value; inside only when ρ equals it")
BAND_COLUMNS = ("n_fit_rows", "ratio_low", "ratio_high", "headroom", "predicted_low", "predicted_high")


def prediction_band(gated: pl.DataFrame, inputs: pl.DataFrame, *, fit_contexts: Sequence[int], target_context: int,
                    evictor: str | None = None, by=("model", "task")) -> pl.DataFrame:
    """The prediction band of §4 "Pre-Registered 32K Test" (Table 21), from what may be known
    before the measurement: the fitting contexts' eviction outcomes and the target context's
    full-KV scores.

    Per ``by`` group: the ratio band ρ/(1 − A_full) over the fitting contexts
    (:func:`pagestats.metrics.scaling_rows` on the plain arm of ``evictor``) times the
    headroom 1 − mean full_score of the target context's inputs
    (:func:`pagestats.metrics.predict_band`). The target context's outcome rows are
    dropped before anything is computed.

    Returns
    -------
    polars.DataFrame
        ``by``, ``context_length`` (the target), ``evictor``, ``n_fit_rows``, ``ratio_low``,
        ``ratio_high``, ``headroom``, ``predicted_low``, ``predicted_high``. Groups without a
        fitting row of positive headroom cannot be predicted and are left out.

    Raises
    ------
    ValueError
        The target is a fitting context, a context is not logged, or no group can be predicted.
    """
    by = as_list(by)
    fit_contexts = sorted(int(c) for c in fit_contexts)
    target = int(target_context)
    if target in fit_contexts:
        raise ValueError(f"the target context {target} is also a fitting context")
    logged = set(inputs["context_length"].unique().to_list())
    missing = [c for c in [*fit_contexts, target] if c not in logged]
    if missing:
        raise ValueError(f"context(s) {missing} are not in the logs (logged: {sorted(logged)})")
    fit, ev = one_evictor(gated.filter(pl.col("context_length").is_in(fit_contexts)), evictor)
    fit_rows = metrics.on_frame(metrics.scaling_rows, fit)
    require_columns(inputs, [*by, "context_length", "full_score"], "prediction_band")
    headroom = metrics.on_frame(metrics.full_accuracy, inputs.filter(pl.col("context_length") == target), by=by,
                                column="full_score").select(*by, (1.0 - pl.col("acc_full")).alias("headroom"))
    fittable = fit_rows.filter(pl.col("headroom") > 0).select(by).unique()
    headroom = headroom.join(fittable, on=by, how="semi")
    if headroom.height == 0:
        raise ValueError("no group has a fitting row with positive headroom to predict from")
    band = metrics.predict_band(fit_rows, headroom, by=by)
    return band.with_columns(pl.lit(target, pl.Int64).alias("context_length"), pl.lit(ev).alias("evictor")).select(
        *by, "context_length", "evictor", *BAND_COLUMNS)


def preregistered_table(gated: pl.DataFrame, inputs: pl.DataFrame, *, band: pl.DataFrame | None = None,
                        status: str | None = None, evictor: str | None = None, by=("model", "task")) -> pl.DataFrame:
    """Table 21: predicted ρ bands at a target context vs the measured ρ.

    With ``band`` (read through :func:`pagestats.io.prereg.load_band` after its hash and its
    freezing time were checked) the table is the pre-registered test of §4. Without it the
    band is computed here from the same logs (fitting contexts = every context but the
    largest, target = the largest) and the table says so in ``status``:
    :data:`POST_HOC`, since the outcomes were in memory when the band was formed.

    Returns
    -------
    polars.DataFrame
        ``by``, ``context_length`` (the predicted one), ``evictor``, ``n_fit_rows``,
        ``ratio_low``, ``ratio_high``, ``headroom``, ``predicted_low``, ``predicted_high``,
        ``task_class``, ``n``, ``rho`` (measured, plain arm), ``low``, ``high`` (Wilson),
        ``inside`` (measured ρ in the band), ``status``, ``note``: a band fitted on one row (one
        fitting context, e.g. the shipped 512 → 1,024 logs) has zero width, ratio low = ratio high,
        so ``inside`` asks whether ρ equals the prediction exactly; the note says so (null otherwise).
    """
    by = as_list(by)
    if band is None:
        contexts = sorted(gated["context_length"].unique().to_list())
        if len(contexts) < 2:
            raise ValueError(f"preregistered_table needs ≥2 context lengths, got {contexts}")
        band = prediction_band(gated, inputs, fit_contexts=contexts[:-1], target_context=contexts[-1],
                               evictor=evictor, by=by)
        status = POST_HOC
    require_columns(band, [*by, "context_length", "evictor", *BAND_COLUMNS], "preregistered_table band")
    targets = band.select("context_length", "evictor").unique()
    if targets.height != 1:
        raise ValueError(f"a band predicts one (context, evictor), got {targets.rows()}")
    target, ev = targets.row(0)
    sub = gated.filter((pl.col("context_length") == target) & (pl.col("evictor") == ev))
    if sub.height == 0:
        raise ValueError(f"no {ev} outcomes at the target context {target} to check the band against")
    measured = names_like(metrics.on_frame(metrics.scaling_rows, sub, by=(*by, "context_length")),
                          band)  # a frozen band's text
    out = band.with_columns(pl.col("context_length").cast(pl.Int64)).join(
        measured.select(*by, "task_class", "n", "rho", "low", "high"), on=by, how="left")
    out = out.with_columns(
        ((pl.col("rho") >= pl.col("predicted_low")) & (pl.col("rho") <= pl.col("predicted_high"))).alias("inside"),
        pl.lit(status or "pre-registered").alias("status"),
        pl.when(pl.col("n_fit_rows") == 1).then(pl.lit(ZERO_WIDTH)).otherwise(None).alias("note"),
    )
    return out.select(*by, "context_length", "evictor", *BAND_COLUMNS, "task_class", "n", "rho", "low", "high",
                      "inside", "status", "note").sort(by)


def harm_table(gated: pl.DataFrame, *, evictor: str | None = None, by=("task", "task_class"),
               confidence_level: float = defaults.CONFIDENCE_LEVEL) -> pl.DataFrame:
    """Table 27: fixed-budget harm rate Pr_x[A(b,x) < A_plain(1,x)], gated / plain, pooled over cells.

    Returns
    -------
    polars.DataFrame
        ``by``, ``budget``, ``evictor``, ``n``, ``harm_gated`` (+ ``gated_low``, ``gated_high``),
        ``harm_plain`` (+ ``plain_low``, ``plain_high``), Wilson intervals, and
        ``harm_ratio`` = harm_plain / harm_gated (null when harm_gated is 0), budgets b < 1.

    References
    ----------
    PAGE §4.1 "Catastrophic Failure Prevention", App. A.7.1, Table 27 (0.75 → 0.026, 29×).
    """
    by = as_list(by)
    sub, ev = one_evictor(gated, evictor)
    read = [*input_key(sub), "evictor", *by, "budget", "score_full", "score_plain", "score_gated"]
    sub = sub.select(list(dict.fromkeys(read))).filter(formulas.EVICTED)  # the columns read, then the rows
    keys = [*by, "budget"]
    g = metrics.on_frame(metrics.harm_rate, sub, by=by, arm="gated", confidence_level=confidence_level).rename(
        {"harm": "harm_gated", "low": "gated_low", "high": "gated_high"})
    p = metrics.on_frame(metrics.harm_rate, sub, by=by, arm="plain", confidence_level=confidence_level).rename(
        {"harm": "harm_plain", "low": "plain_low", "high": "plain_high"})
    out = g.select(*keys, "n", "harm_gated", "gated_low", "gated_high").join(
        p.select(*keys, "harm_plain", "plain_low", "plain_high"), on=keys)
    out = out.with_columns(
        pl.lit(ev).alias("evictor"),
        pl.when(pl.col("harm_gated") > 0).then(pl.col("harm_plain") / pl.col("harm_gated")).otherwise(None).alias("harm_ratio"),
    )
    return out.select(*keys, "evictor", "n", "harm_gated", "gated_low", "gated_high", "harm_plain", "plain_low",
                      "plain_high", "harm_ratio").sort(keys)


def per_layer_table(gated: pl.DataFrame, *, single: str = "snapkv", per_layer: str = "snapkv-perlayer",
                    confidence_level: float = defaults.CONFIDENCE_LEVEL) -> pl.DataFrame:
    """Table 32: ρ (Eq. 1) of per-layer vs single-mask SnapKV per (model, context, task).

    Returns
    -------
    polars.DataFrame
        ``model, context_length, task, task_class, n``, ``rho_single`` with ``single_low``,
        ``single_high`` and ``rho_per_layer`` with ``per_layer_low``, ``per_layer_high`` (Wilson), and
        ``rho_ratio`` = rho_per_layer / rho_single (null when rho_single is 0). Both arms on the
        inputs they both hold.

    References
    ----------
    PAGE App. C, Table 32 ("Per-layer wins clearly on aggregation tasks at 4K (FWE 1.8×,
    niah_multivalue 2.1×); ties at 16K and on sequential-integration tasks").
    """
    joined = _paired_rho(gated, {"single": single, "per_layer": per_layer}, confidence_level)
    return joined.with_columns(
        pl.when(pl.col("rho_single") > 0).then(pl.col("rho_per_layer") / pl.col("rho_single")).otherwise(None)
        .alias("rho_ratio")).select("model", "context_length", "task", "task_class", "n", "rho_single", "single_low",
                                    "single_high", "rho_per_layer", "per_layer_low", "per_layer_high",
                                    "rho_ratio").sort("model", "context_length", "task")


def random_control_table(gated: pl.DataFrame, *, scored: str = "snapkv", control: str = "random",
                         confidence_level: float = defaults.CONFIDENCE_LEVEL) -> pl.DataFrame:
    """Table 31: an informed scorer (SnapKV) against uniform-random scoring at matched budget.

    Returns
    -------
    polars.DataFrame
        ``model, context_length, task, task_class, n``; ``acc_full``, and the plain accuracy of each
        arm over the budgets b < 1 (``acc_snapkv``, ``acc_random``: every budget is run by both arms,
        so the comparison is at matched budget); ρ (Eq. 1) of each arm with its Wilson interval
        (``rho_snapkv``, ``snapkv_low``, ``snapkv_high``, ``rho_random``, ``random_low``,
        ``random_high``). Both arms on the inputs they both hold.

    References
    ----------
    PAGE App. B "Random-eviction control", Table 31 ("Random eviction destroys accuracy long before the budget gets
    aggressive; the dilution effect requires informed scoring"; ρ = 0.027 under random scoring vs
    0.013 under SnapKV).
    """
    arms = {"snapkv": scored, "random": control}
    rho = _paired_rho(gated, arms, confidence_level)
    keys = ["model", "context_length", "task_class", "task"]
    read = [*INPUT_KEY, *keys, "evictor", "budget", "score_full", "score_plain", "score_gated"]
    acc = [metrics.on_frame(metrics.accuracy, one_evictor(gated, ev)[0].select(list(dict.fromkeys(read)))
                            .filter(formulas.EVICTED), by=keys)
           .select(*keys, "acc_full", pl.col("acc_plain").alias(f"acc_{name}"))
           for name, ev in arms.items()]  # the columns read, then the rows
    out = rho.join(acc[0], on=keys).join(acc[1].drop("acc_full"), on=keys)
    return out.select("model", "context_length", "task", "task_class", "n", "acc_full", "acc_snapkv", "acc_random",
                      "rho_snapkv", "snapkv_low", "snapkv_high", "rho_random", "random_low",
                      "random_high").sort("model", "context_length", "task")


def _paired_rho(gated: pl.DataFrame, arms: dict[str, str], confidence_level: float) -> pl.DataFrame:
    """ρ (Eq. 1) with Wilson intervals of two evictors on the inputs both hold, per (model, context,
    task): ``n`` and, per arm name, ``rho_<name>``, ``<name>_low``, ``<name>_high``."""
    keys = ["model", "context_length", "task_class", "task"]
    subs = [one_evictor(gated, ev)[0] for ev in arms.values()]
    unit = list(INPUT_KEY)
    both = subs[0].select(unit).unique().join(subs[1].select(unit).unique(), on=unit)  # the inputs both arms hold
    out = []
    for sub, name in zip(subs, arms):
        sub = sub.join(both, on=unit, how="semi")
        rate = metrics.on_frame(metrics.recovery_rate, sub, by=keys, confidence_level=confidence_level)
        out.append(rate.select(*keys, "n", pl.col("rho").alias(f"rho_{name}"), pl.col("low").alias(f"{name}_low"),
                               pl.col("high").alias(f"{name}_high")))
    return out[0].join(out[1].drop("n"), on=keys)

