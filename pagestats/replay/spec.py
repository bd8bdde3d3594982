"""Recompute the gate statistic D from stored logs under any profile spec (§3, Eq. 3).

:class:`ProfileSpec` names a variant of the profile — layer subset, bin fractions, the
strict-thirds convention, a head-pair subset drawn from ``pair_jaccard``, a top-k ``k ≤ k_max``
re-derived from ``topk``, or another profile statistic / logged signal. D is recomputed with the
collector's own functions, so the default spec reproduces the logged ``drop`` bit for bit.

References
----------
PAGE paper, §3 (Eq. 3 D); App. F (deployed bins); Table 24 (strict thirds); App. A.3.1 (k);
A.3.3 (profile statistics); A.3.5 (head-pair subsampling, Table 9; layer subsampling, Table 10).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl

from pagestats.core import defaults
from pagestats.core.columns import input_key, require_columns
from pagestats.core.profile import (
    bin_layers,
    drop_from_agreement,
    jaccard_from_intersections,
    n_heads_from_pairs,
    n_pairs,
    pairwise_intersections,
)
from pagestats.core.schema import INPUT_KEY

#: Named layer subsets of Table 10 (App. A.3.5); explicit index tuples are also accepted.
LAYER_SUBSETS = ("all", "first-half", "second-half", "every-2", "every-4", "early-only", "first-last")
#: Profile statistics computed from a_ℓ (App. A.3.3); any other name is a ``signals`` field.
STATISTICS = ("drop", "late_plateau", "slope", "decreasing_fraction")
_CHUNK = 4096  # inputs per block in the vectorised recomputations (bounds memory)


# --------------------------------------------------------------------------- profile spec


@dataclass(frozen=True)
class ProfileSpec:
    """How D (or another gate statistic) is recomputed from the stored profile.

    Parameters
    ----------
    layers : None, str or tuple of int
        Layer subset (Table 10, App. A.3.5): ``None``/``"all"``; ``"first-half"`` =
        [0, ⌊L/2⌋); ``"second-half"`` = [⌊L/2⌋, L); ``"every-2"`` / ``"every-4"`` = layers
        0, 2, 4, … / 0, 4, 8, …; ``"early-only"`` = the early bin [0, ⌊fL⌋) of the full profile
        (f = ``bin_fraction``); ``"first-last"`` = {0, L−1}; or explicit layer indices.
        On a subset of L' layers the bins are recomputed over the kept layers in depth
        order (:func:`pagestats.core.profile.bin_layers` with L'), so "first-last" gives
        D = a_0 − a_{L−1} and "early-only" contrasts the first and last ⌊fL'⌋ layers of the
        early bin. A subset must keep at least 2 layers.
    bin_fraction : float
        f, each bin holds ⌊fL⌋ layers (1/4, 1/3, 1/2 in the ablations).
    convention : {"deployed", "strict"}
        Equal-size bins (App. F) or strict thirds (Table 24).
    pairs_fraction : float, optional
        Keep a random fraction of the head pairs (Table 9): m = max(1, round(f·P)) of the
        P = H(H−1)/2 pairs, drawn without replacement ``pair_draws`` times. Within one draw the same
        pairs are used for every layer and every input of a model; a_ℓ is the mean of the
        kept pairs' Jaccards (from ``pair_jaccard``, or from ``topk`` when ``k`` is set).
        Draws are seeded by (``seed``, model name), so a model's draws do not depend on which
        other models are loaded. The output gets a ``pair_draw`` column.
    pair_draws : int
        Number of head-pair draws (20 in Table 9).
    seed : int
        Seed of the head-pair draws.
    k : int, optional
        Recompute the pair Jaccards from the stored top-k_max indices truncated to ``k``
        (App. A.3.1); requires ``topk`` logs and k ≤ k_max. a_ℓ is rounded to float32 as the
        collector stores it, so k = the logged k reproduces the logged path.
    statistic : str
        ``"drop"`` (Eq. 3), ``"late_plateau"`` (mean a_ℓ over the late bin), ``"slope"``
        (least-squares slope of a_ℓ on the layer index; negative for a decaying profile),
        ``"decreasing_fraction"`` (fraction of adjacent kept layers with a_{ℓ+1} < a_ℓ),
        App. A.3.3; or the name of a ``signals`` field (Tables 5–6; ``"signals.NAME"`` also
        accepted). Whatever the statistic, the output column is ``drop`` and the gate opens
        iff it is ≥ τ, so thresholds must be on the statistic's own scale and orientation.
    """

    layers: str | tuple[int, ...] | None = None
    bin_fraction: float = defaults.BIN_FRACTION
    convention: str = defaults.BIN_CONVENTION
    pairs_fraction: float | None = None
    pair_draws: int = defaults.PAIR_DRAWS
    seed: int = 0
    k: int | None = None
    statistic: str = "drop"

    def __post_init__(self):
        layers = self.layers
        if isinstance(layers, (list, tuple, np.ndarray)):
            idx = tuple(int(i) for i in layers)
            if any(i < 0 for i in idx) or len(set(idx)) != len(idx):
                raise ValueError(f"explicit layers must be distinct non-negative indices, got {idx}")
            object.__setattr__(self, "layers", tuple(sorted(idx)))
        elif layers is not None and layers not in LAYER_SUBSETS:
            raise ValueError(f"unknown layer subset {layers!r}; expected one of {LAYER_SUBSETS} or indices")
        if not 0 < self.bin_fraction <= 0.5:
            raise ValueError(f"bin_fraction must be in (0, 1/2], got {self.bin_fraction}")
        if self.convention not in ("deployed", "strict"):
            raise ValueError(f"convention must be 'deployed' or 'strict', got {self.convention!r}")
        if self.pairs_fraction is not None and not 0 < self.pairs_fraction <= 1:
            raise ValueError(f"pairs_fraction must be in (0, 1], got {self.pairs_fraction}")
        if int(self.pair_draws) != self.pair_draws or self.pair_draws < 1:
            raise ValueError(f"pair_draws must be a positive integer, got {self.pair_draws}")
        if self.k is not None and (int(self.k) != self.k or self.k < 1):
            raise ValueError(f"k must be a positive integer, got {self.k}")
        if not isinstance(self.statistic, str) or not self.statistic:
            raise ValueError(f"statistic must be a name, got {self.statistic!r}")

    @property
    def is_signal(self) -> bool:
        return self.statistic not in STATISTICS

    @property
    def has_draws(self) -> bool:
        return self.pairs_fraction is not None


def resolve_layers(spec: ProfileSpec, n_layers: int) -> np.ndarray:
    """The layer indices (depth order) that ``spec.layers`` keeps from an L-layer profile."""
    name = spec.layers
    if name is None or name == "all":
        idx = np.arange(n_layers)
    elif isinstance(name, tuple):
        idx = np.asarray(name, dtype=np.int64)
        if idx.size and idx.max() >= n_layers:
            raise ValueError(f"layer index {int(idx.max())} out of range for a {n_layers}-layer profile")
    elif name == "first-half":
        idx = np.arange(0, n_layers // 2)
    elif name == "second-half":
        idx = np.arange(n_layers // 2, n_layers)
    elif name == "every-2":
        idx = np.arange(0, n_layers, 2)
    elif name == "every-4":
        idx = np.arange(0, n_layers, 4)
    elif name == "early-only":
        idx = bin_layers(n_layers, spec.bin_fraction, spec.convention)[0]
    elif name == "first-last":
        idx = np.array([0, n_layers - 1])
    else:  # pragma: no cover - rejected by ProfileSpec
        raise ValueError(name)
    if idx.size < 2:
        raise ValueError(
            f"layer subset {name!r} keeps {idx.size} layer(s) of L={n_layers}; D needs at least 2"
        )
    return idx


def profile_statistic(agreement: np.ndarray, layer_idx: np.ndarray, spec: ProfileSpec) -> np.ndarray:
    """The gate statistic of ``spec`` over the last axis of ``agreement`` restricted to ``layer_idx``.

    Parameters
    ----------
    agreement : array, shape (..., L)
        a_ℓ (float32 as stored, or float64).
    layer_idx : int array
        Kept layers in depth order (:func:`resolve_layers`).

    Returns
    -------
    numpy.ndarray, shape (...), float64
    """
    a = agreement[..., layer_idx]
    if spec.statistic == "drop":
        return drop_from_agreement(a, spec.bin_fraction, spec.convention)
    if spec.statistic == "late_plateau":
        late = bin_layers(a.shape[-1], spec.bin_fraction, spec.convention)[1]
        return a[..., late].astype(np.float64).mean(axis=-1)
    if spec.statistic == "slope":
        x = layer_idx.astype(np.float64)
        xc = x - x.mean()
        # einsum, not BLAS: sums in one fixed order whatever the thread count (bit-identical reruns)
        return np.einsum("...l,l->...", a.astype(np.float64), xc) / np.einsum("l,l->", xc, xc)
    if spec.statistic == "decreasing_fraction":
        return (np.diff(a.astype(np.float64), axis=-1) < 0).mean(axis=-1)
    raise ValueError(f"unknown profile statistic {spec.statistic!r}")  # pragma: no cover


def pair_subsets(n_pairs_per_layer: int, spec: ProfileSpec, model: str) -> np.ndarray:
    """Head-pair subsets of the ``spec.pair_draws`` draws for ``model``: int array (draws, m).

    m = max(1, round(f·P)); each row is sorted, distinct, drawn without replacement from a
    generator seeded by (``spec.seed``, crc32(model)).
    """
    f = spec.pairs_fraction
    m = max(1, int(np.floor(f * n_pairs_per_layer + 0.5)))
    rng = np.random.default_rng([int(spec.seed), zlib.crc32(model.encode("utf-8"))])
    return np.stack([np.sort(rng.choice(n_pairs_per_layer, size=m, replace=False)) for _ in range(spec.pair_draws)])


def topk_pair_jaccard(indices: np.ndarray, k: int) -> np.ndarray:
    """Pair Jaccards of top-k sets from stored top-k_max index lists, vectorised.

    Parameters
    ----------
    indices : int array, shape (N, L, H, k_max)
        Key positions in descending score order (docs/SCHEMA.md).
    k : int
        Set size, k ≤ k_max; the first k positions of each list form the set.

    Returns
    -------
    numpy.ndarray, shape (N, L, H(H−1)/2), float64

    Notes
    -----
    Per (input, layer) the positions are renumbered densely (0 … U−1, U ≤ H·k distinct
    positions) so that the one-hot intersection of
    :func:`pagestats.core.profile.pairwise_intersections` (the collector's definition) needs at
    most H·k columns instead of T; renumbering preserves every intersection exactly. Rows
    are processed in blocks of 256 (input, layer) rows to keep the one-hot block in cache.
    Each stored list must be a set (no repeated position), as docs/SCHEMA.md states.
    """
    n, n_layers, h, k_max = indices.shape
    if k > k_max:
        raise ValueError(f"k={k} exceeds the stored k_max={k_max}")
    rows = indices[..., :k].reshape(n * n_layers, h * k)
    out = np.empty((n * n_layers, n_pairs(h)), dtype=np.float64)
    step = 256  # (input, layer) rows per block: keeps the one-hot block in cache
    for start in range(0, rows.shape[0], step):
        dense = _dense_ranks(rows[start : start + step])
        inter = pairwise_intersections(dense.reshape(-1, h, k), n_positions=int(dense.max()) + 1)
        out[start : start + dense.shape[0]] = jaccard_from_intersections(inter, k)
    return out.reshape(n, n_layers, -1)


def _dense_ranks(block: np.ndarray) -> np.ndarray:
    """Per row, replace each value by its rank among the row's distinct values (0 … U−1).

    One flat sort of (row, value) keys; equal values in a row get equal ranks, so set
    intersections within a row are unchanged.
    """
    n_rows, width = block.shape
    keys = ((np.arange(n_rows, dtype=np.int64)[:, None] << 32) | block.astype(np.int64)).ravel()
    order = np.argsort(keys)
    srt = keys[order]
    new = np.empty(keys.size, dtype=np.int32)
    new[:1] = 0
    np.not_equal(srt[1:], srt[:-1], out=new[1:])
    cum = np.cumsum(new, dtype=np.int32)
    dense = np.empty_like(cum)
    dense[order] = cum
    dense = dense.reshape(n_rows, width)
    return dense - cum[::width][:, None]


def _require(frame: pl.DataFrame | None, cols, what: str) -> None:
    if frame is None:
        raise ValueError(f"{what} is missing from the logs")
    require_columns(frame, cols, what)


def _stack(series: pl.Series, width: int) -> np.ndarray:
    """A list column of equal-length lists as a 2-D array (dtype kept, float32 stays float32)."""
    return series.list.to_array(width).to_numpy()


def _list_width(sub: pl.DataFrame, col: str, model: str) -> int:
    lengths = sub[col].list.len().unique()
    if lengths.len() != 1:
        raise ValueError(f"model {model!r}: {col} has differing lengths {sorted(lengths.to_list())} across inputs")
    return int(lengths[0])


def _topk_array(logs, keys: pl.DataFrame, n_layers: int, model: str) -> np.ndarray:
    topk = logs.topk
    if topk is None:
        raise ValueError("ProfileSpec.k needs top-k index logs (topk/), but none were loaded")
    _require(topk, [*INPUT_KEY, "layer", "head", "indices"], "topk")
    t = topk.join(keys.with_row_index("_row"), on=INPUT_KEY, how="inner").sort(["_row", "layer", "head"])
    n = keys.height
    n_heads = int(t["head"].max()) + 1 if t.height else 0
    have = t["_row"].unique().len() if t.height else 0
    if have != n:
        found = set(t["_row"].unique().to_list()) if t.height else set()
        missing = [keys.row(i) for i in range(n) if i not in found][:3]
        raise ValueError(f"model {model!r}: topk has no rows for {n - have} input(s), e.g. {missing}")
    widths = t["indices"].list.len().unique()
    if widths.len() != 1:
        raise ValueError(f"model {model!r}: topk index lists have differing lengths {sorted(widths.to_list())}")
    k_max = int(widths[0])
    expected_layer = np.tile(np.repeat(np.arange(n_layers), n_heads), n)
    expected_head = np.tile(np.arange(n_heads), n * n_layers)
    if t.height != n * n_layers * n_heads or not (
        np.array_equal(t["layer"].to_numpy(), expected_layer) and np.array_equal(t["head"].to_numpy(), expected_head)
    ):
        raise ValueError(
            f"model {model!r}: topk must hold exactly one row per (input, layer < {n_layers}, head < {n_heads})"
        )
    arr = _stack(t["indices"], k_max).reshape(n, n_layers, n_heads, k_max)
    if arr.size and (arr.min() < 0 or arr.max() >= 2**31 - 1):
        raise ValueError(f"model {model!r}: topk indices must be key positions in [0, 2^31-1)")
    return arr


def _pair_jaccard(logs, sub: pl.DataFrame, n_layers: int, model: str, spec: ProfileSpec) -> np.ndarray:
    if spec.k is not None:
        return topk_pair_jaccard(_topk_array(logs, sub.select(INPUT_KEY), n_layers, model), spec.k)
    width = _list_width(sub, "pair_jaccard", model)
    if width % n_layers:
        raise ValueError(f"model {model!r}: pair_jaccard length {width} is not a multiple of L={n_layers}")
    n_heads_from_pairs(width // n_layers)  # raises if P is not H(H−1)/2
    return _stack(sub["pair_jaccard"], width).reshape(sub.height, n_layers, width // n_layers)


def _imported_drop(sub: pl.DataFrame, model: str, spec: ProfileSpec) -> np.ndarray | None:
    """The logged D of inputs without per-pair Jaccards (runs imported from a release: docs/IMPORT.md)
    under the default spec, where it is the release's own D; ``None`` for collected inputs. Any other
    spec needs what such inputs may lack, and is refused in one line that says what."""
    missing_pairs = sub["pair_jaccard"].null_count() if "pair_jaccard" in sub.columns else 0
    missing = sub["agreement"].null_count()
    if not (missing_pairs or missing):
        return None
    if spec == ProfileSpec():
        return sub["drop"].to_numpy()
    if spec.k is not None or spec.pairs_fraction is not None:
        raise ValueError(f"model {model!r}: {max(missing_pairs, missing)} inputs have no per-pair Jaccards or top-k sets (an "
                         "imported release does not record them), so D cannot be replayed with another k or "
                         "head-pair subset")
    if missing:
        raise ValueError(f"model {model!r}: {missing} inputs have no per-layer agreement profile (an imported "
                         "release has none for them), so D cannot be replayed over another layer subset, bin "
                         "fraction or profile statistic")
    return None


def _model_statistic(logs, sub: pl.DataFrame, model: str, spec: ProfileSpec) -> np.ndarray:
    """Statistic for one model's inputs: shape (N,) or (draws, N)."""
    logged = _imported_drop(sub, model, spec)
    if logged is not None:
        return logged
    n_layers = _list_width(sub, "agreement", model)
    layer_idx = resolve_layers(spec, n_layers)
    if spec.k is None and spec.pairs_fraction is None:
        return profile_statistic(_stack(sub["agreement"], n_layers), layer_idx, spec)
    jac = _pair_jaccard(logs, sub, n_layers, model, spec)
    if spec.pairs_fraction is None:  # k replay, all pairs: a_ℓ as the collector stores it (float32)
        return profile_statistic(jac.mean(axis=-1).astype(np.float32), layer_idx, spec)
    subsets = pair_subsets(jac.shape[-1], spec, model)
    weights = np.zeros((jac.shape[-1], spec.pair_draws))
    for d, chosen in enumerate(subsets):
        weights[chosen, d] = 1.0 / subsets.shape[1]
    out = np.empty((spec.pair_draws, sub.height))
    for start in range(0, sub.height, _CHUNK):
        blk = jac[start : start + _CHUNK].astype(np.float64)
        agreement = np.einsum("nlp,pd->dnl", blk, weights)  # (draws, n, L); no BLAS: fixed sum order
        out[:, start : start + blk.shape[0]] = profile_statistic(agreement, layer_idx, spec)
    return out


def _signal_statistic(inputs: pl.DataFrame, spec: ProfileSpec, columns=()) -> pl.DataFrame:
    name = spec.statistic.removeprefix("signals.")
    if spec.layers not in (None, "all") or spec.pairs_fraction is not None or spec.k is not None:
        raise ValueError(f"statistic {spec.statistic!r} is a stored signal; layers/pairs/k do not apply to it")
    if "signals" not in inputs.columns:
        raise ValueError(f"unknown statistic {spec.statistic!r}: not one of {STATISTICS} and the logs have no signals")
    fields = [f.name for f in inputs.schema["signals"].fields]
    if name not in fields:
        raise ValueError(f"unknown statistic {spec.statistic!r}: not one of {STATISTICS} nor a signals field {fields}")
    out = inputs.select(*INPUT_KEY, *columns, pl.col("signals").struct.field(name).cast(pl.Float64).alias("drop"))
    bad = out.filter(pl.col("drop").is_null() | pl.col("drop").is_nan())
    if bad.height:
        raise ValueError(f"signal {name!r} is null/NaN for {bad.height} input(s), e.g. {bad.select(INPUT_KEY).row(0)}")
    return out


def _statistics(logs, profile: ProfileSpec, columns=()):
    """The checked, key-sorted inputs and, per model, its input keys (and ``columns`` of the inputs)
    and the statistic of ``profile`` (shape (N,), or (draws, N) with head-pair draws)."""
    if not isinstance(profile, ProfileSpec):
        raise TypeError(f"profile must be a ProfileSpec, got {type(profile).__name__}")
    inputs = logs.inputs
    _require(inputs, [*INPUT_KEY, "model", "agreement"], "inputs")
    inputs = inputs.sort(INPUT_KEY)
    if profile.is_signal:
        return inputs, None
    parts = []
    for model in sorted(inputs["model"].unique().to_list()):
        sub = inputs.filter(pl.col("model") == model)
        parts.append((sub.select(*INPUT_KEY, *columns), _model_statistic(logs, sub, model, profile)))
    return inputs, parts


def _drop_frame(inputs: pl.DataFrame, parts, draw: int | None = None) -> pl.DataFrame:
    """The rows of :func:`profile_drop` from :func:`_statistics`: every draw, or only ``draw``."""
    frames = []
    for keys, stat in parts:
        if stat.ndim == 1:
            frames.append(keys.with_columns(pl.Series("drop", stat, dtype=pl.Float64)))
        elif draw is not None:
            frames.append(keys.with_columns(pl.lit(draw, pl.Int64).alias("pair_draw"),
                                            pl.Series("drop", stat[draw], dtype=pl.Float64)))
        else:
            draws = stat.shape[0]
            rep = keys.select(pl.all().repeat_by(draws).explode())
            frames.append(
                rep.with_columns(
                    pl.Series("pair_draw", np.tile(np.arange(draws), keys.height), dtype=pl.Int64),
                    pl.Series("drop", stat.T.ravel(), dtype=pl.Float64),
                )
            )
    out = pl.concat(frames) if frames else pl.DataFrame(schema={**inputs.select(INPUT_KEY).schema, "drop": pl.Float64})
    return out.sort(input_key(out))


def profile_drop(logs, profile: ProfileSpec = ProfileSpec()) -> pl.DataFrame:
    """Recompute the gate statistic D per input (and per head-pair draw) from stored logs.

    Parameters
    ----------
    logs : pagestats.io.Logs
        Only ``logs.inputs`` (``agreement``, ``pair_jaccard``, ``signals``) and, for
        ``profile.k``, ``logs.topk`` are read.
    profile : ProfileSpec

    Returns
    -------
    polars.DataFrame
        ``run_id, task, input_id, [pair_draw], drop`` sorted by input key (then draw).
        ``pair_draw`` (int64) is present iff ``profile.pairs_fraction`` is set.

    Notes
    -----
    Everything is vectorised per model: the list columns are stacked into 2-D/3-D arrays.
    The default spec takes the stored float32 a_ℓ through
    :func:`pagestats.core.profile.drop_from_agreement`, the collector's own function, and so
    reproduces the logged ``drop`` exactly.
    """
    inputs, parts = _statistics(logs, profile)
    if parts is None:
        return _signal_statistic(inputs, profile)
    return _drop_frame(inputs, parts)


def profile_drop_by_draw(logs, profile: ProfileSpec = ProfileSpec(), columns=()) -> Iterator[pl.DataFrame]:
    """:func:`profile_drop` one head-pair draw at a time (Table 9: 20 draws per fraction).

    D is computed once for every draw (an array of draws × inputs); the frame of draw ``d``
    is the rows of :func:`profile_drop` with ``pair_draw == d``, in the same order, so that a
    caller aggregating draw by draw never holds the input keys of every draw. Without
    head-pair draws it yields :func:`profile_drop` itself, once. ``columns`` (names or polars
    expressions over the inputs) are carried beside the keys: the replay's decisions then need
    no join back to the inputs.
    """
    inputs, parts = _statistics(logs, profile, columns)
    if parts is None:
        yield _signal_statistic(inputs, profile, columns)
        return
    if not profile.has_draws:
        yield _drop_frame(inputs, parts)
        return
    for draw in range(profile.pair_draws):
        yield _drop_frame(inputs, parts, draw)
