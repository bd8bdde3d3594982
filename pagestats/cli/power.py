"""``pagestats power rho|harm|delta|claims``: how many inputs a claim needs (docs/STATISTICS.md;
:mod:`pagestats.stats.power`, :mod:`pagestats.tables.claims`).

``rho`` and ``harm`` print ``n = N`` on stdout (``n = none`` when no n up to the search's limit, or
none at all, reaches the power; why on stderr). ``delta`` and ``claims`` read logs and print one row
per cell or claim (``--format csv`` for the exact numbers).
"""

from __future__ import annotations

import sys

import numpy as np
import polars as pl

from pagestats import replay
from pagestats.core import defaults
from pagestats.cli.logs import exclusion_line
from pagestats.cli.options import number
from pagestats.core.escape import csv_frame
from pagestats.io import ExclusionError, LogError, load
from pagestats.io.validation.problems import one_line

#: The cell keys ``power delta --cell`` filters on.
CELL_KEYS = ("model", "context_length", "evictor")


def _rate(name: str):
    return number(0.0, 1.0, name=name)


def add_parser(sub) -> None:
    """The ``pagestats power`` subparsers."""
    p = sub.add_parser("power", help="inputs a claim needs: rho (Wilson), harm (Clopper-Pearson), delta (cluster "
                       "bootstrap), and the claims of logs that are settled or not")
    kinds = p.add_subparsers(dest="kind", required=True)
    r = kinds.add_parser("rho", help="smallest n whose Wilson interval excludes --threshold with probability "
                         "--power when the true rho is --expected (exact binomial search)")
    r.add_argument("--expected", required=True, type=_rate("--expected"), help="the true rho assumed, in [0, 1]")
    r.add_argument("--threshold", type=_rate("--threshold"), default=defaults.RHO_THRESHOLD,
                   help="the partition threshold (§4)")
    r.add_argument("--power", required=True, type=_rate("--power"), help="target probability, in (0, 1)")
    r.add_argument("--level", type=_rate("--level"), default=defaults.CONFIDENCE_LEVEL, help="Wilson interval level")
    h = kinds.add_parser("harm", help="smallest n at which a harm rate of --expected is shown <= --bound by a "
                         "one-sided Clopper-Pearson upper bound with probability --power (exact search)")
    h.add_argument("--bound", required=True, type=_rate("--bound"), help="A, the harm bound, in (0, 1)")
    h.add_argument("--expected", required=True, type=_rate("--expected"), help="the true harm rate assumed, < A")
    h.add_argument("--power", type=_rate("--power"), default=0.8, help="target probability, in (0, 1)")
    h.add_argument("--level", type=_rate("--level"), default=defaults.CONFIDENCE_LEVEL,
                   help="level of the one-sided upper bound")
    d = kinds.add_parser("delta", help="inputs per (model, context, evictor) cell for the Table 28 bootstrap test "
                         "to find a paired delta of --effect, from each cell's variance and cross-budget correlation; "
                         "checked by simulating the test")
    d.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    d.add_argument("--effect", required=True, type=number(-1.0, 1.0, name="--effect"), help="the delta to detect (non-zero)")
    d.add_argument("--power", type=_rate("--power"), default=0.8, help="target probability, in (0, 1)")
    d.add_argument("--alpha", type=_rate("--alpha"), default=0.05, help="two-sided level of the test, in (0, 1)")
    d.add_argument("--cell", action="append", default=None, metavar="KEY=VALUE[,KEY=VALUE]",
                   help=f"only the cells matching (keys: {', '.join(CELL_KEYS)}); repeat for several (default: every cell)")
    d.add_argument("--simulations", type=number(0, 100_000, integer=True, name="--simulations"), default=200,
                   help="simulated cells per check of the answer (0: no check)")
    d.add_argument("--seed", type=number(0, 2**63 - 1, integer=True, name="--seed"), default=0, help="simulation seed")
    d.add_argument("--format", choices=["table", "csv"], default="table", help="output on stdout")
    c = kinds.add_parser("claims", help="which claims of the logs are settled (rho vs 0.05, delta vs 0, harm vs "
                         "--harm-bound) and how many inputs each unsettled one needs")
    c.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    c.add_argument("--power", type=_rate("--power"), default=0.8, help="target probability, in (0, 1)")
    c.add_argument("--level", type=_rate("--level"), default=defaults.CONFIDENCE_LEVEL, help="interval level")
    c.add_argument("--harm-bound", type=_rate("--harm-bound"), default=None,
                   help="A: add the claims 'gated harm at --budget <= A' per cell (default: no harm claims)")
    c.add_argument("--budget", type=_rate("--budget"), default=None, help="the budget of the harm claims (default: none; goes with --harm-bound)")
    c.add_argument("--seed", type=number(0, 2**63 - 1, integer=True, name="--seed"), default=defaults.BOOTSTRAP_SEED,
                   help="bootstrap seed")
    c.add_argument("--format", choices=["table", "csv"], default="table", help="output on stdout")


