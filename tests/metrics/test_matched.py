"""Δ at matched memory (pagestats.metrics.matched) against a brute-force reading of its definition."""

import numpy as np
import polars as pl
import pytest

from pagestats import metrics
from pagestats.core.columns import sorting_order


def brute_frontier(kept, acc, k):
    """Pareto points by explicit search, then straight lines between consecutive ones (np.interp)."""
    pts = sorted(zip(kept, acc))
    # a point stays when every other point that keeps no more KV scores lower (the first of equal ones)
    pareto = [(kp, ap) for i, (kp, ap) in enumerate(pts)
              if not any(k2 <= kp and a2 >= ap - 1e-9 and (k2 < kp or a2 > ap + 1e-9 or j < i)
                         for j, (k2, a2) in enumerate(pts) if j != i)]
    xs = [p[0] for p in pareto]
    ys = [p[1] for p in pareto]
    return float(np.interp(k, xs, ys))


def test_frontier_equals_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(200):
        p = rng.integers(2, 9)
        kept = np.round(rng.random(p), 2)
        acc = np.round(rng.random(p), 1)
        query = rng.random(5)
        got = metrics.frontier_accuracy(kept[None], acc[None], query[None])[0]
        want = [brute_frontier(kept, acc, k) for k in query]
        np.testing.assert_allclose(got, want, atol=1e-12)


def _cell(rng, n, evictor):
    rows = []
    budgets = (0.125, 0.25, 0.5, 1.0)
    for i in range(n):
        full = float(rng.integers(0, 2))
        open_ = rng.random() < 0.5
        for b in budgets:
            plain = full if b == 1.0 else float(rng.integers(0, 2)) * (rng.random() < b + 0.3)
            kept = 100 if b == 1.0 else int(max(10, b * 100))
            rows.append({"model": "m", "context_length": 512, "evictor": evictor, "run_id": "r", "task": "t",
                         "input_id": i, "budget": b, "n_tokens": 100, "score_plain": plain, "n_kept_plain": kept,
                         "score_gated": plain if open_ else full, "n_kept_gated": kept if open_ else 100})
    return rows


def test_matched_delta_equals_a_by_hand_computation():
    rng = np.random.default_rng(0)
    frame = pl.DataFrame(_cell(rng, 40, "a") + _cell(rng, 40, "b"))
    out = metrics.matched_memory(metrics.relation(frame), rng=np.random.default_rng(1), n_boot=400)
    assert out.height == 2
    for r in out.iter_rows(named=True):
        cell = frame.filter(pl.col("evictor") == r["evictor"])
        means = cell.group_by("budget").agg(
            pl.col("score_plain").mean(), (pl.col("n_kept_plain") / 100).mean().alias("kp"),
            pl.col("score_gated").mean(), (pl.col("n_kept_gated") / 100).mean().alias("kg")).sort("budget")
        evicted = means.filter(pl.col("budget") < 1)
        matched = [brute_frontier(means["kp"].to_list(), means["score_plain"].to_list(), k) for k in evicted["kg"]]
        want = float(np.mean(evicted["score_gated"].to_numpy() - np.array(matched)))
        assert r["delta_matched"] == pytest.approx(want, abs=1e-12)
        assert r["delta_nominal"] == pytest.approx(float((evicted["score_gated"] - evicted["score_plain"]).mean()))
        assert r["low"] <= r["delta_matched"] <= r["high"] and 0 < r["p_value"] <= 1
        assert r["p_adjusted"] >= r["p_value"]


def test_a_gate_that_never_opens_has_no_matched_gain():
    """Closed everywhere: the gated arm is the full cache, which is plain eviction's own b = 1 point."""
    rng = np.random.default_rng(5)
    rows = _cell(rng, 30, "a")
    for r in rows:
        r["score_gated"] = next(x["score_plain"] for x in rows if x["input_id"] == r["input_id"] and x["budget"] == 1.0)
        r["n_kept_gated"] = 100
    out = metrics.matched_memory(metrics.relation(pl.DataFrame(rows)), rng=np.random.default_rng(2), n_boot=200)
    assert out["delta_matched"][0] == pytest.approx(0.0, abs=1e-12) and out["kept_kv_gated"][0] == 1.0


def test_a_cell_without_the_full_cache_is_refused():
    rows = [r for r in _cell(np.random.default_rng(0), 5, "a") if r["budget"] < 1]
    with pytest.raises(ValueError, match="budget 1.0"):
        metrics.matched_memory(metrics.relation(pl.DataFrame(rows)), rng=np.random.default_rng(0), n_boot=10)


