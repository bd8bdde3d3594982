"""Which claims of a set of logs are settled, and how many inputs each unsettled one needs
(``pagestats power``).

Three kinds of claim, each an interval against a threshold:

* ρ of a task cell (Eq. 1, Table 1) against 0.05: the task is dilution-prone iff ρ ≥ 0.05 (§4),
  settled when the Wilson interval lies on one side;
* Δ of a (model, context, evictor) cell (Table 2) against 0: settled when the cluster-bootstrap
  interval of Table 28 (App. A.7.2) excludes 0;
* the gated harm at a budget (Table 27) against a bound A, when one is given: shown when the
  one-sided Clopper–Pearson upper bound is below A (over the inputs whose full-KV outcome is known).

An unsettled claim gets the n at which it would be settled with the given power were its true
value the one observed (:mod:`pagestats.stats.power`; Δ's uses the cell's own per-input variance
and cross-budget correlation as a design effect).
"""

from __future__ import annotations

import numpy as np
import polars as pl
from scipy.stats import beta

from pagestats import metrics
from pagestats.core import defaults
from pagestats.core.columns import MATRIX_CELL, input_key
from pagestats.stats import power as pw
from pagestats.tables import recovery_table

__all__ = ["CLAIM_COLUMNS", "claims_table", "delta_cells", "delta_power_table"]

#: The columns of :func:`claims_table`.
CLAIM_COLUMNS = ["claim", "model", "context_length", "evictor", "task", "budget", "n", "estimate", "low", "high",
                 "threshold", "settled", "under_powered", "n_needed", "power_at_n_needed"]


def delta_cells(gated: pl.DataFrame, by=MATRIX_CELL):
    """Each ``by`` cell's key (a dict) and its (units × budgets) matrix of paired differences
    ``score_gated − score_plain`` over budgets b < 1 (App. A.7.2), units = input × evictor."""
    by = list(by)
    unit = [*input_key(gated), *(["evictor"] if "evictor" not in by else [])]
    rows = gated.filter(pl.col("budget") < 1.0).select(*by, *unit, "budget",
                                                        (pl.col("score_gated") - pl.col("score_plain")).alias("_d"))
    for key, part in rows.sort([*by, *unit, "budget"]).group_by(by, maintain_order=True):
        wide = part.pivot(on="budget", index=unit, values="_d")
        matrix = wide.drop(unit).to_numpy().astype(np.float64)
        if np.isnan(matrix).any():
            raise ValueError(f"delta_cells: cell {dict(zip(by, key))} has units with different budget sets")
        yield dict(zip(by, key)), matrix


def delta_power_table(gated: pl.DataFrame, *, effect: float, power: float = 0.8, alpha: float = 0.05,
                      n_sim: int = 200, n_boot: int = 1_000, rng: np.random.Generator) -> pl.DataFrame:
    """Inputs per (model, context, evictor) cell for the Table 28 bootstrap test to find a Δ of
    ``effect`` with probability ``power`` at two-sided level ``alpha``, from each cell's design
    effect, with the power the bootstrap test itself reaches at that n in ``n_sim`` simulated cells
    (:func:`~pagestats.stats.power.delta_power_simulated`; none when ``n_sim`` is 0)."""
    out = []
    for key, diffs in delta_cells(gated):
        if diffs.shape[0] < 2:
            continue
        size, de = pw.delta_sample_size(diffs, effect, power=power, alpha=alpha)
        sim = (pw.delta_power_simulated(diffs, effect, size.n, rng=rng, alpha=alpha, n_sim=n_sim, n_boot=n_boot)
               if n_sim and size.n is not None else None)
        out.append({**key, "n_inputs": de.n_inputs, "n_budgets": de.n_budgets, "variance": de.variance,
                    "correlation": de.correlation, "design_effect": de.design_effect,
                    "sd_input_mean": de.sd_input_mean, "n_needed": size.n, "power_normal": size.power,
                    "power_simulated": None if sim is None else sim.power, "mc_se": None if sim is None else sim.mc_se})
    return pl.DataFrame(out, infer_schema_length=None)


def _rho_rows(gated, evictor, confidence_level, power):
    table = recovery_table(gated, evictor=evictor, confidence_level=confidence_level).filter(pl.col("scope") == "cell")
    rows = []
    for r in table.iter_rows(named=True):
        size = pw.rho_sample_size(r["rho"], defaults.RHO_THRESHOLD, power=power, confidence_level=confidence_level) \
            if r["rho"] is not None and r["rho"] != defaults.RHO_THRESHOLD else None
        claim = ("rho vs 0.05 (no estimate)" if r["rho"] is None else
                 "rho >= 0.05 (dilution-prone)" if r["dilution_prone"] else "rho < 0.05 (capacity-bound)")
        rows.append({"claim": claim,
                     "model": r["model"], "context_length": r["context_length"], "evictor": r["evictor"],
                     "task": r["task"], "budget": None, "n": r["n"], "estimate": r["rho"], "low": r["low"],
                     "high": r["high"], "threshold": defaults.RHO_THRESHOLD,
                     "n_needed": None if size is None else size.n,
                     "power_at_n_needed": None if size is None or size.n is None else size.power})
    return rows


