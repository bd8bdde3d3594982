"""``pagestats compact RUN --out RUN2``: a run's part files merged into one file per table, with a new
manifest, validated (docs/CLI.md, :func:`pagestats.io.compact_run`)."""

from __future__ import annotations

import sys

from pagestats.cli.logs import bad_logs_line
from pagestats.cli.options import comma_list, number
from pagestats.io import LogError, compact_run
from pagestats.io.validation.problems import one_line


def add_parser(sub) -> None:
    """The ``pagestats compact`` subparser."""
    p = sub.add_parser("compact", help="merge a run's part files into one file per table, with a new manifest")
    p.add_argument("run", metavar="RUN", help="the run directory to compact")
    p.add_argument("--out", required=True, metavar="RUN2", help="the new run directory (must not exist)")
    p.add_argument("--rows", type=number(1, 10**12, integer=True, name="--rows"), default=None,
                   help="rows per output file (default: one file per table)")
    p.add_argument("--tasks", default=None, metavar="TASK,...",
                   help="keep only these tasks of the run, e.g. to replace the others by a re-collection "
                   "(default: every task)")


def usage_problem(args) -> str | None:
    """Nothing beyond the shared checks (:func:`pagestats.io.compact_run` checks RUN and RUN2)."""
    return None


def run(args) -> int:
    """Exit 0 with the run compacted, 1 on bad logs, 2 on bad usage."""
    try:
        compact_run(args.run, args.out, rows_per_file=args.rows, tasks=comma_list(args.tasks, name="--tasks"))
    except LogError as err:
        print(bad_logs_line(err, [args.run]), file=sys.stderr)
        return 1
    except (ValueError, OSError) as err:
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    print(one_line(f"compacted {args.run} into {args.out} (validated)"), file=sys.stderr)
    return 0
