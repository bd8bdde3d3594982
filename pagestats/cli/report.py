"""``pagestats report LOGS --out DIR``: every table and figure plus an index with file hashes
(docs/CLI.md, :mod:`pagestats.report`); prints the path of the page to open."""

from __future__ import annotations

import os
import sys

from pagestats import replay
from pagestats.core import defaults
from pagestats.cli.logs import decode_warnings, folded_warnings, open_for, print_lines, strict_failure
from pagestats.cli.options import MAX_SEED, add_logs, add_policy, database_problem, number, policy_from_args
from pagestats.cli.prereg import band_problem
from pagestats.io.logs import categorical_names
from pagestats.io.validation.problems import one_line
from pagestats.io.prereg import PreregistrationError, verified_band
from pagestats.core.targets import report_problem


def add_parser(sub) -> None:
    """The ``pagestats report`` subparser."""
    p = sub.add_parser("report", help="write every table and figure plus an index with file hashes")
    add_logs(p)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--prereg", default=None, metavar="BAND.json",
                   help="Table 21 checks this frozen band (pagestats prereg freeze) (default: none, Table 21 is a "
                   "post-hoc illustration)")
    p.add_argument("--prereg-sha256", default=None, metavar="HEX", help="the sha256 printed when the band was frozen (default: none; required with --prereg)")
    p.add_argument("--no-pdf", action="store_true",
                   help="write the figures as PNG only, without their PDF copies (about twice as fast; default: PNG "
                   "and PDF)")
    p.add_argument("--dilution-rule", choices=["task-class", "rho"], default=defaults.DILUTION_RULE,
                   help="rows Fig. 9's scaling slope is fitted on: the dilution-prone task class or measured ρ ≥ 0.05 "
                   f"(default: {defaults.DILUTION_RULE}; Table 25 shows both)")
    add_policy(p)
    p.add_argument("--seed", type=number(0, MAX_SEED, integer=True, name="--seed"), default=None,
                   help="seed of the pilot hash of a random/held-out pilot (default: 0)")
    p.add_argument("--see-also", action="append", default=[], metavar="TEXT=HREF",
                   help="a link shown under the page's title (repeatable), e.g. to a companion report: "
                   "\"the PAGE paper's own logs=page-release/index.html\" (default: no link)")
    p.add_argument("--headline-evictor", default=None, metavar="EVICTOR",
                   help="the evictor of the headline sentences and of the single-evictor figures and tables "
                   f"(default: {defaults.HEADLINE_EVICTOR} when logged, else the first in name order)")


def usage_problem(args) -> str | None:
    """Why the options cannot run (one line), before any log is read: ``--db``, the policy (kept on
    ``args`` as ``parsed_policy``), ``--out`` and the band to check (read, its sha256 compared)."""
    problem = database_problem(args)
    if problem:
        return problem
    if (args.prereg is None) != (args.prereg_sha256 is None):
        return "--prereg and --prereg-sha256 go together"
    for link in args.see_also:
        text, _, href = link.partition("=")
        if not text.strip() or not href.strip():
            return f"--see-also {link!r}: give TEXT=HREF, both non-empty"
    try:
        args.parsed_policy = policy_from_args(args)
    except ValueError as err:
        return str(err)
    problem = report_problem(args.out, "--out")
    if problem or args.prereg is None:
        return problem
    return band_problem(args.prereg, args.prereg_sha256, "--prereg-sha256")


def run(args) -> int:
    """Exit 0 with the report written, 1 on bad logs (or ``--strict`` and cut answers), 2 on bad usage."""
    opened = open_for(args)
    if isinstance(opened, int):
        return opened
    logs, excluded = opened
    print_lines(excluded)
    # matplotlib, SciPy, statsmodels and great_tables: imported only for `report` (ARCHITECTURE.md)
    from pagestats.report import build_report, context

    limit_lines = decode_warnings(logs.files, logs.manifests)
    for line in folded_warnings(limit_lines, args.logs):
        print(one_line(line), file=sys.stderr)
    if args.strict and limit_lines:
        print(strict_failure(limit_lines), file=sys.stderr)
        return 1
    # the names as categoricals: the report holds every outcome row twice (io.categorical_names)
    if args.db is None:
        logs = categorical_names(logs)
    else:  # the report reads the frames alone: closing the database frees its buffers (1.1 GiB at 1M inputs)
        db = logs
        logs = db.load(categorical=True)
        db.close()
    if args.parsed_policy.fixed_tau is None:  # a pilot or a sample the logs may not hold
        try:
            replay.gate(context.first_draw(logs), args.parsed_policy)
        except ValueError as err:
            print(one_line(f"error: {err}"), file=sys.stderr)
            return 2
    prereg = None
    if args.prereg is not None:
        try:
            prereg = verified_band(logs, args.prereg, args.prereg_sha256)
        except (PreregistrationError, OSError) as err:
            print(one_line(f"error: {err}"), file=sys.stderr)
            return 2
    try:
        index = build_report(logs, out=args.out, prereg=prereg, dilution_rule=args.dilution_rule,
                             policy=args.parsed_policy, headline_evictor=args.headline_evictor,
                             see_also=[tuple(link.split("=", 1)) for link in args.see_also],
                             **({"formats": ("png",)} if args.no_pdf else {}))
    except context.HeadlineEvictorError as err:  # the one error of an option that needs the logs to check
        print(one_line(f"error: --headline-evictor {err.evictor!r} is not logged; the logs hold "
                       f"{', '.join(err.logged) or 'no evictor'}"), file=sys.stderr)
        return 2
    print(one_line(os.path.join(os.path.dirname(index), "index.html")))  # the page to open; index.md beside it
    return 0
