"""Gate signals from the captured observation window: top-k sets, a_ℓ, pair Jaccards, D, and
other cheap prefill statistics.

Everything is vectorised: one linear-time partition per (layer, head) for the top-k sets with
exact tie-breaking, and the pair intersections through
:func:`pagestats.core.profile.mask_intersections` — one one-hot batched matmul (L, H, T) → (L, H, H),
the same kernel the offline replay uses — with no Python loop over pairs. The drop is computed by
:func:`pagestats.core.profile.drop_from_agreement` on the float32 agreements that are logged, so an
offline replay of the logged defaults reproduces the logged ``drop`` bit for bit.

References
----------
PAGE paper §3 "Head-Agreement Drop D" (Eq. 3: a_ℓ, D); App. F (deployed bins); Table 24 (strict
thirds); App. A.3.1 (k, stored top-k_max); App. A.3.3 (late plateau, slope, monotonicity);
Tables 5–6 (other cheap prefill signals).
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass

import numpy as np
import torch

from pagestats.core import defaults, profile

#: Positions counted as attention sinks by the ``sink_mass`` signal (the protected sinks, App. F).
N_SINK = defaults.N_SINK
#: Recent positions counted by the ``recent_mass`` signal (the protected recent window, App. F).
N_RECENT = defaults.N_RECENT

#: The ``signals`` fields and what each one is (all float64; docs/SCHEMA.md ``signals`` struct).
SIGNAL_DOCS = {
    "entropy_early": "mean over early-bin (layer, head) of the Shannon entropy of ā_{ℓ,h}, divided by log T",
    "entropy_late": "mean over late-bin (layer, head) of the Shannon entropy of ā_{ℓ,h}, divided by log T",
    "sink_mass": "mean over (layer, head) of the window attention on the first 4 positions",
    "recent_mass": "mean over (layer, head) of the window attention on the last 32 positions",
    "topk_mass": "mean over (layer, head) of the window attention inside that head's top-k set",
    "early_plateau": "mean a_ℓ over the early bin",
    "late_plateau": "mean a_ℓ over the late bin (App. A.3.3)",
    "agreement_slope": "least-squares slope of a_ℓ on relative depth ℓ/(L−1) (App. A.3.3)",
    "frac_decreasing": "fraction of adjacent layer pairs with a_{ℓ+1} < a_ℓ (App. A.3.3)",
    "head_cosine": "mean over layers and head pairs of the cosine similarity of ā_{ℓ,h} and ā_{ℓ,h'}",
}


def _single_threaded(fn):
    """Run ``fn`` with one intra-op torch thread, restoring the previous count afterwards.

    The gate works on a few hundred thousand floats: a handful of millisecond-scale ops whose
    cost is dominated by thread hand-offs when torch uses several threads, and by far when the
    cores are oversubscribed (measured in bench/gate_signal.py: 2 threads on a busy 2-core machine
    were ~15× slower than 1).
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        previous = torch.get_num_threads()
        with contextlib.ExitStack() as stack:
            if previous != 1:
                torch.set_num_threads(1)
                stack.callback(torch.set_num_threads, previous)
            return fn(*args, **kwargs)

    return wrapper


@dataclass
class GateSignals:
    """The gate's inputs for one prompt (docs/SCHEMA.md ``inputs`` and ``topk`` rows).

    Attributes
    ----------
    agreement : numpy.ndarray, shape (L,), float32
        a_ℓ, mean Jaccard of the top-k sets over the head pairs of layer ℓ (Eq. 3).
    pair_jaccard : numpy.ndarray, shape (L·H(H−1)/2,), float32
        Layer-major, pairs (i < j) in lexicographic order (:func:`pagestats.core.profile.pair_index`).
    drop : float
        D = :func:`pagestats.core.profile.drop_from_agreement` of ``agreement`` (float32) (Eq. 3).
    topk : numpy.ndarray, shape (L, H, k_max), int32
        Key positions of ā_{ℓ,h}, descending score, ties to the lower position.
    signals : dict[str, float]
        Other cheap prefill statistics, see :data:`SIGNAL_DOCS`.
    gate_ms : float
        Wall time of this computation, milliseconds.
    k : int
        The set size used (``min(k, T)``).
    """

    agreement: np.ndarray
    pair_jaccard: np.ndarray
    drop: float
    topk: np.ndarray
    signals: dict
    gate_ms: float
    k: int = defaults.TOP_K


