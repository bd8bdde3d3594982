"""``pagestats show LOGS --input RUN/TASK/ID`` (docs/CLI.md): one input as text, the prompt's head and
tail, the references, D with the gate's decision, a sparkline of the agreement profile a_ℓ, and the
prediction and score of the full-KV arm and of every (evictor, budget) arm.

References
----------
PAGE paper, §3 (a_ℓ, D, Eq. 3; the gate, Eq. 2); docs/SCHEMA.md (the ``inputs`` and
``outcomes`` rows shown).
"""

from __future__ import annotations

import os
import sys
import textwrap

import numpy as np
import polars as pl

from pagestats.cli.logs import bad_logs_line
from pagestats.cli.options import number
from pagestats.core import defaults
from pagestats.io import LogError, Logs, load
from pagestats.io.validation.problems import one_line
from pagestats.replay import FixedTau, Policy, ProfileSpec, gate

#: Characters of the prompt shown at its head and at its tail.
PROMPT_CHARS = 400
#: The eight block characters of a sparkline, lowest first.
BLOCKS = "▁▂▃▄▅▆▇█"


def parse_input_spec(spec: str, logs) -> tuple[str, str, int]:
    """``RUN/TASK/ID`` → ``(run_id, task, input_id)``; RUN may be the run_id or the name of the
    run's directory. A spec that names nothing in ``logs`` is a ``ValueError`` listing what does."""
    parts = str(spec).split("/")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"an input is named RUN/TASK/ID, got {spec!r}")
    run, task, ident = parts
    try:
        input_id = int(ident)
    except ValueError:
        raise ValueError(f"input {spec!r}: the input id {ident!r} is not an integer") from None
    runs = run_names(logs)
    if run not in runs:
        raise ValueError(f"input {spec!r}: no run {run!r}; the runs are {', '.join(sorted(set(runs.values())))}")
    run_id = runs[run]
    rows = logs.inputs.filter(pl.col("run_id") == run_id)
    if task not in set(rows["task"].to_list()):
        raise ValueError(f"input {spec!r}: run {run_id} has no task {task!r}; it has "
                         f"{', '.join(sorted(set(rows['task'].to_list())))}")
    ids = rows.filter(pl.col("task") == task)["input_id"].sort().to_list()
    if input_id not in ids:
        raise ValueError(f"input {spec!r}: no input {input_id} in {run_id}/{task}; ids run from {ids[0]} to {ids[-1]}")
    return run_id, task, input_id


def run_names(logs: Logs) -> dict[str, str]:
    """Every name a run answers to (its run_id, and the name of its directory) → run_id."""
    names = {run_id: run_id for run_id in logs.inputs["run_id"].unique().to_list()}
    for run_id, folder in logs.run_dirs.items():
        names.setdefault(os.path.basename(os.path.normpath(folder)), run_id)
    return names


