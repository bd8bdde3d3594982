"""Monitoring that stays valid over any number of looks: a confidence sequence for p_open and a
sequential test of D's distribution against the calibration's (NumPy/SciPy only).

A deployed gate (PAGE §3, Eq. 2) opens on a share p_open of its inputs, which its memory saving
rests on (App. A.6.2), and its τ holds only while the deployed D is distributed as the calibration
D (App. A.3.4). A test repeated at level α after every new input raises a false alarm with
probability far above α; the two tests here keep P(any false alarm, ever) ≤ α by Ville's
inequality (a nonnegative martingale of mean 1 exceeds 1/α with probability ≤ α, over all times).

**p_open.** The gate-open indicators X_1, X_2, … are Bernoulli(p). The beta-binomial mixture
martingale (Robbins 1970) M_t(p₀) = B(a + k_t, b + t − k_t) / (B(a, b) p₀^{k_t} (1 − p₀)^{t − k_t})
is a martingale under p = p₀, and {p₀ : M_t(p₀) < 1/α} is a (1 − α) confidence sequence: it covers p
at every t at once with probability ≥ 1 − α (Howard, Ramdas, McAuliffe, Sekhon 2021). An alarm
sounds when the sequence leaves the calibration's Clopper–Pearson interval for p_open; with each at
α/2 the two miss together with probability ≤ α.

**D.** Conformal test martingales (Vovk, Nouretdinov, Gammerman 2003; Vovk 2021): with the calibration
D first and the deployed D after, the smoothed conformal p-value of each deployed D among all earlier
values is uniform and independent of the earlier ones when the whole sequence is exchangeable. Each
p-value is bet on with the calibrator f(p) = mean over ε of ε p^{ε − 1}, and the bets are mixed over
start times with weights 1/(j(j + 1)) (the martingale can "sleep" through a long no-drift stretch and
still detect a later change with a delay that grows like log j). One martingale bets on large D
(p-value of D among earlier values from the top), one on small D; each alarms at 2/α.

References
----------
J. Ville (1939), *Étude critique de la notion de collectif*. H. Robbins (1970), "Statistical methods
related to the law of the iterated logarithm", Ann. Math. Stat. 41. S. R. Howard, A. Ramdas,
J. McAuliffe, J. Sekhon (2021), "Time-uniform, nonparametric, nonasymptotic confidence sequences",
Ann. Stat. 49. V. Vovk, I. Nouretdinov, A. Gammerman (2003), "Testing exchangeability on-line", ICML.
V. Vovk (2021), "Testing randomness online", Statistical Science 36. PAGE paper: §3, App. A.3.4, A.6.2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import betaln
from scipy.stats import beta as beta_dist

from pagestats.stats._results import _Result

__all__ = ["EPSILONS", "SequentialResult", "conformal_pvalues", "log_mixture_martingale", "p_open_alarm_index",
           "p_open_confidence_sequence", "restart_log_martingale", "sequential_drift"]

#: The ε of the power calibrators ε p^{ε − 1} that are averaged into the bet on a conformal p-value.
EPSILONS = np.linspace(0.05, 0.95, 19)
#: The beta prior (a, b) of the p_open mixture martingale (Jeffreys).
PRIOR = (0.5, 0.5)


def log_mixture_martingale(k, t, p0, prior=PRIOR):
    """log M_t(p₀) of the beta-binomial mixture (module docstring), vectorised; k of t inputs opened."""
    a, b = prior
    k, t, p0 = (np.asarray(v, dtype=np.float64) for v in (k, t, p0))
    with np.errstate(divide="ignore", invalid="ignore"):
        lik = np.where(k > 0, k * np.log(p0), 0.0) + np.where(t - k > 0, (t - k) * np.log1p(-p0), 0.0)
    return betaln(a + k, b + t - k) - betaln(a, b) - lik


def p_open_confidence_sequence(k: int, t: int, alpha: float, prior=PRIOR) -> tuple[float, float]:
    """The confidence sequence's interval for p_open after t inputs of which k opened:
    {p₀ : log M_t(p₀) < log(1/α)}, an interval since log M_t is convex in p₀ (minimum at k/t)."""
    if t == 0:
        return 0.0, 1.0
    bound = np.log(1.0 / alpha)
    centre = k / t

    def f(p):
        return float(log_mixture_martingale(k, t, p, prior)) - bound

    low = 0.0 if k == 0 or f(1e-300) < 0 else brentq(f, 1e-300, centre) if centre > 0 else 0.0
    high = 1.0 if k == t or f(1 - 1e-16) < 0 else brentq(f, centre, 1 - 1e-16)
    return float(low), float(high)


def p_open_alarm_index(opened, low: float, high: float, alpha: float, prior=PRIOR) -> int | None:
    """The first index (0-based) at which the confidence sequence of ``opened`` (Booleans in order)
    at level 1 − ``alpha`` lies wholly outside [``low``, ``high``], or None.

    The sequence misses the interval iff k/t is outside it and the martingale at the nearer end is
    ≥ 1/α (log M_t is convex in p₀ with its minimum at k/t), so no root is found per input.
    """
    x = np.asarray(opened, dtype=bool)
    if x.size == 0:
        return None
    k = np.cumsum(x)
    t = np.arange(1, x.size + 1)
    bound = np.log(1.0 / alpha)
    est = k / t
    above = (est > high) & (log_mixture_martingale(k, t, high, prior) >= bound)
    below = (est < low) & (log_mixture_martingale(k, t, low, prior) >= bound)
    hit = np.flatnonzero(above | below)
    return int(hit[0]) if hit.size else None


def conformal_pvalues(reference, stream, *, rng: np.random.Generator, block: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Smoothed conformal p-values of each ``stream`` value among ``reference`` and the earlier stream values.

    Returns ``(upper, lower)``: for value s_t with N earlier values, ``upper`` =
    (#{earlier > s_t} + U_t(#{earlier = s_t} + 1)) / (N + 1) — small when s_t is large — and ``lower``
    the same with "<"; U_t uniform from ``rng``, shared by both. Counted in blocks: earlier blocks by
    binary search in a sorted array, the block's own earlier values pairwise.
    """
    ref = np.sort(np.asarray(reference, dtype=np.float64))
    s = np.asarray(stream, dtype=np.float64)
    if not (np.all(np.isfinite(ref)) and np.all(np.isfinite(s))):
        raise ValueError("conformal_pvalues: values must be finite")
    u = rng.random(s.size)
    upper, lower = np.empty(s.size), np.empty(s.size)
    for start in range(0, s.size, block):
        b = s[start:start + block]
        m = b.size
        below_n = np.searchsorted(ref, b, side="left")
        above_n = ref.size - np.searchsorted(ref, b, side="right")
        earlier = np.tri(m, m, -1, dtype=bool)                      # [i, j]: j before i in the block
        gt = (np.sum(earlier & (b[None, :] > b[:, None]), axis=1))
        lt = (np.sum(earlier & (b[None, :] < b[:, None]), axis=1))
        n_prev = ref.size + np.arange(m)
        eq = n_prev - (above_n + gt) - (below_n + lt)
        uu = u[start:start + m]
        upper[start:start + m] = (above_n + gt + uu * (eq + 1)) / (n_prev + 1)
        lower[start:start + m] = (below_n + lt + uu * (eq + 1)) / (n_prev + 1)
        sb = np.sort(b)
        ref = np.insert(ref, np.searchsorted(ref, sb), sb)
    return upper, lower


