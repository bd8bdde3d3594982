"""Per-input rates: ρ (Eq. 1), harm (Table 27), r(x) (App. A.7.1), p_open, and the per-input AUC.

Pure functions of the replay frames; conventions in :mod:`pagestats.metrics`.
"""

from __future__ import annotations

import polars as pl

from pagestats import stats
from pagestats.core import defaults, formulas
from pagestats.core.columns import TASK_CELL, distinct_rows, input_key, repeats_a_key, require_columns
from pagestats.metrics.sides import capacity_side, dilution_side
from pagestats.metrics._frames import (
    _arm,
    _by,
    _outcome_rows,
    _uniq,
    _unit_key,
    _with_wilson,
)

__all__ = ["recovery_rate", "harm_rate", "recovery_indicator", "p_open", "auc_by_signal"]


def recovery_rate(
    frame: pl.DataFrame,
    by=TASK_CELL,
    arm: str = "plain",
    *,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
    threshold: float = defaults.RHO_THRESHOLD,
) -> pl.DataFrame:
    """Per-input recovery rate ρ (§3, Eq. 1; Table 1) with its Wilson interval.

    ``ρ = Pr_x[max_{b<1} A(b, x) > A(1, x)]``: the share of units for which some eviction
    budget strictly beats the full cache, ``A`` the ``arm``'s score (plain by default,
    as in Eq. 1).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``k`` (recovered units), ``n`` (units), ``rho``, ``low``,
        ``high`` (Wilson), ``dilution_prone`` (``rho >= threshold``, 0.05 pre-registered).
    """
    score, _ = _arm(arm)
    rows, by = _outcome_rows(frame, by, [score, "score_full"], "recovery_rate")
    units = rows.group_by(_uniq(by, _unit_key(rows))).agg(
        formulas.expr(formulas.recovered(score)).alias("_rec")
    )
    known = pl.col("_rec").null_count() == 0  # a unit with an unknown full-KV outcome leaves k unknown
    out = units.group_by(by).agg(pl.when(known).then(pl.col("_rec").sum()).cast(pl.Int64).alias("k"),
                                 pl.len().cast(pl.Int64).alias("n"))
    out = _with_wilson(out.sort(by), "rho", confidence_level)
    return out.with_columns((pl.col("rho") >= threshold).alias("dilution_prone"))


def harm_rate(
    frame: pl.DataFrame,
    by=TASK_CELL,
    arm: str = "gated",
    *,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
) -> pl.DataFrame:
    """Fixed-budget harm rate ``Pr_x[A(b, x) < A_plain(1, x)]`` per budget (App. A.7.1, Table 27).

    Unlike r(x), this is a real event: at a fixed budget the gate can lose an answer the
    full cache had. Computed for every budget present, including a logged 1.0 audit row.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``budget``, ``k`` (harmed units), ``n``, ``harm``, ``low``, ``high``.
    """
    score, _ = _arm(arm)
    by = _by(frame, by, "harm_rate")
    _outcome_rows(frame, by, [score, "score_full"], "harm_rate", include_full=True)  # checks only: no filtered copy
    keys = _uniq(by, ["budget"])
    out = frame.group_by(keys).agg(
        formulas.expr(formulas.harm_count(score)).cast(pl.Int64).alias("k"), pl.len().cast(pl.Int64).alias("n")
    )
    return _with_wilson(out.sort(keys), "harm", confidence_level)


def recovery_indicator(frame: pl.DataFrame, arm: str = "gated", *, include_full: bool = True) -> pl.DataFrame:
    """Per-unit recovery indicator ``r(x) = sign(max_b A_arm(b, x) − A_plain(1, x))`` (App. A.7.1).

    With ``include_full=True`` (the paper) the sweep includes ``b = 1.0``, where the gated
    arm reproduces the full cache, so ``r >= 0`` by construction: r is an oracle-budget
    recovery measure, not a harm measure (see :func:`harm_rate`). ``include_full=False``
    takes the maximum over ``b < 1`` only, so ``r = −1`` becomes possible.

    Returns
    -------
    polars.DataFrame
        One row per unit: its key, ``model``, ``context_length``, ``task_class`` (those
        present), ``best`` (the maximum) and ``r`` (Int8 in {−1, 0, 1}).
    """
    score, _ = _arm(arm)
    extra = [c for c in ("model", "context_length", "task_class") if c in frame.columns]
    rows, _ = _outcome_rows(frame, (), [score, "score_full"], "recovery_indicator", keep=extra)
    unit = _unit_key(rows)
    best = pl.col(score).max()
    if include_full:
        best = pl.max_horizontal(best, pl.col("score_full").first())
    out = rows.group_by(unit).agg(*[pl.col(c).first() for c in extra], best.alias("best"),
                                  pl.col("score_full").first().alias("_full"))
    out = out.with_columns((pl.col("best") - pl.col("_full")).sign().cast(pl.Int8).alias("r")).drop("_full")
    return out.sort(unit)


