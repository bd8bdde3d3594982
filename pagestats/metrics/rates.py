"""Per-input rates: ρ (Eq. 1), harm (Table 27), r(x) (App. A.7.1), p_open, and the per-input AUC.

Each reads a relation of gated outcomes (:mod:`pagestats.metrics.engine`) and counts in SQL; the
intervals are NumPy's (:mod:`pagestats.stats`). Conventions in :mod:`pagestats.metrics`.
"""

from __future__ import annotations

import polars as pl

from pagestats import stats
from pagestats.core import defaults, formulas
from pagestats.core.columns import TASK_CELL
from pagestats.metrics import engine
from pagestats.metrics.engine import ROWS, grouped, names, query, uniq
from pagestats.metrics.sides import capacity_side, dilution_side

__all__ = ["recovery_rate", "harm_rate", "recovery_indicator", "p_open", "auc_by_signal"]

_ARMS = {"plain": ("score_plain", "n_kept_plain"), "gated": ("score_gated", "n_kept_gated")}


def arm_columns(arm: str) -> tuple[str, str]:
    """The score and kept-token columns of an arm, ``"plain"`` or ``"gated"``."""
    try:
        return _ARMS[arm]
    except KeyError:
        raise ValueError(f"arm must be 'plain' or 'gated', got {arm!r}") from None


def _counts(out: pl.DataFrame, by) -> pl.DataFrame:
    return out.with_columns(pl.col("k", "n").cast(pl.Int64)).sort(by)


def recovery_rate(
    rows,
    by=TASK_CELL,
    arm: str = "plain",
    *,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
    threshold: float = defaults.RHO_THRESHOLD,
) -> pl.DataFrame:
    """Per-input recovery rate ρ (§3, Eq. 1; Table 1) with its Wilson interval.

    ``ρ = Pr_x[max_{b<1} A(b, x) > A(1, x)]``: the share of units for which some eviction
    budget strictly beats the full cache, ``A`` the ``arm``'s score (plain by default,
    as in Eq. 1): :func:`pagestats.core.formulas.recovered` per unit, counted in SQL.

    Parameters
    ----------
    rows : duckdb.DuckDBPyRelation
        Gated outcomes (:mod:`pagestats.metrics.engine`).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``k`` (recovered units; null when a full-KV outcome is unknown), ``n``
        (units), ``rho``, ``low``, ``high`` (Wilson), ``dilution_prone`` (``rho >= threshold``,
        0.05 pre-registered).
    """
    score, _ = arm_columns(arm)
    by = engine.outcome_rows(rows, by, [score, "score_full"], "recovery_rate")
    units = uniq(by, engine.unit_key(rows))
    out = query(rows, f"""
        SELECT {names(by)}{", " if by else ""}{formulas.known_count("_rec")} AS k, count(*) AS n
        FROM (SELECT {names(units)}, {formulas.recovered(score)} AS _rec FROM {ROWS}
              WHERE {formulas.evicted()} GROUP BY {names(units)}) {grouped(by)}""")
    out = engine.with_wilson(_counts(out, by), "rho", confidence_level)
    return out.with_columns((pl.col("rho") >= threshold).alias("dilution_prone"))


def harm_rate(
    rows,
    by=TASK_CELL,
    arm: str = "gated",
    *,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
) -> pl.DataFrame:
    """Fixed-budget harm rate ``Pr_x[A(b, x) < A_plain(1, x)]`` per budget (App. A.7.1, Table 27).

    Unlike r(x), this is a real event: at a fixed budget the gate can lose an answer the
    full cache had (:func:`pagestats.core.formulas.harm_count`). Computed for every budget
    present, including a logged 1.0 audit row.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``budget``, ``k`` (harmed units), ``n``, ``harm``, ``low``, ``high``.
    """
    score, _ = arm_columns(arm)
    by = engine.outcome_rows(rows, by, [score, "score_full"], "harm_rate")
    keys = uniq(by, ["budget"])
    out = query(rows, f"SELECT {names(keys)}, {formulas.harm_count(score)} AS k, count(*) AS n FROM {ROWS} "
                      f"{grouped(keys)}")
    return engine.with_wilson(_counts(out, keys), "harm", confidence_level)