def sparkline(values) -> str:
    """``values`` as one block character each, scaled from their minimum to their maximum."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return ""
    lo, hi = np.nanmin(v), np.nanmax(v)
    if not np.isfinite(lo) or hi == lo:
        return BLOCKS[0] * v.size
    idx = np.clip(((v - lo) / (hi - lo) * (len(BLOCKS) - 1)).round().astype(int), 0, len(BLOCKS) - 1)
    return "".join(BLOCKS[i] for i in idx)


def show_input(logs, run_id: str, task: str, input_id: int, *, policy: Policy = FixedTau(),
               profile: ProfileSpec = ProfileSpec(), width: int = 100) -> str:
    """The text that ``pagestats show`` prints for one input of ``logs`` (loaded with
    ``columns="all"``, so that the prompt, references and predictions are there).

    The gate's decision is that of ``policy`` replayed on all of ``logs`` (a z-scored or
    midpoint threshold depends on the other inputs), under ``profile``.
    """
    key = (pl.col("run_id") == run_id) & (pl.col("task") == task) & (pl.col("input_id") == input_id)
    row = logs.inputs.filter(key).row(0, named=True)
    decision = gate(logs, policy, profile).filter(key)
    arms = logs.outcomes.filter(key).sort("evictor", "budget")
    lines = [f"input {run_id}/{task}/{input_id}",
             f"model {row['model']}, context {row['context_length']}, {row['n_tokens']} prompt tokens, "
             f"draw {row.get('draw')}, task class {row.get('task_class')}"]
    prompt = row.get("prompt")
    if prompt is not None:
        lines.append("")
        if len(prompt) <= 2 * PROMPT_CHARS:
            lines += ["prompt:", _indent(prompt)]
        else:
            lines += [f"prompt (first {PROMPT_CHARS} of {len(prompt):,} characters):", _indent(prompt[:PROMPT_CHARS]),
                      f"  … {len(prompt) - 2 * PROMPT_CHARS:,} characters …",
                      f"prompt (last {PROMPT_CHARS}):", _indent(prompt[-PROMPT_CHARS:])]
    if row.get("references") is not None:
        lines += ["", f"references: {', '.join(repr(r) for r in row['references'])}"]
    lines.append("")
    drop = float(decision["drop"].mean())
    tau = float(decision["tau"].mean())
    opened = bool(decision["gate_open"].all())
    verdict = "open: the arms evict" if opened else "closed: the gated arms keep the full cache"
    if decision["gate_open"].n_unique() > 1:
        verdict = f"open in {int(decision['gate_open'].sum())} of {decision.height} head-pair draws"
    lines.append(f"D = {drop:.4f}   τ = {tau:.4f} ({policy.name})   gate {verdict}")
    agreement = row.get("agreement")
    if agreement is not None:
        a = np.asarray(agreement, dtype=float)
        lines.append(f"a_ℓ over {a.size} layers, {a.min():.2f} … {a.max():.2f}:  {sparkline(a)}")
    lines += ["", f"full KV: score {row['full_score']:.2f}  prediction {_quote(row.get('full_prediction'), width)}", ""]
    if arms.height:
        gated = "gated = plain" if opened else "gated = full KV"
        lines.append(f"{'evictor':<16}{'budget':>8}{'n_kept':>8}{'score':>7}  prediction   ({gated})")
        for arm in arms.iter_rows(named=True):
            lines.append(f"{arm['evictor']:<16}{arm['budget']:>8.4g}{arm['n_kept']:>8d}{arm['score']:>7.2f}  "
                         f"{_quote(arm.get('prediction'), width - 41)}")
    return "\n".join(lines)


def _indent(text: str) -> str:
    return textwrap.indent(text.rstrip("\n"), "  | ", lambda _: True)


def _quote(text, width: int) -> str:
    if text is None:
        return "(not logged)"
    shown = repr(text)
    return shown if len(shown) <= max(width, 12) else shown[: max(width, 12) - 1] + "…"


def add_parser(sub) -> None:
    """The ``pagestats show`` subparser."""
    p = sub.add_parser("show", help="print one input: prompt, references, D and the gate, a_ℓ, every arm's prediction")
    p.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    p.add_argument("--input", required=True, metavar="RUN/TASK/ID",
                   help="the input; RUN is a run_id or the run's directory name")
    p.add_argument("--tau", type=number(-1.0, 1.0, name="--tau"), default=defaults.TAU,
                   help="the fixed threshold τ of the gate decision shown")


def usage_problem(args) -> str | None:
    """Nothing beyond the shared checks (the input is looked up in the logs)."""
    return None


def run(args) -> int:
    """Exit 0 with the input printed, 1 on bad logs, 2 on an input the logs do not hold."""
    try:
        logs = load(args.logs, columns="all", mode=None)  # one input, of whichever mode
    except LogError as err:
        print(bad_logs_line(err, args.logs), file=sys.stderr)
        return 1
    try:
        run_id, task, input_id = parse_input_spec(args.input, logs)
    except ValueError as err:
        print(one_line(f"error: --input: {err}"), file=sys.stderr)
        return 2
    print(show_input(logs, run_id, task, input_id, policy=FixedTau(args.tau)))
    return 0
