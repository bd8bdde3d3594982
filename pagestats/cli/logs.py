"""Logs as the commands open them, and the lines they print about them: the one error line of bad logs,
the excluded runs, and the warnings of answers the decode limit may have cut (docs/reliability.md)."""

from __future__ import annotations

import shlex
import sys

from pagestats.io import ExclusionError, LogError, load, logs_in_place, only_parquet, open_logs
from pagestats.io.validation.problems import one_line
from pagestats.io.decoding import decode_profile, limit_warnings

#: Problems of bad logs shown on the one error line of ``whatif`` / ``report``.
SHOWN_PROBLEMS = 3


def bad_logs_line(err: LogError, logs: list[str]) -> str:
    """One line for bad logs: the count, the first :data:`SHOWN_PROBLEMS` problems, and the
    ``pagestats validate`` command that lists them all."""
    n = len(err.problems)
    shown = "; ".join(str(p) for p in err.problems[:SHOWN_PROBLEMS])
    rest = f"; {n - SHOWN_PROBLEMS} more" if n > SHOWN_PROBLEMS else ""
    command = "pagestats validate " + " ".join(shlex.quote(a) for a in logs)
    return one_line(f"error: {n} problem{'s' if n != 1 else ''} in the logs: {shown}{rest}; run `{command}` "
                    "for the full list")


def exclusion_line(err: ExclusionError) -> str:
    """The error line of an ``--exclude`` that is malformed or matches nothing (a usage error, exit 2)."""
    return one_line(f"error: {'; '.join(p.message for p in err.problems)}")


def _open(args):
    """The logs named by LOGS (validated and loaded) or by ``--db`` (a :class:`~pagestats.io.LogDB`)."""
    if args.db is None:
        if not args.logs:
            raise ValueError("give LOGS or --db FILE")
        if args.command == "whatif" and not args.exclude and only_parquet(args.logs):
            # validated as queries over the files, then the what-if reads them in place (out of core)
            return logs_in_place(args.logs, memory_limit=args.memory_limit, temp_directory=args.temp_dir,
                                 mode=args.mode, revalidate=args.revalidate)
        return load(args.logs, exclude=args.exclude, mode=args.mode, revalidate=args.revalidate,
                    memory_limit=args.memory_limit, temp_directory=args.temp_dir)
    if args.logs or args.exclude or args.revalidate:
        raise ValueError("--db replaces LOGS, --exclude and --revalidate: the database holds the logs it was "
                         "validated and indexed from (re-run `pagestats index --revalidate` to check them again)")
    db = open_logs(args.db, memory_limit=args.memory_limit, temp_directory=args.temp_dir)
    if db.mode != args.mode:
        db.close()
        raise ValueError(f"{args.db} holds {db.mode} runs, not {args.mode}: index those with "
                         f"`pagestats index LOGS --mode {args.mode} --db FILE`")
    return db


def open_for(args):
    """The logs of ``whatif``, ``report`` and ``prereg`` (LOGS or ``--db``) and the lines that say what was
    left out of them, or the exit status once the one error line is printed (1 bad logs, 2 bad usage).

    Returns
    -------
    tuple of (pagestats.io.LogTables, list of str), or int
    """
    try:
        logs = _open(args)
    except ExclusionError as err:
        print(exclusion_line(err), file=sys.stderr)
        return 2
    except LogError as err:
        if args.db is not None:
            print(one_line(f"error: {'; '.join(str(p) for p in err.problems)}"), file=sys.stderr)
        else:
            print(bad_logs_line(err, args.logs), file=sys.stderr)
        return 1
    except ValueError as err:  # bad usage
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    excluded = [*map(one_line, logs.notes), *(one_line(f"excluded: {line}")
                for line in logs.exclusion_report())]
    return logs, excluded


def print_lines(lines) -> None:
    """``lines`` on stderr, one each (nothing for none)."""
    print(*lines, sep="\n", file=sys.stderr, end="\n" if lines else "")


def decode_limits(manifests: dict) -> dict[tuple[str, str], int]:
    """(run_id, task) → the manifest's ``task_options.{task}.max_new_tokens``, where recorded."""
    out = {}
    for run_id, manifest in manifests.items():
        for task, options in (manifest.get("task_options") or {}).items():
            if isinstance(options, dict) and isinstance(options.get("max_new_tokens"), int):
                out[(run_id, task)] = options["max_new_tokens"]
    return out


def decode_warnings(files, manifests) -> list[str]:
    """The warning lines of :func:`pagestats.io.decoding.limit_warnings` for the full-KV answers."""

    return limit_warnings(decode_profile(files, arms=False), decode_limits(manifests))


def folded_warnings(lines: list[str], logs) -> list[str]:
    """The decode-limit warnings of ``whatif`` and ``report``: one as it is; several folded into one
    line that counts them and names the ``pagestats validate`` command that lists each (the shipped
    data/ holds five such cells: RULER's own decode limits, kept in the ``*-ruler-limits`` runs)."""
    if len(lines) < 2:
        return lines
    named = " ".join(shlex.quote(str(a)) for a in logs or ())
    command = (f"`pagestats validate {named}`" if named and len(named) <= 60
               else "`pagestats validate` on the same LOGS" if named
               else "`pagestats validate` on the logs the database was indexed from")
    return [f"warning: {len(lines)} (run, task) cells hold full-KV answers the decode limit may have cut, so their "
            f"outcomes may measure the limit, not eviction; {command} lists them"]


def strict_failure(limit_lines: list[str]) -> str:
    """The error line of ``--strict`` when answers the decode limit may have cut were found (exit 1)."""
    return one_line(f"error: --strict: {len(limit_lines)} (run, task) cells with answers the decode limit may "
                    "have cut (the warnings above)")
