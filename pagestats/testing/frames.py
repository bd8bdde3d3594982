"""Schema-v1 frames of one synthetic cell: INPUTS, OUTCOMES and TOPK rows with exactly the columns
of :mod:`pagestats.core.schema`; with ``with_text``, prompts, references and predictions consistent
with the RULER ``string_match_all`` scores.

References
----------
docs/SCHEMA.md (the collector's output these frames imitate); PAGE paper §4 "Setup" (tasks).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pagestats.core import schema
from pagestats.testing.params import SIGNAL_NAMES

#: Tokens every synthetic decode generates (it stops at EOS).
SYNTHETIC_N_GENERATED = 8


def _list_column(name: str, values: np.ndarray, dtype) -> pl.Series:
    """A 2-D array as a polars List column (one row per array row)."""
    return pl.Series(name, np.ascontiguousarray(values)).cast(pl.List(dtype))


def _empty_lists(name: str) -> pl.Expr:
    return pl.lit(pl.Series(name, [[]], dtype=pl.List(pl.String))).first().alias(name)


def _cell_frames(cell, ids, evictors, budgets, with_text):
    n, m, L, H = cell["n"], cell["m"], cell["L"], cell["H"]
    E, B = len(evictors), len(budgets)
    lits = [pl.lit(ids[c]).alias(c) for c in ("run_id", "model", "task")]
    inputs = pl.DataFrame(
        {
            "input_id": np.arange(n, dtype=np.int64),
            "draw": np.full(n, ids["draw"], dtype=np.int64),
            "context_length": np.full(n, ids["context_length"], dtype=np.int64),
            "n_tokens": cell["n_tokens"],
            "drop": cell["drop"],
            "full_score": cell["full_j"] / m,
            "prefill_ms": cell["prefill_ms"],
            "gate_ms": cell["gate_ms"],
            **{f"_s_{k}": v for k, v in cell["signals"].items()},
        }
    ).with_columns(
        _list_column("agreement", cell["agreement"], pl.Float32),
        _list_column("pair_jaccard", cell["pair_jaccard"], pl.Float32),
        pl.struct([pl.col(f"_s_{k}").alias(k) for k in SIGNAL_NAMES]).alias("signals"),
        *lits,
    )
    row_of_outcome = np.repeat(np.arange(n), E * B)
    outcomes = pl.DataFrame(
        {
            "input_id": row_of_outcome.astype(np.int64),
            "evictor": pl.Series(list(evictors)).gather(np.tile(np.repeat(np.arange(E), B), n)),
            "budget": np.tile(np.asarray(budgets, dtype=np.float64), n * E),
            "n_kept": cell["n_kept"].reshape(-1),
            "score": (cell["j"] / m).reshape(-1),
            "decode_ms": cell["decode_ms"].reshape(-1),
        }
    ).with_columns(lits[0], lits[2])
    if with_text:
        refs = _list_column("references", cell["references"], pl.Int64).cast(pl.List(pl.String))
        inputs = inputs.with_columns(
            refs,
            pl.format(
                "<|user|> Synthetic {} input {} (draw {}, {} tokens). What are the special magic numbers? "
                "<|assistant|> Answer:",
                pl.lit(ids["task"]),
                pl.col("input_id"),
                pl.col("draw"),
                pl.col("n_tokens"),
            ).alias("prompt"),
            _prediction(refs, pl.Series(cell["full_j"])).alias("full_prediction"),
        )
        outcomes = outcomes.with_columns(
            _prediction(refs.gather(row_of_outcome), pl.Series(cell["j"].reshape(-1))).alias("prediction")
        )
    else:
        inputs = inputs.with_columns(
            _empty_lists("references"), pl.lit("").alias("prompt"), pl.lit("").alias("full_prediction")
        )
        outcomes = outcomes.with_columns(pl.lit("").alias("prediction"))
    # Synthetic decodes end at EOS well inside their limit: the draw models scores, not decode lengths.
    inputs = inputs.with_columns(pl.lit(SYNTHETIC_N_GENERATED, pl.Int64).alias("full_n_generated"),
                                 pl.lit("eos").alias("full_stop_reason"))
    outcomes = outcomes.with_columns(pl.lit(SYNTHETIC_N_GENERATED, pl.Int64).alias("n_generated"),
                                     pl.lit("eos").alias("stop_reason"))
    inputs = inputs.select([c.name for c in schema.INPUTS])
    outcomes = outcomes.select([c.name for c in schema.OUTCOMES])

    topk = None
    if cell["indices"] is not None:
        k_max = cell["indices"].shape[-1]
        topk = pl.DataFrame(
            {
                "input_id": np.repeat(np.arange(n, dtype=np.int64), L * H),
                "layer": np.tile(np.repeat(np.arange(L, dtype=np.int64), H), n),
                "head": np.tile(np.arange(H, dtype=np.int64), n * L),
            }
        ).with_columns(_list_column("indices", cell["indices"].reshape(-1, k_max), pl.Int32), lits[0], lits[2])
        topk = topk.select([c.name for c in schema.TOPK])
    return inputs, outcomes, topk


def _prediction(refs: pl.Series, n_found: pl.Series) -> pl.Series:
    """'Answer: r1, r2' with the first ``n_found`` references (string_match_all = n_found/m)."""
    frame = pl.DataFrame({"r": refs, "j": n_found})
    return frame.select(pl.lit("Answer: ") + pl.col("r").list.head(pl.col("j")).list.join(", ")).to_series()
