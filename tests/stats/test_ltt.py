"""Learn then Test (pagestats.stats.ltt, pagestats.deploy.risk) against a brute force over scipy's exact binomial
test, and its guarantee by simulation (P(harm of the certified τ > A) ≤ δ, Monte Carlo error stated)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from pagestats.deploy import risk
from pagestats.stats.ltt import fixed_sequence_threshold
from brute import brute_ltt_tau




@pytest.mark.parametrize("seed", range(6))
def test_matches_the_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(30, 200))
    drops = np.round(rng.normal(0.05, 0.05, size=n), 3)  # rounded: tied D values
    harmed = rng.random(n) < np.clip(4 * drops, 0, 0.9)
    a, delta = float(rng.choice([0.05, 0.1, 0.2])), float(rng.choice([0.05, 0.1]))
    cert = fixed_sequence_threshold(drops, harmed, harm_bound=a, delta=delta)
    assert cert.tau == brute_ltt_tau(drops.tolist(), harmed.tolist(), a, delta)
    if cert.tau is not None:
        x = int(np.sum((drops >= cert.tau) & harmed))
        assert (cert.n_harmed, cert.harm, cert.p_open) == (x, x / n, np.mean(drops >= cert.tau))
        assert cert.p_value == pytest.approx(binomtest(x, n, a, alternative="less").pvalue, rel=1e-9)


def test_nothing_certified_and_all_certified():
    drops = np.array([0.3, 0.2, 0.1])
    cert = fixed_sequence_threshold(drops, np.array([True, True, True]), harm_bound=0.1, delta=0.1)
    assert cert.tau is None and cert.n_rejected == 0 and cert.stopped_at == 0.3
    cert = fixed_sequence_threshold(np.linspace(0, 1, 40), np.zeros(40, bool), harm_bound=0.1, delta=0.1)
    assert cert.tau == 0.0 and cert.n_rejected == 40 and cert.stopped_at is None and cert.p_open == 1.0


def test_bad_input():
    with pytest.raises(TypeError, match="Boolean"):
        fixed_sequence_threshold([0.1], [1], harm_bound=0.1, delta=0.1)
    with pytest.raises(ValueError, match="finite"):
        fixed_sequence_threshold([np.nan], [True], harm_bound=0.1, delta=0.1)
    with pytest.raises(ValueError, match="delta"):
        fixed_sequence_threshold([0.1], [True], harm_bound=0.1, delta=1.0)


def test_guarantee_by_simulation():
    """D ~ U(0, 1), P(harmed | D) = D: the gate at τ harms (1 − τ²)/2 of the population. Certify on
    n = 150 draws, 2,000 times: the share with true harm > A must be ≤ δ (MC error √(δ(1−δ)/2000) ≈ 0.0067)."""
    rng = np.random.default_rng(11)
    a, delta, n, reps = 0.15, 0.1, 150, 2_000
    above = 0
    for _ in range(reps):
        d = rng.random(n)
        h = rng.random(n) < d
        cert = fixed_sequence_threshold(d, h, harm_bound=a, delta=delta)
        true_harm = 0.0 if cert.tau is None else (1.0 - cert.tau ** 2) / 2.0
        above += true_harm > a
    share = above / reps
    se = np.sqrt(delta * (1 - delta) / reps)
    assert share <= delta + 3 * se, f"P(harm > A) = {share:.4f} > δ = {delta} (+3 MC se {se:.4f})"
    assert share > 0.01  # the certificate is not vacuous: τ sits near the bound, not far above it


def test_split_validation_counts():
    rng = np.random.default_rng(5)
    d = rng.random(400)
    h = rng.random(400) < d
    v = risk.split_validation(d, h, harm_bound=0.15, delta=0.1, n_calibration=150, n_splits=300, rng=rng)
    assert v.share_pool_above <= 0.1 + 3 * v.mc_se_pool + 0.02
    assert 0 <= v.share_test_above <= 1 and v.mc_se_test == pytest.approx(np.sqrt(v.share_test_above * (1 - v.share_test_above) / 300))
    assert v.share_certified == 1.0 and v.mean_p_open > 0
