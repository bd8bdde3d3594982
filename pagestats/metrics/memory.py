"""The gate's effect on memory: achieved kept-KV, compression, and compression under static
batching (App. A.6.2, Tables 22–23).

:func:`kept_kv` reads a relation of gated outcomes (:mod:`pagestats.metrics.engine`) in SQL; the
batching and cache-size arithmetic is NumPy's. Conventions in :mod:`pagestats.metrics`.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats.core import defaults, formulas, schema
from pagestats.core.columns import MATRIX_CELL, names_like
from pagestats.metrics import engine
from pagestats.metrics.engine import ROWS, grouped, names, query
from pagestats.metrics.rates import arm_columns

__all__ = ["kept_kv", "compression", "static_batching", "kv_bytes_per_token", "full_cache_gib"]


def kept_kv(rows, by=MATRIX_CELL, arm: str = "gated", *, include_full: bool = False) -> pl.DataFrame:
    """Achieved kept-KV and compression of an arm (App. A.6.2, Table 22).

    ``kept_kv`` = mean over rows (inputs × budgets b < 1 in the group; the b = 1 audit rows
    too with ``include_full``) of ``n_kept / n_tokens`` (:func:`pagestats.core.formulas.kept_fraction`,
    an exact mean: :func:`pagestats.core.formulas.mean`); put ``budget`` in ``by`` for one
    budget, leave it out for the paper's "grid mean" over the budget grid.
    ``compression = 1 / kept_kv``.
    ``kept_kv_open`` is the same mean over gate-open rows only (Table 23's ``k_open``).

    Parameters
    ----------
    rows : duckdb.DuckDBPyRelation
        Gated outcomes (:mod:`pagestats.metrics.engine`).

    Returns
    -------
    polars.DataFrame
        ``by`` columns, ``kept_kv``, ``compression``, ``kept_kv_open``, ``n_rows``, ``n_open_rows``.
    """
    _, kept = arm_columns(arm)
    by = engine.outcome_rows(rows, by, [kept, "n_tokens", "gate_open"], "kept_kv")
    where = "" if include_full else f"WHERE {formulas.evicted()}"
    if query(rows, f"SELECT count(*) FROM {ROWS} {where}{' AND' if where else 'WHERE'} n_tokens <= 0").item():
        raise ValueError("kept_kv: n_tokens must be positive")
    frac = formulas.mean(formulas.kept_fraction(kept))
    out = query(rows, f"""
        SELECT {names(by)}{", " if by else ""}{frac} AS kept_kv, {frac} FILTER (WHERE gate_open) AS kept_kv_open,
            count(*) AS n_rows, {formulas.OPEN_COUNT} AS n_open_rows
        FROM {ROWS} {where} {grouped(by)}""")
    out = out.with_columns(pl.col("kept_kv", "kept_kv_open").cast(pl.Float64),
                           pl.col("n_rows", "n_open_rows").cast(pl.Int64))
    out = out.with_columns((1.0 / pl.col("kept_kv")).alias("compression"))
    return out.select(*by, "kept_kv", "compression", "kept_kv_open", "n_rows", "n_open_rows").sort(by)


def compression(rows, by=MATRIX_CELL, arm: str = "gated") -> pl.DataFrame:
    """Achieved compression ``1 / kept-KV`` (Table 22): :func:`kept_kv`'s by-columns,
    ``compression`` and ``kept_kv``."""
    return kept_kv(rows, by, arm).select(*([by] if isinstance(by, str) else by), "compression", "kept_kv")


def static_batching(p_open, kept_open, batch_sizes=defaults.BATCH_SIZES) -> pl.DataFrame:
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


def kv_bytes_per_token(model: dict) -> int:
    """Bytes of KV cache one prompt token occupies: 2 (keys and values) × layers × KV heads ×
    head_dim × bytes per element of the model's dtype (docs/DEFINITIONS.md, "Memory"; the KV cache is
    held in the model's dtype, :data:`pagestats.core.schema.MODEL_DTYPE_BYTES`).

    Parameters
    ----------
    model : dict
        The manifest's ``model`` entry (``n_layers``, ``n_kv_heads``, ``head_dim``, ``dtype``).
    """
    missing = [k for k in ("n_layers", "n_kv_heads", "head_dim", "dtype") if model.get(k) is None]
    if missing:
        raise ValueError(f"kv_bytes_per_token: the manifest's model entry lacks {', '.join(missing)}")
    dtype = model["dtype"]
    if not isinstance(dtype, str) or dtype not in schema.MODEL_DTYPE_BYTES:
        raise ValueError(f"kv_bytes_per_token: unknown dtype {dtype!r}; known: {', '.join(schema.MODEL_DTYPE_BYTES)}")
    return 2 * int(model["n_layers"]) * int(model["n_kv_heads"]) * int(model["head_dim"]) * schema.MODEL_DTYPE_BYTES[dtype]


def full_cache_gib(inputs: pl.DataFrame, manifests: dict) -> pl.DataFrame:
    """The full KV cache of one sequence in GiB, per (model, context_length).

    Parameters
    ----------
    inputs : polars.DataFrame
        ``Logs.inputs`` (``run_id``, ``model``, ``context_length``, ``n_tokens``).
    manifests : dict
        ``Logs.manifests`` (run_id → manifest); the architecture is read from each run's
        ``model`` entry.

    Returns
    -------
    polars.DataFrame
        ``model, context_length, bytes_per_token, n_tokens`` (mean prompt length) and
        ``full_gib`` = bytes_per_token × n_tokens / 2³⁰; a kept-KV fraction f then occupies
        f × ``full_gib``. Runs of one (model, context_length) must agree on bytes_per_token.
    """
    per_run = []
    for run_id in inputs["run_id"].unique().sort().to_list():
        manifest = manifests.get(run_id)
        if not manifest:
            raise ValueError(f"full_cache_gib: no manifest for run {run_id!r}")
        per_run.append({"run_id": run_id, "bytes_per_token": kv_bytes_per_token(manifest.get("model") or {})})
    frame = inputs.select("run_id", "model", "context_length", "n_tokens").join(
        names_like(pl.DataFrame(per_run, schema={"run_id": pl.String, "bytes_per_token": pl.Int64}), inputs), on="run_id")
    out = frame.group_by("model", "context_length").agg(
        pl.col("bytes_per_token").n_unique().alias("_distinct"), pl.col("bytes_per_token").first(),
        pl.col("n_tokens").cast(pl.Float64).mean())
    if (out["_distinct"] > 1).any():
        raise ValueError("full_cache_gib: runs of one (model, context_length) disagree on the KV-cache layout")
    return out.drop("_distinct").with_columns(
        (pl.col("bytes_per_token") * pl.col("n_tokens") / 2**30).alias("full_gib")).sort("model", "context_length")
