"""``pagestats whatif LOGS``: replay the gate under a policy (docs/CLI.md).

``--format csv`` prints exactly :data:`pagestats.replay.whatif.WHATIF_COLUMNS` at full float precision; the
table format prints the summary of ``--by``. Stderr says what was left out, the pilot that set τ, the
degenerate cells, and the answers the decode limit may have cut.
"""

from __future__ import annotations

import sys
import textwrap

import polars as pl

from pagestats.core import defaults
from pagestats.cli.logs import decode_warnings, folded_warnings, open_for, strict_failure
from pagestats.cli.text import COLUMN_HELP, WIDTH, summary_text
from pagestats.cli.options import (
    MAX_DRAWS,
    MAX_K,
    MAX_SEED,
    add_logs,
    add_policy,
    comma_list,
    database_problem,
    input_draws,
    number,
    policy_from_args,
    profile_from_args,
)
from pagestats.core.columns import MATRIX_CELL
from pagestats.core.escape import csv_frame
from pagestats.io.validation.problems import one_line
from pagestats.replay import RECALIBRATE_MODES
from pagestats.core.columns import WHATIF_CELL
from pagestats.core.targets import file_problem
from pagestats.replay.whatif import WHATIF_FORMATS
from pagestats.replay.whatif import degenerate_messages, filter_whatif, whatif_summary, whatif_with_pilot, write_whatif


def add_parser(sub) -> None:
    """The ``pagestats whatif`` subparser."""
    p = sub.add_parser("whatif", help="replay the gate under a policy and print the per-cell table",
                       description=textwrap.fill("Replay the gate under a policy and print, per (model, "
                                                 "context), the summary of --by. " + COLUMN_HELP, 79))
    add_logs(p)
    add_policy(p)
    p.add_argument("--recalibrate", choices=list(RECALIBRATE_MODES), default="none",
                   help="re-derive a fixed τ on the changed statistic: z = keep τ's z-position in the pilot, "
                   "midpoint = Eq. 5 (App. A.3.1: a sweep that rescales D must recalibrate τ; default: none)")
    p.add_argument("--layers", default=None, help="layer subset: all, first-half, second-half, every-2, "
                   "every-4, early-only, first-last, or a comma list / a:b range of layer indices "
                   "(default: all layers)")
    p.add_argument("--pairs-fraction", type=number(0.0, 1.0, name="--pairs-fraction"), default=None, help="fraction of head pairs kept per draw (default: every pair)")
    p.add_argument("--input-draws", type=input_draws, default=None, metavar="pooled|N",
                   help="input draws (inputs.draw): N keeps draw N, pooled pools them on purpose (default: one "
                   "row per draw, with a draw column, when the logs hold more than one)")
    p.add_argument("--pair-draws", type=number(1, MAX_DRAWS, integer=True, name="--pair-draws"), default=None,
                   help=f"random head-pair draws, averaged (default: {defaults.PAIR_DRAWS}; at most {MAX_DRAWS})")
    p.add_argument("--seed", type=number(0, MAX_SEED, integer=True, name="--seed"), default=None,
                   help="seed of the head-pair draws / pilot hash (default: 0)")
    p.add_argument("--k", type=number(1, MAX_K, integer=True, name="--k"), default=None, help="top-k set size, k ≤ k_max (needs topk logs; default: the logged k)")
    p.add_argument("--bins", default=None, help="bin fraction, decimal or fraction such as 1/4 (default: 1/3)")
    p.add_argument("--strict-bins", action="store_true", help="strict-thirds late bin (Table 24; default: the deployed equal-size bins)")
    p.add_argument("--format", choices=["csv", "table"], default="table",
                   help="table: the summary of --by for reading; csv: the per-cell table (every column "
                   "at full precision) on stdout")
    p.add_argument("--by", default=None, metavar="KEYS",
                   help="group keys of the summary (--format table), a comma list of model, context_length, "
                   f"evictor, task, budget (default: {','.join(MATRIX_CELL)})")
    p.add_argument("--evictor", default=None, metavar="E1,E2", help="show only these evictors (default: all)")
    p.add_argument("--task", default=None, metavar="T1,T2", help="show only these tasks (default: all)")
    p.add_argument("--context", default=None, metavar="N1,N2",
                   help="show only these context lengths (default: all); the replay still sees every input")
    p.add_argument("--wide", action="store_true",
                   help=f"print every name whole (default: the table fits {WIDTH} columns, long names shortened)")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="also write the per-cell table to FILE: .csv, .parquet or .json (default: none)")


