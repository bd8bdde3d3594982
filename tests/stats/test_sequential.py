"""pagestats.stats.sequential against brute forces written here (loops, numerical integration) and its
anytime validity by simulation: with no drift, P(any alarm within 2,000 looks) ≤ α (Monte Carlo error stated)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate

from pagestats.stats import sequential as sq


def test_mixture_martingale_is_the_beta_integral():
    a, b = sq.PRIOR
    from scipy.special import beta as B

    for k, t, p0 in [(0, 5, 0.3), (3, 10, 0.2), (10, 10, 0.9), (7, 40, 0.5)]:
        num, _ = integrate.quad(lambda q: q ** (k + a - 1) * (1 - q) ** (t - k + b - 1), 0, 1)
        brute = num / B(a, b) / (p0 ** k * (1 - p0) ** (t - k))
        assert np.exp(sq.log_mixture_martingale(k, t, p0)) == pytest.approx(brute, rel=1e-6)


def test_conformal_pvalues_by_loop():
    rng = np.random.default_rng(0)
    ref = np.round(rng.normal(size=50), 1)          # ties on purpose
    stream = np.round(rng.normal(0.3, 1, size=130), 1)
    up, down = sq.conformal_pvalues(ref, stream, rng=np.random.default_rng(9), block=32)
    u = np.random.default_rng(9).random(stream.size)
    seen = list(ref)
    for t, s in enumerate(stream):
        gt = sum(v > s for v in seen)
        lt = sum(v < s for v in seen)
        eq = sum(v == s for v in seen)
        assert up[t] == pytest.approx((gt + u[t] * (eq + 1)) / (len(seen) + 1), abs=1e-12)
        assert down[t] == pytest.approx((lt + u[t] * (eq + 1)) / (len(seen) + 1), abs=1e-12)
        seen.append(s)


def test_restart_martingale_by_recursion():
    rng = np.random.default_rng(1)
    p = rng.random(300) ** 1.5
    f = lambda x: np.mean(sq.EPSILONS * x ** (sq.EPSILONS - 1))  # noqa: E731
    s, out = 0.0, []
    for t, x in enumerate(p, start=1):
        s = (s + 1.0 / (t * (t + 1))) * f(x)
        out.append(np.log(s + 1.0 / (t + 1)))
    assert np.allclose(sq.restart_log_martingale(p), out, rtol=1e-9)


def test_alarm_index_matches_the_root_found_sequence():
    rng = np.random.default_rng(2)
    x = rng.random(400) < 0.45
    low, high, alpha = 0.2, 0.3, 0.05
    first = None
    for t in range(1, x.size + 1):
        lo, hi = sq.p_open_confidence_sequence(int(x[:t].sum()), t, alpha)
        if hi < low or lo > high:
            first = t - 1
            break
    assert first is not None and sq.p_open_alarm_index(x, low, high, alpha) == first


def test_confidence_sequence_covers_at_all_times():
    """2,000 Bernoulli(0.3) streams of 2,000: the share whose sequence ever excludes 0.3 is ≤ α
    (MC error √(0.1·0.9/2000) ≈ 0.0067)."""
    rng = np.random.default_rng(3)
    alpha, reps = 0.1, 2_000
    misses = sum(sq.p_open_alarm_index(rng.random(2_000) < 0.3, 0.3, 0.3, alpha) is not None for _ in range(reps))
    assert misses / reps <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / reps)


def test_no_drift_false_alarms_within_2000_looks():
    """Calibration of 300 and 2,000 deployed inputs from one law, α = 0.1, 400 repetitions:
    P(any alarm) ≤ α + 3 MC se (se = √(0.1·0.9/400) ≈ 0.015)."""
    rng = np.random.default_rng(4)
    alpha, reps, tau = 0.1, 400, 0.5
    alarms = 0
    for _ in range(reps):
        cal = rng.normal(size=300)
        d = rng.normal(size=2_000)
        res = sq.sequential_drift(cal, d, d >= tau, tau, alpha=alpha, rng=rng)
        alarms += res.first_alarm is not None
    se = np.sqrt(alpha * (1 - alpha) / reps)
    assert alarms / reps <= alpha + 3 * se, f"P(any alarm) = {alarms / reps:.4f}, α = {alpha}, MC se {se:.4f}"


def test_drift_is_found_with_its_input():
    rng = np.random.default_rng(5)
    cal = rng.normal(size=500)
    d = np.concatenate([rng.normal(size=300), rng.normal(0.8, 1, size=700)])
    res = sq.sequential_drift(cal, d, d >= 0.5, 0.5, alpha=0.05, rng=rng)
    assert res.drop_direction == "up" and 300 <= res.drop_alarm < 1000
    assert res.first_alarm == min(a for a in (res.p_open_alarm, res.drop_alarm) if a is not None)