def _big_cell(n):
    """One cell of ``n`` inputs with binary scores and one prompt length: few distinct rows."""
    return pl.DataFrame(_cell(np.random.default_rng(11), n, "a"))


def test_distinct_rows_give_the_statistic_of_the_inputs_they_stand_for():
    """A resample over the distinct rows is the resample of the inputs grouped by row: for any input
    counts, Δ_matched from the inputs equals Δ_matched from the counts summed per distinct row."""
    from pagestats.metrics.matched import _cells, _delta_matched, _resampled_rows

    ((_, budgets, evicted, values),) = _cells(metrics.relation(_big_cell(800)),
                                              ["model", "context_length", "evictor"])
    distinct, counts = _resampled_rows(values)
    n = values.shape[0]
    assert len(counts) * 8 <= n and counts.sum() == n  # this cell is drawn over its distinct rows
    which = np.array([np.flatnonzero((distinct == r).all(axis=1))[0] for r in values])  # input → its row
    assert (np.bincount(which, minlength=len(counts)) == counts).all()
    per_input = np.random.default_rng(4).multinomial(n, np.full(n, 1 / n), size=50)
    per_row = np.stack([np.bincount(which, weights=c, minlength=len(counts)) for c in per_input])
    for got, want in zip(_delta_matched(per_row, evicted, distinct), _delta_matched(per_input, evicted, values)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_distinct_row_and_per_input_draws_give_one_interval(monkeypatch):
    """The two draws sample one bootstrap distribution: their intervals agree to Monte Carlo error,
    and the point estimate is the same number."""
    from pagestats.metrics import matched

    frame = _big_cell(800)
    distinct = metrics.matched_memory(metrics.relation(frame), rng=np.random.default_rng(7), n_boot=4000)
    monkeypatch.setattr(matched, "DISTINCT_ROWS_FACTOR", 10**9)  # every cell over its inputs
    inputs = metrics.matched_memory(metrics.relation(frame), rng=np.random.default_rng(8), n_boot=4000)
    assert distinct["delta_matched"][0] == pytest.approx(inputs["delta_matched"][0], abs=1e-12)
    width = inputs["high"][0] - inputs["low"][0]
    assert width > 0
    for end in ("low", "high"):
        assert abs(distinct[end][0] - inputs[end][0]) < 0.1 * width


def test_resamples_are_drawn_in_chunks_without_changing_them():
    """Chunked draws (stats.resample_counts) are the rows of one multinomial call with the same seed."""
    from pagestats import stats

    counts = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    want = np.random.default_rng(9).multinomial(counts.sum(), counts / counts.sum(), size=37)
    for chunk_size in (1, 8, 50, 10**6):
        chunks = list(stats.resample_counts(counts, 37, np.random.default_rng(9), chunk_size))
        assert max(len(c) for c in chunks) == min(37, max(1, chunk_size // len(counts)))
        np.testing.assert_array_equal(np.vstack(chunks), want)


def test_rows_in_key_order_or_shuffled_give_the_same_bits():
    """The per-input matrices are gathered in key order, or taken as they are when the rows are in
    that order already (columns.sorting_order): both give the same numbers, bit for bit."""
    rng = np.random.default_rng(4)
    frame = pl.DataFrame(_cell(rng, 60, "a") + _cell(rng, 60, "b"))
    ordered = frame.sort("evictor", "run_id", "task", "input_id", "budget")
    shuffled = frame.sample(fraction=1.0, shuffle=True, seed=9)
    assert sorting_order(ordered.filter(pl.col("evictor") == "a"), ["run_id", "task", "input_id", "budget"]) is None
    assert sorting_order(shuffled, ["run_id", "task", "input_id", "budget"]) is not None
    got = [metrics.matched_memory(metrics.relation(f), rng=np.random.default_rng(5), n_boot=300)
           for f in (ordered, shuffled)]
    assert got[0].equals(got[1])


def test_one_product_over_the_four_matrices_sums_as_four_products():
    """_delta_matched takes the four means from one product over the side-by-side matrix: each
    column is summed over the inputs in their order, bit for bit the product of its own matrix."""
    from pagestats import stats

    rng = np.random.default_rng(12)
    for n, m in ((450, 9), (78_000, 9), (31, 3)):
        values = rng.random((n, 4 * m))
        weights = rng.multinomial(n, np.full(n, 1 / n), size=3).astype(np.float64)
        apart = np.hstack([stats.weighted_sums(weights, np.ascontiguousarray(values[:, i * m:(i + 1) * m]))
                           for i in range(4)])
        assert np.array_equal(stats.weighted_sums(weights, values), apart)
