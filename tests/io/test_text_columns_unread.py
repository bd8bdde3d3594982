"""The first calls on a release read no text column where no decode can have been cut (issue 40 §5).

``pagestats validate`` profiled why every decode stopped by reading every outcome's text (9M texts at
1M inputs), and every ``whatif`` read every full-KV answer again. The text readings (looping, cut
inside a reference) concern only the decodes the limit may have cut, those that stopped by ``length``
or for a reason a v1 log did not record (pagestats.io.decoding). Here every decode ended at EOS, and
the pages of every text column are overwritten with bytes no parquet reader can decode, the
manifest's sha256 updated: reading any text value fails, so validate and whatif pass only if they read
none. A second test holds the rule that decides which texts are read: an answer ending inside its
reference counts as cut only when its decode stopped at the limit; a third, that the full-KV readings
``validate`` made are not made again by the ``whatif`` after it.
"""

from __future__ import annotations

import dataclasses
import json

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from pagestats.core import schema
from pagestats.cli import main
from pagestats.io import decoding, load
from pagestats.io.decoding import decode_profile
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


def _cut_run(tmp_path):
    """A run of 4 NIAH-MK3 inputs whose answers at b = 0.5 are: input 0 stopped by ``length`` inside its
    reference (cut), 1 the same text ended at EOS, 2 stopped by ``length`` with its whole answer; the
    full-KV answer of input 0 ends inside its reference at EOS, that of input 3 stopped by ``length``
    with its whole answer."""
    logs = synthetic_logs(models={"m": (4, 2)}, n_inputs=4, tasks=("niah_multikey_3",), evictors=("snapkv",),
                          budgets=(0.5, 1.0), with_topk=False, with_text=True, seed=2)
    ref = pl.col("references").list.first()
    cut = pl.lit("Answer: ") + ref.str.slice(0, 4)  # the first 4 of 7 digits
    inputs = logs.inputs.with_columns(
        pl.when(pl.col("input_id") == 0).then(cut).otherwise(pl.col("full_prediction")).alias("full_prediction"),
        pl.when(pl.col("input_id") == 3).then(pl.lit("length")).otherwise(pl.col("full_stop_reason"))
        .alias("full_stop_reason"))
    evicted = pl.col("budget") < 1
    outcomes = logs.outcomes.join(inputs.select("input_id", "references"), on="input_id").with_columns(
        pl.when(evicted & (pl.col("input_id") <= 1)).then(cut).otherwise(pl.col("prediction")).alias("prediction"),
        pl.when(evicted & (pl.col("input_id").is_in([0, 2]))).then(pl.lit("length")).otherwise(pl.col("stop_reason"))
        .alias("stop_reason")).select(logs.outcomes.columns)
    logs.inputs, logs.outcomes = inputs, outcomes
    (run,) = logs.write(tmp_path / "logs")
    return run


def test_only_decodes_stopped_at_the_limit_count_as_cut(tmp_path):
    """An answer ending inside its reference counts as cut when its decode stopped by ``length`` (or for an
    unknown reason), not when it ended at EOS: the limit did not cut that one."""
    profile = decode_profile(load([str(_cut_run(tmp_path))]).files)
    got = {r["arm"]: (r["n"], r["n_length"], r["n_cut"]) for r in profile.iter_rows(named=True)}
    assert got == {"full": (4, 1, 0), "snapkv": (4, 2, 1)}


def test_the_full_kv_profile_is_read_once(tmp_path, monkeypatch, capsys):
    """``validate`` keeps the full-KV rows of its profile; a later ``whatif`` on the same files reads them
    instead of the texts, and files with another sha256 are read again, to the same rows."""
    run = _cut_run(tmp_path)
    texts = []  # every SQL reading of texts
    real = decoding._read
    monkeypatch.setattr(decoding, "_read", lambda rows: texts.append(rows) or real(rows))
    assert main(["validate", str(run)]) == 0 and len(texts) == 1
    assert main(["whatif", str(run), "--format", "csv"]) == 0 and len(texts) == 1
    capsys.readouterr()
    files = load([str(run)]).files
    kept = decode_profile(files, arms=False)
    assert len(texts) == 1 and kept.height == 1 and kept["arm"].to_list() == ["full"]
    other = [dataclasses.replace(f, sha256="0" * 64) if f.table == "inputs" else f for f in files]
    assert decode_profile(other, arms=False).equals(kept) and len(texts) == 2


def test_validate_reads_the_evicted_texts_with_decodes_only(tmp_path, monkeypatch, capsys):
    """By default ``validate`` reads the full-KV texts only (they decide the warnings) and leaves the
    evicted arms' looping and cut shares blank; ``--decodes`` reads those texts too, to the counts of
    :func:`decode_profile` over every arm (snapkv: 1 of 4 answers cut inside its reference)."""
    run = _cut_run(tmp_path)
    read = []  # the text rows of every SQL reading: with the evicted arms, they join the inputs' references
    real = decoding._read
    monkeypatch.setattr(decoding, "_read", lambda rows: read.append("JOIN" in rows) or real(rows))

    def table(err):
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in err.splitlines() if line.startswith("| ")]
        header, *body = rows
        return {r[header.index("arm")]: dict(zip(header, r)) for r in body if set(r[0]) != {"-"}}

    assert main(["validate", str(run)]) == 0 and read == [False]
    default = table(capsys.readouterr().err)
    assert default["snapkv"]["looping"] == default["snapkv"]["cut_in_reference"] == "not read"
    assert default["snapkv"]["length"] == "0.5" and default["full"]["cut_in_reference"] == "0.0"
    assert main(["validate", str(run), "--decodes", "--revalidate"]) == 0 and read == [False, True]
    every = table(capsys.readouterr().err)
    assert every["snapkv"]["cut_in_reference"] == "0.25" and every["snapkv"]["looping"] == "0.0"
    assert every["full"] == default["full"]