def topk_mask(window_attention, k: int) -> np.ndarray:
    """Boolean (L, H, T) mask of each (layer, head)'s top-k key positions, exactly k per row.

    Ties go to the lower position: every position scoring above the k-th largest value v is in,
    and of the positions scoring exactly v the lowest ones fill the remaining places.

    Notes
    -----
    One ``numpy.partition`` finds v per row (linear-time selection, no sort); two comparisons
    give the positions above and at v; a cumulative count over the tied positions is needed only
    when some row has more positions tied at v than places left.
    """
    a = np.asarray(window_attention)
    n_positions = a.shape[-1]
    kth = np.partition(a, n_positions - k, axis=-1)[..., n_positions - k, None]
    above = a > kth
    tied = a == kth
    places = k - above.sum(-1, keepdims=True)
    if np.array_equal(tied.sum(-1, keepdims=True), places):
        return above | tied
    return above | (tied & (np.cumsum(tied, axis=-1) <= places))


def topk_positions(window_attention, k_max: int) -> np.ndarray:
    """The ``k_max`` highest-scoring key positions per (layer, head), shape (L, H, k_max), int64.

    Descending score; ties go to the lower position.

    Notes
    -----
    The set comes from :func:`topk_mask`; ``numpy.nonzero`` lists each row's k_max positions in
    ascending order, and a stable sort on −score then orders them by (−score, position).
    """
    a = np.asarray(window_attention)
    mask = topk_mask(a, k_max)
    positions = np.nonzero(mask)[-1].reshape(*a.shape[:-1], k_max)
    values = np.take_along_axis(a, positions, axis=-1)
    order = np.argsort(-values, axis=-1, kind="stable")
    return np.take_along_axis(positions, order, axis=-1)


def _agreement(inter: np.ndarray, k: int):
    """float32 a_ℓ and layer-major float32 pair Jaccards from (L, P) intersection sizes.

    |A∩B| / (2k − |A∩B|) and the pair mean in float64, exactly as
    :func:`pagestats.core.profile.agreement_from_topk` computes them, then cast to float32.
    """
    jaccard = profile.jaccard_from_intersections(inter, k)
    return jaccard.mean(axis=-1).astype(np.float32), jaccard.astype(np.float32).reshape(-1)


@_single_threaded
def agreement_profile(window_attention, k: int, k_max: int | None = None):
    """Top-k_max lists, a_ℓ and pair Jaccards of ā (L, H, T) (§3, Eq. 3).

    Parameters
    ----------
    window_attention : numpy.ndarray or torch.Tensor, (L, H, T) float32, finite, non-negative
    k : int
        Set size of the agreement (≤ T).
    k_max : int or None
        Number of ordered positions to return (k ≤ k_max ≤ T); ``None`` skips the lists and
        computes only the agreement (the gate's D path).

    Returns
    -------
    topk : numpy.ndarray (L, H, k_max) int64, or None
    agreement : numpy.ndarray, (L,) float32
    pair_jaccard : numpy.ndarray, (L·P,) float32, layer-major

    Notes
    -----
    Replaying the stored lists with :func:`pagestats.core.profile.agreement_from_topk` gives the same
    intersections and therefore the same float32 agreements, bit for bit.
    """
    a = window_attention.numpy() if isinstance(window_attention, torch.Tensor) else np.asarray(window_attention)
    if k_max is None:
        agreement, pair_jaccard = _agreement(profile.mask_intersections(topk_mask(a, k)), k)
        return None, agreement, pair_jaccard
    topk = topk_positions(a, k_max)
    agreement, pair_jaccard = _agreement(profile.pairwise_intersections(topk[..., :k], a.shape[-1]), k)
    return topk, agreement, pair_jaccard


