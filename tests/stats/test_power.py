"""pagestats.stats.power against independent references (statsmodels' Wilson, scipy's exact binomial test)
and Monte Carlo power at the returned n, with the Monte Carlo error stated in each check."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest
from statsmodels.stats.proportion import proportion_confint

from pagestats.stats import power as pw


def wilson_excludes(k, n, t, level=0.95):
    low, high = proportion_confint(k, n, alpha=1 - level, method="wilson")
    return (t < low) | (t > high)


@pytest.mark.parametrize("n", [1, 7, 30, 100, 179, 180, 181, 523])
@pytest.mark.parametrize("r,t,level", [(0.10, 0.05, 0.95), (0.01, 0.05, 0.95), (0.3, 0.2, 0.9)])
def test_rho_power_is_the_binomial_sum_over_wilson_exclusions(n, r, t, level):
    # brute force: every k, its statsmodels Wilson interval (method named), weighted by Bin(n, r)
    from scipy.stats import binom

    k = np.arange(n + 1)
    brute = float(np.sum(binom.pmf(k, n, r) * wilson_excludes(k, n, t, level)))
    assert pw.rho_power(n, r, t, level) == pytest.approx(brute, abs=1e-12)


def test_rho_sample_size_is_the_first_n_reaching_the_power():
    res = pw.rho_sample_size(0.10, 0.05, power=0.8)
    assert res.n == 180  # the example (ρ = 0.10 against 0.05 at 80 %), reproduced
    ns = np.arange(1, res.n + 1)
    exact = pw.rho_power(ns, 0.10, 0.05)
    assert exact[-1] >= 0.8 and np.all(exact[:-1] < 0.8)
    assert res.power == pytest.approx(exact[-1])


@pytest.mark.parametrize("r,t,p", [(0.10, 0.05, 0.8), (0.01, 0.05, 0.9), (0.15, 0.05, 0.7)])
def test_rho_monte_carlo_power_at_returned_n(r, t, p):
    res = pw.rho_sample_size(r, t, power=p)
    rng = np.random.default_rng(1)
    draws = 20_000
    k = rng.binomial(res.n, r, size=draws)
    mc = float(np.mean(wilson_excludes(k, res.n, t)))
    se = np.sqrt(mc * (1 - mc) / draws)  # Monte Carlo error: ≈ 0.003 at 20,000 draws
    assert abs(mc - res.power) <= 4 * se, f"MC power {mc:.4f} ± {se:.4f} vs exact {res.power:.4f}"
    assert mc >= p - 4 * se, f"MC power {mc:.4f} ± {se:.4f} below the target {p}"


def test_rho_on_the_threshold_or_out_of_reach():
    assert pw.rho_sample_size(0.05, 0.05).n is None
    assert pw.rho_sample_size(0.051, 0.05, n_max=1000).n is None
    with pytest.raises(ValueError, match="expected"):
        pw.rho_sample_size(1.5, 0.05)
    # ρ = 0: settled once the Wilson interval of 0/n ends below T, n > z²(1 − T)/T = 72.99
    assert pw.rho_sample_size(0.0, 0.05, power=0.99).n == 73


@pytest.mark.parametrize("n", [5, 40, 179, 300])
@pytest.mark.parametrize("h,a,level", [(0.05, 0.10, 0.95), (0.0, 0.05, 0.9), (0.02, 0.04, 0.99)])
def test_harm_power_against_scipy_clopper_pearson(n, h, a, level):
    from scipy.stats import binom

    shown = np.array([binomtest(k, n, a, alternative="less").proportion_ci(level, method="exact").high < a
                      for k in range(n + 1)])
    brute = float(np.sum(binom.pmf(np.arange(n + 1), n, h) * shown))
    assert pw.harm_power(n, h, a, level) == pytest.approx(brute, abs=1e-12)


def test_harm_sample_size_monte_carlo():
    res = pw.harm_sample_size(0.10, 0.05, power=0.8)
    assert np.all(pw.harm_power(np.arange(1, res.n), 0.05, 0.10) < 0.8) and res.power >= 0.8
    rng = np.random.default_rng(2)
    draws = 4_000
    ks = rng.binomial(res.n, 0.05, size=draws)
    shown = {k: binomtest(int(k), res.n, 0.10, alternative="less").proportion_ci(0.95, method="exact").high < 0.10
             for k in np.unique(ks)}
    mc = float(np.mean([shown[k] for k in ks]))
    se = np.sqrt(mc * (1 - mc) / draws)  # ≈ 0.006
    assert abs(mc - res.power) <= 4 * se, f"MC power {mc:.4f} ± {se:.4f} vs exact {res.power:.4f}"
    assert pw.harm_sample_size(0.10, 0.10).n is None


def test_design_effect_against_the_variance_of_input_means():
    rng = np.random.default_rng(3)
    shared = rng.normal(size=(500, 1))
    d = 0.8 * shared + 0.6 * rng.normal(size=(500, 6))
    de = pw.design_effect(d)
    means = d.mean(axis=1)
    assert de.sd_input_mean == pytest.approx(means.std(ddof=1), rel=1e-10)
    assert de.variance * de.design_effect / 6 == pytest.approx(means.var(ddof=1), rel=1e-10)
    corr = np.corrcoef(d, rowvar=False)
    assert de.correlation == pytest.approx(corr[~np.eye(6, dtype=bool)].mean(), abs=0.02)


@pytest.mark.parametrize("correlated", [False, True])
def test_delta_sample_size_reaches_its_power_in_the_bootstrap_test(correlated):
    rng = np.random.default_rng(4)
    base = (rng.random((80, 8)) < 0.25).astype(float) - (rng.random((80, 8)) < 0.25)
    if correlated:  # an input's differences move together across budgets: a design effect > 1
        base = np.repeat(base[:, :1], 8, axis=1) * (rng.random((80, 8)) < 0.8)
    n, de = pw.delta_sample_size(base, 0.08, power=0.8)
    assert (de.design_effect > 2) == correlated
    sim = pw.delta_power_simulated(base, 0.08, n.n, rng=rng, n_sim=400, n_boot=1_000)
    # Monte Carlo error of the simulated power: √(0.8·0.2/400) = 0.02
    assert abs(sim.power - 0.8) <= 3 * 0.02 + 0.01, f"simulated power {sim.power:.3f} ± {sim.mc_se:.3f} at n = {n.n}"


def test_straddles():
    assert list(pw.straddles([0.01, 0.06, 0.01, np.nan], [0.2, 0.2, 0.04, 0.2], 0.05)) == [True, False, False, False]
