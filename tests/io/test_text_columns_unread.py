"""The first calls on a release read no text column where no decode can have been cut (issue 40 §5).

``pagestats validate`` profiled why every decode stopped by reading every outcome's text (9M texts at
1M inputs), and every ``whatif`` read every full-KV answer again. The text readings (looping, cut
inside a reference) concern only the decodes the limit may have cut, those that stopped by ``length``
or for a reason a v1 log did not record (pagestats.io.decoding). Here every decode ended at EOS, and
the pages of every text column are overwritten with bytes no parquet reader can decode, the
manifest's sha256 updated: reading any text value fails, so validate and whatif pass only if they read
none.
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
