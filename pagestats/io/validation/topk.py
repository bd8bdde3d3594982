"""Row rules of the ``topk`` table (docs/SCHEMA.md): every row has an input, layer/head/indices in
range, every list is complete and every input has all its rows.

``layer`` in [0, L) (L = the input's ``agreement`` length), ``head`` in [0, H) (H from
the manifest, else the run's largest head + 1), ``indices`` in [0, n_tokens) without
repeats and of length min(k_max_stored, n_tokens) (k_max_stored from the manifest, else
the run's most common length); topk rows whose input is missing from ``inputs``; and,
for every input of a run that stores top-k lists (it has topk rows, or its manifest's
``gate.k_max_stored`` is positive and the topk table was read), exactly L·H rows — with
no duplicate and every layer and head in range, that is one row per (layer, head).

References
----------
docs/SCHEMA.md (schema, reader rules).
"""

from __future__ import annotations

import polars as pl

from pagestats import schema
from pagestats.io.validation.manifest import _run_frame
from pagestats.io.validation.problems import Problem, _mode_per_run, emit


def _check_topk(inp: pl.DataFrame, tk: pl.DataFrame, files, runs, incomplete, key) -> list[Problem]:
    problems: list[Problem] = []
    ikey = list(schema.INPUT_KEY)
    cols = ["_file", "_row", *ikey, "layer", "head", "indices"] + (["_ih"] if "_ih" in key else [])
    manifest = _run_frame(runs).select("run_id", "_n_heads", "_k_max_stored")
    # runs without a manifest value: H = the run's largest head + 1, k_max = its most common list length
    observed = tk.group_by("run_id").agg((pl.col("head").max() + 1).alias("_H_obs"))
    observed = observed.join(
        _mode_per_run(tk.select("run_id", pl.col("indices").list.len().alias("_len")), "_len"), on="run_id", how="left"
    )
    per_run = observed.join(manifest, on="run_id", how="full", coalesce=True).select(
        "run_id",
        pl.coalesce("_n_heads", "_H_obs").alias("_H"),
        pl.col("_n_heads"),
        pl.coalesce("_k_max_stored", "_len").alias("_kmax"),
        pl.col("_H_obs").is_not_null().alias("_has_topk"),
        (pl.col("_k_max_stored").fill_null(0) > 0).alias("_stores"),
    )
    joined = tk.select(cols).join(
        inp.select(*key, "n_tokens", pl.col("agreement").list.len().alias("_L")), on=key, how="left"
    ).join(per_run, on="run_id", how="left")
    if "inputs" not in incomplete:
        missing = joined.filter(pl.col("n_tokens").is_null())
        missing = missing.group_by(ikey).agg(pl.col("_file").first(), pl.col("_row").first(), pl.len().alias("_n"))
        missing = missing.with_columns(pl.format("input ({}, {}, {}) has {} topk rows", *ikey, "_n").alias("_d"))
        problems += emit(missing, files, "topk rows whose input is missing from inputs", "_d")
    j = joined.filter(pl.col("n_tokens").is_not_null())
    bad = j.filter((pl.col("layer") < 0) | (pl.col("layer") >= pl.col("_L")))
    problems += emit(bad.with_columns(pl.format("layer {} with L = {}", "layer", "_L").alias("_d")),
                     files, "topk layer out of range", "_d")
    bad = j.filter((pl.col("head") < 0) | (pl.col("_n_heads").is_not_null() & (pl.col("head") >= pl.col("_n_heads"))))
    problems += emit(bad.with_columns(pl.format("head {} with H = {}", "head", "_n_heads").alias("_d")),
                     files, "topk head out of range", "_d")
    idx = pl.col("indices")
    bad = j.filter((idx.list.len() > 0) & ((idx.list.min() < 0) | (idx.list.max() >= pl.col("n_tokens"))))
    bad = bad.with_columns(pl.format("min {}, max {}, n_tokens {}", idx.list.min(), idx.list.max(), "n_tokens").alias("_d"))
    problems += emit(bad, files, "topk indices outside [0, n_tokens)", "_d")
    bad = j.filter(idx.list.n_unique() != idx.list.len())
    bad = bad.with_columns(pl.format("{} indices, {} distinct", idx.list.len(), idx.list.n_unique()).alias("_d"))
    problems += emit(bad, files, "topk indices repeat", "_d")
    want = pl.min_horizontal("_kmax", "n_tokens")
    bad = j.filter(pl.col("_kmax").is_not_null() & (idx.list.len() != want))
    bad = bad.with_columns(pl.format("{} indices, expected min(k_max_stored = {}, n_tokens = {})", idx.list.len(),
                                     "_kmax", "n_tokens").alias("_d"))
    problems += emit(bad, files, "topk list of the wrong length", "_d")
    if "topk" not in incomplete:
        problems += _check_rows_per_input(inp, j, per_run, files, key)
    return problems


def _check_rows_per_input(inp: pl.DataFrame, j: pl.DataFrame, per_run: pl.DataFrame, files, key) -> list[Problem]:
    """Every input of a run that stores top-k lists has exactly L·H topk rows."""
    ikey = list(schema.INPUT_KEY)
    runs = per_run.filter(pl.col("_has_topk") | pl.col("_stores")).filter(pl.col("_H").is_not_null())
    counts = j.group_by(key).agg(pl.len().alias("_n"), pl.col("_file").first().alias("_tf"),
                                 pl.col("_row").first().alias("_tr"))
    expected = inp.select("_file", "_row", *{*key, *ikey}, pl.col("agreement").list.len().alias("_L")).join(
        runs.select("run_id", "_H"), on="run_id", how="inner"
    )
    got = expected.join(counts, on=key, how="left").with_columns(pl.col("_n").fill_null(0))
    got = got.filter(pl.col("_n") != pl.col("_L") * pl.col("_H"))
    detail = pl.format("input ({}, {}, {}) has {} topk rows; expected L × H = {} × {}", *ikey, "_n", "_L", "_H")
    none = got.filter(pl.col("_n") == 0).with_columns(detail.alias("_d"))
    some = got.filter(pl.col("_n") > 0).with_columns(detail.alias("_d"), pl.col("_tf").alias("_file"),
                                                     pl.col("_tr").alias("_row"))
    return (emit(none, files, "input without its topk rows", "_d")
            + emit(some, files, "topk rows missing for an input", "_d"))
