"""The scaling relation ρ ≈ (1 − A_full)·p_recov and its pre-registered test (§5, Eq. 4).

``scaling_rows`` builds Table 25 / Fig. 9 from gated outcomes, ``scaling_fit`` is the
through-origin slope over dilution-prone rows (a binomial GLM; ≈ 0.34 in the paper), and
``predict_band`` forms the pre-registered intervals of Table 21 (ratio band of the fitting
contexts × measured headroom), to be frozen with :func:`pagestats.io.prereg.freeze_band`
before the measurement is loaded. Re-exported by :mod:`pagestats.metrics`.
"""

from __future__ import annotations

import polars as pl

from pagestats import stats
from pagestats.core import defaults
from pagestats.metrics import engine
from pagestats.metrics.delta import full_accuracy
from pagestats.metrics.engine import ROWS, grouped, names, query
from pagestats.metrics.rates import recovery_rate

__all__ = ["scaling_rows", "scaling_fit", "predict_band", "in_fit", "SCALING_BY", "DILUTION_RULES"]

#: One row of Table 25: (model, context, task).
SCALING_BY = ("model", "context_length", "task")


def scaling_rows(
    rows,
    by=SCALING_BY,
    *,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
    threshold: float = defaults.RHO_THRESHOLD,
) -> pl.DataFrame:
    """Rows of Table 25: headroom ``1 − A_full`` and plain ρ per (model, context, task).

    Parameters
    ----------
    rows : duckdb.DuckDBPyRelation
        Gated outcomes (:mod:`pagestats.metrics.engine`) of **one** evictor per row group
        (the paper uses SnapKV); select it first, pooling evictors raises.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``task_class``, ``n`` (inputs), ``a_full`` (mean full-cache score,
        :func:`~pagestats.metrics.full_accuracy`), ``headroom``, ``k``, ``rho``, ``low``, ``high``
        (Wilson, Eq. 1 on the plain arm: :func:`~pagestats.metrics.recovery_rate`),
        ``dilution_prone`` (ρ ≥ 0.05) and ``ratio = rho / headroom`` (null at zero headroom).
    """
    by = engine.group_by(by, "scaling_rows", rows)
    engine.check(rows, [*engine.input_key(rows), "evictor", "score_full", "task_class"], "scaling_rows")
    groups = query(rows, f"SELECT {names(by)}, count(DISTINCT evictor) AS evictors, count(DISTINCT task_class) AS "
                         f"classes, any_value(task_class) AS task_class FROM {ROWS} {grouped(by)}")
    if (groups["evictors"] > 1).any():
        raise ValueError("scaling_rows: several evictors in a row group; filter to one evictor (e.g. snapkv)")
    if (groups["classes"] > 1).any():
        raise ValueError("scaling_rows: a row group mixes task classes; include 'task' in by")
    full = full_accuracy(rows, by).rename({"acc_full": "a_full"})
    rho = recovery_rate(rows, by, "plain", confidence_level=confidence_level, threshold=threshold)
    out = groups.select(*by, "task_class").join(full, on=by, nulls_equal=True).join(rho.drop("n"), on=by, how="left",
                                                                                    nulls_equal=True)
    out = out.with_columns((1.0 - pl.col("a_full")).alias("headroom"))
    out = out.with_columns(
        pl.when(pl.col("headroom") > 0).then(pl.col("rho") / pl.col("headroom")).otherwise(None).alias("ratio")
    )
    cols = [*by, "task_class", "n", "a_full", "headroom", "k", "rho", "low", "high", "dilution_prone", "ratio"]
    return out.select(cols).sort(by)


#: Which rows of Table 25 the scaling slope is fitted on (§5): the dilution-prone *task class*
#: (Fig. 9's filled circles) or the measured ρ ≥ 0.05 (the table's ``dilution_prone`` column).
DILUTION_RULES = ("task-class", "rho")


def in_fit(rule: str) -> pl.Expr:
    """Rows of :func:`scaling_rows` that ``rule`` counts as dilution-prone (:data:`DILUTION_RULES`)."""
    if rule == "task-class":
        return (pl.col("task_class") == defaults.DILUTION_PRONE).fill_null(False)
    if rule == "rho":
        return pl.col("dilution_prone").fill_null(False)
    raise ValueError(f"dilution rule must be one of {DILUTION_RULES}, got {rule!r}")


