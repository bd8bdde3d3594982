"""The report's decision entries: the accuracy–memory frontier over τ and budgets per evictor
as a figure (:func:`pagestats.figures.decision_frontier`) and as a table of its frontier
points, with the kept KV cache as a fraction and in GiB per sequence (docs/DEFINITIONS.md,
"Memory"). The frontier data are computed once per report context."""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np
import polars as pl

from pagestats import metrics, replay
from pagestats.core import defaults
from pagestats.core.columns import distinct_rows, input_key, names_like
from pagestats.figures import decision_frontier, decision_frontier_data
from pagestats.metrics.engine import ROWS, names, query
from pagestats.report.context import Context
from pagestats.core.schema import INPUT_KEY
from pagestats.tables import LAYOUTS

_CACHE: "weakref.WeakKeyDictionary[Context, pl.DataFrame]" = weakref.WeakKeyDictionary()

def decision_taus(tau0: float) -> np.ndarray:
    """The thresholds of the decision frontier: the Fig. 6 grid, the deployed τ0, and ±∞."""
    start, stop, step = defaults.TAU_GRID
    grid = np.round(np.arange(start, stop + step / 25, step), 6)
    return np.unique(np.r_[grid, tau0, -np.inf, np.inf])


def decision_data(ctx: Context) -> pl.DataFrame:
    """:func:`pagestats.figures.decision_frontier_data` of the context's logs and profile
    (computed once per context)."""
    if ctx not in _CACHE:
        tau0 = ctx.fixed_tau if ctx.fixed_tau is not None else defaults.TAU
        keys = ("model", "context_length", "evictor", "budget")
        # the columns read; the rows b < 1, the evictors of a (model, context) on the same inputs, as Table 2
        read = ctx.gated.select(*input_key(ctx.gated), *keys, "score_full", "score_plain", "score_gated")
        gated = metrics.evicted_on_equal_inputs(read)
        accuracy = metrics.on_rows(metrics.accuracy, gated, read, list(keys))
        unit = [*INPUT_KEY, "evictor"]
        units = names_like(query(gated, f"SELECT DISTINCT {names(unit)} FROM {ROWS}"), read)
        like = read.head(0)
        del gated, read
        outcomes = ctx.logs.outcomes
        if units.height != distinct_rows(outcomes, unit).height:  # else every unit: no copy
            outcomes = outcomes.join(units, on=unit, how="semi")
        logs = dataclasses.replace(ctx.logs, outcomes=outcomes)
        curve = names_like(replay.tau_curve(logs, decision_taus(tau0), ctx.profile, by=keys), like)  # SQL's text
        if "pair_draw" in curve.columns:
            curve = curve.group_by(*keys, "tau").agg(pl.col("delta", "kept_kv", "p_open").mean())
        gib = None
        if ctx.logs.manifests:
            gib = metrics.full_cache_gib(ctx.logs.inputs, ctx.logs.manifests)
        _CACHE[ctx] = decision_frontier_data(curve, accuracy, gib)
    return _CACHE[ctx]


def decision_figure(ctx: Context):
    """The decision figure with the context's fixed τ (or the default τ) marked."""
    return decision_frontier(decision_data(ctx), tau=ctx.fixed_tau if ctx.fixed_tau is not None else defaults.TAU)


def decision_table(ctx: Context):
    """The frontier points of every evictor, cheapest first, typeset with its layout in
    :data:`pagestats.tables.LAYOUTS`.

    Thresholds that give the same point (same budget, accuracy and kept-KV: no input's D lies
    between them) are one row, with the range ``tau_from`` … ``tau_to``."""
    data = decision_data(ctx).filter(pl.col("on_frontier")).drop("on_frontier", "acc_full")
    keys = [k for k in ("model", "context_length", "evictor") if k in data.columns]
    point = [*keys, "budget", "accuracy", "kept_kv", *(["kv_gib"] if "kv_gib" in data.columns else []), "p_open",
             "delta"]
    rows = data.group_by(point).agg(pl.col("tau").min().alias("tau_from"), pl.col("tau").max().alias("tau_to"))
    return rows.select(*keys, "tau_from", "tau_to", *point[len(keys):]).sort([*keys, "kept_kv", "accuracy"]), \
        LAYOUTS["tabN2_decision_frontier"]
