"""The first calls on a release read no text column where no decode can have been cut (issue 40 §5).

``pagestats validate`` profiled why every decode stopped by reading every outcome's text (9M texts at
1M inputs), and every ``whatif`` read every full-KV answer again. The text readings (looping, cut
inside a reference) concern only the decodes the limit may have cut, those that stopped by ``length``
or for a reason a v1 log did not record (pagestats.io.decoding). Here every decode ended at EOS, and
the pages of every text column are overwritten with bytes no parquet reader can decode, the
manifest's sha256 updated: reading any text value fails, so validate and whatif pass only if they read
none. A second test holds the rule that decides which texts are read: an answer ending inside its
reference counts as cut only when its decode stopped at the limit.
"""

from __future__ import annotations

import json

import duckdb
import pyarrow.parquet as pq
import pytest

from pagestats import schema
from pagestats.cli import main
from pagestats.testing import synthetic_logs

TEXT = {"inputs": ("prompt", "full_prediction", "references"), "outcomes": ("prediction",)}


def _spoil(path, columns) -> None:
    """Overwrite the column chunks of ``columns`` (every row group) with 0xFF bytes."""
    meta = pq.ParquetFile(path).metadata
    spans = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.path_in_schema.split(".")[0] in columns:
                start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
                spans.append((start, chunk.total_compressed_size))
    assert len(spans) >= meta.num_row_groups * len(columns)
    with open(path, "r+b") as fh:
        for start, size in spans:
            fh.seek(start)
            fh.write(b"\xff" * size)


@pytest.fixture
def spoiled_run(tmp_path):
    logs = synthetic_logs(models={"m": (4, 2)}, n_inputs=40, tasks=("niah_multikey_3", "vt"), evictors=("snapkv",),
                          budgets=(0.25, 0.5, 1.0), with_topk=False, with_text=True, seed=5)
    assert set(logs.outcomes["stop_reason"]) == {"eos"} and set(logs.inputs["full_stop_reason"]) == {"eos"}
    (run,) = logs.write(tmp_path / "logs", n_shards=2)
    for table, columns in TEXT.items():
        for f in (run / table).glob("*.parquet"):
            _spoil(f, columns)
            with pytest.raises(duckdb.Error):  # the plant holds: a text value cannot be read
                duckdb.sql(f"SELECT {columns[-1]} FROM read_parquet('{f}')").fetchall()
            assert duckdb.sql(f"SELECT count(task) FROM read_parquet('{f}')").fetchall()[0][0] > 0  # the rest can
    manifest = json.loads((run / "manifest.json").read_text())
    for entry in manifest["files"]:
        entry["sha256"] = schema.sha256_file(run / entry["path"])
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_validate_then_whatif_read_no_text(spoiled_run, capsys):
    assert main(["validate", str(spoiled_run)]) == 0
    err = capsys.readouterr().err
    assert "| full " in err and "| snapkv " in err and "ok: " in err  # the decode profile was printed
    assert main(["whatif", str(spoiled_run), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("model,") and len(out.splitlines()) == 1 + 2 * 3  # 2 tasks × 3 budgets


def test_only_decodes_stopped_at_the_limit_count_as_cut(tmp_path):
    """An answer ending inside its reference counts as cut when its decode stopped by ``length`` (or for an
    unknown reason), not when it ended at EOS: the limit did not cut that one."""
    import polars as pl

    from pagestats.io import load
    from pagestats.io.decoding import decode_profile

    logs = synthetic_logs(models={"m": (4, 2)}, n_inputs=4, tasks=("niah_multikey_3",), evictors=("snapkv",),
                          budgets=(0.5, 1.0), with_topk=False, with_text=True, seed=2)
    ref = pl.col("references").list.first()
    cut = pl.lit("Answer: ") + ref.str.slice(0, 4)  # the first 4 of 7 digits
    inputs = logs.inputs.with_columns(pl.when(pl.col("input_id") == 0).then(cut).otherwise(pl.col("full_prediction"))
                                      .alias("full_prediction"))  # ended at EOS: not cut by the limit
    evicted = pl.col("budget") < 1
    outcomes = logs.outcomes.join(inputs.select("input_id", "references"), on="input_id").with_columns(
        pl.when(evicted & (pl.col("input_id") <= 1)).then(cut).otherwise(pl.col("prediction")).alias("prediction"),
        pl.when(evicted & (pl.col("input_id").is_in([0, 2]))).then(pl.lit("length")).otherwise(pl.col("stop_reason"))
        .alias("stop_reason")).select(logs.outcomes.columns)
    logs.inputs, logs.outcomes = inputs, outcomes
    (run,) = logs.write(tmp_path / "logs")
    profile = decode_profile(load([str(run)]).files)
    got = {r["arm"]: (r["n"], r["n_length"], r["n_cut"]) for r in profile.iter_rows(named=True)}
    # input 0: stopped by length inside its reference (cut); 1: the same text at EOS; 2: length, whole answer
    assert got == {"full": (4, 0, 0), "snapkv": (4, 2, 1)}
