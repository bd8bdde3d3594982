"""Command line of DESIGN §5: ``pagestats validate | whatif | report``.

Machine-readable outputs are part of the interface: ``validate`` prints one line per
problem (``FILE[:row N]: message``) and exits 1 if there is any; ``whatif --format csv``
prints exactly :data:`pagestats.whatif.WHATIF_COLUMNS` at full float precision.
"""

from __future__ import annotations

import argparse
import sys

from pagestats import defaults


def _add_logs(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="RUN_ID[/TASK[/INPUT_ID]]",
        help="leave out a run, a task of a run, or one input (repeatable; exclusions are reported)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagestats", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check logs against schema v1; exit 1 with one line per problem")
    p.add_argument("logs", nargs="+", metavar="LOGS")

    p = sub.add_parser("whatif", help="replay the gate under a policy and print the per-cell table")
    _add_logs(p)
    pol = p.add_mutually_exclusive_group()
    pol.add_argument("--tau", type=float, help=f"fixed threshold τ (default {defaults.TAU})")
    pol.add_argument("--policy", choices=["fixed", "z", "midpoint", "oracle"], help="gate policy")
    p.add_argument("--theta", type=float, default=defaults.THETA_Z, help="θ_z of the z-scored policy")
    p.add_argument("--midpoint-tasks", default=None, metavar="CAP,DIL",
                   help="midpoint policy: take the two samples from these tasks (the paper: niah_multikey_3,vt); "
                   "default: all capacity-bound vs all dilution-prone inputs")
    p.add_argument("--pilot", type=int, default=defaults.PILOT_N, help="pilot size per model (z-scored)")
    p.add_argument(
        "--pilot-by",
        default="model",
        choices=["model", "model,context_length"],
        help="pool the z-scored pilot per model or per model×context",
    )
    p.add_argument("--layers", default=None, help="layer subset: all, first-half, second-half, every-2, "
                   "every-4, early-only, first-last, or a comma list / a:b range of layer indices")
    p.add_argument("--pairs-fraction", type=float, default=None, help="fraction of head pairs kept per draw")
    p.add_argument("--draws", type=int, default=20, help="random head-pair draws (averaged)")
    p.add_argument("--seed", type=int, default=0, help="seed of the head-pair draws / pilot sample")
    p.add_argument("--k", type=int, default=None, help="top-k set size, k ≤ k_max (needs topk logs)")
    p.add_argument("--bins", default=None, help="bin fraction, decimal or fraction such as 1/4 (default 1/3)")
    p.add_argument("--strict-bins", action="store_true", help="strict-thirds late bin (Table 24)")
    p.add_argument("--format", choices=["csv", "table"], default="table")

    p = sub.add_parser("report", help="write every table and figure plus an index with file hashes")
    _add_logs(p)
    p.add_argument("--out", required=True, help="output directory")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "validate":
        from pagestats.io import validate_paths

        problems = validate_paths(args.logs)
        for problem in problems:
            print(problem)
        if not problems:
            print(f"ok: {', '.join(args.logs)}", file=sys.stderr)
        return 1 if problems else 0

    from pagestats.io import LogError, load

    try:
        logs = load(args.logs, exclude=args.exclude)
    except LogError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in logs.exclusion_report():
        print(f"excluded: {line}", file=sys.stderr)

    if args.command == "whatif":
        from pagestats.whatif import policy_from_args, profile_from_args, whatif_table

        try:
            table = whatif_table(logs, policy=policy_from_args(args), profile=profile_from_args(args))
        except (ValueError, TypeError) as err:  # bad option values: one line, no traceback
            print(f"error: {err}", file=sys.stderr)
            return 2
        if args.format == "csv":
            sys.stdout.write(table.write_csv(float_precision=None))
        else:
            import polars as pl

            with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200):
                print(table)
        return 0

    if args.command == "report":
        from pagestats.report import build_report

        index = build_report(logs, out=args.out)
        print(index)
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
