"""Command line of docs/CLI.md: ``pagestats validate | whatif | report | index | prereg freeze|check``.

Machine-readable outputs are part of the interface: ``validate`` prints one line per
problem (``FILE[:row N]: message``) and exits 1 if there is any; ``whatif --format csv``
prints exactly :data:`pagestats.replay.whatif.WHATIF_COLUMNS` at full float precision.

One module per command (:data:`COMMANDS`), each with ``add_parser(subparsers)``, ``usage_problem(args)``
(every check that needs no log, made before any log is read: bad usage is one line and exit 2,
docs/reliability.md) and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import sys

import duckdb

import pagestats
from pagestats.cli import calibrate, compact, imports, index, monitor, power, prereg, report, show, validate, whatif
from pagestats.cli.options import usage_problem
from pagestats.io.duck import MEMORY_LIMIT
from pagestats.io.validation.problems import one_line

__all__ = ["COMMANDS", "build_parser", "main"]

#: Command name → its module, in the order of ``pagestats --help``.
COMMANDS = {
    "import": imports,  # issue 40: the PAGE paper's released logs as runs
    "validate": validate,
    "whatif": whatif,
    "report": report,
    "prereg": prereg,
    "show": show,
    "compact": compact,
    "index": index,
    "calibrate": calibrate,  # issue 24: gate.json for GatedPress
    "monitor": monitor,  # issue 24: a deployed gate's log
    "power": power,  # issue 43: the inputs a claim needs
}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help text that ends every option with its default (unless it states one, or there is none)."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == [] \
            or action.default == argparse.SUPPRESS
        if not unset and "default" not in text and action.option_strings:
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2), no abbreviated options, and every
    option's default in its help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **{**kwargs, "allow_abbrev": False})

    def error(self, message: str):
        self.exit(2, one_line(f"{self.prog}: error: {message} (see {self.prog} --help)") + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``pagestats`` parser: one subparser per entry of :data:`COMMANDS`."""
    parser = _Parser(prog="pagestats", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"pagestats {pagestats.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``pagestats``: exit 0 ok, 1 bad logs, 2 bad usage, 3 out of resources (one line each)."""
    try:
        return _main(argv)
    except (duckdb.OutOfMemoryException, MemoryError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(one_line(f"error: out of memory ({first}); raise --memory-limit (default {MEMORY_LIMIT}), "
                       "or give --temp-dir a disk with room to spill"), file=sys.stderr)
        return 3
    except duckdb.IOException as err:
        if "No space left on device" not in str(err):
            raise
        print(one_line(f"error: no space left to spill ({str(err).splitlines()[0]}); give --temp-dir a disk "
                       "with room"), file=sys.stderr)
        return 3


def _main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    raw = sys.argv[1:] if argv is None else list(argv)
    if raw[:1] == ["--version"] and len(raw) > 1:  # argparse prints the version and ignores the rest
        parser.error(f"--version takes no other arguments, got {' '.join(raw[1:])!r}")
    args = parser.parse_args(raw)
    command = COMMANDS[args.command]
    problem = usage_problem(args) or command.usage_problem(args)
    if problem:
        print(one_line(f"error: {problem}"), file=sys.stderr)
        return 2
    return command.run(args)
