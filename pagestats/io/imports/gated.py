"""The release's *gated* schema: one record per (input, budget) with the plain and gated arms.

Record keys (the paper's authors' runner): ``id`` (an input number running on across the tasks of a
file), ``task``, ``budget`` (the kept fraction b, 1.0 = full cache; or an absolute token count),
``T`` (prompt tokens), ``drop`` (D, Eq. 3), ``gate_open``, optional ``score_policy``,
``n_kept_plain``, ``n_kept_gated``, ``correct_plain``, ``correct_gated`` and the optional text
fields ``gold``, ``pred_plain``, ``pred_gated``.

:func:`read_gated` checks a file's records and returns them in the project's terms; each bad record
is one line naming the file and line. The rules: every required key present; no (task, id, budget)
twice; T, D and ``gate_open`` the same on every row of an input; the stored gate fits one threshold
(:func:`infer_tau`); budgets either all fractions in (0, 1] or all absolute counts.

References
----------
PAGE paper, §3 (Eq. 2: gated = plain if D ≥ τ, else the full-KV outcome; Eq. 3: D).
"""

from __future__ import annotations

import polars as pl

from pagestats.core import formulas
from pagestats.io.imports.records import Records, RecordError, missing_keys
from pagestats.io.imports.rules import Threshold, differing, lines, repeated, stored_threshold


def _score(column: str) -> pl.Expr:
    """A correctness field as a score in [0, 1] (booleans → 0/1; numbers kept)."""
    return pl.col(column).cast(pl.Float64).alias(column)


def read_gated(records: Records) -> tuple[pl.DataFrame, Threshold, bool]:
    """A gated file's rows in the project's terms, its stored gate's threshold, and whether its budgets
    are absolute token counts.

    Returns a frame with ``task, input_id, budget, n_tokens, drop, gate_open, score_plain,
    score_gated, n_kept, n_kept_gated, score_policy, references, prediction, _line`` (file order).

    Raises
    ------
    RecordError
        One line per bad record (at most :data:`MAX_LINES_NAMED` per rule).
    """
    path, frame = records.path, records.frame
    problems = missing_keys(records)
    if problems:
        raise RecordError(path, problems)
    types = {"id": pl.Int64, "T": pl.Int64, "n_kept_plain": pl.Int64, "budget": pl.Float64, "drop": pl.Float64}
    for key, dtype in types.items():
        bad = frame.filter(pl.col(key).cast(dtype, strict=False).is_null())
        problems += lines(path, bad, lambda row, k=key: f"{k} {row[k]!r} is not a number")
    for key in ("gate_open",):
        if frame.schema[key] != pl.Boolean:
            problems.append(f"{path}: {key} is not true/false on every record")
    for key in ("correct_plain", "correct_gated"):
        value = frame[key]
        if value.dtype != pl.Boolean and not value.dtype.is_numeric():
            problems.append(f"{path}: {key} is not a boolean or a number on every record")
    if problems:
        raise RecordError(path, problems)
    rows = frame.select(
        pl.col("task").cast(pl.String), pl.col("id").cast(pl.Int64).alias("input_id"),
        pl.col("budget").cast(pl.Float64), pl.col("T").cast(pl.Int64).alias("n_tokens"),
        pl.col("drop").cast(pl.Float64), pl.col("gate_open"),
        _score("correct_plain").alias("score_plain"), _score("correct_gated").alias("score_gated"),
        pl.col("n_kept_plain").cast(pl.Int64).alias("n_kept"),
        (pl.col("n_kept_gated").cast(pl.Int64) if "n_kept_gated" in frame.columns
         else pl.lit(None, pl.Int64)).alias("n_kept_gated"),
        (pl.col("score_policy").cast(pl.String) if "score_policy" in frame.columns
         else pl.lit(None, pl.String)).alias("score_policy"),
        _references(frame), _text(frame, "pred_plain").alias("prediction"), "_line")
    problems += lines(path, rows.filter(~pl.col("score_plain").is_between(0, 1) | ~pl.col("score_gated").is_between(0, 1)),
                       lambda r: f"correct_plain / correct_gated {r['score_plain']} / {r['score_gated']} outside [0, 1]")
    problems += lines(path, rows.filter(pl.col("drop").is_nan() | pl.col("drop").is_infinite()),
                       lambda r: f"drop {r['drop']} is not a finite number")
    problems += lines(path, rows.filter(pl.col("n_tokens") < 1), lambda r: f"T {r['n_tokens']} is not ≥ 1")
    absolute = bool((rows["budget"] > 1).any())
    if absolute:
        problems += lines(path, rows.filter((pl.col("budget") < 1) | (pl.col("budget") != pl.col("budget").floor())),
                           lambda r: f"budget {r['budget']} mixes a fraction into a file of absolute budgets")
    else:
        problems += lines(path, rows.filter(pl.col("budget") <= 0), lambda r: f"budget {r['budget']} is not in (0, 1]")
    problems += repeated(path, rows)
    problems += differing(path, rows, {"n_tokens": "T", "drop": "drop", "gate_open": "gate_open"})
    if "tau" in frame.columns:  # a recorded threshold (DBTrimKV's runner): the stored gate must follow it
        recorded = frame.select(pl.col("tau").cast(pl.Float64, strict=False), "_line")
        wrong = rows.with_columns(recorded["tau"].alias("_tau")).filter(
            pl.col("_tau").is_null() | (pl.col("gate_open") != formulas.opens(pl.col("drop"), pl.col("_tau"))))
        problems += lines(path, wrong, lambda r: f"gate_open {str(r['gate_open']).lower()} contradicts drop "
                           f"{r['drop']!r} and the record's tau {r['_tau']!r} (open iff drop ≥ tau)")
    if problems:
        raise RecordError(path, problems)
    per_input = rows.unique(["task", "input_id"], keep="first", maintain_order=True)
    threshold = stored_threshold(path, per_input)
    return rows, threshold, absolute


