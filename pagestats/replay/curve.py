"""The fixed-τ replay at many thresholds in one query: the threshold-sensitivity curve
(App. A.3.4 "Threshold sensitivity", Fig. 6), computed by DuckDB over a thresholds table."""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats.core import defaults, formulas
from pagestats.replay.session import Replay
from pagestats.replay.spec import ProfileSpec
from pagestats.replay.sqltext import sql_string
from pagestats.core.schema import INPUT_KEY

TAU_CURVE_COLUMNS = ("tau", "n_inputs", "p_open", "delta", "fp_rate", "fn_rate", "kept_kv")
#: Columns of the outcome rows the curve can be grouped by.
GROUP_COLUMNS = ("model", "context_length", "evictor", "task", "task_class", "budget", "run_id", "input_id",
                 "n_tokens", "full_score")  # fmt: skip


def tau_curve_query(groups: list[str]) -> str:
    """The curve as one DuckDB query over ``outcomes``, ``drops`` (the relations of a
    :class:`~pagestats.replay.Replay`) and ``_thresholds(tau, _ord)``.

    Per input: D, its class, Σ(A_full − A_plain), Σ kept fraction and the row count over the
    rows with b < 1. Per group and distinct D: running sums in D order. For each threshold an
    ASOF join picks the running sums of the inputs with D < τ, the inputs whose gate
    :data:`~pagestats.core.formulas.GATE_RULE` keeps closed; every metric is then a difference of
    sums.
    """
    g = ", ".join(groups)
    unit = ", ".join([*groups, *(c for c in INPUT_KEY if c not in groups)])
    on = " AND ".join(f"g.{c} = c.{c}" for c in groups)
    sums = ("n", "cap", "dil", "gain", "kept", "n_rows")
    window = "PARTITION BY " + g + ' ORDER BY "drop" ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW'
    return f"""
    WITH rows AS (
        SELECT o.run_id, o.task, o.input_id, o.evictor, o.budget, o.n_kept, o.score, d.model, d.context_length,
            d.task_class, d.n_tokens, d.full_score, d."drop"{", d.pair_draw" if "pair_draw" in groups else ""}
        FROM outcomes o JOIN drops d USING ({", ".join(INPUT_KEY)}) WHERE {formulas.evicted("o")}
    ), units AS (
        SELECT {unit}, any_value("drop") AS "drop", 1 AS n,
            CAST(any_value(task_class) = {sql_string(defaults.CAPACITY_BOUND)} AS DOUBLE) AS cap,
            CAST(any_value(task_class) = {sql_string(defaults.DILUTION_PRONE)} AS DOUBLE) AS dil,
            sum(full_score - score) AS gain, sum({formulas.kept_fraction("n_kept")}) AS kept,
            CAST(count(*) AS DOUBLE) AS n_rows
        FROM rows GROUP BY {unit}
    ), levels AS (
        SELECT {g}, "drop", {", ".join(f"sum(sum({c})) OVER w AS {c}" for c in sums)}
        FROM units GROUP BY {g}, "drop" WINDOW w AS ({window})
    ), totals AS (
        SELECT {g}, {", ".join(f"sum({c}) AS {c}" for c in sums)} FROM units GROUP BY {g}
    ), grid AS (
        SELECT * FROM totals CROSS JOIN _thresholds
    )
    SELECT {", ".join(f"g.{c}" for c in groups)}, g.tau, CAST(g.n AS BIGINT) AS n_inputs,
        1.0 - coalesce(c.n, 0) / g.n AS p_open,
        coalesce(c.gain, 0) / g.n_rows AS delta,
        CASE WHEN g.cap > 0 THEN (g.cap - coalesce(c.cap, 0)) / g.cap ELSE CAST('NaN' AS DOUBLE) END AS fp_rate,
        CASE WHEN g.dil > 0 THEN coalesce(c.dil, 0) / g.dil ELSE CAST('NaN' AS DOUBLE) END AS fn_rate,
        (g.kept - coalesce(c.kept, 0) + coalesce(c.n_rows, 0)) / g.n_rows AS kept_kv
    FROM grid g ASOF LEFT JOIN levels c ON {on} AND g.tau > c."drop"
    ORDER BY {", ".join(f"g.{c}" for c in groups)}, g._ord
    """


