"""The release's RULER sweeps: the plain arm alone, at every budget, with no D (``ruler_*`` files).

Record keys: ``id, task, budget`` (b = 1 is the full cache), ``T``, ``n_kept``, ``correct`` and the
optional texts ``gold``, ``pred``. The paper reads them for ρ (Eq. 1) and Table 1, which need no gate.
Imported, they become a run of their own (``-ruler``) whose inputs have no D (null ``drop``): every
gate replay on it is refused in one line, and the report reads it for ρ only (docs/IMPORT.md).
"""

from __future__ import annotations

import polars as pl

from pagestats.io.imports.records import Records, RecordError
from pagestats.io.imports.rules import differing, keyed_rows, lines, repeated


def read_sweep(records: Records, evictor: pl.Expr) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(inputs, outcomes)`` of a RULER sweep file (the frames of
    :func:`pagestats.io.imports.gated.gated_tables`; ``drop`` null, the full-KV outcome the b = 1 row's).

    Raises
    ------
    RecordError
        A missing key, a value of the wrong type, a (task, id, budget) twice, T differing across an
        input's rows, or an input without its b = 1 row.
    """
    path, frame = records.path, records.frame
    rows = keyed_rows(
        records, pl.col("n_kept").cast(pl.Int64), pl.col("correct").cast(pl.Float64).alias("score"),
        (pl.col("gold").cast(pl.List(pl.String)) if "gold" in frame.columns
         else pl.lit(None, pl.List(pl.String))).alias("references"),
        (pl.col("pred").cast(pl.String) if "pred" in frame.columns else pl.lit(None, pl.String)).alias("prediction"),
        (pl.col("score_policy").cast(pl.String) if "score_policy" in frame.columns
         else pl.lit(None, pl.String)).alias("score_policy"))
    problems = []
    problems += repeated(path, rows)
    problems += lines(path, rows.filter(~pl.col("budget").is_between(0, 1, closed="right")),
                      lambda r: f"budget {r['budget']} is not in (0, 1]")
    problems += differing(path, rows, {"n_tokens": "T"})
    full = rows.filter(pl.col("budget") == 1.0)
    lacking = rows.unique(["task", "input_id"], keep="first", maintain_order=True).join(
        full, on=["task", "input_id"], how="anti")
    problems += lines(path, lacking, lambda r: f"input ({r['task']}, {r['input_id']}) has no b = 1 (full-cache) row")
    if problems:
        raise RecordError(path, problems)
    inputs = rows.unique(["task", "input_id"], keep="first", maintain_order=True).select(
        "task", "input_id", "n_tokens", pl.lit(None, pl.Float64).alias("drop"), "_line").join(
        full.select("task", "input_id", pl.col("score").alias("full_score"), "references",
                    pl.col("prediction").alias("full_prediction")), on=["task", "input_id"], how="left",
        maintain_order="left")
    outcomes = rows.select("task", "input_id", evictor.alias("evictor"), "budget", "n_kept", "prediction", "score",
                           "_line")
    return inputs, outcomes
