"""``pagestats validate LOGS``: one line per problem on stdout and exit 1 if there is any; then, on
stderr, why the decodes stopped (docs/CLI.md). Logs that are only deployment runs are checked as such."""

from __future__ import annotations

import sys

import polars as pl

from pagestats.cli.logs import decode_limits
from pagestats.cli.options import add_duckdb, add_revalidate, add_strict
from pagestats.core.escape import csv_frame
from pagestats.io.decoding import decode_profile, limit_warnings
from pagestats.io.deployment import check_deployment, split_deployments
from pagestats.io.validate import checked_runs
from pagestats.io.validation.problems import one_line
from pagestats.deploy.monitor import only_deployments


def add_parser(sub) -> None:
    """The ``pagestats validate LOGS`` subparser."""
    p = sub.add_parser("validate", help="check logs against the schema; exit 1 with one line per problem; "
                       "then say on stderr why the decodes stopped")
    p.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    add_revalidate(p)
    add_strict(p)
    add_duckdb(p)
    p.add_argument("--decodes", action="store_true",
                   help="also read the texts of the evicted arms' decodes that stopped at the limit, for their "
                   "looping and cut-in-reference shares (default: only the full-KV texts, which decide the "
                   "warnings, are read; at 1M inputs the evicted texts cost several times a what-if)")


def usage_problem(args) -> str | None:
    """Nothing beyond the shared checks."""
    return None


def run(args) -> int:
    """Exit 0 valid, 1 with one line per problem (or, with ``--strict``, per cell the decode limit may have cut)."""
    if only_deployments(args.logs):  # issue 24: deployment runs, when LOGS are only those
        return _deployments(args)
    checked = checked_runs(args.logs, revalidate=args.revalidate, memory_limit=args.memory_limit,
                           temp_directory=args.temp_dir)
    problems = checked.problems
    for problem in problems:
        print(problem)
    for line in checked.notes:
        print(one_line(line), file=sys.stderr)
    if problems:
        return 1
    profile = decode_profile(checked.files, arm_texts=args.decodes)
    print(_decode_table(profile, args.decodes), file=sys.stderr)
    warnings = limit_warnings(profile, decode_limits(checked.manifests))
    for line in warnings:
        print(one_line(line), file=sys.stdout if args.strict else sys.stderr)
    if args.strict and warnings:
        return 1
    print(one_line(f"ok: {', '.join(args.logs)}"), file=sys.stderr)
    return 0


def _deployments(args) -> int:
    """``pagestats validate`` of deployment runs only (exit 0 valid, 1 with one line per problem)."""
    problems, lines = [], []
    for path in split_deployments(args.logs)[1]:
        run, found = check_deployment(path)
        problems += found
        lines += [run.summary()] if run is not None else []
    for problem in problems:
        print(problem)
    if problems:
        return 1
    for line in lines:
        print(one_line(line), file=sys.stderr)
    print(one_line(f"ok: {', '.join(args.logs)}"), file=sys.stderr)
    return 0


def _decode_table(profile: pl.DataFrame, arm_texts: bool) -> str:
    """The per (run, task, arm) decode profile of ``validate`` as a text table of shares ("not read"
    where the texts were not read)."""
    n = pl.col("n")
    body = profile.select(
        "run", "task", "arm", "n",
        (pl.col("n_length") / n).round(3).alias("length"),
        *((pl.col(c) / n).round(3).cast(pl.String).fill_null("not read").alias(name)
          for c, name in (("n_looping", "looping"), ("n_cut", "cut_in_reference"))),
        (pl.col("n_unknown") / n).round(3).alias("reason_unknown"),
        "max_generated",
    )
    body = csv_frame(body)  # run and task names escaped for the terminal
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=-1, fmt_str_lengths=1000, tbl_hide_dataframe_shape=True,
                   tbl_hide_column_data_types=True, tbl_formatting="ASCII_MARKDOWN"):
        text = str(body)
    return (f"{text}\nwhy decodes stopped, per (run, task, arm): shares of decodes that stopped at the decode limit, "
            "of those that loop (repeating text), of those (or of reasons unknown) whose text ends inside a "
            "reference it does not contain, and of reasons a v1 log did not record; arm 'full' is the full-KV "
            "answer, the evictors' rows are budgets b < 1"
            + ("" if arm_texts else "; the evictors' texts are read with --decodes"))
