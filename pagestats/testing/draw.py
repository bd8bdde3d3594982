"""Drawing of one synthetic cell: depth profile, slot-sharing bits (probability σ_ℓ), top-k
lists and outcomes, from one child stream per component (the generative rule is in
:mod:`pagestats.testing.synthetic`).

References
----------
PAGE paper: §3 "Head-Agreement Drop D" (Eq. 3), App. F (deployed bins); docs/COLLECTION.md and
App. A.2.3 (kept count: protection overrides the budget).
"""

from __future__ import annotations

import numpy as np

from pagestats.core import defaults, profile

_WORD_CHUNK = 1 << 20  # sharing words (or pair words) per chunk (bounds peak memory)
#: Binary digits of the slot-sharing probability σ_ℓ (σ is a multiple of 2^-SIGMA_BITS).
SIGMA_BITS = 10
_POPCOUNT8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def profile_shape(n_layers: int) -> np.ndarray:
    """Linear depth shape s_ℓ with early-bin mean 1 and late-bin mean 0 (deployed bins, App. F)."""
    s = 1.0 - np.arange(n_layers) / (n_layers - 1)
    early, late = profile.bin_layers(n_layers)
    return (s - s[late].mean()) / (s[early].mean() - s[late].mean())


def _draw_cell(ss, *, spec, ctx, n, task_class, m, evictors, budgets, effect, k_max, with_topk) -> dict:
    """All numeric arrays of one (model, context, draw, task) cell."""
    rng_profile, rng_topk, rng_outcome, rng_text, rng_signal = (np.random.default_rng(s) for s in ss.spawn(5))
    ce = effect.for_class(task_class)
    L, H, k = spec.n_layers, spec.n_heads, defaults.TOP_K
    n_tokens = ctx - rng_profile.integers(0, max(1, ctx // 64), size=n)

    # target profile and per-pair overlap probability π_ℓ
    d = rng_profile.normal(ce.drop_mean, ce.drop_sd, size=n)
    base = rng_profile.uniform(ce.level_low, ce.level_high, size=n)
    target = np.clip(base[:, None] + d[:, None] * profile_shape(L)[None, :], 0.005, 0.95)
    pi = 2.0 * target / (1.0 + target)

    top = 2**SIGMA_BITS - 1
    sigma = np.clip(np.rint(np.sqrt(pi) * 2**SIGMA_BITS), 1, top).astype(np.int64)  # σ = sigma / 2^SIGMA_BITS
    agreement, pair_jaccard, bits = _draw_profile(rng_profile, sigma, H, k, keep_bits=with_topk)
    indices = _draw_topk(rng_topk, bits, sigma, n_tokens, k_max) if with_topk else None
    drop = profile.drop_from_agreement(agreement)

    # outcomes
    E, B = len(evictors), len(budgets)
    b = np.asarray(budgets)
    full_correct = rng_outcome.random(n) < ce.p_full
    full_j = np.where(full_correct, m, rng_outcome.integers(0, m, size=n))
    u = rng_outcome.random((n, E))
    v = rng_outcome.random((n, E))
    harm_j = rng_outcome.integers(0, m, size=(n, E, B))
    h = np.stack([effect.harm_probability(task_class, b, e) for e in evictors])  # (E, B)
    r = effect.recovery_probability(task_class, b)  # (B,)
    harmed = full_correct[:, None, None] & (u[:, :, None] < h[None])
    recovered = ~full_correct[:, None, None] & (v[:, :, None] < r[None, None, :])
    j = np.where(harmed, harm_j, np.where(recovered, m, full_j[:, None, None]))
    n_kept = np.maximum(np.floor(b[None, :] * n_tokens[:, None]), defaults.N_SINK + defaults.N_RECENT)
    n_kept = np.broadcast_to(n_kept.astype(np.int64)[:, None, :], (n, E, B))

    # text (drawn even when unused so with_text changes nothing else) and signals
    ref_base = rng_text.integers(0, 9_000_000, size=n)
    references = 1_000_000 + (ref_base[:, None] + 1_299_709 * np.arange(m)[None, :]) % 9_000_000

    dil = float(task_class == defaults.DILUTION_PRONE)
    signals = {
        "attention_entropy": 4.0 + 0.8 * dil + rng_signal.normal(0, 0.4, n),
        "top1_mass": 0.25 - 0.08 * dil + rng_signal.normal(0, 0.05, n),
        "sink_mass": rng_signal.uniform(0.1, 0.5, n),
        "key_norm_cv": rng_signal.lognormal(-1.0, 0.3, n),
        "mean_agreement": agreement.astype(np.float64).mean(axis=-1),
    }
    prefill_ms = n_tokens * L * H * 2e-4 * np.exp(rng_signal.normal(0, 0.05, n))
    gate_ms = L * H * H * k * 1e-5 * np.exp(rng_signal.normal(0, 0.1, n))
    decode_ms = (20.0 + 2e-3 * n_kept) * np.exp(rng_signal.normal(0, 0.05, (n, E, B)))
    return {
        "n": n,
        "L": L,
        "H": H,
        "m": m,
        "n_tokens": n_tokens.astype(np.int64),
        "agreement": agreement,
        "pair_jaccard": pair_jaccard,
        "drop": drop,
        "full_j": full_j,
        "j": j,
        "n_kept": n_kept,
        "references": references,
        "signals": signals,
        "prefill_ms": prefill_ms,
        "gate_ms": gate_ms,
        "decode_ms": decode_ms,
        "indices": indices,
    }


def _sharing_words(rng, sigma: np.ndarray, n_heads: int, n_slots: int) -> np.ndarray:
    """Slot-sharing bits packed in uint32 words, shape (n, L, H, ⌈n_slots/32⌉).

    Bit s of a head's words is 1 with probability ``sigma / 2^SIGMA_BITS`` (``sigma`` an
    integer array (n, L)), independently per bit: the dyadic digits of σ are folded in from
    the least significant one, ``x ← d_j ? (w | x) : (w & x)`` with a fresh fair word ``w``
    per digit, so that Pr[bit] = (d_j + Pr_before)/2 at each step.
    """
    n, L = sigma.shape
    n_words = -(-n_slots // 32)
    shape = (n, L, n_heads, n_words)
    raw = rng.integers(0, 2**32, size=(SIGMA_BITS, *shape), dtype=np.uint32)
    x = np.zeros(shape, dtype=np.uint32)
    for j in range(SIGMA_BITS):
        keep = np.where((sigma >> j) & 1, np.uint32(0xFFFFFFFF), np.uint32(0))[:, :, None, None]
        w = raw[j]
        either = w | x
        either &= keep
        x &= w
        x |= either
    if n_slots % 32:
        x[..., -1] &= np.uint32((1 << (n_slots % 32)) - 1)
    return x


def _unpack(words: np.ndarray, n_slots: int) -> np.ndarray:
    """Sharing words → bool (n, L, H, n_slots), slot s = bit s."""
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :n_slots].astype(bool)


def _intersections(words: np.ndarray) -> np.ndarray:
    """|S_h ∩ S_g| of the shared-slot sets of every (i<j) head pair, (n, L, P) int64, by popcount."""
    pairs = profile.pair_index(words.shape[2])
    both = np.ascontiguousarray(words[:, :, pairs[:, 0]] & words[:, :, pairs[:, 1]])
    if hasattr(np, "bitwise_count"):  # NumPy ≥ 2.0
        count = np.bitwise_count(both)
    else:
        count = _POPCOUNT8[both.view(np.uint8)].reshape(*both.shape[:-1], -1)
    if count.shape[-1] == 1:
        return count[..., 0].astype(np.int64)
    return count.sum(axis=-1, dtype=np.int64)


def _stored_profile(inter: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(agreement float32 (n, L), pair_jaccard float32 (n, L·P)) from intersections (n, L, P).

    Same arithmetic as :func:`pagestats.core.profile.agreement_from_topk`: Jaccard in float64,
    layer mean in float64, then stored as float32.
    """
    jac = profile.jaccard_from_intersections(inter, k)
    return jac.mean(axis=-1).astype(np.float32), jac.astype(np.float32).reshape(inter.shape[0], -1)


def _draw_profile(rng, sigma: np.ndarray, n_heads: int, k: int, keep_bits: bool):
    """Sharing bits of the first k slots, drawn in input chunks; stored profiles (+ the bits)."""
    n, L = sigma.shape
    P = profile.n_pairs(n_heads)
    agreement = np.empty((n, L), dtype=np.float32)
    pair_jaccard = np.empty((n, L * P), dtype=np.float32)
    bits = np.empty((n, L, n_heads, k), dtype=bool) if keep_bits else None
    step = max(1, _WORD_CHUNK // (L * max(P, n_heads) * -(-k // 32)))
    for start in range(0, n, step):
        sl = slice(start, start + step)
        words = _sharing_words(rng, sigma[sl], n_heads, k)
        agreement[sl], pair_jaccard[sl] = _stored_profile(_intersections(words), k)
        if keep_bits:
            bits[sl] = _unpack(words, k)
    return agreement, pair_jaccard, bits


def _draw_topk(rng, shared_k, sigma, n_tokens, k_max) -> np.ndarray:
    """Top-k_max lists (n, L, H, k_max) int32 from the first-k sharing bits plus new slots k..k_max."""
    n, L, H, k = shared_k.shape
    extra = _unpack(_sharing_words(rng, sigma, H, k_max - k), k_max - k) if k_max > k else shared_k[..., :0]
    shared = np.concatenate([shared_k, extra], axis=-1)
    size = (H + 1) * k_max
    gap = n_tokens // size  # ≥ 1, checked by the caller
    inc = rng.integers(1, gap[:, None, None] + 1, size=(n, L, size))
    pool = np.cumsum(inc, axis=-1)
    offset = rng.integers(0, n_tokens[:, None] - pool[..., -1] + 1)  # keeps max position ≤ T−1
    pool += offset[..., None] - 1
    pool = rng.permuted(pool, axis=-1)
    anchors = pool[..., :k_max]
    private = pool[..., k_max:].reshape(n, L, H, k_max)
    return np.where(shared, anchors[:, :, None, :], private).astype(np.int32)
