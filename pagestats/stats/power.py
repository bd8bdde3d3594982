"""How many inputs a claim needs: sample sizes for ρ, harm and Δ (NumPy/SciPy only).

Three claims of the PAGE paper rest on a rate or a mean compared with a threshold:

* ρ (Eq. 1) against 0.05 — a task is dilution-prone iff ρ ≥ 0.05 (§4 "The partition",
  Table 1), settled when the Wilson interval (§4 "Uncertainty") excludes 0.05;
* a harm rate (Table 27) against a bound A — shown when the one-sided Clopper–Pearson upper
  bound is below A (the bound :mod:`pagestats.stats.ltt` certifies a threshold with);
* the gating Δ of a cell against 0 — settled when the cluster-bootstrap interval of Table 28
  (App. A.7.2) excludes 0.

:func:`rho_sample_size` and :func:`harm_sample_size` search n exactly over the binomial law;
:func:`delta_sample_size` uses the per-input variance and the cross-budget correlation measured
in a cell as a design effect, and :func:`delta_power_simulated` checks its answer by running the
bootstrap test itself on simulated cells.

References
----------
PAGE paper: §3 (Eq. 1), §4 "Uncertainty", Table 1, Table 27, App. A.7.2 (Table 28).
E. B. Wilson (1927), "Probable inference, the law of succession, and statistical inference", JASA 22.
C. J. Clopper, E. S. Pearson (1934), "The use of confidence or fiducial limits", Biometrika 26.
L. Kish (1965), *Survey Sampling*, §8.2 (the design effect 1 + (m − 1)ρ̄ of clusters of m).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from pagestats.core import defaults
from pagestats.stats._results import _check_level, _Result
from pagestats.stats.bootstrap import cluster_bootstrap

__all__ = [
    "DesignEffect",
    "SampleSize",
    "delta_power_simulated",
    "delta_sample_size",
    "design_effect",
    "harm_power",
    "harm_sample_size",
    "rho_power",
    "rho_sample_size",
    "straddles",
]

#: The largest n the exact searches try (a claim that needs more is reported as not reachable).
N_MAX = 1_000_000


@dataclass(frozen=True)
class SampleSize(_Result):
    """The smallest n whose test reaches ``target_power``; ``n`` is None when no n ≤ ``n_max`` does.

    ``power`` is the exact (binomial) or approximate (design-effect) power at ``n``; ``method``
    names the test and the search.
    """

    n: int | None
    power: float
    target_power: float
    confidence_level: float
    method: str
    n_max: int


@dataclass(frozen=True)
class DesignEffect(_Result):
    """The spread of a cell's per-input paired differences (App. A.7.2).

    ``variance`` is the mean over budgets of the per-budget variance of the differences,
    ``correlation`` the mean cross-budget correlation ρ̄ (average covariance over average
    variance), ``design_effect`` = 1 + (m − 1)ρ̄, and ``sd_input_mean`` the standard
    deviation of one input's mean over its m budgets, √(variance · design_effect / m) —
    the unit the bootstrap resamples.
    """

    variance: float
    correlation: float
    n_budgets: int
    design_effect: float
    sd_input_mean: float
    n_inputs: int


def _check_rate(x, name: str, *, open_interval: bool = True) -> float:
    x = float(x)
    if not (0.0 < x < 1.0 if open_interval else 0.0 <= x <= 1.0):
        raise ValueError(f"{name} must lie in {'(0, 1)' if open_interval else '[0, 1]'}, got {x!r}")
    return x


def _search(power_of, target: float, n_max: int) -> tuple[int | None, float]:
    """The first n in 1 … ``n_max`` with ``power_of(n) ≥ target`` and its power (else None and the
    largest power seen), trying every n in blocks that double in length."""
    start, size, best = 1, 1024, 0.0
    while start <= n_max:
        ns = np.arange(start, min(n_max, start + size - 1) + 1, dtype=np.float64)
        p = power_of(ns)
        hit = np.flatnonzero(p >= target)
        if hit.size:
            return int(ns[hit[0]]), float(p[hit[0]])
        best, start, size = max(best, float(p.max())), start + size, size * 2
    return None, best


def straddles(low, high, threshold):
    """Whether an interval leaves a claim against ``threshold`` open: ``low < threshold ≤ high``.

    The claim "rate ≥ threshold" (or "Δ ≥ threshold") is settled either way when the interval
    lies wholly on one side (``low ≥ threshold``: at or above; ``high < threshold``: below); it
    is *under-powered* when the interval straddles it. Vectorised; NaN bounds give False.
    """
    low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    return (low < threshold) & (threshold <= high)


def rho_power(n, expected: float, threshold: float = defaults.RHO_THRESHOLD,
              confidence_level: float = defaults.CONFIDENCE_LEVEL) -> np.ndarray:
    """Exact probability that the Wilson interval of k ~ Bin(n, ``expected``) excludes ``threshold``.

    Notes
    -----
    The Wilson interval is the set of p the score test does not reject (Wilson 1927), so it
    excludes T iff |k − nT| > z √(nT(1 − T)), z the two-sided normal quantile. With k_lo the
    largest k below nT − z√(nT(1−T)) and k_hi the smallest above nT + z√(nT(1−T)), the power is
    F(k_lo) + 1 − F(k_hi − 1) under Bin(n, expected): no simulation and no per-k interval.
    """
    level = _check_level(confidence_level)
    r, t = _check_rate(expected, "expected", open_interval=False), _check_rate(threshold, "threshold")
    n = np.asarray(n, dtype=np.float64)
    z = sps.norm.ppf(0.5 + level / 2.0)
    half = z * np.sqrt(n * t * (1.0 - t))
    k_lo = np.ceil(n * t - half) - 1.0   # the largest k with k < nT − z√…
    k_hi = np.floor(n * t + half) + 1.0  # the smallest k with k > nT + z√…
    return sps.binom.cdf(k_lo, n, r) + sps.binom.sf(k_hi - 1.0, n, r)


def rho_sample_size(expected: float, threshold: float = defaults.RHO_THRESHOLD, *, power: float = 0.8,
                    confidence_level: float = defaults.CONFIDENCE_LEVEL, n_max: int = N_MAX) -> SampleSize:
    """The smallest n whose Wilson interval excludes ``threshold`` with probability ≥ ``power``
    when the true ρ is ``expected`` (exact binomial search over n = 1 … ``n_max``).

    Parameters
    ----------
    expected : float
        The true ρ (Eq. 1) assumed, in [0, 1].
    threshold : float
        The partition threshold (0.05, §4), in (0, 1).
    power : float
        Target probability of a settled claim, in (0, 1).
    confidence_level : float
        Level of the two-sided Wilson interval (0.95).
    n_max : int
        The largest n tried.

    Returns
    -------
    SampleSize
        ``n`` None when ``expected == threshold`` or no n ≤ ``n_max`` reaches the power.

    Notes
    -----
    :func:`rho_power` at every n. The power is not monotone in n (the binomial lattice makes it
    a sawtooth), so n + 1 can fall below the target again; the answer is the first n that
    reaches it, as the question asks.

    Examples
    --------
    >>> rho_sample_size(0.10, 0.05, power=0.8).n
    180
    """
    target = _check_rate(power, "power")
    if float(expected) == float(threshold):
        return SampleSize(None, float("nan"), target, float(confidence_level),
                          "exact binomial search, Wilson interval", int(n_max))
    n, p = _search(lambda ns: rho_power(ns, expected, threshold, confidence_level), target, int(n_max))
    return SampleSize(n, p, target, float(confidence_level), "exact binomial search, Wilson interval", int(n_max))


def harm_power(n, expected: float, bound: float, confidence_level: float = defaults.CONFIDENCE_LEVEL) -> np.ndarray:
    """Exact probability that the one-sided Clopper–Pearson upper bound of k ~ Bin(n, ``expected``)
    at ``confidence_level`` lies below ``bound``.

    Notes
    -----
    The Clopper–Pearson upper bound U(k) is below A iff P(Bin(n, A) ≤ k) ≤ 1 − level (the bound
    inverts that tail), so the power is F(k*; n, expected) with k* the largest such k, read from
    the binomial quantile of A.
    """
    level = _check_level(confidence_level)
    h, a = _check_rate(expected, "expected", open_interval=False), _check_rate(bound, "bound")
    n = np.asarray(n, dtype=np.float64)
    alpha = 1.0 - level
    k = sps.binom.ppf(alpha, n, a)           # the smallest k with F(k; n, A) ≥ α
    k_star = np.where(sps.binom.cdf(k, n, a) <= alpha, k, k - 1.0)
    return np.where(k_star >= 0, sps.binom.cdf(k_star, n, h), 0.0)


def harm_sample_size(bound: float, expected: float, *, power: float = 0.8,
                     confidence_level: float = defaults.CONFIDENCE_LEVEL, n_max: int = N_MAX) -> SampleSize:
    """The smallest n at which a harm rate of ``expected`` is shown ≤ ``bound`` (one-sided
    Clopper–Pearson upper bound below it) with probability ≥ ``power`` (exact search).

    ``n`` is None when ``expected ≥ bound`` (the bound cannot be shown) or no n ≤ ``n_max`` reaches
    the power. Harm at a fixed budget: Table 27.
    """
    target = _check_rate(power, "power")
    method = "exact binomial search, one-sided Clopper-Pearson upper bound"
    if float(expected) >= float(bound):
        return SampleSize(None, 0.0, target, float(confidence_level), method, int(n_max))
    n, p = _search(lambda ns: harm_power(ns, expected, bound, confidence_level), target, int(n_max))
    return SampleSize(n, p, target, float(confidence_level), method, int(n_max))


def design_effect(diffs) -> DesignEffect:
    """The per-input variance and cross-budget correlation of one cell's paired differences.

    Parameters
    ----------
    diffs : array_like, shape (n_inputs, n_budgets)
        ``A_gated(b, x) − A_plain(b, x)`` per input and budget b < 1 (App. A.7.2), as
        :func:`pagestats.stats.cluster_bootstrap` takes them. At least two inputs.

    Notes
    -----
    With S the sample covariance of the budget columns (ddof 1), the variance of one input's mean
    over m budgets is 1ᵀS1 / m² = (v / m)(1 + (m − 1)ρ̄), v = tr S / m the average variance and
    ρ̄ = (1ᵀS1 − tr S) / ((m − 1) tr S) the average correlation (Kish 1965, §8.2).
    """
    d = np.asarray(diffs, dtype=np.float64)
    d = d[:, None] if d.ndim == 1 else d
    if d.ndim != 2 or d.shape[0] < 2 or d.shape[1] < 1 or not np.all(np.isfinite(d)):
        raise ValueError(f"design_effect: need a finite (n_inputs ≥ 2, n_budgets ≥ 1) array, got shape {d.shape}")
    n, m = d.shape
    cov = np.atleast_2d(np.cov(d, rowvar=False, ddof=1))
    trace, total = float(np.trace(cov)), float(cov.sum())
    variance = trace / m
    correlation = float("nan") if trace == 0.0 or m == 1 else (total - trace) / ((m - 1) * trace)
    deff = 1.0 if m == 1 else (float("nan") if trace == 0.0 else 1.0 + (m - 1) * correlation)
    return DesignEffect(variance, correlation, m, deff, float(np.sqrt(max(total, 0.0)) / m), n)


def delta_sample_size(diffs, effect: float, *, power: float = 0.8, alpha: float = 0.05) -> tuple[SampleSize, DesignEffect]:
    """Inputs per cell for the cluster-bootstrap test of Table 28 to find a paired Δ of ``effect``.

    Parameters
    ----------
    diffs : array_like, shape (n_inputs, n_budgets)
        A cell's paired differences (see :func:`design_effect`): they give the spread only.
    effect : float
        The Δ to detect (non-zero).
    power, alpha : float
        Target power and the two-sided level of the test (the 1 − α interval excludes 0).

    Returns
    -------
    (SampleSize, DesignEffect)
        ``n`` is None when the cell has no variance (every input's mean equal).

    Notes
    -----
    The bootstrap's Δ* is the mean of n resampled per-input means, whose standard error is
    σ_m / √n with σ_m = ``sd_input_mean`` (:func:`design_effect`); the percentile test is then
    close to the two-sided z test, and n = ⌈(z_{1−α/2} + z_{power})² σ_m² / Δ²⌉. The normal
    approximation is checked by :func:`delta_power_simulated`, which runs the bootstrap itself.
    """
    target = _check_rate(power, "power")
    a = _check_rate(alpha, "alpha")
    if not np.isfinite(effect) or effect == 0.0:
        raise ValueError(f"effect must be a finite non-zero Δ, got {effect!r}")
    de = design_effect(diffs)
    method = "normal approximation, cluster design effect (Kish), bootstrap percentile test"
    if de.sd_input_mean == 0.0:
        return SampleSize(None, float("nan"), target, 1.0 - a, method, N_MAX), de
    z = sps.norm.ppf(1.0 - a / 2.0) + sps.norm.ppf(target)
    n = max(2, int(np.ceil((z * de.sd_input_mean / effect) ** 2)))
    achieved = float(sps.norm.cdf(abs(effect) * np.sqrt(n) / de.sd_input_mean - sps.norm.ppf(1.0 - a / 2.0)))
    return SampleSize(n, achieved, target, 1.0 - a, method, N_MAX), de


@dataclass(frozen=True)
class SimulatedPower(_Result):
    """Share of simulated cells whose bootstrap test rejected, with its Monte Carlo standard error."""

    power: float
    mc_se: float
    n_inputs: int
    n_sim: int
    n_boot: int
    effect: float
    alpha: float
    method: str = "cells resampled from the centred input rows, shifted by the effect; cluster bootstrap test"


def delta_power_simulated(diffs, effect: float, n_inputs: int, *, rng: np.random.Generator, alpha: float = 0.05,
                          n_sim: int = 400, n_boot: int = 2_000) -> SimulatedPower:
    """The power of the cluster-bootstrap test (App. A.7.2) at ``n_inputs`` inputs, by simulation.

    Each simulated cell draws ``n_inputs`` rows with replacement from the observed rows of
    ``diffs``, centred on each budget's mean and shifted by ``effect`` (the observed per-input
    variance and cross-budget correlation, true Δ = ``effect``), and runs
    :func:`pagestats.stats.cluster_bootstrap`; the test rejects when its two-sided p-value is
    ≤ ``alpha`` (the 1 − α percentile interval excludes 0). The Monte Carlo standard error is
    √(p(1 − p)/n_sim).
    """
    d = np.asarray(diffs, dtype=np.float64)
    d = d[:, None] if d.ndim == 1 else d
    rows = d - d.mean(axis=0) + float(effect)
    cells = [rows[rng.integers(0, rows.shape[0], size=int(n_inputs))] for _ in range(int(n_sim))]
    res = cluster_bootstrap(cells, rng=rng, n_boot=int(n_boot), confidence_level=1.0 - float(alpha))
    p = np.asarray(res.p_value, dtype=np.float64)
    rejected = np.where(np.isnan(p), False, p <= float(alpha))
    share = float(np.mean(rejected))
    return SimulatedPower(share, float(np.sqrt(share * (1.0 - share) / len(cells))), int(n_inputs), len(cells),
                          int(n_boot), float(effect), float(alpha))
