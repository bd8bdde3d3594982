"""The head-agreement profile a_ℓ and the drop D, as pure NumPy functions.

This is the one definition of D shared by the collector (which logs ``drop``) and the
offline replay (which recomputes it), so that replaying the logged defaults reproduces
the logged value bit for bit. It depends only on NumPy.

References
----------
PAGE paper, §3 "Head-Agreement Drop D", Eq. 3; App. F (deployed equal-size bins);
Table 24 (strict-thirds bins); App. A.3.1 (k), A.3.5 (head-pair and layer subsampling).
"""

from __future__ import annotations

import math

import numpy as np

from pagestats.core import defaults


def n_pairs(n_heads: int) -> int:
    """Number of unordered head pairs, H(H−1)/2."""
    return n_heads * (n_heads - 1) // 2


def pair_index(n_heads: int) -> np.ndarray:
    """The (i, j), i < j, head pairs in lexicographic order, shape ``(H(H−1)/2, 2)``.

    This is the order of the pairs inside each layer's block of ``pair_jaccard``.
    """
    i, j = np.triu_indices(n_heads, k=1)
    return np.stack([i, j], axis=1)


def n_heads_from_pairs(n_pairs_per_layer: int) -> int:
    """Invert P = H(H−1)/2; raises if P is not triangular."""
    h = int(round((1 + math.sqrt(1 + 8 * n_pairs_per_layer)) / 2))
    if h * (h - 1) // 2 != n_pairs_per_layer:
        raise ValueError(f"{n_pairs_per_layer} is not H(H-1)/2 for any integer H")
    return h


def bin_layers(
    n_layers: int,
    bin_fraction: float = defaults.BIN_FRACTION,
    convention: str = defaults.BIN_CONVENTION,
) -> tuple[np.ndarray, np.ndarray]:
    """Early and late layer indices for a profile of ``n_layers`` layers.

    Parameters
    ----------
    n_layers : int
        L, the number of layers in the profile (after any layer subsetting).
    bin_fraction : float
        f; each bin holds ⌊f·L⌋ layers (at least one).
    convention : {"deployed", "strict"}
        ``"deployed"`` (App. F): early = [0, ⌊fL⌋), late = [L − ⌊fL⌋, L), equal sizes.
        ``"strict"`` (Table 24): early = [0, ⌊fL⌋), late = [⌊(1−f)L⌋, L).

    Notes
    -----
    For f = 1/3, ⌊fL⌋ is computed as ``L // 3`` exactly (floating ``L * (1/3)`` can land
    just below an integer). The two conventions coincide when 3 | L.
    """
    if n_layers < 2:
        raise ValueError(f"need at least 2 layers to form early/late bins, got {n_layers}")
    if not 0 < bin_fraction <= 0.5:
        raise ValueError(f"bin_fraction must be in (0, 1/2], got {bin_fraction}")
    size = _floor_fraction(n_layers, bin_fraction)
    size = max(size, 1)
    early = np.arange(0, size)
    if convention == "deployed":
        late = np.arange(n_layers - size, n_layers)
    elif convention == "strict":
        start = n_layers - _ceil_complement(n_layers, bin_fraction)
        late = np.arange(min(start, n_layers - 1), n_layers)
    else:
        raise ValueError(f"convention must be 'deployed' or 'strict', got {convention!r}")
    return early, late


def _floor_fraction(n: int, f: float) -> int:
    frac = _as_simple_fraction(f)
    if frac is not None:
        num, den = frac
        return (n * num) // den
    return int(math.floor(n * f + 1e-9))


def _ceil_complement(n: int, f: float) -> int:
    # number of layers in [⌊(1−f)n⌋, n)
    frac = _as_simple_fraction(f)
    if frac is not None:
        num, den = frac
        return n - (n * (den - num)) // den
    return n - int(math.floor(n * (1 - f) + 1e-9))


def _as_simple_fraction(f: float) -> tuple[int, int] | None:
    for den in range(1, 13):
        num = round(f * den)
        if abs(num / den - f) < 1e-12:
            return num, den
    return None


