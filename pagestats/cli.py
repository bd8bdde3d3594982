"""Command line of DESIGN §5: ``pagestats validate | whatif | report``.

Machine-readable outputs are part of the interface: ``validate`` prints one line per
problem (``FILE[:row N]: message``) and exits 1 if there is any; ``whatif --format csv``
prints exactly :data:`pagestats.whatif.WHATIF_COLUMNS` at full float precision. Every
option is parsed into a :class:`~pagestats.replay.Policy` / :class:`~pagestats.replay.ProfileSpec` here.
"""

from __future__ import annotations

import argparse
import sys
from fractions import Fraction

import polars as pl

from pagestats import defaults
from pagestats.io import LogError, load, validate_paths
from pagestats.replay import (
    LAYER_SUBSETS,
    FixedTau,
    Midpoint,
    Policy,
    ProfileSpec,
    TaskOracle,
    ZScored,
)


def policy_from_args(args) -> Policy:
    """The gate policy named by the ``pagestats whatif`` options.

    ``--tau X`` → :class:`FixedTau` (X); ``--policy fixed`` or no flag → fixed τ = 0.07;
    ``--policy z`` → :class:`ZScored` (``--theta``, ``--pilot``, ``--pilot-by``, ``--seed``);
    ``--policy midpoint`` → :class:`Midpoint` (samples by ``task_class``, as DESIGN §4 words
    Eq. 5; ``--midpoint-tasks niah_multikey_3,vt`` takes them from two named tasks, as the
    paper's Table 7 does); ``--policy oracle`` → :class:`TaskOracle`.
    """
    tau = getattr(args, "tau", None)
    name = getattr(args, "policy", None)
    if tau is not None:
        if name not in (None, "fixed"):
            raise ValueError(f"--tau applies to the fixed policy, not --policy {name}")
        return FixedTau(float(tau))
    if name in (None, "fixed"):
        return FixedTau(defaults.TAU)
    if name == "z":
        pilot_by = tuple(s.strip() for s in str(getattr(args, "pilot_by", "model")).split(",") if s.strip())
        return ZScored(
            theta_z=float(getattr(args, "theta", defaults.THETA_Z)),
            pilot_n=int(getattr(args, "pilot", defaults.PILOT_N)),
            pilot_by=pilot_by,
            seed=int(getattr(args, "seed", 0)),
        )
    if name == "midpoint":
        tasks = getattr(args, "midpoint_tasks", None)
        if tasks is None:
            return Midpoint()
        parts = [t.strip() for t in str(tasks).split(",")]
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"--midpoint-tasks takes CAPACITY_TASK,DILUTION_TASK (e.g. niah_multikey_3,vt), got {tasks!r}")
        return Midpoint(capacity_tasks=(parts[0],), dilution_tasks=(parts[1],))
    if name == "oracle":
        return TaskOracle()
    raise ValueError(f"unknown policy {name!r}; expected fixed, z, midpoint or oracle")


def parse_layers(text: str | None):
    """``--layers`` value → :attr:`ProfileSpec.layers`: a subset name, or indices from a comma
    list whose items are integers or half-open ranges ``a:b`` (e.g. ``"0:4,10,27"``)."""
    if text is None:
        return None
    text = text.strip()
    if text in LAYER_SUBSETS or not any(ch.isdigit() for ch in text):
        return text  # a named subset; ProfileSpec validates it
    idx: list[int] = []
    for item in text.split(","):
        item = item.strip()
        try:
            if ":" in item:
                lo, hi = item.split(":")
                idx.extend(range(int(lo), int(hi)))
            else:
                idx.append(int(item))
        except ValueError:
            raise ValueError(f"--layers: cannot read {item!r}; use a name, integers or a:b ranges") from None
    return tuple(idx)


def parse_fraction(text) -> float:
    """``--bins`` value → float: a decimal (``0.25``) or an exact fraction (``1/3``)."""
    try:
        return float(Fraction(str(text).strip()))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"--bins: cannot read {text!r}; use a decimal or a fraction such as 1/3") from None


def profile_from_args(args) -> ProfileSpec:
    """The :class:`ProfileSpec` named by ``--layers``, ``--pairs-fraction``, ``--draws``,
    ``--seed``, ``--k``, ``--bins`` and ``--strict-bins``."""
    bins = getattr(args, "bins", None)
    return ProfileSpec(
        layers=parse_layers(getattr(args, "layers", None)),
        bin_fraction=defaults.BIN_FRACTION if bins is None else parse_fraction(bins),
        convention="strict" if getattr(args, "strict_bins", False) else defaults.BIN_CONVENTION,
        pairs_fraction=getattr(args, "pairs_fraction", None),
        draws=int(getattr(args, "draws", defaults.PAIR_DRAWS)),
        seed=int(getattr(args, "seed", 0)),
        k=getattr(args, "k", None),
    )


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
    p.add_argument("--draws", type=int, default=defaults.PAIR_DRAWS, help="random head-pair draws (averaged)")
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
        problems = validate_paths(args.logs)
        for problem in problems:
            print(problem)
        if not problems:
            print(f"ok: {', '.join(args.logs)}", file=sys.stderr)
        return 1 if problems else 0

    try:
        logs = load(args.logs, exclude=args.exclude)
    except LogError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in logs.exclusion_report():
        print(f"excluded: {line}", file=sys.stderr)

    if args.command == "whatif":
        from pagestats.whatif import whatif_table  # SciPy via metrics: imported only for `whatif`

        try:
            table = whatif_table(logs, policy=policy_from_args(args), profile=profile_from_args(args))
        except (ValueError, TypeError) as err:  # bad option values: one line, no traceback
            print(f"error: {err}", file=sys.stderr)
            return 2
        if args.format == "csv":
            sys.stdout.write(table.write_csv(float_precision=None))
        else:
            with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200):
                print(table)
        return 0

    if args.command == "report":
        from pagestats.report import build_report  # matplotlib and great_tables: imported only for `report`

        index = build_report(logs, out=args.out)
        print(index)
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