def _references(frame: pl.DataFrame) -> pl.Expr:
    """``gold`` (``answers`` in LongBench files) as a list of strings (a single string becomes a
    one-element list); null when absent."""
    key = next((k for k in ("gold", "answers") if k in frame.columns), None)  # answers: the LongBench files
    if key is None:
        return pl.lit(None, pl.List(pl.String)).alias("references")
    if isinstance(frame.schema[key], pl.List):
        return pl.col(key).cast(pl.List(pl.String)).alias("references")
    return pl.concat_list(pl.col(key).cast(pl.String)).alias("references")


def _text(frame: pl.DataFrame, key: str) -> pl.Expr:
    return pl.col(key).cast(pl.String) if key in frame.columns else pl.lit(None, pl.String)


def incomplete_inputs(rows: pl.DataFrame, path: str) -> str | None:
    """Why a file is partial (some input lacks budgets others have: a run cut short), or ``None``."""
    grid = rows["budget"].n_unique()
    short = rows.group_by("task", "input_id").agg(pl.col("budget").n_unique().alias("n")).filter(pl.col("n") < grid)
    if short.height:
        return (f"a partial file: {short.height} of {rows.select('task', 'input_id').n_unique()} inputs lack some of "
                f"its {grid} budgets")
    return None


def gated_tables(rows: pl.DataFrame, evictor: pl.Expr, *, absolute: bool, context: int,
                 kv_slots: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(inputs, outcomes)`` of a gated file in the project's terms (docs/IMPORT.md, "Conventions").

    inputs: ``task, input_id, n_tokens, drop, full_score, references, full_prediction, _line``; the
    full-KV outcome is ``correct_plain`` at b = 1.0, else (no b = 1.0 rows) the stored gated outcome of
    a gate-closed input and null for an open one. outcomes: ``task, input_id, evictor, budget, n_kept,
    prediction, score, _line``, the plain arm; absolute budgets become B / ``context``, and an ``n_kept``
    summed over the model's ``kv_slots`` (layers × KV heads, DBTrimKV's paged cache) is divided by it.
    """
    full = rows.filter(pl.col("budget") == 1.0).select("task", "input_id", pl.col("score_plain").alias("full_score"),
                                                      "references", pl.col("prediction").alias("full_prediction"))
    first = rows.unique(["task", "input_id"], keep="first", maintain_order=True)
    if full.height:
        inputs = first.select("task", "input_id", "n_tokens", "drop", "_line").join(
            full, on=["task", "input_id"], how="left", maintain_order="left")
    else:
        inputs = first.select("task", "input_id", "n_tokens", "drop", "_line",
                              pl.when(~pl.col("gate_open")).then(pl.col("score_gated")).alias("full_score"),
                              "references", pl.lit(None, pl.String).alias("full_prediction"))
    kept = pl.col("n_kept")
    if absolute and bool((rows["n_kept"] > rows["n_tokens"]).any()):
        kept = kept // kv_slots  # checked exact by the caller (summed_kept_problem)
    outcomes = rows.select("task", "input_id", evictor.alias("evictor"),
                           (pl.col("budget") / context) if absolute else pl.col("budget"), kept.alias("n_kept"),
                           "prediction", pl.col("score_plain").alias("score"), "_line")
    return inputs, outcomes


def summed_kept_problem(rows: pl.DataFrame, kv_slots: int, path: str) -> list[str]:
    """Lines for an ``n_kept`` above T that is not a whole multiple of the layers × KV heads it was
    summed over (DBTrimKV's runner sums its paged cache over them)."""
    over = rows.filter(pl.col("n_kept") > pl.col("n_tokens"))
    if not over.height:
        return []
    bad = rows.filter((pl.col("n_kept") % kv_slots != 0) | (pl.col("n_kept") // kv_slots > pl.col("n_tokens")))
    return lines(path, bad, lambda r: f"n_kept_plain {r['n_kept']} is above T {r['n_tokens']} and not a sum over "
                  f"the model's {kv_slots} layer × KV-head slots of at most T positions each")
