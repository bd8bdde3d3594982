"""Column checks and grouping conventions shared by the frame-level metrics.

The conventions themselves are documented once, in :mod:`pagestats.metrics`.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats import stats
from pagestats.core import formulas
from pagestats.core.columns import input_key, repeats_a_key, require_columns

_ARMS = {"plain": ("score_plain", "n_kept_plain"), "gated": ("score_gated", "n_kept_gated")}




def _unit_key(frame: pl.DataFrame) -> list[str]:
    return [*input_key(frame), *(["evictor"] if "evictor" in frame.columns else [])]


def _uniq(*parts) -> list[str]:
    out: list[str] = []
    for part in parts:
        for c in part:
            if c not in out:
                out.append(c)
    return out


def _cell_rows(frame: pl.DataFrame, by):
    """Each ``by`` group's rows of ``frame`` in turn, groups in order of first appearance and rows in
    frame order (as ``partition_by(by, maintain_order=True)``), made one at a time so that no two are
    held at once; ``frame`` itself when it is one group (docs/PERFORMANCE.md, sixth round)."""
    cells = frame.select(by).unique(maintain_order=True)
    if cells.height == 1:
        yield frame
        return
    for i in range(cells.height):
        yield frame.join(cells.slice(i, 1), on=by, how="semi", nulls_equal=True)


def _by(frame: pl.DataFrame, by, what: str) -> list[str]:
    by = [by] if isinstance(by, str) else list(by)
    require_columns(frame, by, what)
    if "pair_draw" in frame.columns and "pair_draw" not in by and frame["pair_draw"].n_unique() > 1:
        raise ValueError(f"{what}: the frame has several pair_draw values; add 'pair_draw' to by")
    return by


def _arm(arm: str) -> tuple[str, str]:
    try:
        return _ARMS[arm]
    except KeyError:
        raise ValueError(f"arm must be 'plain' or 'gated', got {arm!r}") from None


def _outcome_rows(frame: pl.DataFrame, by, cols, what: str, *, include_full: bool = False,
                  keep=()) -> tuple[pl.DataFrame, list[str]]:
    """Check an outcome frame, reject duplicate (unit, budget) rows, keep budgets b < 1 (and the
    b = 1 audit rows too with ``include_full``). The rows hold only ``by``, the unit key, ``budget``,
    ``cols`` and those of ``keep`` present: the filter copies what it keeps, and a gated frame has 18
    columns where a measure reads a few (at 1M inputs, 9M rows: docs/PERFORMANCE.md)."""
    by = _by(frame, by, what)
    key = [*_unit_key(frame), "budget"]
    require_columns(frame, [*key, *cols], what)
    if repeats_a_key(frame, key):
        raise ValueError(f"{what}: duplicate rows for the same (input, evictor, budget)")
    rows = frame.select(_uniq(by, key, cols, [c for c in keep if c in frame.columns]))
    return (rows if include_full else rows.filter(formulas.EVICTED)), by


def _with_wilson(df: pl.DataFrame, name: str, confidence_level: float) -> pl.DataFrame:
    """Add ``name`` (= k/n), ``low`` and ``high`` from the ``k``/``n`` columns (Wilson)."""
    if df.height == 0:
        return df.with_columns(
            pl.lit(None, pl.Float64).alias(name), pl.lit(None, pl.Float64).alias("low"),
            pl.lit(None, pl.Float64).alias("high"),
        )
    known = df["k"].is_not_null().to_numpy()  # k is unknown where a full-KV outcome is (formulas.with_full)
    out = {c: np.full(df.height, np.nan) for c in (name, "low", "high")}
    if known.any():
        iv = stats.wilson(df["k"].to_numpy()[known], df["n"].to_numpy()[known], confidence_level)
        for c, v in ((name, iv.estimate), ("low", iv.low), ("high", iv.high)):
            out[c][known] = np.atleast_1d(v)
    return df.with_columns(pl.Series(c, v).fill_nan(None) for c, v in out.items())
