"""Hand-built schema-v1 runs for the io tests (tests/io/test_load_and_rules.py and the robustness, bad-input and
validate-CLI tests that break them): 2 tasks × 3 inputs × 2 evictors × the 9 budgets, L = 6, H = 4,
written with the shared writers of pagestats.core.schema, and the assertions on the problems a rule
reports. A module of its own so that no test file imports another."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import polars as pl

from pagestats.core import defaults, profile, schema

L, H, K_MAX = 6, 4, 8
TASKS = ("niah_multikey_3", "vt")
N_INPUTS = 3
EVICTORS = ("snapkv", "h2o")
BUDGETS = defaults.BUDGETS


# --------------------------------------------------------------------------- fixture builder


def build_frames(run_id="r1", seed=0):
    """inputs, outcomes, topk frames of a valid run (plain Python / NumPy, independent of io)."""
    rng = np.random.default_rng(seed)
    inputs, outcomes, topk = [], [], []
    for task in TASKS:
        for input_id in range(N_INPUTS):
            n_tokens = int(rng.integers(100, 200))
            pair_jaccard = rng.uniform(0, 1, L * H * (H - 1) // 2).astype(np.float32)
            agreement = pair_jaccard.astype(np.float64).reshape(L, -1).mean(axis=1).astype(np.float32)  # a_ℓ (§3)
            full_score = float(rng.integers(0, 5)) / 4
            inputs.append(
                {
                    "run_id": run_id,
                    "model": "tiny-llama",
                    "context_length": 128,
                    "task": task,
                    "input_id": input_id,
                    "draw": 1000,
                    "n_tokens": n_tokens,
                    "drop": float(profile.drop_from_agreement(agreement)),
                    "agreement": agreement.tolist(),
                    "pair_jaccard": pair_jaccard.tolist(),
                    "signals": {"entropy": float(rng.random())},
                    "prompt": f"prompt {task} {input_id}",
                    "references": [f"ans{input_id}"],
                    "full_prediction": f"ans{input_id}",
                    "full_score": full_score,
                    "prefill_ms": 1.0,
                    "gate_ms": 0.1,
                    "full_n_generated": 3,
                    "full_stop_reason": "eos",
                }
            )
            for evictor in EVICTORS:
                for b in BUDGETS:
                    full = b == 1.0
                    outcomes.append(
                        {
                            "run_id": run_id,
                            "task": task,
                            "input_id": input_id,
                            "evictor": evictor,
                            "budget": b,
                            "n_kept": n_tokens if full else max(math.floor(b * n_tokens), 36),
                            "prediction": "p",
                            "score": full_score if full else float(rng.integers(0, 5)) / 4,
                            "decode_ms": 2.0,
                            "n_generated": 2,
                            "stop_reason": "eos",
                        }
                    )
            for layer in range(L):
                for head in range(H):
                    idx = rng.choice(n_tokens, size=K_MAX, replace=False).astype(np.int32)
                    topk.append(
                        {"run_id": run_id, "task": task, "input_id": input_id, "layer": layer, "head": head,
                         "indices": idx.tolist()}
                    )
    return inputs, outcomes, topk


def manifest_for(run_id="r1", **overrides):
    m = {
        "run_id": run_id,
        "created_at": "2025-01-01T00:00:00Z",
        "model": {"name": "tiny-llama", "revision": "x", "n_layers": L, "n_heads": H, "n_kv_heads": 2,
                  "head_dim": 8, "dtype": "float32", "attn_impl": "eager"},
        "device": "cpu",
        "context_length": 128,
        "tasks": {"niah_multikey_3": "capacity-bound", "vt": "dilution-prone"},
        "evictors": list(EVICTORS),
        "budgets": list(BUDGETS),
        "gate": {"w": 32, "k": K_MAX, "k_max_stored": K_MAX, "bins": defaults.BIN_FRACTION},
        "protection": {"n_sink": 4, "n_recent": 32},
        "seed": 0,
        "software": {"python": "3", "torch": "x", "transformers": "x", "pagestats": "0.1.0"},
    }
    m.update(overrides)
    return m


def write_run(root: Path, run_id="r1", *, inputs=None, outcomes=None, topk=None, manifest=None, mutate=None,
              seed=0) -> Path:
    """Write a run directory; ``mutate(inputs, outcomes, topk, manifest)`` edits the rows first.

    Inputs go to one file; outcomes to one file per task (rows of task 0 first); topk to one file.
    """
    ins, ocs, tks = build_frames(run_id, seed)
    man = manifest_for(run_id)
    if mutate is not None:
        mutate(ins, ocs, tks, man)
    run = root / run_id
    schema.write_parquet("inputs", pl.DataFrame(ins), run / "inputs" / "part-0000.parquet")
    for t, task in enumerate(TASKS):
        rows = [r for r in ocs if r["task"] == task]
        schema.write_parquet("outcomes", pl.DataFrame(rows), run / "outcomes" / f"part-{t:04d}.parquet")
    schema.write_parquet("topk", pl.DataFrame(tks), run / "topk" / "part-0000.parquet")
    schema.write_manifest(run, man)
    return run


def refresh_manifest(run: Path) -> None:
    """Rewrite files[] after a file was edited on disk (keeps the other manifest keys)."""
    man = json.loads((run / "manifest.json").read_text())
    man.pop("files")
    schema.write_manifest(run, man)


def outcome_row(task_index, input_id, evictor, budget):
    """Row number, inside outcomes/part-{task}.parquet, of (input_id, evictor, budget)."""
    return (input_id * len(EVICTORS) + EVICTORS.index(evictor)) * len(BUDGETS) + BUDGETS.index(budget)


def input_row(task_index, input_id):
    return task_index * N_INPUTS + input_id


def messages(problems):
    return [str(p) for p in problems]


def assert_problem(problems, file, row, *fragments):
    """Some problem names ``file`` and ``row`` (None: no row) and contains every fragment."""
    file = os.path.normpath(str(file))
    hits = [p for p in problems if p.file == file and p.row == row and all(f in p.message for f in fragments)]
    assert hits, f"no problem at {file} row {row} with {fragments}; got:\n" + "\n".join(messages(problems))
    line = str(hits[0])
    assert line.startswith(file + (f":row {row}: " if row is not None else ": "))
    return hits[0]
