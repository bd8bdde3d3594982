"""`pagestats import page` against DuckDB's `read_json` over the same files (issue 40 §5).

A synthetic release of the importer's schemas (gated files of three evictors on the same inputs, an
Ada-KV file, a per-layer profile file) at about 1M records is written to bench/tmp/, then, each in a
fresh process: DuckDB reading every file with `read_json` into Arrow (the baseline: parsing alone),
the library import (`import_page`: parse, check, group, write the runs), and the command line
(`pagestats import page`, which also validates the runs it wrote). The shipped condensed subset is
imported the same way. Speed is the ratio to the baseline in the same run; the result goes to
bench/results/import_scale.json.

    python bench/import_scale.py [--inputs N]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

from _results import git_head, measured, write_result

ROOT = Path(__file__).resolve().parents[1]
TMP = ROOT / "bench" / "tmp" / "import_scale"
BUDGETS = (1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0625)
TASKS = ("niah_multikey_3", "vt", "fwe", "qa_1")
LAYERS = 28  # Qwen2.5-1.5B


def write_release(folder: Path, n_inputs: int) -> int:
    """The synthetic release; returns its record count."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    inputs = []
    for i in range(n_inputs):
        early, late = rng.uniform(0.3, 0.6), rng.uniform(0.2, 0.5)
        profile = [early] * (LAYERS // 3) + [0.4] * (LAYERS - 2 * (LAYERS // 3)) + [late] * (LAYERS // 3)
        inputs.append((i, TASKS[i * len(TASKS) // n_inputs], rng.randint(3800, 4300), early - late, profile))
    full_kv = [rng.random() < 0.8 for _ in inputs]  # one full-KV outcome per input, in every file
    records = 0
    for policy in ("snapkv", "h2o", "pyramidkv"):
        with open(folder / f"gated_{policy}_qwen15b_4k.jsonl", "w") as fh:
            for i, task, T, drop, _ in inputs:
                full = full_kv[i]
                for b in BUDGETS:
                    plain = full if b == 1.0 else rng.random() < 0.5
                    fh.write(json.dumps({"id": i, "task": task, "budget": b, "T": T, "drop": drop,
                                         "gate_open": drop >= 0.07, "score_policy": policy,
                                         "n_kept_plain": max(40, int(T * b)), "n_kept_gated": max(40, int(T * b)),
                                         "correct_plain": plain,
                                         "correct_gated": plain}) + "\n")
                    records += 1
    with open(folder / "adakv_4k_qwen15b.jsonl", "w") as fh:
        for i, task, T, drop, _ in inputs:
            for b in BUDGETS[1:]:
                fh.write(json.dumps({"id": i, "task": task, "budget": b, "T": T, "drop": drop, "gate_open": drop >= 0.07,
                                     "correct_full": True, "correct_plain_shared": rng.random() < 0.5,
                                     "n_kept_shared": max(36, round(b * T)), "correct_gated_shared": True,
                                     "correct_plain_adakv": rng.random() < 0.5, "n_kept_adakv": max(36, round(b * T)),
                                     "correct_gated_adakv": True, "pred_full": "x"}) + "\n")
                records += 1
    with open(folder / "drops_qwen15b_4k.jsonl", "w") as fh:
        for i, task, T, _, profile in inputs:
            fh.write(json.dumps({"task": task, "T": T, "head_agreement_per_layer": profile}) + "\n")
            records += 1
    return records


READ_JSON = """
import sys, pathlib
sys.path.insert(0, {root!r})
from pagestats.io.duck import connect
con = connect(threads=None)
n = 0
for p in sorted(pathlib.Path({folder!r}).glob("*.jsonl")):
    with open(p, "rb") as fh:
        n += con.read_json(fh, format="newline_delimited", sample_size=-1).to_arrow_table().num_rows
print(n)
"""
IMPORT = """
import sys
sys.path.insert(0, {root!r})
from pagestats.io.imports import import_page
print(len(import_page([{folder!r}], {out!r}).runs))
"""


def _measure(name: str, cmd: list[str]) -> dict:
    out = measured(cmd, TMP / f"{name}.out", 900, cwd=ROOT, rss_unit="mib")
    if cmd[1] == "-c":  # the script itself is this file's READ_JSON / IMPORT
        out["cmd"] = f"python -c <bench/import_scale.py {name}>"
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=30_000, help="inputs of the synthetic release")
    args = parser.parse_args(argv)
    shutil.rmtree(TMP, ignore_errors=True)
    release = TMP / "release"
    n_records = write_release(release, args.inputs)
    py = sys.executable
    runs = {
        "read_json": _measure("read_json", [py, "-c", READ_JSON.format(root=str(ROOT), folder=str(release))]),
        "import_page": _measure("import_page", [py, "-c", IMPORT.format(root=str(ROOT), folder=str(release),
                                                                         out=str(TMP / "runs"))]),
        "cli_with_validation": _measure("cli", [py, "-m", "pagestats", "import", "page", str(release), "--out",
                                                str(TMP / "runs-cli"), "--quiet"]),
        "shipped_subset_cli": _measure("shipped", [py, "-m", "pagestats", "import", "page",
                                                   str(ROOT / "data" / "page-release" / "condensed"), "--out",
                                                   str(TMP / "runs-shipped"), "--quiet"]),
    }
    base = runs["read_json"]["wall_s"]
    result = {
        "what": "pagestats import page vs DuckDB read_json over the same synthetic release (issue 40 §5)",
        "commit": git_head(ROOT), "records": n_records, "inputs": args.inputs, "runs": runs,
        "import_over_read_json": round(runs["import_page"]["wall_s"] / base, 2),
        "cli_over_read_json": round(runs["cli_with_validation"]["wall_s"] / base, 2),
        "shipped_subset_cli_s": runs["shipped_subset_cli"]["wall_s"],
    }
    result["meets_2x"] = result["import_over_read_json"] <= 2.0
    write_result("import_scale", result)
    return 0 if all(r.get("returncode", 0) == 0 for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