def tau_curve(
    logs,
    taus,
    profile: ProfileSpec = ProfileSpec(),
    by=("model", "context_length", "evictor"),
) -> pl.DataFrame:
    """Fixed-τ replay at many thresholds in one query (App. A.3.4 "Threshold sensitivity", Fig. 6).

    Parameters
    ----------
    logs : pagestats.io.Logs or pagestats.io.LogDB
    taus : array_like of float
        Thresholds (any order; ±inf allowed).
    profile : ProfileSpec
    by : sequence of str
        Groups of the curve (columns of the outcome rows, :data:`GROUP_COLUMNS`: model,
        context_length, evictor, task, task_class, budget, run_id, …).

    Returns
    -------
    polars.DataFrame
        ``*by, [pair_draw], tau, n_inputs, p_open, delta, fp_rate, fn_rate, kept_kv``, one
        row per group and threshold, taus in the given order within a group.

    Notes
    -----
    Over the rows with b < 1 of a group: Δ(τ) = mean over (input, budget) of
    (1 − open)(A_full − A_plain) = mean(gated − plain); kept_kv(τ) = mean of the gated arm's
    n_kept/n_tokens. Over the group's inputs: p_open = fraction with D ≥ τ; fp_rate = share of
    capacity-bound inputs whose gate opens ("gate fires on capacity-bound MK3"); fn_rate =
    share of dilution-prone inputs whose gate stays closed (App. A.3.4); NaN when the group
    has no input of that class. Equals the brute-force loop of :func:`gated_outcomes` over τ up
    to floating-point summation order.
    """
    taus = np.asarray(taus, dtype=np.float64).ravel()
    if np.isnan(taus).any():
        raise ValueError("taus contain NaN")
    if taus.size == 0:
        raise ValueError("taus is empty")
    by = list(by)
    bad = [c for c in by if c not in GROUP_COLUMNS]
    if bad:
        raise ValueError(f"tau_curve: cannot group by {bad}")
    with Replay(logs, profile=profile) as session:
        con = session.con
        groups = [*by, *session.drops_relation()]
        con.register("_thresholds", pl.DataFrame({"tau": taus, "_ord": np.arange(taus.size, dtype=np.int64)}))
        out = con.sql(tau_curve_query(groups)).pl()
    if out.height == 0:
        raise ValueError("tau_curve: no outcome rows with budget < 1 to replay")
    return out.with_columns(pl.col("n_inputs").cast(pl.Int64), *(pl.col(c).cast(pl.Float64) for c in TAU_CURVE_COLUMNS
                                                                   if c != "n_inputs"))


def paper_tau_curve(logs, taus, profile: ProfileSpec = ProfileSpec(), *, budgets=defaults.FIG6_BUDGETS,
                    fp_tasks=defaults.FIG6_FP_TASKS, fn_tasks=defaults.FIG6_FN_TASKS,
                    by=("model", "context_length", "evictor")) -> pl.DataFrame:
    """Fig. 6's threshold-sensitivity curve as the paper computes it (App. A.3.4 "Threshold sensitivity").

    On the budgets {0.5, 0.25, 0.125, 0.0625}: Δ(τ) is the mean over (task, budget) cells of each
    cell's mean gated − plain accuracy (every task weighs the same, whatever its inputs); the
    false-positive rate is the share of the capacity-bound anchor's inputs (NIAH-MK3) on which the
    gate opens; the false-negative rate the share of the dilution-prone tasks' inputs (VT, FWE,
    QA_1, those present) on which it stays closed. p_open and kept_kv are pooled over the inputs
    and over the (task, budget) cells. :func:`tau_curve` over whole classes and every b < 1 is the
    variant this replaces in the report.

    Returns
    -------
    polars.DataFrame
        ``*by, tau, n_inputs, p_open, delta, fp_rate, fn_rate, kept_kv`` (NaN rates where the logs
        lack those tasks).

    Raises
    ------
    ValueError
        When the logs hold none of ``budgets``.
    """
    by = list(by)
    cells = tau_curve(logs, taus, profile, by=[*by, "task", "budget"])
    cells = cells.filter(pl.col("budget").is_in(list(budgets)))
    if cells.height == 0:
        raise ValueError(f"paper_tau_curve: the logs hold none of the budgets {list(budgets)}")
    keys = [*by, "tau"]
    # one budget's rows give each task's inputs and the share of them whose gate opens
    per_task = cells.group_by([*keys, "task"]).agg(pl.col("n_inputs").first(), pl.col("p_open").first())

    def share_open(tasks) -> pl.DataFrame:
        part = per_task.filter(pl.col("task").is_in(list(tasks)))
        return part.group_by(keys).agg(
            ((pl.col("p_open") * pl.col("n_inputs")).sum() / pl.col("n_inputs").sum()).alias("_open"))

    out = cells.group_by(keys).agg(pl.col("delta").mean(), pl.col("kept_kv").mean()).join(
        per_task.group_by(keys).agg(pl.col("n_inputs").sum(),
                                    ((pl.col("p_open") * pl.col("n_inputs")).sum() / pl.col("n_inputs").sum())
                                    .alias("p_open")), on=keys)
    out = out.join(share_open(fp_tasks).rename({"_open": "fp_rate"}), on=keys, how="left").join(
        share_open(fn_tasks).with_columns((1.0 - pl.col("_open")).alias("fn_rate")).drop("_open"), on=keys, how="left")
    return (out.with_columns(pl.col("fp_rate", "fn_rate").fill_null(float("nan")))
            .select(*keys[:-1], "tau", "n_inputs", "p_open", "delta", "fp_rate", "fn_rate", "kept_kv")
            .sort(*keys))

