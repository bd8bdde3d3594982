"""collectors.signals against a brute-force reference (explicit loops, Python sets)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from collectors import signals  # noqa: E402


def brute_topk(scores_row, k):
    """Positions sorted by (−score, position): descending score, ties to the lower position."""
    return sorted(range(len(scores_row)), key=lambda t: (-float(scores_row[t]), t))[:k]


def brute_gate(att, k, k_max, n_early, n_late):
    """Per-layer agreement, per-pair Jaccard, drop, and top-k lists with Python loops and sets."""
    n_layers, n_heads, _ = att.shape
    topk = [[brute_topk(att[l, h], k_max) for h in range(n_heads)] for l in range(n_layers)]
    agreement, pair_jaccard = [], []
    for l in range(n_layers):
        values = []
        for i, j in itertools.combinations(range(n_heads), 2):
            a, b = set(topk[l][i][:k]), set(topk[l][j][:k])
            values.append(len(a & b) / len(a | b))
        pair_jaccard.extend(values)
        agreement.append(sum(values) / len(values))
    early = sum(agreement[:n_early]) / n_early
    late = sum(agreement[n_layers - n_late :]) / n_late
    return np.array(agreement), np.array(pair_jaccard), early - late, np.array(topk)


@pytest.mark.parametrize("shape,k,k_max", [((6, 4, 50), 8, 16), ((9, 5, 200), 32, 128), ((4, 3, 40), 32, 128)])
def test_matches_brute_force(shape, k, k_max):
    rng = np.random.default_rng(7)
    logits = rng.normal(size=shape) * 2
    att = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    att = att.astype(np.float32)
    got = signals.gate_signals(torch.from_numpy(att), k=k, k_max=k_max)
    n_layers = shape[0]
    n_bin = n_layers // 3
    k_eff, k_max_eff = min(k, shape[2]), min(k_max, shape[2])
    agreement, pair_jaccard, drop, topk = brute_gate(att, k_eff, k_max_eff, n_bin, n_bin)
    assert got.topk.dtype == np.int32 and got.topk.shape == (n_layers, shape[1], k_max_eff)
    np.testing.assert_array_equal(got.topk, topk)
    assert got.agreement.dtype == np.float32 and got.pair_jaccard.dtype == np.float32
    np.testing.assert_allclose(got.agreement, agreement, rtol=1e-6)
    np.testing.assert_allclose(got.pair_jaccard, pair_jaccard, rtol=1e-6)
    assert got.pair_jaccard.shape == (n_layers * shape[1] * (shape[1] - 1) // 2,)
    assert math.isclose(got.drop, drop, rel_tol=1e-5, abs_tol=1e-7)
    assert got.k == k_eff
    # the D-only path (sets from the top-k mask, no ordered lists) gives the same float32 profile
    topk_none, agreement_d, pair_jaccard_d = signals.agreement_profile(att, k_eff)
    assert topk_none is None
    np.testing.assert_array_equal(agreement_d, got.agreement)
    np.testing.assert_array_equal(pair_jaccard_d, got.pair_jaccard)


def test_drop_is_bit_exact_replay_of_logged_agreement():
    from pagestats.core import profile

    rng = np.random.default_rng(3)
    att = torch.from_numpy(rng.dirichlet(np.ones(300), size=(30, 9)).astype(np.float32))
    got = signals.gate_signals(att)
    assert got.drop == float(profile.drop_from_agreement(got.agreement))
    # the stored top-k_max lists replay the same float32 agreement
    replayed, _ = profile.agreement_from_topk(got.topk, k=32, n_positions=300)
    np.testing.assert_array_equal(replayed.astype(np.float32), got.agreement)


def test_ties_break_to_lower_position():
    # Crafted ties: head 0 has a 3-way tie at the top, head 1 all-equal scores, head 2 ties in the middle.
    row0 = [0.1, 0.3, 0.0, 0.3, 0.3, 0.0, 0.0, 0.0]
    row1 = [0.125] * 8
    row2 = [0.05, 0.2, 0.05, 0.4, 0.2, 0.05, 0.0, 0.05]
    att = torch.tensor([[row0, row1, row2], [row2, row0, row1]], dtype=torch.float32)
    got = signals.gate_signals(att, k=3, k_max=5)
    assert got.topk[0, 0].tolist() == [1, 3, 4, 0, 2]
    assert got.topk[0, 1].tolist() == [0, 1, 2, 3, 4]
    assert got.topk[0, 2].tolist() == [3, 1, 4, 0, 2]
    for l in range(2):
        for h in range(3):
            assert got.topk[l, h].tolist() == brute_topk(att[l, h].tolist(), 5)
    # layer 0: sets {1,3,4}, {0,1,2}, {3,1,4}: J01 = 1/5, J02 = 3/3, J12 = 1/5
    np.testing.assert_allclose(got.pair_jaccard[:3], [0.2, 1.0, 0.2], rtol=1e-7)


def test_short_prompt_caps_k():
    att = torch.softmax(torch.randn(3, 4, 10, generator=torch.Generator().manual_seed(0)), -1)
    got = signals.gate_signals(att, k=32, k_max=128)
    assert got.topk.shape == (3, 4, 10) and got.k == 10
    np.testing.assert_array_equal(got.agreement, np.ones(3, dtype=np.float32))
    assert got.drop == 0.0


def test_strict_convention_and_bin_fraction():
    rng = np.random.default_rng(11)
    att = torch.from_numpy(rng.dirichlet(np.ones(64) * 0.3, size=(8, 4)).astype(np.float32))
    deployed = signals.gate_signals(att, k=8, k_max=16)
    strict = signals.gate_signals(att, k=8, k_max=16, convention="strict")
    a = deployed.agreement.astype(np.float64)
    # L = 8: early = [0, 2); deployed late = [6, 8), strict late = [5, 8) (⌊2·8/3⌋ = 5)
    assert math.isclose(deployed.drop, a[:2].mean() - a[6:].mean(), rel_tol=1e-12)
    assert math.isclose(strict.drop, a[:2].mean() - a[5:].mean(), rel_tol=1e-12)
    half = signals.gate_signals(att, k=8, k_max=16, bin_fraction=0.5)
    assert math.isclose(half.drop, a[:4].mean() - a[4:].mean(), rel_tol=1e-12)


def test_other_signals_against_loops():
    rng = np.random.default_rng(5)
    L, H, T, k = 6, 3, 60, 8
    att = rng.dirichlet(np.ones(T) * 0.5, size=(L, H))
    got = signals.gate_signals(torch.from_numpy(att.astype(np.float32)), k=k, k_max=16)
    att = att.astype(np.float32).astype(np.float64)
    assert set(got.signals) == set(signals.SIGNAL_DOCS) and len(got.signals) >= 5
    ent = [[-sum(p * math.log(p) for p in att[l, h] / att[l, h].sum() if p > 0) / math.log(T) for h in range(H)] for l in range(L)]
    assert math.isclose(got.signals["entropy_early"], np.mean(ent[:2]), rel_tol=1e-6)
    assert math.isclose(got.signals["entropy_late"], np.mean(ent[4:]), rel_tol=1e-6)
    assert math.isclose(got.signals["sink_mass"], np.mean([att[l, h, :4].sum() for l in range(L) for h in range(H)]), rel_tol=1e-6)
    assert math.isclose(got.signals["recent_mass"], np.mean([att[l, h, -32:].sum() for l in range(L) for h in range(H)]), rel_tol=1e-6)
    tm = [sum(att[l, h, t] for t in brute_topk(att[l, h], k)) for l in range(L) for h in range(H)]
    assert math.isclose(got.signals["topk_mass"], np.mean(tm), rel_tol=1e-6)
    a = got.agreement.astype(np.float64)
    assert math.isclose(got.signals["late_plateau"], a[4:].mean(), rel_tol=1e-12)
    assert math.isclose(got.signals["early_plateau"], a[:2].mean(), rel_tol=1e-12)
    slope = np.polynomial.polynomial.polyfit(np.arange(L) / (L - 1), a, 1)[1]
    assert math.isclose(got.signals["agreement_slope"], slope, rel_tol=1e-9, abs_tol=1e-12)
    assert got.signals["frac_decreasing"] == sum(a[i + 1] < a[i] for i in range(L - 1)) / (L - 1)
    cos = [
        att[l, i] @ att[l, j] / (np.linalg.norm(att[l, i]) * np.linalg.norm(att[l, j]))
        for l in range(L)
        for i, j in itertools.combinations(range(H), 2)
    ]
    assert math.isclose(got.signals["head_cosine"], np.mean(cos), rel_tol=1e-6)
    assert got.gate_ms >= 0


def test_bad_inputs():
    with pytest.raises(ValueError, match="shape"):
        signals.gate_signals(torch.ones(4, 10))
    with pytest.raises(ValueError, match="NaN"):
        signals.gate_signals(torch.full((3, 2, 5), float("nan")))
    with pytest.raises(ValueError, match="k ≤ k_max"):
        signals.gate_signals(torch.ones(3, 2, 50), k=64, k_max=32)
    with pytest.raises(ValueError, match="L ≥ 2"):
        signals.gate_signals(torch.ones(3, 1, 50))


@pytest.mark.parametrize("levels", [3, 20, 1000])
@pytest.mark.parametrize("k_max", [1, 7, 50, 100])
def test_topk_positions_with_many_ties(levels, k_max):
    """Quantised scores: ties inside the selection and at its boundary, both resolved to lower positions."""
    rng = np.random.default_rng(levels * 1000 + k_max)
    scores = rng.integers(0, levels, size=(5, 6, 100)).astype(np.float32) / levels
    got = signals.topk_positions(torch.from_numpy(scores), k_max)
    mask = signals.topk_mask(scores, k_max)
    for l in range(5):
        for h in range(6):
            expected = brute_topk(scores[l, h].tolist(), k_max)
            assert got[l, h].tolist() == expected
            assert np.flatnonzero(mask[l, h]).tolist() == sorted(expected)


def test_topk_positions_negative_zero():
    scores = torch.tensor([[[0.0, -0.0, 0.5, -0.0, 0.0]]])
    assert signals.topk_positions(scores, 4)[0, 0].tolist() == [2, 0, 1, 3]


def test_rejects_negative_and_infinite():
    with pytest.raises(ValueError, match="non-negative"):
        signals.gate_signals(torch.full((3, 2, 5), -0.1))
    with pytest.raises(ValueError, match="finite"):
        signals.gate_signals(torch.full((3, 2, 5), float("inf")))


def test_thread_count_restored():
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        signals.gate_signals(torch.softmax(torch.randn(3, 2, 40), -1), k=4, k_max=8)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