def restart_log_martingale(pvalues) -> np.ndarray:
    """log M_t of the conformal test martingale mixed over start times (module docstring), for each t.

    M_t = Σ_{j ≤ t} w_j Π_{i=j}^{t} f(p_i) + Σ_{j > t} w_j, w_j = 1/(j(j+1)), f(p) = mean_ε ε p^{ε−1};
    computed in logs: Σ_{j ≤ t} w_j Π = exp(L_t) Σ_{j ≤ t} w_j exp(−L_{j−1}), L the cumulative log f.
    """
    p = np.clip(np.asarray(pvalues, dtype=np.float64), 1e-300, 1.0)
    if p.size == 0:
        return np.empty(0)
    logf = np.log(np.mean(EPSILONS[:, None] * p[None, :] ** (EPSILONS[:, None] - 1.0), axis=0))
    L = np.cumsum(logf)
    j = np.arange(1, p.size + 1, dtype=np.float64)
    logw = -np.log(j) - np.log1p(j)
    prev = np.concatenate([[0.0], L[:-1]])
    started = L + np.logaddexp.accumulate(logw - prev)
    return np.logaddexp(started, -np.log1p(j))                      # + Σ_{j > t} w_j = 1/(t + 1)


@dataclass(frozen=True)
class SequentialResult(_Result):
    """Both sequential tests over a stream of deployed inputs, in order.

    ``first_alarm``: the index (0-based, in stream order) of the first input at which either test
    alarmed, None if none did; ``p_open_alarm`` / ``drop_alarm`` those of each test (``drop_direction``
    "up" or "down": the deployed D larger or smaller). ``p_open_low``/``p_open_high``: the confidence
    sequence's interval after the last input; ``calibration_low``/``high``: the calibration's
    Clopper–Pearson interval. ``max_log_martingale``: the largest log M_t of each D martingale.
    """

    n: int
    n_calibration: int
    alpha: float
    first_alarm: int | None
    p_open_alarm: int | None
    drop_alarm: int | None
    drop_direction: str | None
    p_open: float
    p_open_low: float
    p_open_high: float
    calibration_p_open: float
    calibration_low: float
    calibration_high: float
    max_log_martingale_up: float
    max_log_martingale_down: float
    method: str = ("p_open: beta-binomial mixture confidence sequence (alpha/4) vs the calibration's Clopper-Pearson "
                   "interval (alpha/4); D: conformal test martingales up and down (alpha/4 each), mixed over start times")


