"""Effects of the gate: Δ with its cluster-bootstrap intervals, Δ(f), the oracle gap,
kept-KV, compression and static batching (Tables 2, 12, 14, 22, 23, 28; Fig. 7).

Pure functions of the replay frames; conventions in :mod:`pagestats.metrics`, which
re-exports everything here.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats import defaults, stats
from pagestats._frames import CELL, _arm, _input_key, _outcome_rows, _uniq, _unit_key

__all__ = [
    "delta",
    "delta_bootstrap",
    "delta_of_f",
    "oracle_gap",
    "kept_kv",
    "compression",
    "static_batching",
]


def delta(frame: pl.DataFrame, by=CELL) -> pl.DataFrame:
    """Gating Δ: mean over inputs and budgets b < 1 of ``score_gated − score_plain`` (Table 2).

    Add ``task`` to ``by`` for the per-task breakdown (Table 12).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``delta``, ``n_inputs`` (units), ``n_rows``.
    """
    rows, by = _outcome_rows(frame, by, ["score_gated", "score_plain"], "delta")
    out = rows.group_by(by).agg(
        (pl.col("score_gated") - pl.col("score_plain")).mean().alias("delta"),
        pl.struct(_unit_key(rows)).n_unique().cast(pl.Int64).alias("n_inputs"),
        pl.len().cast(pl.Int64).alias("n_rows"),
    )
    return out.sort(by)


def delta_bootstrap(
    frame: pl.DataFrame,
    by=CELL,
    *,
    rng: np.random.Generator,
    n_boot: int = defaults.N_BOOTSTRAP,
    confidence_level: float = defaults.CONFIDENCE_LEVEL,
    q: float = defaults.FDR_Q,
    shared_inputs: bool = False,
) -> pl.DataFrame:
    """Δ per cell with cluster-bootstrap intervals and BH-adjusted p-values (Table 28).

    Each group of ``by`` is a cell; its units (inputs) carry their per-budget paired
    differences ``score_gated − score_plain`` over budgets b < 1 into
    :func:`pagestats.stats.cluster_bootstrap` (cells in ``by`` order, one ``rng``).
    Benjamini–Hochberg at ``q`` runs across all cells of the call (:func:`pagestats.stats.bh`).
    ``shared_inputs=True`` resamples the inputs jointly across cells (see
    :func:`~pagestats.stats.cluster_bootstrap`); every cell must then hold the same inputs.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``delta``, ``low``, ``high``, ``p_value``, ``p_adjusted``,
        ``rejected``, ``n_inputs``, ``n_budgets``, ``n_boot``.

    Raises
    ------
    ValueError
        A cell whose units do not all carry the same set of budgets (the bootstrap needs
        a balanced grid so that Δ is the mean of per-input means).
    """
    rows, by = _outcome_rows(frame, by, ["score_gated", "score_plain"], "delta_bootstrap")
    unit = _unit_key(rows)
    rows = rows.with_columns((pl.col("score_gated") - pl.col("score_plain")).alias("_d")).sort(
        _uniq(by, unit, ["budget"])
    )
    keys, cells, inputs = [], [], []
    for part in rows.partition_by(by, maintain_order=True):
        n_units = part.select(pl.struct(unit).n_unique()).item()
        n_budgets = part["budget"].n_unique()
        per_unit = part.group_by(unit).agg(pl.col("budget").sort())
        if part.height != n_units * n_budgets or per_unit["budget"].n_unique() != 1:
            label = part.select(by).row(0, named=True)
            raise ValueError(f"delta_bootstrap: cell {label} has units with different budget sets")
        keys.append(part.select(by).head(1))
        cells.append(part["_d"].to_numpy().reshape(n_units, n_budgets))
        if shared_inputs:
            inputs.append(part.select(_input_key(part)).unique(maintain_order=True))
    if shared_inputs and any(not x.equals(inputs[0]) for x in inputs[1:]):
        raise ValueError("delta_bootstrap: shared_inputs=True but the cells do not hold the same inputs")
    if not cells:
        schema = {**{c: frame.schema[c] for c in by}, "delta": pl.Float64, "low": pl.Float64,
                  "high": pl.Float64, "p_value": pl.Float64, "p_adjusted": pl.Float64,
                  "rejected": pl.Boolean, "n_inputs": pl.Int64, "n_budgets": pl.Int64, "n_boot": pl.Int64}
        return pl.DataFrame(schema=schema)
    res = stats.cluster_bootstrap(
        cells, rng=rng, n_boot=n_boot, confidence_level=confidence_level, shared_inputs=shared_inputs
    )
    adj = stats.bh(res.p_value, q=q)
    return pl.concat(keys).with_columns(
        pl.Series("delta", res.estimate),
        pl.Series("low", res.low),
        pl.Series("high", res.high),
        pl.Series("p_value", res.p_value),
        pl.Series("p_adjusted", adj.adjusted),
        pl.Series("rejected", adj.rejected),
        pl.Series("n_inputs", res.n_inputs),
        pl.Series("n_budgets", res.n_budgets),
        pl.lit(res.n_boot, pl.Int64).alias("n_boot"),
    )


def delta_of_f(delta_capacity, delta_rest, f):
    """Δ as a function of the capacity-bound share ``f`` of the workload (§4.1, Fig. 7).

    ``Δ(f) = f·Δ_capacity + (1 − f)·Δ_rest``, vectorised (NumPy broadcasting) over all
    three arguments; per-task accuracy is additive under reweighting, so this is exact
    for a workload mixing the two classes in proportion ``f``.
    """
    f = np.asarray(f, dtype=np.float64)
    if not np.all((f >= 0) & (f <= 1)):
        raise ValueError("f must lie in [0, 1]")
    out = f * np.asarray(delta_capacity, dtype=np.float64) + (1.0 - f) * np.asarray(delta_rest, dtype=np.float64)
    return out.item() if out.ndim == 0 else out


def oracle_gap(frame_gate_policy: pl.DataFrame, frame_oracle: pl.DataFrame, by=CELL) -> pl.DataFrame:
    """Δ of a gate policy minus Δ of the task-label oracle per cell (§4.1, App. A.4.3, Table 14).

    Both frames are gated outcomes of the same logs, under the policy and under
    :class:`pagestats.policies.TaskOracle` (close on capacity-bound tasks, open elsewhere).
    A gap of exactly 0 means the gate reproduced the oracle's decisions; positive needs
    within-task per-input variation.

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``delta_policy``, ``delta_oracle``, ``gap``, ``n_inputs``.
    """
    a = delta(frame_gate_policy, by).rename({"delta": "delta_policy"})
    b = delta(frame_oracle, by).rename({"delta": "delta_oracle"})
    by = [by] if isinstance(by, str) else list(by)
    if a.height != b.height or a.join(b, on=by, how="anti", nulls_equal=True).height:
        raise ValueError("oracle_gap: the two frames do not cover the same cells")
    out = a.join(b.select(*by, "delta_oracle"), on=by, nulls_equal=True)
    return out.select(*by, "delta_policy", "delta_oracle", (pl.col("delta_policy") - pl.col("delta_oracle")).alias("gap"),
                      "n_inputs").sort(by)


def kept_kv(frame: pl.DataFrame, by=CELL, arm: str = "gated") -> pl.DataFrame:
    """Achieved kept-KV and compression of an arm (App. A.6.2, Table 22).

    ``kept_kv`` = mean over rows (inputs × budgets b < 1 in the group) of
    ``n_kept / n_tokens``; put ``budget`` in ``by`` for one budget, leave it out for the
    paper's "grid mean" over the budget grid. ``compression = 1 / kept_kv``.
    ``kept_kv_open`` is the same mean over gate-open rows only (Table 23's ``k_open``).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``kept_kv``, ``compression``, ``kept_kv_open``, ``n_rows``, ``n_open_rows``.
    """
    _, kept = _arm(arm)
    rows, by = _outcome_rows(frame, by, [kept, "n_tokens", "gate_open"], "kept_kv")
    if (rows["n_tokens"] <= 0).any():
        raise ValueError("kept_kv: n_tokens must be positive")
    frac = pl.col(kept) / pl.col("n_tokens")
    out = rows.group_by(by).agg(
        frac.mean().alias("kept_kv"),
        frac.filter(pl.col("gate_open")).mean().alias("kept_kv_open"),
        pl.len().cast(pl.Int64).alias("n_rows"),
        pl.col("gate_open").sum().cast(pl.Int64).alias("n_open_rows"),
    )
    out = out.with_columns((1.0 / pl.col("kept_kv")).alias("compression"))
    return out.select(*by, "kept_kv", "compression", "kept_kv_open", "n_rows", "n_open_rows").sort(by)


def compression(frame: pl.DataFrame, by=CELL, arm: str = "gated") -> pl.DataFrame:
    """Achieved compression ``1 / kept-KV`` (Table 22): :func:`kept_kv`'s by-columns,
    ``compression`` and ``kept_kv``."""
    return kept_kv(frame, by, arm).select(*([by] if isinstance(by, str) else by), "compression", "kept_kv")


def static_batching(p_open, kept_open, batch_sizes=(1, 2, 4, 8, 16, 32)) -> pl.DataFrame:
    """Compression under static batch provisioning (App. A.6.2, Table 23).

    A batch of ``B`` sequences is provisioned for its largest resident cache: one
    gate-closed sequence forces the whole batch to the full cache.

    Parameters
    ----------
    p_open, kept_open : float or array_like
        Gate-open fraction and mean kept-KV fraction of gate-open inputs (Table 22);
        arrays are paired element-wise (one entry per model).
    batch_sizes : sequence of int

    Returns
    -------
    polars.DataFrame
        ``p_open``, ``kept_open``, ``batch_size``, ``p_all_open``, ``provisioned``
        (expected provisioned fraction of the full cache) and ``compression``.

    Notes
    -----
    With independent gate decisions, every sequence of the batch is provisioned at the
    full cache (fraction 1) unless all ``B`` gates open, which happens with probability
    ``p_open^B``; then the batch is provisioned at ``kept_open``:
    ``provisioned(B) = (1 − p_open^B) + p_open^B · kept_open`` and
    ``compression(B) = 1 / provisioned(B)`` (expected memory, not expected ratio). At
    ``B = 1`` this is Table 22's realized compression ``1 / ((1 − p_open) + p_open·k_open)``;
    as ``B`` grows it decays to 1× (``p_open = 0.75``, ``k_open = 0.0625``: 3.37× at
    ``B = 1``, 1.01× at ``B = 16``).
    """
    p = np.atleast_1d(np.asarray(p_open, dtype=np.float64))
    k = np.atleast_1d(np.asarray(kept_open, dtype=np.float64))
    p, k = np.broadcast_arrays(p, k)
    b = np.asarray(batch_sizes)
    if b.ndim != 1 or b.size == 0 or not np.issubdtype(b.dtype, np.integer) or np.any(b < 1):
        raise ValueError("batch_sizes must be a non-empty sequence of positive integers")
    for name, v in (("p_open", p), ("kept_open", k)):
        if not np.all((v >= 0) & (v <= 1)):
            raise ValueError(f"{name} must lie in [0, 1]")
    pp, bb = np.meshgrid(p, b, indexing="ij")
    kk = np.broadcast_to(k[:, None], pp.shape)
    all_open = pp**bb
    provisioned = (1.0 - all_open) + all_open * kk
    return pl.DataFrame(
        {
            "p_open": pp.ravel(),
            "kept_open": kk.ravel(),
            "batch_size": bb.ravel().astype(np.int64),
            "p_all_open": all_open.ravel(),
            "provisioned": provisioned.ravel(),
            "compression": 1.0 / provisioned.ravel(),
        }
    )