def p_open(
    frame: pl.DataFrame,
    by=("model", "context_length"),
    *,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
) -> pl.DataFrame:
    """Gate-open fraction ``p_open`` per group, with a Wilson interval (Tables 12, 22).

    A per-input property, independent of the budget and the evictor (App. A.6.2): each
    input (and pair draw) is counted once per group. Works on the gate frame or on gated
    outcomes.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``k`` (open inputs), ``n`` (inputs), ``p_open``, ``low``, ``high``.
    """
    by = _by(frame, by, "p_open")
    key = input_key(frame)
    require_columns(frame, [*key, "gate_open"], "p_open")
    inputs = distinct_rows(frame, _uniq(by, key, ["gate_open"]))
    if repeats_a_key(inputs, _uniq(by, key)):
        raise ValueError("p_open: gate_open differs between rows of the same input")
    out = inputs.group_by(by).agg(
        formulas.expr(formulas.OPEN_COUNT).cast(pl.Int64).alias("k"), pl.len().cast(pl.Int64).alias("n")
    )
    return _with_wilson(out.sort(by), "p_open", confidence_level)


def auc_by_signal(
    frame: pl.DataFrame,
    statistic: str = "drop",
    by=("model", "context_length"),
    *,
    capacity_tasks=None,
    dilution_tasks=None,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
) -> pl.DataFrame:
    """Per-input AUC of capacity-bound vs dilution-prone inputs by a statistic (§3; Tables 5–6).

    Each input (and pair draw) counts once. The capacity-bound side is the inputs of
    ``capacity_tasks`` (the paper's: ``["niah_multikey_3"]``, Table 6: "per-input separability
    of NIAH-MK3 from the pooled dilution-prone tasks") or, when ``None``, of the capacity-bound
    ``task_class``; the other side is the inputs of ``dilution_tasks`` or, when ``None``, of the
    dilution-prone ``task_class`` outside the capacity-bound side
    (:func:`pagestats.metrics.dilution_side`). Inputs on neither side are left out.
    Orientation as :func:`pagestats.stats.auc`: capacity-bound inputs should have the
    LOWER statistic, AUC = Pr[s(dilution) > s(capacity)] + ½·Pr[tie].

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``auc``, ``low``, ``high`` (DeLong), ``n_capacity``,
        ``n_dilution``, ``p_value`` (two-sided Mann–Whitney test of AUC = 0.5, on the same U:
        :func:`pagestats.stats.auc`); ``auc``, its interval and ``p_value`` are null in a group
        lacking either side.
    """
    by = _by(frame, by, "auc_by_signal")
    key = input_key(frame)
    need = [*key, statistic, *([] if capacity_tasks is not None and dilution_tasks is not None else ["task_class"])]
    require_columns(frame, need, "auc_by_signal")
    inputs = frame.select(_uniq(by, need)).unique(subset=_uniq(by, key), keep="first", maintain_order=True)
    cap = capacity_side(None if capacity_tasks is None else list(capacity_tasks))
    dil = (dilution_side(None if capacity_tasks is None else list(capacity_tasks)) if dilution_tasks is None
           else pl.col("task").is_in(list(dilution_tasks)) & ~cap)
    inputs = inputs.filter(cap | dil).with_columns(cap.alias("_cap"))
    rows = []
    for part in inputs.sort(by).partition_by(by, maintain_order=True) if inputs.height else []:
        lab = part["_cap"].to_numpy().astype(bool)
        row = part.select(by).row(0, named=True)
        row.update(n_capacity=int(lab.sum()), n_dilution=int((~lab).sum()), auc=None, low=None, high=None,
                   p_value=None)
        if lab.any() and (~lab).any():
            r = stats.auc(part[statistic].to_numpy(), lab, confidence_level)
            row.update(auc=r.estimate, low=r.low, high=r.high, p_value=r.p_value)
        rows.append(row)
    schema = {**{c: frame.schema[c] for c in by}, "auc": pl.Float64, "low": pl.Float64, "high": pl.Float64,
              "n_capacity": pl.Int64, "n_dilution": pl.Int64, "p_value": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