@_single_threaded
def gate_signals(
    window_attention,
    *,
    k: int = defaults.TOP_K,
    k_max: int = defaults.K_MAX,
    bin_fraction: float = defaults.BIN_FRACTION,
    convention: str = defaults.BIN_CONVENTION,
) -> GateSignals:
    """Agreement profile, pair Jaccards, drop D, stored top-k and other signals from ā.

    Parameters
    ----------
    window_attention : torch.Tensor or numpy.ndarray, shape (L, H, T)
        ā_{ℓ,h} from :func:`collectors.capture.prefill` (§3).
    k : int
        Top-k set size of the agreement (§3: k = 32).
    k_max : int
        Number of top positions stored per (layer, head) for offline replay of any k ≤ k_max
        (docs/SCHEMA.md; App. A.3.1).
    bin_fraction, convention
        Early/late bins of D, see :func:`pagestats.core.profile.bin_layers`.

    Returns
    -------
    GateSignals

    Notes
    -----
    Short prompts: when T < k_max only T positions exist, so ``topk`` has ``min(k_max, T)``
    columns; likewise the agreement uses k' = min(k, T) (with k' = T every set is the whole
    prompt and every Jaccard is 1). The Jaccard of two k'-sets is |A∩B| / (2k' − |A∩B|),
    computed in float64 exactly as :func:`pagestats.core.profile.agreement_from_topk` does, averaged
    over pairs, then cast to float32 for the log; D is computed from that float32 vector.
    """
    start = time.perf_counter()
    att = torch.as_tensor(window_attention).detach().to("cpu", torch.float32)
    if att.ndim != 3:
        raise ValueError(f"window_attention must have shape (L, H, T), got {tuple(att.shape)}")
    n_layers, n_heads, n_tokens = att.shape
    if n_layers < 2 or n_heads < 2 or n_tokens < 1:
        raise ValueError(f"need L ≥ 2 layers, H ≥ 2 heads and T ≥ 1 positions, got {tuple(att.shape)}")
    low, high = torch.aminmax(att)
    if not (bool(low >= 0) and bool(high < float("inf"))):  # NaN fails both comparisons
        raise ValueError("window_attention must be finite and non-negative (attention probabilities); found NaN, inf or negative values")
    if k < 1 or k_max < k:
        raise ValueError(f"need 1 ≤ k ≤ k_max, got k={k}, k_max={k_max}")
    k_eff = min(k, n_tokens)
    k_max_eff = min(k_max, n_tokens)

    topk, agreement, pair_jaccard = agreement_profile(att, k_eff, k_max_eff)
    drop = float(profile.drop_from_agreement(agreement, bin_fraction, convention))
    signals = _other_signals(att, torch.from_numpy(topk[..., :k_eff]), agreement, bin_fraction, convention)
    gate_ms = (time.perf_counter() - start) * 1e3
    return GateSignals(
        agreement=agreement,
        pair_jaccard=pair_jaccard,
        drop=drop,
        topk=topk.astype(np.int32),
        signals=signals,
        gate_ms=gate_ms,
        k=k_eff,
    )


def _other_signals(att, topk, agreement, bin_fraction, convention) -> dict:
    """The statistics of :data:`SIGNAL_DOCS`, float64 scalars.

    Elementwise work stays in float32 (one pass each over the (L, H, T) tensor); reductions
    accumulate in float64.
    """
    n_layers, n_heads, n_tokens = att.shape
    early, late = profile.bin_layers(n_layers, bin_fraction, convention)
    f64 = torch.float64
    row_sum = att.sum(-1, dtype=f64)  # (L, H), 1 up to rounding
    # H(p) with p = a / Σa:  H = log Σa − Σ a log a / Σa
    a_log_a = torch.special.entr(att).sum(-1, dtype=f64)  # −Σ a log a
    entropy = a_log_a / row_sum + torch.log(row_sum)
    entropy = entropy / np.log(n_tokens) if n_tokens > 1 else torch.zeros_like(entropy)
    sink = att[..., :N_SINK].sum(-1, dtype=f64)
    recent = att[..., -N_RECENT:].sum(-1, dtype=f64)
    topk_mass = torch.gather(att, 2, topk).sum(-1, dtype=f64)
    gram = torch.bmm(att, att.transpose(1, 2)).to(f64)  # (L, H, H)
    norms = torch.sqrt(torch.diagonal(gram, dim1=1, dim2=2)).clamp_min(1e-30)
    i, j = torch.triu_indices(n_heads, n_heads, offset=1)
    cosine = gram[:, i, j] / (norms[:, i] * norms[:, j])
    ag = agreement.astype(np.float64)
    depth = np.arange(n_layers) / (n_layers - 1)
    depth_c = depth - depth.mean()
    slope = float(depth_c @ (ag - ag.mean()) / (depth_c @ depth_c))
    return {
        "entropy_early": float(entropy[early].mean()),
        "entropy_late": float(entropy[late].mean()),
        "sink_mass": float(sink.mean()),
        "recent_mass": float(recent.mean()),
        "topk_mass": float(topk_mass.mean()),
        "early_plateau": float(ag[early].mean()),
        "late_plateau": float(ag[late].mean()),
        "agreement_slope": slope,
        "frac_decreasing": float(np.mean(np.diff(ag) < 0)),
        "head_cosine": float(cosine.mean()),
    }