def _open(name: str, value) -> bool:
    return value is not None and not 0.0 < value < 1.0


def _cells(specs) -> list[dict] | str:
    out = []
    for spec in specs or ():
        cell = {}
        for part in spec.split(","):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in CELL_KEYS or not value.strip():
                return f"--cell {spec!r}: write KEY=VALUE[,KEY=VALUE] with keys {', '.join(CELL_KEYS)}"
            cell[key.strip()] = int(value) if key.strip() == "context_length" and value.strip().isdigit() else value.strip()
        out.append(cell)
    return out


def usage_problem(args) -> str | None:
    """Rates on the open interval, --effect non-zero, --cell well formed, --harm-bound with --budget."""
    for name in ("power", "level", "bound", "alpha", "harm_bound", "budget"):
        if _open(name, getattr(args, name, None)):
            return f"--{name.replace('_', '-')} {getattr(args, name)!r} is not in (0, 1)"
    if args.kind == "delta":
        if args.effect == 0.0:
            return "--effect must be non-zero"
        cells = _cells(args.cell)
        if isinstance(cells, str):
            return cells
    if args.kind == "claims" and (args.harm_bound is None) != (args.budget is None):
        return "--harm-bound and --budget go together"
    return None


def _load(paths):
    try:
        return load(paths), 0
    except ExclusionError as err:
        print(exclusion_line(err), file=sys.stderr)
        return None, 2
    except LogError as err:
        print(one_line(f"error: bad logs: {'; '.join(p.message for p in err.problems[:3])}"), file=sys.stderr)
        return None, 1


def _print(frame: pl.DataFrame, fmt: str) -> None:
    if fmt == "csv":
        sys.stdout.write(csv_frame(frame).write_csv())
    else:
        with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=250, fmt_str_lengths=40, tbl_hide_dataframe_shape=True):
            print(frame)


def run(args) -> int:
    """Exit 0; 1 on bad logs; 2 on bad usage."""
    from pagestats.stats import power as pw  # SciPy and statsmodels: imported only for `power` (ARCHITECTURE.md)

    if args.kind in ("rho", "harm"):
        try:
            res = (pw.rho_sample_size(args.expected, args.threshold, power=args.power, confidence_level=args.level)
                   if args.kind == "rho" else
                   pw.harm_sample_size(args.bound, args.expected, power=args.power, confidence_level=args.level))
        except ValueError as err:
            print(one_line(f"error: {err}"), file=sys.stderr)
            return 2
        print(f"n = {'none' if res.n is None else res.n}")
        why = (f"power {res.power:.4f} at n = {res.n} ({res.method}, level {res.confidence_level:g})" if res.n
               else f"no n up to {res.n_max:,} reaches power {res.target_power:g} ({res.method})")
        print(one_line(why), file=sys.stderr)
        return 0
    logs, code = _load(args.logs)
    if logs is None:
        return code
    from pagestats.tables import claims as power  # the tables, SciPy and statsmodels: imported only for `power` (ARCHITECTURE.md)

    gated = replay.gated_outcomes(logs, replay.FixedTau())
    try:
        if args.kind == "delta":
            cells = _cells(args.cell)
            if cells:
                mask = pl.lit(False)
                for cell in cells:
                    mask = mask | pl.all_horizontal([pl.col(k) == v for k, v in cell.items()])
                gated = gated.filter(mask)
                if gated.height == 0:
                    print(one_line(f"error: no cell of the logs matches --cell {' '.join(args.cell)}"), file=sys.stderr)
                    return 2
            table = power.delta_power_table(gated, effect=args.effect, power=args.power, alpha=args.alpha,
                                            n_sim=args.simulations, rng=np.random.default_rng(args.seed))
        else:
            table = power.claims_table(gated, rng=np.random.default_rng(args.seed), power=args.power,
                                       confidence_level=args.level, harm_bound=args.harm_bound, budget=args.budget)
    except ValueError as err:
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    _print(table, args.format)
    if args.kind == "claims":
        n_open, n_settled = int(table["under_powered"].sum()), int(table["settled"].sum())
        unknown = table.height - n_open - n_settled
        print(one_line(f"{n_settled} of {table.height} claims settled; {n_open} under-powered (interval straddles the "
                       f"threshold){f'; {unknown} without an estimate' if unknown else ''}; n_needed at power "
                       f"{args.power:g}"), file=sys.stderr)
    return 0
