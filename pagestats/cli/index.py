"""``pagestats index LOGS --db FILE``: validate logs once and write a DuckDB database of views over their
parquet files, for ``--db`` of ``whatif``, ``report`` and ``prereg freeze`` (docs/CLI.md,
:func:`pagestats.io.index_logs`)."""

from __future__ import annotations

import sys

from pagestats.cli.logs import bad_logs_line, exclusion_line
from pagestats.cli.options import add_duckdb, add_mode, add_revalidate
from pagestats.io import ExclusionError, LogError, index_logs
from pagestats.io.validation.problems import one_line
from pagestats.core.targets import file_problem


def add_parser(sub) -> None:
    """The ``pagestats index`` subparser."""
    p = sub.add_parser("index", help="validate logs and write a DuckDB database of views over their parquet files")
    p.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    p.add_argument("--db", required=True, metavar="FILE", help="the DuckDB file to write")
    add_mode(p)
    add_revalidate(p)
    add_duckdb(p)


def usage_problem(args) -> str | None:
    """Why ``--db`` cannot be written (:mod:`pagestats.core.targets`: an existing DuckDB file is replaced)."""
    return file_problem(args.db, "--db", replace="duckdb")


def run(args) -> int:
    """Exit 0 with the database written, 1 on bad logs, 2 on bad usage."""
    try:
        db = index_logs(args.logs, args.db, memory_limit=args.memory_limit, temp_directory=args.temp_dir,
                        mode=args.mode, revalidate=args.revalidate)
    except ExclusionError as err:
        print(exclusion_line(err), file=sys.stderr)
        return 2
    except LogError as err:
        print(bad_logs_line(err, args.logs), file=sys.stderr)
        return 1
    for line in [*db.notes, *(f"excluded: {x}" for x in db.left_out)]:
        print(one_line(line), file=sys.stderr)
    print(one_line(f"indexed {len(db.files)} files of {db.mode} runs into {args.db}"), file=sys.stderr)
    db.close()
    return 0