def _clopper_pearson(k: int, n: int, level: float) -> tuple[float, float]:
    a = 1.0 - level
    low = 0.0 if k == 0 else float(beta_dist.ppf(a / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta_dist.ppf(1 - a / 2, k + 1, n - k))
    return low, high


def sequential_drift(calibration_drops, drops, opened, tau: float, *, alpha: float,
                     rng: np.random.Generator) -> SequentialResult:
    """Anytime-valid drift tests of a deployed stream against its calibration (module docstring).

    Parameters
    ----------
    calibration_drops : array_like
        D of the calibration inputs (the gate file's ``pilot.drops``).
    drops, opened : array_like
        D and the gate's decision of each deployed input, in the order they were gated.
    tau : float
        The τ in use: the calibration's p_open is the share of its D ≥ τ.
    alpha : float
        P(any false alarm over the whole stream) ≤ α: α/2 for p_open (α/4 the calibration interval,
        α/4 the confidence sequence), α/2 for D (α/4 each direction).
    rng : numpy.random.Generator
        The conformal p-values' tie-breaking uniforms.
    """
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    cal = np.asarray(calibration_drops, dtype=np.float64)
    d = np.asarray(drops, dtype=np.float64)
    x = np.asarray(opened, dtype=bool)
    if cal.size == 0 or d.shape != x.shape:
        raise ValueError("sequential_drift: needs calibration D values and one decision per deployed D")
    quarter = float(alpha) / 4.0
    k_cal = int(np.count_nonzero(cal >= tau))
    c_low, c_high = _clopper_pearson(k_cal, cal.size, 1.0 - quarter)
    p_alarm = p_open_alarm_index(x, c_low, c_high, quarter)
    upper, lower = conformal_pvalues(cal, d, rng=rng)
    bound = np.log(1.0 / quarter)
    m_up, m_down = restart_log_martingale(upper), restart_log_martingale(lower)
    hits = {name: np.flatnonzero(m >= bound) for name, m in (("up", m_up), ("down", m_down))}
    firsts = {name: int(h[0]) for name, h in hits.items() if h.size}
    direction = min(firsts, key=firsts.get) if firsts else None
    d_alarm = firsts[direction] if direction else None
    alarms = [a for a in (p_alarm, d_alarm) if a is not None]
    low, high = p_open_confidence_sequence(int(x.sum()), int(x.size), quarter)
    return SequentialResult(
        n=int(d.size), n_calibration=int(cal.size), alpha=float(alpha), first_alarm=min(alarms) if alarms else None,
        p_open_alarm=p_alarm, drop_alarm=d_alarm, drop_direction=direction,
        p_open=float(x.mean()) if x.size else float("nan"), p_open_low=low, p_open_high=high,
        calibration_p_open=k_cal / cal.size, calibration_low=c_low, calibration_high=c_high,
        max_log_martingale_up=float(m_up.max()) if m_up.size else 0.0,
        max_log_martingale_down=float(m_down.max()) if m_down.size else 0.0)
