"""``pagestats show LOGS --input RUN/TASK/ID``: one input as text (docs/CLI.md, :mod:`pagestats.show`)."""

from __future__ import annotations

import sys

from pagestats import defaults
from pagestats.cli.logs import bad_logs_line
from pagestats.cli.options import number
from pagestats.io import LogError, load
from pagestats.io.validation.problems import one_line
from pagestats.replay import FixedTau
from pagestats.show import parse_input_spec, show_input


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