def _delta_rows(gated, rng, confidence_level, power):
    boot = metrics.on_frame(metrics.delta_bootstrap, gated, rng=rng, confidence_level=confidence_level)
    diffs = {tuple(k.values()): d for k, d in delta_cells(gated)}
    rows = []
    for r in boot.iter_rows(named=True):
        d = diffs[tuple(r[c] for c in MATRIX_CELL)]
        size = None
        if r["delta"] != 0.0 and d.shape[0] >= 2:
            size, _ = pw.delta_sample_size(d, r["delta"], power=power, alpha=1.0 - confidence_level)
        rows.append({"claim": "delta > 0" if r["delta"] > 0 else "delta < 0", **{c: r[c] for c in MATRIX_CELL},
                     "task": None, "budget": None, "n": r["n_inputs"], "estimate": r["delta"], "low": r["low"],
                     "high": r["high"], "threshold": 0.0, "n_needed": None if size is None else size.n,
                     "power_at_n_needed": None if size is None or size.n is None else size.power})
    return rows


def _harm_rows(gated, harm_bound, budget, confidence_level, power):
    at = gated.filter((pl.col("budget") == float(budget)) & pl.col("score_full").is_not_null())  # harm needs A(1, x)
    if at.height == 0:
        raise ValueError(f"claims_table: no outcomes at budget {budget!r}")
    counts = at.group_by(MATRIX_CELL).agg((pl.col("score_gated") < pl.col("score_full")).sum().alias("k"),
                                          pl.len().alias("n")).sort(MATRIX_CELL)
    rows = []
    for r in counts.iter_rows(named=True):
        k, n = int(r["k"]), int(r["n"])
        high = 1.0 if k == n else float(beta.ppf(confidence_level, k + 1, n - k))
        size = pw.harm_sample_size(harm_bound, k / n, power=power, confidence_level=confidence_level)
        rows.append({"claim": f"harm <= {harm_bound:g}", **{c: r[c] for c in MATRIX_CELL}, "task": None,
                     "budget": float(budget), "n": n, "estimate": k / n, "low": 0.0, "high": high,
                     "threshold": float(harm_bound), "n_needed": size.n,
                     "power_at_n_needed": None if size.n is None else size.power})
    return rows


def claims_table(gated: pl.DataFrame, *, rng: np.random.Generator, power: float = 0.8,
                 confidence_level: float = defaults.CONFIDENCE_LEVEL, evictor: str | None = None,
                 harm_bound: float | None = None, budget: float | None = None) -> pl.DataFrame:
    """Every claim of ``gated`` (:func:`pagestats.replay.gated_outcomes`), settled or not (module docstring).

    Returns
    -------
    polars.DataFrame
        :data:`CLAIM_COLUMNS`: ``settled`` when the interval lies wholly on one side of the threshold
        (for harm: the upper bound below it), ``under_powered`` its negation
        (:func:`~pagestats.stats.power.straddles`), both null for a claim without an estimate (no
        input, or outcomes that were not logged); ``n_needed``, the inputs at which the claim is
        settled with probability ``power`` were the true value the estimate (given for settled claims
        too; null when no n up to :data:`~pagestats.stats.power.N_MAX` reaches ``power``, or the
        estimate is on the threshold, or a harm estimate is at or above the bound), with the power there.
    """
    rows = _rho_rows(gated, evictor, confidence_level, power) + _delta_rows(gated, rng, confidence_level, power)
    if harm_bound is not None:
        rows += _harm_rows(gated, harm_bound, budget, confidence_level, power)
    frame = pl.DataFrame(rows, infer_schema_length=None)
    open_ = pw.straddles(frame["low"].to_numpy(), frame["high"].to_numpy(), frame["threshold"].to_numpy())
    harm = frame["claim"].str.starts_with("harm").to_numpy()
    open_ = np.where(harm, frame["high"].to_numpy() >= frame["threshold"].to_numpy(), open_)
    known = frame["estimate"].is_not_null() & frame["low"].is_not_null() & frame["high"].is_not_null()
    return frame.with_columns(  # a claim without an estimate (no input, or unknown outcomes) is neither
        pl.when(known).then(pl.Series(open_)).alias("under_powered"),
        pl.when(known).then(pl.Series(~open_)).alias("settled"),
    ).select(CLAIM_COLUMNS)