def scaling_fit(rows: pl.DataFrame, *, rule: str = defaults.DILUTION_RULE) -> stats.BinomialFitResult:
    """The slope of ρ on headroom through the origin (§5 Eq. 4; Table 25; Fig. 9: ≈ 0.34).

    A binomial GLM with an identity link (:func:`pagestats.stats.binomial_origin_fit`): each
    row's ρ = k/n is weighted by its binomial information, so a 65-input row counts more
    than a 15-input one. Rows with zero headroom (A_full = 1) carry no information on the
    slope (ρ is 0 there by construction) and are left out and counted (``n_excluded``).

    Parameters
    ----------
    rows : polars.DataFrame
        :func:`scaling_rows` output (drop any rows to exclude beforehand, as the paper
        drops Qwen2.5-3B 4K FWE as counting noise).
    rule : {"task-class", "rho"}
        Which rows are dilution-prone (:func:`in_fit`).
    """
    sub = rows.filter(in_fit(rule) & pl.col("rho").is_not_null())
    zero = sub.filter(pl.col("headroom") <= 0)
    sub = sub.filter(pl.col("headroom") > 0)
    return stats.binomial_origin_fit(sub["headroom"].to_numpy(), sub["k"].to_numpy(), sub["n"].to_numpy(),
                                     n_excluded=zero.height)


def predict_band(fit_rows: pl.DataFrame, headroom: pl.DataFrame, by=("task",)) -> pl.DataFrame:
    """Pre-registered prediction intervals for ρ at a new context (§4 "Pre-Registered 32K Test", Table 21).

    Per ``by`` group (a task): the ratio band ``[min, max]`` of ``ρ / (1 − A_full)`` over the
    fitting contexts (rows of ``fit_rows`` with positive headroom), times the measured
    headroom at the new context: ``[ratio_low·h, ratio_high·h]``.

    Parameters
    ----------
    fit_rows : polars.DataFrame
        :func:`scaling_rows` of the fitting contexts (e.g. 4K and 16K), with ``by``,
        ``rho`` and ``headroom``.
    headroom : polars.DataFrame
        ``by`` columns and ``headroom`` measured at the new context (full-cache runs only:
        the eviction outcomes must not be loaded before the predictions are frozen).

    Returns
    -------
    polars.DataFrame
        ``by``, ``n_fit_rows``, ``ratio_low``, ``ratio_high``, ``headroom``,
        ``predicted_low``, ``predicted_high``.

    Raises
    ------
    ValueError
        A group of ``headroom`` without any fitting row of positive headroom.
    """
    by = [by] if isinstance(by, str) else list(by)
    for name, f, cols in (("fit_rows", fit_rows, ["rho", "headroom"]), ("headroom", headroom, ["headroom"])):
        missing = [c for c in [*by, *cols] if c not in f.columns]
        if missing:
            raise ValueError(f"predict_band: {name} lacks columns {missing}")
    fit = fit_rows.filter((pl.col("headroom") > 0) & pl.col("rho").is_not_null())
    band = fit.group_by(by).agg(
        pl.len().cast(pl.Int64).alias("n_fit_rows"),
        (pl.col("rho") / pl.col("headroom")).min().alias("ratio_low"),
        (pl.col("rho") / pl.col("headroom")).max().alias("ratio_high"),
    )
    target = headroom.select(*by, "headroom")
    lacking = target.join(band, on=by, how="anti", nulls_equal=True)
    if lacking.height:
        raise ValueError(f"predict_band: no fitting rows with headroom > 0 for {lacking.select(by).rows()}")
    out = target.join(band, on=by, nulls_equal=True).with_columns(
        (pl.col("ratio_low") * pl.col("headroom")).alias("predicted_low"),
        (pl.col("ratio_high") * pl.col("headroom")).alias("predicted_high"),
    )
    return out.select(*by, "n_fit_rows", "ratio_low", "ratio_high", "headroom", "predicted_low", "predicted_high").sort(by)
