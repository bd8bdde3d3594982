"""The calibration of τ: the τ variants (Table 8) and the 40-input midpoint recipe against the
fixed τ (Table 7).

:func:`calibration_table` replays the logs (:mod:`pagestats.replay`) under both τ, so it takes
:class:`pagestats.io.Logs` first.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from pagestats import metrics, replay
from pagestats.core import defaults, formulas
from pagestats.core.columns import MODEL_CELL
from pagestats.replay.pilot import pilot_mask
from pagestats.replay.policies import FixedTau, Midpoint, RecalibratedTau, TaskOracle, ZScored
from pagestats.tables._common import logged_evictor

__all__ = ["calibration_table", "tau_variants_table"]


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
    pilot_means = []
    for label, tasks, klass in (("mean_drop_capacity", capacity_tasks, defaults.CAPACITY_BOUND),
                                ("mean_drop_dilution", dilution_tasks, defaults.DILUTION_PRONE)):
        part = gate.filter(pl.col("task").is_in(list(tasks)) if tasks is not None else pl.col("task_class") == klass)
        part = part.filter(pilot_mask(part, MODEL_CELL, n, mid.pilot_split, mid.seed))
        pilot_means.append(part.group_by(list(MODEL_CELL)).agg(pl.col("drop").mean().alias(label)))
    out = pilot_means[0].join(pilot_means[1], on=list(MODEL_CELL))
    for frame, suffix in ((fixed, "fixed"), (cal, "calibrated")):
        d = metrics.on_frame(metrics.delta, frame, by=MODEL_CELL).select(
            *MODEL_CELL, pl.col("delta").alias(f"delta_{suffix}"))
        po = metrics.on_frame(metrics.p_open, frame, by=MODEL_CELL).select(
            *MODEL_CELL, pl.col("p_open").alias(f"p_open_{suffix}"))
        out = out.join(d, on=list(MODEL_CELL)).join(po, on=list(MODEL_CELL))
    taus = gate.group_by(list(MODEL_CELL)).agg(formulas.expr(formulas.group_tau()).alias("tau_calibrated"))
    out = out.join(taus, on=list(MODEL_CELL)).with_columns(
        pl.lit(ev).alias("evictor"), pl.lit(float(tau)).alias("tau_fixed"),
        pl.when(pl.col("delta_calibrated") > pl.col("delta_fixed")).then(pl.lit("calibrated"))
        .when(pl.col("delta_calibrated") < pl.col("delta_fixed")).then(pl.lit("fixed")).otherwise(pl.lit("tie"))
        .alias("winner"),
    )
    out = out.with_columns(pl.lit(None, pl.String).alias("note")).select(cols)
    skipped = skipped.with_columns(pl.lit(ev).alias("evictor"), pl.lit(float(tau)).alias("tau_fixed"))
    return pl.concat([out, skipped], how="diagonal_relaxed").select(cols).sort(list(MODEL_CELL))


def tau_variants_table() -> pl.DataFrame:
    """Table 8: the τ variants, what each needs besides D, and where the report applies it — read from the
    policies themselves (their ``name``, rule, ``labels`` and ``used_in``).

    References
    ----------
    PAGE Table 8 ("The three τ variants used in the paper, their label requirements, and where each is
    applied"), §3 "Calibration", App. A.3.4.
    """
    variants = (FixedTau(), ZScored(), Midpoint(), RecalibratedTau(), TaskOracle())
    return pl.DataFrame({
        "policy": [type(p).__name__ for p in variants],
        "name": [p.name for p in variants],
        "rule": [" ".join((type(p).__doc__ or "").strip().split("\n\n")[0].split()) for p in variants],
        "labels": [p.labels for p in variants],
        "used_in": [p.used_in for p in variants],
    })