def recovery_indicator(rows, arm: str = "gated", *, include_full: bool = True) -> pl.DataFrame:
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
    score, _ = arm_columns(arm)
    engine.outcome_rows(rows, (), [score, "score_full"], "recovery_indicator")
    extra = [c for c in ("model", "context_length", "task_class") if c in rows.columns]
    unit = engine.unit_key(rows)
    best = f"greatest(max({score}), any_value(score_full))" if include_full else f"max({score})"
    out = query(rows, f"""
        SELECT {names(unit)}, {", ".join(f'any_value("{c}") AS "{c}"' for c in extra)}{", " if extra else ""}
            {best} AS best, any_value(score_full) AS _full
        FROM {ROWS} WHERE {formulas.evicted()} GROUP BY {names(unit)}""")
    out = out.with_columns(pl.col("best").cast(pl.Float64),
                           (pl.col("best") - pl.col("_full")).sign().cast(pl.Int8).alias("r")).drop("_full")
    return out.sort(unit)


def p_open(
    rows,
    by=("model", "context_length"),
    *,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
) -> pl.DataFrame:
    """Gate-open fraction ``p_open`` per group, with a Wilson interval (Tables 12, 22).

    A per-input property, independent of the budget and the evictor (App. A.6.2): each
    input (and pair draw) is counted once per group (:data:`pagestats.core.formulas.P_OPEN`).
    Works on the per-input decisions or on gated outcomes.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``k`` (open inputs), ``n`` (inputs), ``p_open``, ``low``, ``high``.
    """
    by = engine.group_by(by, "p_open", rows)
    engine.check(rows, [*uniq(by, engine.input_key(rows)), "gate_open"], "p_open")
    out = query(rows, f"SELECT {names(by)}{', ' if by else ''}{formulas.OPEN_COUNT} AS k, count(*) AS n, "
                      f"sum(CAST(_differs AS BIGINT)) AS _differs FROM {engine.per_input(rows, by, 'gate_open')} "
                      f"{grouped(by)}")
    out = engine.refuse_differing(out, "p_open", "gate_open")
    return engine.with_wilson(_counts(out, by), "p_open", confidence_level)


def auc_by_signal(
    rows,
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
    by = engine.group_by(by, "auc_by_signal", rows)
    key = engine.input_key(rows)
    need = [*key, statistic, *([] if capacity_tasks is not None and dilution_tasks is not None else ["task_class"])]
    engine.check(rows, need, "auc_by_signal")
    inputs = query(rows, f"SELECT DISTINCT ON ({names(uniq(by, key))}) {names(uniq(by, need))} FROM {ROWS}")
    cap = capacity_side(None if capacity_tasks is None else list(capacity_tasks))
    dil = (dilution_side(None if capacity_tasks is None else list(capacity_tasks)) if dilution_tasks is None
           else pl.col("task").is_in(list(dilution_tasks)) & ~cap)
    inputs = inputs.filter(cap | dil).with_columns(cap.alias("_cap")).sort([*by, *key])  # in input order
    out = []
    for part in inputs.partition_by(by, maintain_order=True) if inputs.height else []:
        lab = part["_cap"].to_numpy().astype(bool)
        row = part.select(by).row(0, named=True)
        row.update(n_capacity=int(lab.sum()), n_dilution=int((~lab).sum()), auc=None, low=None, high=None,
                   p_value=None)
        if lab.any() and (~lab).any():
            r = stats.auc(part[statistic].to_numpy(), lab, confidence_level)
            row.update(auc=r.estimate, low=r.low, high=r.high, p_value=r.p_value)
        out.append(row)
    schema = {**{c: inputs.schema[c] for c in by}, "auc": pl.Float64, "low": pl.Float64, "high": pl.Float64,
              "n_capacity": pl.Int64, "n_dilution": pl.Int64, "p_value": pl.Float64}
    return pl.DataFrame(out, schema=schema, orient="row") if out else pl.DataFrame(schema=schema)
