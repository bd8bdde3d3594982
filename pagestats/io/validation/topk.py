"""Row rules of the ``topk`` table (DESIGN §3): every row has an input, layer/head/indices in range.

``layer`` in [0, L) (L = the input's ``agreement`` length), ``head`` in [0, H) (H from
the manifest, when it has one), ``indices`` in [0, n_tokens) without repeats; topk rows
whose input is missing from ``inputs``.

References
----------
DESIGN §3 (schema, reader rules).
"""

from __future__ import annotations

import polars as pl

from pagestats import schema
from pagestats.io.validation.manifest import _run_frame
from pagestats.io.validation.problems import Problem, emit


def _check_topk(inp: pl.DataFrame, tk: pl.DataFrame, files, runs, incomplete, key) -> list[Problem]:
    problems: list[Problem] = []
    ikey = list(schema.INPUT_KEY)
    cols = ["_file", "_row", *ikey, "layer", "head", "indices"] + (["_ih"] if "_ih" in key else [])
    joined = tk.select(cols).join(
        inp.select(*key, "n_tokens", pl.col("agreement").list.len().alias("_L")), on=key, how="left"
    ).join(_run_frame(runs).select("run_id", "_n_heads"), on="run_id", how="left")
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
    return problems