def _by(args) -> list[str]:
    """The ``whatif --by`` keys (the matrix cell when not given)."""
    return comma_list(args.by, name="--by") if args.by is not None else list(MATRIX_CELL)


def usage_problem(args) -> str | None:
    """Why the options cannot run (one line), before any log is read: ``--db``, ``--by``, ``-o``
    (:mod:`pagestats.core.targets`), the policy and profile (kept on ``args`` as ``parsed_policy`` and
    ``parsed_profile``) and the filters."""

    problem = database_problem(args)
    if problem:
        return problem
    if args.format == "csv" and args.by is not None:
        return "--by groups the summary of --format table; --format csv prints every cell"
    by = _by(args)
    if not by or any(k not in WHATIF_CELL for k in by) or len(set(by)) != len(by):
        return f"--by takes distinct keys among {', '.join(WHATIF_CELL)}; got {','.join(by) or 'nothing'}"
    if args.output is not None:
        problem = file_problem(args.output, "-o", suffixes=WHATIF_FORMATS)
        if problem:
            return problem
    try:
        args.parsed_policy, args.parsed_profile = policy_from_args(args), profile_from_args(args)
    except ValueError as err:
        return str(err)
    for name, kind in (("evictor", str), ("task", str), ("context", int)):
        try:
            comma_list(getattr(args, name), kind, f"--{name}")
        except ValueError as err:
            return str(err)
    return None


def run(args) -> int:
    """Exit 0 with the table, 1 on bad logs (or ``--strict`` and cut answers), 2 on bad usage."""

    opened = open_for(args)
    if isinstance(opened, int):
        return opened
    logs, excluded = opened
    try:
        policy, profile = args.parsed_policy, args.parsed_profile
        table, pilot = whatif_with_pilot(logs, policy, profile, input_draws=args.input_draws)  # one replay: decided once
        warnings = degenerate_messages(table, profile, args.recalibrate)
        table = filter_whatif(table, evictor=comma_list(args.evictor), task=comma_list(args.task),
                              context_length=comma_list(args.context, int, "--context"))
        summary = None if args.format == "csv" else whatif_summary(table, by=_by(args))
        if args.output:
            write_whatif(table, args.output)
    except (ValueError, TypeError, OSError) as err:  # bad option values: one line, no traceback
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    limit_lines = decode_warnings(logs.files, logs.manifests)
    for line in [*excluded, *pilot_lines(pilot), *warnings, *folded_warnings(limit_lines, args.logs)]:
        print(one_line(line), file=sys.stderr)
    if args.strict and limit_lines:
        print(strict_failure(limit_lines), file=sys.stderr)
        return 1
    if args.output:
        print(one_line(f"wrote {table.height} rows × {table.width} columns to {args.output}"), file=sys.stderr)
    if args.format == "csv":
        sys.stdout.write(csv_frame(table).write_csv(float_precision=None))
    else:
        print(summary_text(summary, width=None if args.wide else WIDTH))
    return 0


def pilot_lines(pilot: pl.DataFrame) -> list[str]:
    """Stderr lines of a calibration pilot (:func:`pagestats.replay.pilot_composition`): per τ, the
    (model, context) it gates, its value and its pilot's inputs per task and per run. One line per
    (model, context) where each context has its own τ (the midpoint recipe, Eq. 5), one per model
    where its contexts share one (the z-scored pilot, App. A.3.4)."""
    if pilot.height == 0:
        return []
    lines = []
    for (model,), part in pilot.group_by(["model"], maintain_order=True):
        taus = part.group_by("context_length", maintain_order=True).agg(pl.col("tau").unique()).sort("context_length")
        shared = taus["tau"].list.len().max() == 1 and taus["tau"].list.first().n_unique() == 1
        groups = [(part, ", ".join(f"{c:,}" for c in taus["context_length"]))] if shared else [
            (part.filter(pl.col("context_length") == c), f"{c:,}") for c in taus["context_length"]]
        for rows, contexts in groups:
            value = ", ".join(f"{t:.6g}" for t in rows["tau"].unique(maintain_order=True).to_list())
            label = f"context {contexts} tokens" + (" pooled" if shared and taus.height > 1 else "")
            held = "held out of the evaluation" if rows["held_out"].any() else "evaluated with the rest"
            by_task = rows.group_by("task").agg(pl.col("n_pilot").sum()).sort("task")
            lines.append(f"pilot {model}, {label}: τ = {value}; {int(rows['n_pilot'].sum())} inputs of "
                         f"{rows['run_id'].n_unique()} run(s) (by task: "
                         + ", ".join(f"{k}={n}" for k, n in by_task.iter_rows()) + f"), {held}")
    return lines

