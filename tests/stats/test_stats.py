"""pagestats.stats against independent references written here (closed forms, loops, statsmodels)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from scipy.stats import norm

from pagestats import stats
from pagestats.io import prereg
from pagestats.stats import bootstrap

# --------------------------------------------------------------------------- Wilson


def wilson_by_hand(k, n, level=0.95):
    z = norm.ppf(0.5 + level / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.mark.parametrize("k,n", [(2, 526), (1, 100), (37, 50), (0, 17), (17, 17), (3, 4)])
def test_wilson_matches_closed_form(k, n):
    r = stats.wilson(k, n)
    lo, hi = wilson_by_hand(k, n)
    assert r.low == pytest.approx(max(lo, 0.0), abs=1e-12)
    assert r.high == pytest.approx(min(hi, 1.0), abs=1e-12)
    assert r.estimate == k / n and r.method == "wilson"


def test_wilson_paper_values():
    # §4 / Table 1: 2/526 NIAH-MK3 recoveries, Wilson [0.001, 0.014].
    r = stats.wilson(2, 526)
    assert (round(r.low, 3), round(r.high, 3)) == (0.001, 0.014)
    # App. A.6.4: ρ = 0.01 at N = 100, Wilson [0.002, 0.054].
    r = stats.wilson(1, 100)
    assert (round(r.low, 3), round(r.high, 3)) == (0.002, 0.054)


def test_wilson_edges_and_vectorised():
    r = stats.wilson(np.array([0, 9, 0, 4]), np.array([9, 9, 0, 10]), confidence_level=0.9)
    assert r.low[0] == 0.0 and r.high[1] == 1.0
    assert np.isnan(r.estimate[2]) and np.isnan(r.low[2]) and np.isnan(r.high[2])
    assert r.defined.tolist() == [True, True, False, True]
    lo, hi = wilson_by_hand(4, 10, 0.9)
    assert (r.low[3], r.high[3]) == pytest.approx((lo, hi))
    assert r.to_dict()["n"] == [9, 9, 0, 10]
    assert stats.wilson(3, [10, 20]).n.tolist() == [10, 20]  # broadcasting


@pytest.mark.parametrize("k,n", [(5, 4), (-1, 3), (1.5, 3), (1, -2)])
def test_wilson_rejects_bad_counts(k, n):
    with pytest.raises(ValueError):
        stats.wilson(k, n)


def test_wilson_rejects_bad_level():
    with pytest.raises(ValueError):
        stats.wilson(1, 2, confidence_level=95)


# --------------------------------------------------------------------------- BH


def bh_by_hand(p, q):
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    last = -1
    for rank, i in enumerate(order, start=1):
        if p[i] <= rank * q / m:
            last = rank
    rejected = [False] * m
    for rank, i in enumerate(order, start=1):
        rejected[i] = rank <= last
    adjusted = [0.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, m * p[i] / rank)
        adjusted[i] = min(1.0, running)
    return rejected, adjusted


def test_bh_matches_step_up_loop():
    rng = np.random.default_rng(3)
    for _ in range(20):
        p = np.concatenate([rng.uniform(0, 0.02, 5), rng.uniform(0, 1, 11)])
        rng.shuffle(p)
        res = stats.bh(p, q=0.05)
        rej, adj = bh_by_hand(list(p), 0.05)
        assert res.rejected.tolist() == rej
        np.testing.assert_allclose(res.adjusted, adj, rtol=1e-12)
        assert res.n_tested == 16 and res.method == "fdr_bh"


def test_bh_nan_left_out_of_family():
    p = np.array([0.01, np.nan, 0.02, 0.9])
    res = stats.bh(p)
    rej, adj = bh_by_hand([0.01, 0.02, 0.9], 0.05)
    assert res.rejected.tolist() == [rej[0], False, rej[1], rej[2]]
    assert np.isnan(res.adjusted[1])
    np.testing.assert_allclose(res.adjusted[[0, 2, 3]], adj)
    assert res.n_tested == 3
    empty = stats.bh([])
    assert empty.rejected.shape == (0,) and empty.n_tested == 0


def test_bh_rejects_bad_input():
    with pytest.raises(ValueError):
        stats.bh([0.5, 1.5])
    with pytest.raises(ValueError):
        stats.bh([0.5], q=0)


# --------------------------------------------------------------------------- cluster bootstrap


def bootstrap_loop(diffs, idx, level=0.95):
    """Per-replicate reference: resample input rows, mean over inputs AND budgets of raw diffs."""
    reps = np.array([diffs[row].mean() for row in idx])
    lo, hi = np.percentile(reps, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    b = len(reps)
    below, above = 1 + np.sum(reps <= 0), 1 + np.sum(reps >= 0)
    p = min(1.0, 2 * min(below, above) / (b + 1))
    return reps, lo, hi, p


def test_bootstrap_equals_per_replicate_loop_same_stream():
    diffs = np.random.default_rng(1).normal(0.05, 0.5, size=(37, 5))
    n_boot = 2000
    # one chunk: the index matrix is one uint16 draw of shape (n_boot, n)
    idx = np.random.default_rng(7).integers(0, 37, size=(n_boot, 37), dtype=np.uint16)
    reps, lo, hi, p = bootstrap_loop(diffs, idx)
    res = stats.cluster_bootstrap(
        diffs, rng=np.random.default_rng(7), n_boot=n_boot, chunk_size=n_boot * 37, return_replicates=True
    )
    np.testing.assert_allclose(res.replicates, reps, rtol=0, atol=1e-12)
    assert res.low == pytest.approx(lo, abs=1e-12) and res.high == pytest.approx(hi, abs=1e-12)
    assert res.p_value == pytest.approx(p)
    assert res.estimate == pytest.approx(diffs.mean())
    assert (res.n_inputs, res.n_budgets, res.n_boot) == (37, 5, n_boot)


def test_bootstrap_chunked_stream_documented():
    diffs = np.random.default_rng(2).normal(size=(20, 3))
    rows = 64 // 20  # chunk_size=64 → 3 rows per draw
    rng = np.random.default_rng(11)
    idx = np.concatenate(
        [rng.integers(0, 20, size=(min(rows, 10 - s), 20), dtype=np.uint16) for s in range(0, 10, rows)]
    )
    reps, *_ = bootstrap_loop(diffs, idx)
    res = stats.cluster_bootstrap(diffs, rng=np.random.default_rng(11), n_boot=10, chunk_size=64, return_replicates=True)
    np.testing.assert_allclose(res.replicates, reps, atol=1e-12)


def test_bootstrap_distribution_matches_int64_loop():
    """Distributional agreement with a plain loop using the default integer draws."""
    diffs = np.random.default_rng(5).exponential(0.3, size=(60, 4)) - 0.2
    rng = np.random.default_rng(9)
    ref = np.array([diffs[rng.integers(0, 60, size=60)].mean() for _ in range(4000)])
    res = stats.cluster_bootstrap(diffs, rng=np.random.default_rng(10), n_boot=4000, return_replicates=True)
    se = ref.std()
    assert res.replicates.mean() == pytest.approx(ref.mean(), abs=0.1 * se)
    assert res.replicates.std() == pytest.approx(se, rel=0.08)
    for qq in (0.025, 0.5, 0.975):
        assert np.quantile(res.replicates, qq) == pytest.approx(np.quantile(ref, qq), abs=0.15 * se)


def test_bootstrap_no_variance_and_one_input():
    res = stats.cluster_bootstrap(np.zeros((40, 8)), rng=np.random.default_rng(0), n_boot=500)
    assert (res.estimate, res.low, res.high) == (0.0, 0.0, 0.0) and np.isnan(res.p_value)  # no variation: no test
    one = stats.cluster_bootstrap(np.array([[0.5, 1.0, 0.0]]), rng=np.random.default_rng(0), n_boot=500)
    assert one.estimate == pytest.approx(0.5) and one.low == pytest.approx(0.5) and one.high == pytest.approx(0.5)
    assert np.isnan(one.p_value) and one.n_inputs == 1


def test_bootstrap_many_cells_equal_sequential_single_cells():
    g = np.random.default_rng(4)
    cells = [g.normal(size=(30, 8)), g.normal(0.2, 1, size=(12, 4)), np.zeros((5, 8))]
    many = stats.cluster_bootstrap(cells, rng=np.random.default_rng(8), n_boot=300)
    rng = np.random.default_rng(8)
    singles = [stats.cluster_bootstrap(c, rng=rng, n_boot=300) for c in cells]
    for i, s in enumerate(singles):
        assert many.low[i] == s.low and many.high[i] == s.high
        assert many.p_value[i] == s.p_value or (np.isnan(many.p_value[i]) and np.isnan(s.p_value))
    assert many.n_inputs.tolist() == [30, 12, 5] and many.n_budgets.tolist() == [8, 4, 8]
    cube = stats.cluster_bootstrap(np.stack([cells[0], cells[0]]), rng=np.random.default_rng(1), n_boot=50)
    assert cube.estimate.shape == (2,)


def test_bootstrap_pvalue_formula_by_hand():
    reps = np.array([-0.1, 0.0, 0.2, 0.3, 0.4])
    # #≤0 = 2, #≥0 = 4 → p = 2·(1+2)/6 = 1.0
    assert stats.bootstrap_pvalue(reps) == pytest.approx(1.0)
    reps = np.arange(1, 100) / 100.0  # all > 0 → floor 2/(B+1)
    assert stats.bootstrap_pvalue(reps) == pytest.approx(2 / 100)


def test_bootstrap_coverage():
    """200 repetitions: the 95% percentile interval covers the true Δ about 95% of the time."""
    g = np.random.default_rng(2024)
    true_delta, covered = 0.1, 0
    cells = []
    for _ in range(200):
        u = g.normal(true_delta, 0.3, size=(60, 1))  # input effect, correlated across budgets
        cells.append(u + g.normal(0, 0.2, size=(60, 4)))
    res = stats.cluster_bootstrap(cells, rng=np.random.default_rng(1), n_boot=1000)
    covered = np.sum((res.low <= true_delta) & (true_delta <= res.high))
    assert 0.90 <= covered / 200 <= 0.99


def test_bootstrap_rejects_bad_input():
    with pytest.raises(TypeError):
        stats.cluster_bootstrap(np.zeros((3, 2)), rng=np.random.RandomState(0))
    with pytest.raises(ValueError):
        stats.cluster_bootstrap(np.array([[np.nan, 1.0]]), rng=np.random.default_rng(0))
    with pytest.raises(ValueError):
        stats.cluster_bootstrap(np.zeros((0, 2)), rng=np.random.default_rng(0))
    with pytest.raises(ValueError):
        stats.cluster_bootstrap([], rng=np.random.default_rng(0))


# --------------------------------------------------------------------------- through-origin fit


def test_through_origin_fit_vs_lstsq_and_statsmodels():
    import statsmodels.api as sm

    g = np.random.default_rng(6)
    x = g.uniform(0.05, 0.8, 25)
    y = 0.34 * x + g.normal(0, 0.03, 25)
    fit = stats.through_origin_fit(x, y)
    slope, *_ = np.linalg.lstsq(x[:, None], y, rcond=None)
    assert fit.slope == pytest.approx(slope[0], rel=1e-12)
    ols = sm.OLS(y, x[:, None]).fit()  # no constant: statsmodels reports the uncentred R²
    assert fit.se == pytest.approx(ols.bse[0], rel=1e-10)
    assert fit.r2 == pytest.approx(ols.rsquared, rel=1e-10)
    assert fit.n == 25


def test_through_origin_fit_degenerate():
    one = stats.through_origin_fit([0.5], [0.2])
    assert one.slope == pytest.approx(0.4) and np.isnan(one.se)
    with pytest.raises(ValueError):
        stats.through_origin_fit([0, 0], [1, 2])
    with pytest.raises(ValueError):
        stats.through_origin_fit([], [])
    with pytest.raises(ValueError):
        stats.through_origin_fit([1, 2], [1])


# --------------------------------------------------------------------------- AUC


def auc_pairs(scores, cap):
    dil_s = [s for s, c in zip(scores, cap) if not c]
    cap_s = [s for s, c in zip(scores, cap) if c]
    psi = np.array([[1.0 if d > c else 0.5 if d == c else 0.0 for c in cap_s] for d in dil_s])
    return psi


def test_auc_vs_pair_count_with_ties_and_delong():
    g = np.random.default_rng(12)
    scores = np.round(g.normal(size=40), 1)  # rounding makes ties
    cap = g.uniform(size=40) < 0.35
    scores[cap] -= 0.5
    res = stats.auc(scores, cap)
    psi = auc_pairs(scores, cap)
    assert res.estimate == pytest.approx(psi.mean(), abs=1e-12)
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    se = math.sqrt(v10.var(ddof=1) / len(v10) + v01.var(ddof=1) / len(v01))
    assert res.se == pytest.approx(se, rel=1e-10)
    assert res.low == pytest.approx(max(0, psi.mean() - 1.959963984540054 * se))
    assert (res.n_capacity, res.n_dilution) == (int(cap.sum()), int((~cap).sum()))


def test_auc_orientation_and_edges():
    d = np.array([0.2, 0.3, 0.01, 0.02])
    cap = np.array([False, False, True, True])
    assert stats.auc(d, cap).estimate == 1.0  # capacity-bound has lower D → 1
    assert stats.auc(-d, cap).estimate == 0.0
    assert stats.auc(np.ones(4), cap).estimate == 0.5
    with pytest.raises(ValueError):
        stats.auc(d, np.zeros(4, dtype=bool))
    with pytest.raises(TypeError):
        stats.auc(d, np.array([0, 0, 1, 1]))


# --------------------------------------------------------------------------- pre-registration


def test_freeze_and_load_band(tmp_path):
    import hashlib
    from datetime import datetime, timezone

    frame = pl.DataFrame({"task": ["vt", "fwe"], "predicted_low": [0.1, 0.2], "predicted_high": [0.3, 0.4]})
    path = tmp_path / "band.json"
    when = datetime(2030, 5, 1, 12, 0, tzinfo=timezone.utc)
    digest = prereg.freeze_band(frame, {"target_context": 1024, "evictor": "snapkv"}, path, now=when)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    meta, back = prereg.load_band(path, digest)
    assert back.select(frame.columns).equals(frame) and meta["frozen_at"] == "2030-05-01T12:00:00+00:00"
    with pytest.raises(FileExistsError):
        prereg.freeze_band(frame, {}, path)
    prereg.check_frozen_before(meta, {"r": {"created_at": "2030-05-01T12:00:01Z"}}, ["r"])
    for created in ("2030-05-01T12:00:00+00:00", "2030-04-30T00:00:00+00:00"):
        with pytest.raises(prereg.PreregistrationError, match="after run r"):
            prereg.check_frozen_before(meta, {"r": {"created_at": created}}, ["r"])
    with pytest.raises(prereg.PreregistrationError, match="no created_at"):
        prereg.check_frozen_before(meta, {"r": {}}, ["r"])
    with pytest.raises(prereg.PreregistrationError, match="64 hexadecimal"):
        prereg.load_band(path, "abc")
    path.write_bytes(path.read_bytes() + b"\n")  # any byte changed is caught before parsing
    with pytest.raises(prereg.PreregistrationError, match="does not match"):
        prereg.load_band(path, digest)


def test_bootstrap_shared_inputs_equals_loop_with_one_resample_for_all_cells():
    g = np.random.default_rng(21)
    a, b = g.normal(size=(25, 6)), g.normal(0.3, 1, size=(25, 2))
    idx = np.random.default_rng(5).integers(0, 25, size=(700, 25), dtype=np.uint16)
    res = stats.cluster_bootstrap(
        [a, b], rng=np.random.default_rng(5), n_boot=700, shared_inputs=True, chunk_size=700 * 25,
        return_replicates=True,
    )
    for i, d in enumerate((a, b)):
        ref = np.array([d[row].mean() for row in idx])
        np.testing.assert_allclose(res.replicates[i], ref, atol=1e-12)
        assert res.low[i] == pytest.approx(np.percentile(ref, 2.5), abs=1e-12)
    # a single cell gives the same replicates shared or not (same index stream)
    one = stats.cluster_bootstrap(a, rng=np.random.default_rng(5), n_boot=700, chunk_size=700 * 25,
                                  return_replicates=True)
    np.testing.assert_allclose(one.replicates, res.replicates[0], atol=1e-12)
    with pytest.raises(ValueError, match="same n_inputs"):
        stats.cluster_bootstrap([a, b[:3]], rng=np.random.default_rng(0), shared_inputs=True)


# ----------------------------------------------------- bootstrap: multinomial-count draw (ties)


def binary_diffs(g, n, m, p_help=0.2, p_harm=0.05):
    """Paired differences of binary scores: values in {-1, 0, 1}, so few distinct per-input means."""
    return (g.uniform(size=(n, m)) < p_help).astype(float) - (g.uniform(size=(n, m)) < p_harm).astype(float)


def test_bootstrap_counts_equals_multinomial_loop_same_stream():
    diffs = binary_diffs(np.random.default_rng(3), 50, 4)
    means = [float(r.mean()) for r in diffs]
    values = sorted(set(means))
    counts = np.array([means.count(v) for v in values])
    rng = np.random.default_rng(12)
    ref = np.array([np.dot(rng.multinomial(50, counts / 50), values) / 50 for _ in range(101)])
    res = stats.cluster_bootstrap(
        diffs, rng=np.random.default_rng(12), n_boot=101, draw="counts", chunk_size=3 * len(values),
        return_replicates=True,
    )
    np.testing.assert_allclose(res.replicates, ref, rtol=0, atol=1e-12)
    assert res.estimate == pytest.approx(diffs.mean())


@pytest.mark.parametrize("draw", ["counts", "indices"])
def test_bootstrap_two_values_follow_the_binomial_law(draw):
    """Per-input means in {0, 1}, 13 of 60 ones → Δ* = Binomial(60, 13/60) / 60 exactly."""
    from scipy.stats import binom, chisquare

    diffs = np.zeros((60, 3))
    diffs[:13] = 1.0
    res = stats.cluster_bootstrap(diffs, rng=np.random.default_rng(5), n_boot=20_000, draw=draw,
                                  return_replicates=True)
    k = np.rint(res.replicates * 60).astype(int)
    np.testing.assert_allclose(k / 60, res.replicates, atol=1e-12)
    pmf = binom.pmf(np.arange(61), 60, 13 / 60)
    # bins: ≤6, 7, …, 19, ≥20 (every expected count ≥ 5 × … well above 5)
    edges = np.arange(7, 20)
    observed = np.concatenate([[np.sum(k <= 6)], [np.sum(k == e) for e in edges], [np.sum(k >= 20)]])
    expected = 20_000 * np.concatenate([[pmf[:7].sum()], pmf[7:20], [pmf[20:].sum()]])
    assert expected.min() > 5
    assert chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-3


def test_bootstrap_count_and_index_draws_agree_in_law():
    """Same data, both draws: variance = population variance / n (closed form), same histogram."""
    from scipy.stats import chi2_contingency

    diffs = binary_diffs(np.random.default_rng(8), 60, 2)  # per-input means in {-1, -.5, 0, .5, 1}
    pm = diffs.mean(axis=1)
    reps = {
        draw: stats.cluster_bootstrap(diffs, rng=np.random.default_rng(i), n_boot=20_000, draw=draw,
                                      return_replicates=True).replicates
        for i, draw in enumerate(("counts", "indices"))
    }
    for r in reps.values():
        assert r.mean() == pytest.approx(pm.mean(), abs=4 * pm.std() / np.sqrt(60 * 20_000))
        assert r.var() == pytest.approx(pm.var() / 60, rel=0.05)
    # histogram on the lattice of Δ* (multiples of 1/120), tails pooled
    lattice = {d: np.rint(r * 120).astype(int) for d, r in reps.items()}
    lo, hi = np.percentile(lattice["indices"], [2, 98]).astype(int)
    table = np.array([[np.sum(x < lo), *[np.sum(x == v) for v in range(lo, hi + 1)], np.sum(x > hi)]
                      for x in lattice.values()])
    table = table[:, table.sum(axis=0) > 0]
    assert chi2_contingency(table).pvalue > 1e-3


def test_bootstrap_auto_draw_follows_ties():
    """draw="auto" gives exactly the replicates of the draw its documented rule names."""
    g = np.random.default_rng(6)
    cases = {
        "binary, 8 budgets": binary_diffs(g, 400, 8),
        "continuous": g.normal(size=(400, 8)),
        "one budget, two values": (g.uniform(size=(400, 1)) < 0.3).astype(float),
        "binary, 30 inputs": binary_diffs(g, 30, 8),
    }
    taken = {}
    for name, diffs in cases.items():
        n_distinct = len({float(x) for x in diffs.mean(axis=1)})
        want = "counts" if n_distinct <= max(3, len(diffs) // bootstrap.COUNTS_CROSSOVER) else "indices"
        taken[name] = want
        auto = stats.cluster_bootstrap(diffs, rng=np.random.default_rng(2), n_boot=200, return_replicates=True)
        forced = stats.cluster_bootstrap(diffs, rng=np.random.default_rng(2), n_boot=200, draw=want,
                                         return_replicates=True)
        np.testing.assert_array_equal(auto.replicates, forced.replicates, err_msg=name)
    assert taken["continuous"] == "indices" and taken["one budget, two values"] == "counts"
    assert taken["binary, 30 inputs"] == "indices"  # > 3 distinct means at n = 30
    with pytest.raises(ValueError, match="draw"):
        stats.cluster_bootstrap(cases["continuous"], rng=np.random.default_rng(0), draw="poisson")


def test_bootstrap_shared_counts_keep_the_cross_cell_covariance():
    """shared_inputs with count draws over distinct rows: Cov(Δ*_a, Δ*_b) = cov_pop(a, b) / n."""
    g = np.random.default_rng(9)
    a = binary_diffs(g, 200, 2)
    b = np.where(g.uniform(size=(200, 1)) < 0.8, a[:, :1], 0.0)  # correlated with a
    for draw in ("counts", "indices"):
        res = stats.cluster_bootstrap([a, b], rng=np.random.default_rng(4), n_boot=20_000, shared_inputs=True,
                                      draw=draw, return_replicates=True)
        am, bm = a.mean(axis=1), b.mean(axis=1)
        cov = np.cov(res.replicates)
        assert cov[0, 1] == pytest.approx(np.mean((am - am.mean()) * (bm - bm.mean())) / 200, rel=0.06)
        assert cov[0, 0] == pytest.approx(am.var() / 200, rel=0.06)
        assert cov[1, 1] == pytest.approx(bm.var() / 200, rel=0.06)


def test_bootstrap_counts_coverage_on_binary_scores():
    """200 binary-score cells with known Δ: the count-draw 95% interval covers it about 95% of the time."""
    g = np.random.default_rng(77)
    p_help, p_harm, m = 0.25, 0.10, 4
    true_delta = p_help - p_harm
    cells = []
    for _ in range(200):
        helped = g.uniform(size=(80, 1)) < p_help  # per-input effect, shared by its budgets
        harmed = g.uniform(size=(80, m)) < p_harm
        cells.append(np.repeat(helped, m, axis=1).astype(float) - harmed)
    res = stats.cluster_bootstrap(cells, rng=np.random.default_rng(1), n_boot=1000, draw="counts")
    covered = np.sum((res.low <= true_delta) & (true_delta <= res.high))
    assert 0.90 <= covered / 200 <= 0.99
