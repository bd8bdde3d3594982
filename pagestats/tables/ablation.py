"""Tables 5–6: the gate-signal ablation — does a statistic other than D separate the
capacity-bound anchor (NIAH-MK3) from the dilution-prone tasks (task means, per-input AUC with
multiplicity-corrected p-values, MK monotonicity, correlation with D), and the gate on it at a recalibrated τ.

These tables replay the logs (:mod:`pagestats.replay`) under several profile statistics, so
they take :class:`pagestats.io.Logs` first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from pagestats import metrics, replay, stats
from pagestats.core import defaults
from pagestats.core.columns import MODEL_CELL, names_like
from pagestats.replay.policies import FixedTau
from pagestats.core.schema import INPUT_KEY
from pagestats.tables._common import as_list, gate_at, ordering_margin

__all__ = ["signal_names", "auc_table", "signal_ablation_table"]


def _by_statistic(logs, statistic: str, profile: replay.ProfileSpec) -> pl.Series:
    """``statistic`` per input of ``logs``, as the ``drop`` column of the gate frame (the policy is
    irrelevant), in its input order (:func:`pagestats.replay.gate`), in memory of its own: a column of a
    DuckDB result keeps the whole result alive (its chunks hold every column: 160 MB per statistic at
    1M inputs, where the column is 8 MB), so it is copied into one chunk (a result of one chunk, about
    130,000 rows or fewer, is kept as it is)."""
    spec = replay.ProfileSpec(**{**profile.__dict__, "statistic": statistic})
    return replay.gate(logs, FixedTau(), spec)["drop"].rechunk()


def signal_names(logs) -> list[str]:
    """The profile statistics of App. A.3.3 plus every logged ``signals`` field."""
    names = list(replay.STATISTICS)
    inputs = logs.inputs
    if "signals" in inputs.columns and isinstance(inputs.schema["signals"], pl.Struct):
        names += [f.name for f in inputs.schema["signals"].fields]
    return names


def auc_table(frames: Mapping[str, pl.DataFrame], by=MODEL_CELL, *, q: float = defaults.FDR_Q,
              confidence_level: float = defaults.CONFIDENCE_LEVEL,
              anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> pl.DataFrame:
    """Per-input AUC of several gate signals with multiplicity-corrected p-values (BH).

    Parameters
    ----------
    frames : mapping
        Signal name → per-input frame whose ``drop`` column holds the signal (e.g.
        :func:`pagestats.replay.gate` under ``ProfileSpec(statistic=...)``, or any frame
        with ``run_id, task, input_id, task_class`` and ``drop``: a custom signal).
    by : sequence of str
        Groups (default the (model, context) cell).
    anchor : sequence of str or None
        The capacity-bound side (default NIAH-MK3, Table 6: "per-input separability of NIAH-MK3
        from the pooled dilution-prone tasks"; ``None``: the capacity-bound class); the other side
        is the dilution-prone tasks outside it.

    Returns
    -------
    polars.DataFrame
        ``statistic``, ``by``, ``auc``, ``low``, ``high`` (DeLong), ``auc_oriented`` = max(auc, 1 − auc)
        (Table 5: "oriented per signal"), ``n_capacity``, ``n_dilution``, ``p_value`` (two-sided
        Mann–Whitney test of AUC = 0.5), all of :func:`pagestats.metrics.auc_by_signal` (capacity-bound
        lower orientation; one computation of U per group, on one row per input), ``p_adjusted`` and
        ``rejected`` (Benjamini–Hochberg at ``q`` across every (signal, group) row, :func:`pagestats.stats.bh`).

    Notes
    -----
    The p-value is two-sided because the orientation of a signal is chosen after looking
    (Table 5), which the family-wise BH correction then covers.
    """
    by = as_list(by)
    parts = [metrics.on_frame(metrics.auc_by_signal, frame, "drop", by=by, confidence_level=confidence_level,
                              capacity_tasks=None if anchor is None else list(anchor))
             .with_columns(pl.lit(name).alias("statistic")) for name, frame in frames.items()]
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
    order = names_like(pl.DataFrame({"task": list(tasks), "_pos": list(range(len(tasks)))}), sub)
    sub = sub.join(order, on="task").sort([*by, "_pos"])
    steps = pl.col("mean").diff().drop_nulls()  # monotone in either direction: Table 5's "MK mono."
    out = sub.group_by(by).agg(pl.len().alias("_n"), (steps > 0).all().alias("_up"), (steps < 0).all().alias("_down"))
    return out.select(*by, pl.when(pl.col("_n") == len(tasks)).then(pl.col("_up") | pl.col("_down"))
                      .otherwise(None).alias("mk_monotone"))


def signal_ablation_table(logs, *, statistics: Sequence[str] | None = None, profile: replay.ProfileSpec = replay.ProfileSpec(),
                          exclude_from_margin: Sequence[str] = ("niah_multivalue",),
                          mk_tasks: Sequence[str] = ("niah_multikey_1", "niah_multikey_2", "niah_multikey_3"),
                          q: float = defaults.FDR_Q, recalibrate: str = "z", tau: float = defaults.TAU,
                          pilot_n: int = defaults.PILOT_N,
                          anchor: Sequence[str] | None = defaults.ANCHOR_TASKS) -> pl.DataFrame:
    """Tables 5–6: gate-signal ablation over the profile statistics and the logged ``signals``.

    For every statistic and (model, context) cell: does a single threshold separate the
    capacity-bound anchor's task mean from the dilution-prone ones (Table 5: "separating the
    capacity-bound anchor (NIAH-MK3) from the dilution-prone tasks"; ``anchor``, default
    :data:`pagestats.core.defaults.ANCHOR_TASKS`, ``None`` for the capacity-bound class), by what
    margin, how well does it separate inputs (AUC), are its task means monotone (either
    direction) along MK1 → MK2 → MK3, and how does it correlate with D.

    Returns
    -------
    polars.DataFrame
        ``statistic, model, context_length, n_inputs``, ``separated`` (task means on
        either side: Table 5's "Sep."), ``below`` (the anchor's means strictly below every
        dilution-prone mean: Table 6's "sep."), ``margin`` (:func:`~pagestats.tables._common.ordering_margin`,
        capacity-lower orientation), ``margin_minus`` (tasks of ``exclude_from_margin``
        left out: Table 6's "margin−"), the :func:`auc_table` columns (``auc`` … ``rejected``),
        ``mk_monotone`` (the task means strictly increase, or strictly decrease, along
        ``mk_tasks``: Table 5's "MK mono."; null when an MK task is missing), ``pearson_r`` (per-input
        Pearson correlation with D; NaN for a constant signal), and the gate on the statistic at
        τ recalibrated to it (App. A.3.1; ``recalibrate="none"`` keeps the fixed τ, on the
        statistic's own scale): ``tau_gate``, ``p_open``, ``degenerate``, ``recalibration``.

    References
    ----------
    PAGE §3 "Gate signal", App. A.3.1–A.3.3, Tables 5–6.
    """
    names = list(statistics) if statistics is not None else signal_names(logs)
    by = list(MODEL_CELL)
    # the input columns once, each statistic beside them as ``drop`` (the gate frame's input order):
    # Tables 5–6 hold every statistic at once (at 1M inputs, a copy of the keys per statistic was the
    # report's peak)
    d_spec = replay.ProfileSpec(**{**profile.__dict__, "statistic": "drop"})
    inputs = replay.gate(logs, FixedTau(), d_spec).select(*INPUT_KEY, *MODEL_CELL, "task_class", "drop")
    frames = {s: inputs if s == "drop" else inputs.with_columns(_by_statistic(logs, s, profile)) for s in names}
    aucs = auc_table(frames, by=by, q=q, anchor=anchor)
    rows = []
    for s, frame in frames.items():
        means = metrics.on_frame(metrics.task_means, frame, "drop", by=by, sd=False)  # the margins read the means
        below = ordering_margin(means, by=by, anchor=anchor)
        above = ordering_margin(means.with_columns(-pl.col("mean")), by=by, anchor=anchor).select(
            *by, pl.col("ordered").alias("_above"))
        minus = ordering_margin(means, by=by, exclude=exclude_from_margin, anchor=anchor).select(
            *by, pl.col("margin").alias("margin_minus"))
        mono = _mk_monotone(means, by, mk_tasks)
        joined = frame.with_columns(inputs["drop"].alias("_d"))  # the same inputs in the same order
        corr = []
        for (model, ctx), part in joined.group_by(by, maintain_order=True):
            x, y = part["drop"].to_numpy(), part["_d"].to_numpy()
            r = float(np.corrcoef(x, y)[0, 1]) if part.height > 1 and x.std() > 0 and y.std() > 0 else float("nan")
            corr.append({"model": model, "context_length": ctx, "pearson_r": r, "n_inputs": part.height})
        corr = pl.DataFrame(corr, schema={"model": frame.schema["model"], "context_length": frame.schema["context_length"],
                                          "pearson_r": pl.Float64, "n_inputs": pl.Int64})
        part = below.join(above, on=by).join(minus, on=by).join(mono, on=by, how="left").join(corr, on=by)
        spec = replay.ProfileSpec(**{**profile.__dict__, "statistic": s})
        part = part.join(gate_at(logs, spec, recalibrate, tau, pilot_n), on=by, how="left")
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


