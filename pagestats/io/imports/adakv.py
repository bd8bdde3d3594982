"""The release's Ada-KV / capbound schema (the authors' ``adakv_matrix.py``; ``adakv_4k_*``, ``capbound_4k_*``).

Record keys: ``id, task, budget, T, drop, gate_open, correct_full`` and two arms of SnapKV scores at the
same total budget: the *shared* allocation (one layer-averaged mask, the paper's plain arm:
``correct_plain_shared``, ``n_kept_shared``) and the per-(layer, KV head) *Ada-KV* allocation
(``correct_plain_adakv``, ``n_kept_adakv``), with their stored gated arms and ``pred_full``. No b = 1
rows: the full-KV outcome is ``correct_full``, on every row of the input.

They become the evictors ``snapkv`` (shared) and ``adakv-snapkv`` of a run of their own (``-adakv``):
the runner's budget rule (max(36, round(b·T))) differs from the gated runner's, so its SnapKV arm is not
the gated files' one. ``n_kept_*`` is a mean over layers and KV heads, a float; it is rounded to
positions. The stored gated arms are not read (Eq. 2 replays them).
"""

from __future__ import annotations

import polars as pl

from pagestats.io.imports.records import Records, RecordError
from pagestats.io.imports.rules import Threshold, differing, keyed_rows, repeated, stored_threshold

#: (evictor, score key, kept key) of each arm.
ARMS = (("snapkv", "correct_plain_shared", "n_kept_shared"), ("adakv-snapkv", "correct_plain_adakv", "n_kept_adakv"))


def read_adakv(records: Records) -> tuple[pl.DataFrame, pl.DataFrame, Threshold]:
    """``(inputs, outcomes, threshold)`` of an Ada-KV / capbound file (the frames of
    :func:`pagestats.io.imports.gated.gated_tables`).

    Raises
    ------
    RecordError
        A missing key, a non-numeric value, an input whose T, D, gate or full-KV outcome differs across
        its rows, a (task, id, budget) twice, or a stored gate that fits no single τ.
    """
    path, frame = records.path, records.frame
    rows = keyed_rows(
        records, pl.col("drop").cast(pl.Float64), pl.col("gate_open").cast(pl.Boolean),
        pl.col("correct_full").cast(pl.Float64).alias("full_score"),
        *(pl.col(k).cast(pl.Float64) for _, k, _ in ARMS), *(pl.col(k).cast(pl.Float64) for _, _, k in ARMS),
        (pl.col("pred_full").cast(pl.String) if "pred_full" in frame.columns
         else pl.lit(None, pl.String)).alias("full_prediction"))
    problems = repeated(path, rows) + differing(path, rows, {"n_tokens": "T", "drop": "drop", "gate_open": "gate_open",
                                                             "full_score": "correct_full"})
    if problems:
        raise RecordError(path, problems)
    per_input = rows.unique(["task", "input_id"], keep="first", maintain_order=True)
    threshold = stored_threshold(path, per_input)
    inputs = per_input.select("task", "input_id", "n_tokens", "drop", "_line", "full_score",
                              pl.lit(None, pl.List(pl.String)).alias("references"), "full_prediction")
    outcomes = pl.concat([rows.select("task", "input_id", pl.lit(evictor).alias("evictor"), "budget",
                                      pl.col(kept).round().cast(pl.Int64).alias("n_kept"),
                                      pl.lit(None, pl.String).alias("prediction"), pl.col(score).alias("score"), "_line")
                          for evictor, score, kept in ARMS])
    return inputs, outcomes, threshold
