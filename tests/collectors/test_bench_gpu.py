"""``bench/gpu.py --smoke``: the prepared GPU check runs end to end on the CPU, without duckdb or polars.

The GPU image has torch and transformers but neither duckdb nor polars, so the script runs here in
a fresh interpreter where importing either raises ImportError.
"""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BLOCKED = ("import runpy, sys\n"
           "sys.modules['duckdb'] = None\n"
           "sys.modules['polars'] = None\n"
           "sys.argv = ['gpu.py', '--smoke', '--out', sys.argv[1]]\n"
           "runpy.run_path({script!r}, run_name='__main__')\n")


def test_gpu_bench_smoke_without_duckdb_or_polars(tmp_path):
    out = tmp_path / "gpu-smoke.json"
    code = BLOCKED.format(script=str(ROOT / "bench" / "gpu.py"))
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["smoke"] is True and result["dtype"] == "float32"
    assert set(result["models"]) == {"qwen2.5-1.5b", "mistral-7b", "llama-3.1-70b-8layers"}
    for entry in result["models"].values():
        assert [row["tokens"] for row in entry["gate"]] == [64, 128]
        for row in entry["gate"]:
            for key in ("stock_prefill_ms", "capture_prefill_ms", "gate_signals_ms", "drop"):
                assert math.isfinite(row[key]), key
            assert row["stock_prefill_ms"] > 0 and row["gate_signals_ms"] > 0
            assert row["eager_attentions_predicted_gib"] == 4 * 4 * row["tokens"] ** 2 * 2 / 2**30
    assert result["finished"] is True
    sweep = result["models"]["qwen2.5-1.5b"]["sweep"]
    for batch in ("max_batch_16", "max_batch_33"):
        assert sweep[batch]["n_arms"] == 33 and sweep[batch]["over_baseline"] > 0
        assert sweep[batch]["every_arm_decoded_all_steps"] is True
        assert sweep[batch]["full_arm_equals_baseline_tokens"] is True  # float32 on the CPU: exact