def drop_from_agreement(
    agreement: np.ndarray,
    bin_fraction: float = defaults.BIN_FRACTION,
    convention: str = defaults.BIN_CONVENTION,
) -> np.ndarray:
    """D = mean(a_ℓ, ℓ ∈ early) − mean(a_ℓ, ℓ ∈ late) (Eq. 3), float64.

    Parameters
    ----------
    agreement : array_like, shape (..., L)
        Per-layer agreement a_ℓ (any float dtype; cast to float64 first).
    bin_fraction, convention
        See :func:`bin_layers`.

    Returns
    -------
    numpy.ndarray, shape (...)
        The drop per profile, float64.
    """
    a = np.asarray(agreement, dtype=np.float64)
    early, late = bin_layers(a.shape[-1], bin_fraction, convention)
    return a[..., early].mean(axis=-1) - a[..., late].mean(axis=-1)


def jaccard_from_intersections(intersection: np.ndarray, k: int) -> np.ndarray:
    """Jaccard of two k-sets from their intersection size: |A∩B| / (2k − |A∩B|)."""
    inter = np.asarray(intersection, dtype=np.float64)
    return inter / (2 * k - inter)


def mask_intersections(mask: np.ndarray) -> np.ndarray:
    """|S_{ℓ,i} ∩ S_{ℓ,j}| for every layer and head pair (i < j) of a set mask: the one
    top-k pair-intersection kernel of the collector and the replay.

    Parameters
    ----------
    mask : array, shape (L, H, T)
        One-hot encoding of each (layer, head)'s key set (bool or 0/1).

    Returns
    -------
    numpy.ndarray, shape (L, H(H−1)/2), int64
        Intersection sizes for the pairs of :func:`pair_index`.

    Notes
    -----
    The batched Gram matrix (L, H, T) @ (L, T, H) holds every intersection size at once;
    in float32 the sums of 0/1 products are exact integers up to 2^24, so the result does not
    depend on the BLAS's summation order.
    """
    onehot = np.ascontiguousarray(mask, dtype=np.float32)
    gram = onehot @ onehot.transpose(0, 2, 1)
    pairs = pair_index(onehot.shape[1])
    return np.rint(gram[:, pairs[:, 0], pairs[:, 1]]).astype(np.int64)


def pairwise_intersections(topk: np.ndarray, n_positions: int | None = None) -> np.ndarray:
    """Intersection sizes of every head pair's top-k sets, through :func:`mask_intersections`.

    Parameters
    ----------
    topk : int array, shape (L, H, k)
        Key positions per (layer, head); each row is a set (no repeats).
    n_positions : int, optional
        Number of key positions T (defaults to ``topk.max() + 1``).

    Returns
    -------
    numpy.ndarray, shape (L, H(H−1)/2), int64
        |topk[ℓ, i] ∩ topk[ℓ, j]| for the (i < j) pairs in lexicographic order.
    """
    topk = np.asarray(topk)
    n_layers, n_heads, _ = topk.shape
    t = int(n_positions if n_positions is not None else topk.max() + 1)
    onehot = np.zeros((n_layers, n_heads, t), dtype=np.float32)
    np.put_along_axis(onehot, topk.astype(np.int64), 1.0, axis=2)
    return mask_intersections(onehot)


def agreement_from_topk(topk: np.ndarray, k: int = defaults.TOP_K, n_positions: int | None = None):
    """Per-layer agreement a_ℓ and pair Jaccards from top-k_max index lists truncated to ``k``.

    Parameters
    ----------
    topk : int array, shape (L, H, k_max)
        Key positions in descending score order (ties to the lower position), k ≤ k_max.
    k : int
        Set size (§3: k = 32; App. A.3.1 sweeps it).

    Returns
    -------
    agreement : numpy.ndarray, shape (L,), float64
        Mean Jaccard over head pairs per layer.
    pair_jaccard : numpy.ndarray, shape (L, H(H−1)/2), float64
    """
    topk = np.asarray(topk)
    if k > topk.shape[-1]:
        raise ValueError(f"k={k} exceeds the stored k_max={topk.shape[-1]}")
    inter = pairwise_intersections(topk[..., :k], n_positions)
    jac = jaccard_from_intersections(inter, k)
    return jac.mean(axis=-1), jac
