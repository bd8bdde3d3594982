"""Command line of docs/CLI.md: ``pagestats validate | whatif | report | index | prereg freeze|check``.

Machine-readable outputs are part of the interface: ``validate`` prints one line per
problem (``FILE[:row N]: message``) and exits 1 if there is any; ``whatif --format csv``
prints exactly :data:`pagestats.whatif.WHATIF_COLUMNS` at full float precision. Every
option is parsed into a :class:`~pagestats.replay.Policy` / :class:`~pagestats.replay.ProfileSpec` here.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import sys
from fractions import Fraction

import polars as pl

import pagestats
from pagestats import defaults, replay
from pagestats.columns import MATRIX_CELL
from pagestats.escape import csv_frame
from pagestats.io import (
    ExclusionError,
    LogError,
    Logs,
    index_logs,
    load,
    logs_in_place,
    only_parquet,
    open_logs,
)
from pagestats.io.duck import MEMORY_LIMIT
from pagestats.io.validate import checked_runs
from pagestats.io.validation.problems import one_line
from pagestats.prereg import PreregistrationError, freeze_band, verified_band
from pagestats.replay import (
    LAYER_SUBSETS,
    PILOT_SPLITS,
    RECALIBRATE_MODES,
    FixedTau,
    Midpoint,
    Policy,
    ProfileSpec,
    TaskOracle,
    ZScored,
    pilot_composition,
    recalibrate,
)

#: Bounds of the numeric options: beyond them a value is a typo, or a run of hours.
MAX_DRAWS = 1000
MAX_LAYER = 10_000
MAX_PILOT = 10_000_000
MAX_K = 1_000_000
MAX_SEED = 2**32 - 1
#: Problems of bad logs shown on the one error line of ``whatif`` / ``report``.
SHOWN_PROBLEMS = 3

#: A plain decimal number in ASCII: no ``nan``/``inf``, no ``_`` separators, no other digits.
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[+-]?[0-9]+")


def number(lo: float, hi: float, *, integer: bool = False, name: str = "value"):
    """An argparse ``type``: an ASCII decimal (or integer) in [lo, hi], finite.

    Rejects what ``float``/``int`` would accept but a reader would not mean: ``nan``,
    ``inf``, ``1e400`` (overflows to inf), ``1_0`` (read as 10), non-ASCII digits.
    """

    def parse(text: str):
        text = str(text).strip()
        if not (_INTEGER if integer else _DECIMAL).fullmatch(text):
            kind = "an integer" if integer else "a decimal number"
            raise argparse.ArgumentTypeError(f"{name} {text!r} is not {kind} written with the digits 0-9")
        value = int(text) if integer else float(text)
        if not math.isfinite(value) or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{name} {text!r} is outside [{lo:g}, {hi:g}]")
        return value

    parse.__name__ = name  # argparse names the type in its message
    return parse


#: DuckDB's units of a memory amount (case-insensitive, as DuckDB reads them): 1000^i and 1024^i bytes.
_MEMORY_UNITS = {
    "b": 1, "byte": 1, "bytes": 1,
    "kb": 10**3, "kilobyte": 10**3, "kilobytes": 10**3, "mb": 10**6, "megabyte": 10**6, "megabytes": 10**6,
    "gb": 10**9, "gigabyte": 10**9, "gigabytes": 10**9, "tb": 10**12, "terabyte": 10**12, "terabytes": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_MEMORY = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+) *([A-Za-z]+|%)")


def memory_limit(text: str) -> str:
    """An argparse ``type`` for ``--memory-limit``: DuckDB's grammar of a memory amount, a positive
    number and a unit (``2GB``, ``500 MiB``, ``1.5gigabytes``) or a share of the RAM (``50%``).

    DuckDB reads the value only when a command connects: ``lots`` or ``0`` (no unit) was a
    ParserException traceback in ``whatif`` and ``index`` and ignored by ``report``. Checked
    here, and then by DuckDB itself on an empty connection (its range), before any log is read.
    """
    import duckdb

    text = str(text).strip()
    m = _MEMORY.fullmatch(text)
    units = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB or %"
    if not m or (m.group(2) != "%" and m.group(2).lower() not in _MEMORY_UNITS):
        raise argparse.ArgumentTypeError(f"--memory-limit {text!r} is not a number and a unit of {units} "
                                         "(e.g. 2GB)")
    amount = float(m.group(1))
    if not amount > 0 or (m.group(2) == "%" and amount > 100):
        raise argparse.ArgumentTypeError(f"--memory-limit {text!r} must be more than 0"
                                         + (" and at most 100%" if m.group(2) == "%" else ""))
    try:
        duckdb.connect().execute(f"SET memory_limit = '{text}'")
    except (duckdb.ParserException, duckdb.InvalidInputException) as err:
        raise argparse.ArgumentTypeError(f"--memory-limit {text!r}: {one_line(str(err).splitlines()[0])}") from None
    return text


memory_limit.__name__ = "--memory-limit"


def _fit_contexts(text: str) -> list[int]:
    """``prereg freeze --fit-contexts``: a comma list of distinct positive context lengths."""
    parse = number(1, 10**9, integer=True, name="--fit-contexts")
    items = [s.strip() for s in str(text).split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"--fit-contexts {text!r} is not a comma list of context lengths")
    values = [parse(s) for s in items]
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"--fit-contexts {text!r} names a context length twice")
    return values


_fit_contexts.__name__ = "--fit-contexts"


def _given(args, name: str) -> bool:
    """Whether the user passed ``--name`` (options that only some policies read default to None)."""
    return getattr(args, name, None) is not None


def check_options(args) -> None:
    """Refuse options that the chosen policy and profile do not read (docs/CLI.md: exit 2).

    ``--theta`` applies to ``--policy z``; ``--pilot``, ``--pilot-by`` and ``--pilot-split``
    to a policy with a pilot (``--policy z`` or ``--recalibrate z``); ``--midpoint-tasks`` to
    ``--policy midpoint``; ``--pair-draws`` to ``--pairs-fraction``; ``--seed`` to a
    head-pair draw or a hashed pilot.
    """
    name = getattr(args, "policy", None) or "fixed"
    recal = getattr(args, "recalibrate", None) or "none"
    has_pilot = name == "z" or recal == "z"
    if _given(args, "theta") and name != "z":
        raise ValueError(f"--theta applies to --policy z, not the {name} policy")
    for opt in ("pilot", "pilot_by", "pilot_split"):
        if _given(args, opt) and not has_pilot:
            raise ValueError(f"--{opt.replace('_', '-')} applies to a pilot (--policy z or --recalibrate z), "
                             f"not the {name} policy")
    if _given(args, "midpoint_tasks") and name != "midpoint":
        raise ValueError(f"--midpoint-tasks applies to --policy midpoint, not the {name} policy")
    if _given(args, "pair_draws") and getattr(args, "pairs_fraction", None) is None:
        raise ValueError("--pair-draws applies to --pairs-fraction (head-pair subsampling)")
    split = getattr(args, "pilot_split", None) or defaults.PILOT_SPLIT
    if _given(args, "seed") and getattr(args, "pairs_fraction", None) is None and not (has_pilot and split != "first"):
        raise ValueError("--seed applies to --pairs-fraction draws or a random/held-out pilot")


def _draws(text: str):
    """``--draws`` value: ``pooled`` or a draw number."""
    text = str(text).strip()
    if text == "pooled":
        return text
    if not re.fullmatch(r"[0-9]+", text):
        raise argparse.ArgumentTypeError(f"--draws takes pooled or a draw number, got {text!r}")
    return int(text)


def _pilot_by(args) -> tuple[str, ...]:
    text = getattr(args, "pilot_by", None) or "model"
    return tuple(s.strip() for s in str(text).split(",") if s.strip())


def policy_from_args(args) -> Policy:
    """The gate policy named by the ``pagestats whatif`` options.

    ``--tau X`` → :class:`FixedTau` (X); ``--policy fixed`` or no flag → fixed τ = 0.07;
    ``--policy z`` → :class:`ZScored` (``--theta``, ``--pilot``, ``--pilot-by``,
    ``--pilot-split``, ``--seed``); ``--policy midpoint`` → :class:`Midpoint` (the paper's
    samples, 20 NIAH-MK3 and 20 VT inputs, App. A.3.4 and Table 7; ``--midpoint-tasks CAP,DIL``
    names two other tasks, ``--midpoint-tasks class`` pools every capacity-bound against every
    dilution-prone input); ``--policy oracle`` →
    :class:`TaskOracle`. ``--recalibrate z|midpoint`` then re-derives a fixed τ on the
    changed statistic (:func:`pagestats.replay.recalibrate`, App. A.3.1). Options the policy
    does not read are refused (:func:`check_options`).
    """
    check_options(args)
    tau = getattr(args, "tau", None)
    name = getattr(args, "policy", None)
    seed = int(getattr(args, "seed", None) or 0)
    pilot_n = int(getattr(args, "pilot", None) or defaults.PILOT_N)
    split = getattr(args, "pilot_split", None) or defaults.PILOT_SPLIT
    recal = getattr(args, "recalibrate", None) or "none"
    if tau is not None:
        if name not in (None, "fixed"):
            raise ValueError(f"--tau applies to the fixed policy, not --policy {name}")
        policy = FixedTau(float(tau))
    elif name in (None, "fixed"):
        policy = FixedTau(defaults.TAU)
    elif name == "z":
        theta = getattr(args, "theta", None)
        policy = ZScored(theta_z=defaults.THETA_Z if theta is None else float(theta), pilot_n=pilot_n,
                         pilot_by=_pilot_by(args), pilot=split, seed=seed)
    elif name == "midpoint":
        tasks = getattr(args, "midpoint_tasks", None)
        if tasks is None:
            policy = Midpoint()
        elif str(tasks).strip() == "class":
            policy = Midpoint(capacity_tasks=None, dilution_tasks=None)
        else:
            parts = [t.strip() for t in str(tasks).split(",")]
            if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
                raise ValueError(f"--midpoint-tasks takes two different tasks CAPACITY_TASK,DILUTION_TASK "
                                 f"(e.g. niah_multikey_3,vt), got {tasks!r}")
            policy = Midpoint(capacity_tasks=(parts[0],), dilution_tasks=(parts[1],))
    elif name == "oracle":
        policy = TaskOracle()
    else:
        raise ValueError(f"unknown policy {name!r}; expected fixed, z, midpoint or oracle")
    return recalibrate(policy, recal, pilot_n=pilot_n, pilot_by=_pilot_by(args), pilot=split, seed=seed)


def parse_layers(text: str | None):
    """``--layers`` value → :attr:`ProfileSpec.layers`: a subset name, or indices from a comma
    list whose items are integers or half-open ranges ``a:b`` (e.g. ``"0:4,10,27"``)."""
    if text is None:
        return None
    text = text.strip()
    if text in LAYER_SUBSETS:
        return text
    idx: list[int] = []
    for item in text.split(","):
        item = item.strip()
        bounds = item.split(":")
        if len(bounds) > 2 or not all(re.fullmatch(r"[0-9]+", b) for b in bounds):
            raise ValueError(f"--layers: cannot read {item!r}; use one of {', '.join(LAYER_SUBSETS)}, "
                             f"integers 0-9 or a:b ranges")
        values = [int(b) for b in bounds]
        if max(values) > MAX_LAYER:
            raise ValueError(f"--layers: {item!r} is beyond layer {MAX_LAYER}")
        idx.extend(range(values[0], values[1]) if len(values) == 2 else values)
    return tuple(idx)


def parse_fraction(text) -> float:
    """``--bins`` value → float: a decimal (``0.25``) or an exact fraction (``1/3``)."""
    text = str(text).strip()
    if re.fullmatch(r"([0-9]+\.?[0-9]*|\.[0-9]+)(/[0-9]+)?", text):
        try:
            return float(Fraction(text))
        except ZeroDivisionError:
            pass
    raise ValueError(f"--bins: cannot read {text!r}; use a decimal or a fraction such as 1/3")


def profile_from_args(args) -> ProfileSpec:
    """The :class:`ProfileSpec` named by ``--layers``, ``--pairs-fraction``, ``--pair-draws``,
    ``--seed``, ``--k``, ``--bins`` and ``--strict-bins``."""
    bins = getattr(args, "bins", None)
    return ProfileSpec(
        layers=parse_layers(getattr(args, "layers", None)),
        bin_fraction=defaults.BIN_FRACTION if bins is None else parse_fraction(bins),
        convention="strict" if getattr(args, "strict_bins", False) else defaults.BIN_CONVENTION,
        pairs_fraction=getattr(args, "pairs_fraction", None),
        draws=int(getattr(args, "pair_draws", None) or defaults.PAIR_DRAWS),
        seed=int(getattr(args, "seed", None) or 0),
        k=getattr(args, "k", None),
    )


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


def pilot_lines(pilot: pl.DataFrame) -> list[str]:
    """Stderr lines of a calibration pilot (:func:`pagestats.replay.pilot_composition`): the τ it
    set and its inputs per task, per context and per run, per pilot group."""
    if pilot.height == 0:
        return []
    lines = []
    for (model,), part in pilot.group_by(["model"], maintain_order=True):
        taus = ", ".join(f"{t:.6g}" for t in part["tau"].unique(maintain_order=True).to_list())
        held = "held out of the evaluation" if part["held_out"].any() else "evaluated with the rest"
        lines.append(f"pilot {model}: τ = {taus}; {int(part['n_pilot'].sum())} inputs, {held}")
        for col in ("task", "context_length", "run_id"):
            counts = part.group_by(col).agg(pl.col("n_pilot").sum()).sort(col)
            lines.append(f"pilot {model} by {col}: " + ", ".join(f"{k}={n}" for k, n in counts.iter_rows()))
    return lines


def _pilot(logs, policy, profile) -> pl.DataFrame:
    """:func:`pagestats.replay.pilot_composition` of in-memory logs or of a database (drawn in SQL;
    nothing to compute for a fixed τ, which has no pilot)."""
    if isinstance(policy, FixedTau):
        return pl.DataFrame()
    return pilot_composition(logs, policy, profile)


def _add_duckdb(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory-limit", type=memory_limit, default=MEMORY_LIMIT, help=f"DuckDB memory limit (default: {MEMORY_LIMIT}); "
                   "larger queries spill to --temp-dir")
    p.add_argument("--temp-dir", default=None, help="DuckDB spill directory (default: the system temp dir)")


def _add_mode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=defaults.MODES, default=defaults.MODE,
                   help="collection mode to analyse (manifest 'mode'; none means query-aware); runs of the other mode "
                   "are left out, with one line on stderr, so the two modes never pool into one cell "
                   f"(default: {defaults.MODE}, the paper's setting)")


def _add_revalidate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--revalidate", action="store_true",
                   help="check every rule again even on log files unchanged since they passed (default: files "
                   "whose validation record in $PAGESTATS_CACHE_DIR, else ~/.cache/pagestats, still holds are "
                   "not checked again, with one line on stderr)")


def _add_strict(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="treat answers the decode limit may have cut as bad logs: a (run, task) whose full-KV "
                   "answers stop at the limit without looping on more than 5 %% of inputs, or end inside a "
                   "reference at all, exits 1 (default: one warning line each)")


def _decode_warnings(files, manifests) -> list[str]:
    """The warning lines of :func:`pagestats.io.decoding.limit_warnings` for the full-KV answers."""
    from pagestats.io.decoding import decode_profile, limit_warnings

    return limit_warnings(decode_profile(files, arms=False), decode_limits(manifests))


def decode_limits(manifests: dict) -> dict[tuple[str, str], int]:
    """(run_id, task) → the manifest's ``task_options.{task}.max_new_tokens``, where recorded."""
    out = {}
    for run_id, manifest in manifests.items():
        for task, options in (manifest.get("task_options") or {}).items():
            if isinstance(options, dict) and isinstance(options.get("max_new_tokens"), int):
                out[(run_id, task)] = options["max_new_tokens"]
    return out


def _decode_table(profile: pl.DataFrame) -> str:
    """The per (run, task, arm) decode profile of ``validate`` as a text table of shares."""
    n = pl.col("n")
    body = profile.select(
        "run", "task", "arm", "n",
        (pl.col("n_length") / n).round(3).alias("length"),
        (pl.col("n_looping") / n).round(3).alias("looping"),
        (pl.col("n_cut") / n).round(3).alias("cut_in_reference"),
        (pl.col("n_unknown") / n).round(3).alias("reason_unknown"),
        "max_generated",
    )
    body = csv_frame(body)  # run and task names escaped for the terminal
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=-1, fmt_str_lengths=1000, tbl_hide_dataframe_shape=True,
                   tbl_hide_column_data_types=True, tbl_formatting="ASCII_MARKDOWN"):
        text = str(body)
    return (f"{text}\nwhy decodes stopped, per (run, task, arm): shares of decodes that stopped at the decode limit, "
            "of those that loop (repeating text), of texts that end inside a reference they do not contain, and of "
            "reasons a v1 log did not record; arm 'full' is the full-KV answer, the evictors' rows are budgets b < 1")


def add_midpoint_tasks(p: argparse.ArgumentParser) -> None:
    """``--midpoint-tasks`` of ``whatif`` and ``calibrate`` (read by :func:`policy_from_args`)."""
    p.add_argument("--midpoint-tasks", default=None, metavar="CAP,DIL|class",
                   help="midpoint policy: the tasks of its two samples, or class to pool every capacity-bound "
                   f"against every dilution-prone input (default: {','.join(defaults.MIDPOINT_TASKS)}, the "
                   "paper's 20 NIAH-MK3 and 20 VT inputs, App. A.3.4)")


def _add_policy(p: argparse.ArgumentParser) -> None:
    """The gate policy options of ``whatif`` and ``report`` (read by :func:`policy_from_args`)."""
    pol = p.add_mutually_exclusive_group()
    pol.add_argument("--tau", type=number(-1.0, 1.0, name="--tau"), help=f"fixed threshold τ (default: {defaults.TAU})")
    pol.add_argument("--policy", choices=["fixed", "z", "midpoint", "oracle"], help="gate policy (default: fixed, τ = 0.07)")
    p.add_argument("--theta", type=number(-1e3, 1e3, name="--theta"), default=None,
                   help=f"θ_z of the z-scored policy (default: {defaults.THETA_Z})")
    add_midpoint_tasks(p)
    p.add_argument("--pilot", type=number(1, MAX_PILOT, integer=True, name="--pilot"), default=None,
                   help=f"pilot size per group (default {defaults.PILOT_N})")
    p.add_argument(
        "--pilot-by",
        default=None,
        choices=["model", "model,context_length"],
        help="pool the pilot per model (default) or per model×context",
    )
    p.add_argument("--pilot-split", choices=list(PILOT_SPLITS), default=None,
                   help=f"which inputs form the pilot (default {defaults.PILOT_SPLIT}: a seeded hash of the input "
                   "identity, left out of every evaluated number)")


def _add_logs(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="*", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    _add_mode(p)
    _add_revalidate(p)
    _add_strict(p)
    p.add_argument("--db", default=None, metavar="FILE",
                   help="read the logs through a database written by `pagestats index` instead of LOGS "
                   "(default: read LOGS)")
    _add_duckdb(p)
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="RUN[/TASK[/INPUT_ID]]",
        help="leave out a run, a task of a run, or one input; RUN is a run_id or the run's directory name "
        "(repeatable; exclusions are reported; default: none)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pagestats", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"pagestats {pagestats.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check logs against the schema; exit 1 with one line per problem; "
                       "then say on stderr why the decodes stopped")
    p.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    _add_revalidate(p)
    _add_strict(p)
    _add_duckdb(p)

    p = sub.add_parser("whatif", help="replay the gate under a policy and print the per-cell table")
    _add_logs(p)
    _add_policy(p)
    p.add_argument("--recalibrate", choices=list(RECALIBRATE_MODES), default="none",
                   help="re-derive a fixed τ on the changed statistic: z = keep τ's z-position in the pilot, "
                   "midpoint = Eq. 5 (App. A.3.1: a sweep that rescales D must recalibrate τ; default: none)")
    p.add_argument("--layers", default=None, help="layer subset: all, first-half, second-half, every-2, "
                   "every-4, early-only, first-last, or a comma list / a:b range of layer indices "
                   "(default: all layers)")
    p.add_argument("--pairs-fraction", type=number(0.0, 1.0, name="--pairs-fraction"), default=None, help="fraction of head pairs kept per draw (default: every pair)")
    p.add_argument("--draws", type=_draws, default=None, metavar="pooled|N",
                   help="input draws (inputs.draw): N keeps draw N, pooled pools them on purpose (default: one "
                   "row per draw, with a draw column, when the logs hold more than one)")
    p.add_argument("--pair-draws", type=number(1, MAX_DRAWS, integer=True, name="--pair-draws"), default=None,
                   help=f"random head-pair draws, averaged (default: {defaults.PAIR_DRAWS}; at most {MAX_DRAWS})")
    p.add_argument("--seed", type=number(0, MAX_SEED, integer=True, name="--seed"), default=None,
                   help="seed of the head-pair draws / pilot hash (default: 0)")
    p.add_argument("--k", type=number(1, MAX_K, integer=True, name="--k"), default=None, help="top-k set size, k ≤ k_max (needs topk logs; default: the logged k)")
    p.add_argument("--bins", default=None, help="bin fraction, decimal or fraction such as 1/4 (default: 1/3)")
    p.add_argument("--strict-bins", action="store_true", help="strict-thirds late bin (Table 24; default: the deployed equal-size bins)")
    p.add_argument("--format", choices=["csv", "table"], default="table",
                   help="table: the summary of --by for reading; csv: the per-cell table (every column "
                   "at full precision) on stdout")
    p.add_argument("--by", default=None, metavar="KEYS",
                   help="group keys of the summary (--format table), a comma list of model, context_length, "
                   f"evictor, task, budget (default: {','.join(MATRIX_CELL)})")
    p.add_argument("--evictor", default=None, metavar="E1,E2", help="show only these evictors (default: all)")
    p.add_argument("--task", default=None, metavar="T1,T2", help="show only these tasks (default: all)")
    p.add_argument("--context", default=None, metavar="N1,N2",
                   help="show only these context lengths (default: all); the replay still sees every input")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="also write the per-cell table to FILE: .csv, .parquet or .json (default: none)")

    p = sub.add_parser("report", help="write every table and figure plus an index with file hashes")
    _add_logs(p)
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
    _add_policy(p)
    p.add_argument("--seed", type=number(0, MAX_SEED, integer=True, name="--seed"), default=None,
                   help="seed of the pilot hash of a random/held-out pilot (default: 0)")
    p.add_argument("--headline-evictor", default=None, metavar="EVICTOR",
                   help="the evictor of the headline sentences and of the single-evictor figures and tables "
                   f"(default: {defaults.HEADLINE_EVICTOR} when logged, else the first in name order)")

    p = sub.add_parser("prereg", help="two-step pre-registration of the scaling prediction (Table 21)")
    steps = p.add_subparsers(dest="step", required=True)
    q = steps.add_parser("freeze", help="write the prediction band from the fitting contexts and the target's "
                         "full-KV scores; print its sha256")
    _add_logs(q)
    q.add_argument("--fit-contexts", required=True, type=_fit_contexts, metavar="N[,N…]",
                   help="fitting context lengths")
    q.add_argument("--target-context", required=True, type=number(1, 10**9, integer=True, name="--target-context"),
                   metavar="N", help="the context length to predict")
    q.add_argument("--out", required=True, metavar="BAND.json", help="band file (never overwritten)")
    q.add_argument("--evictor", default=None, help="evictor whose plain arm defines ρ (default: snapkv when logged)")
    q = steps.add_parser("check", help="compare a frozen band with the measurement, after checking its sha256 and "
                         "that it was frozen before the target outcomes' runs were created")
    q.add_argument("band", metavar="BAND.json")
    q.add_argument("--sha256", required=True, metavar="HEX", help="the sha256 printed by prereg freeze")
    q.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    _add_mode(q)
    _add_revalidate(q)
    q.add_argument("--exclude", action="append", default=[], metavar="RUN_ID[/TASK[/INPUT_ID]]",
                   help="leave out a run, a task of a run, or one input (repeatable; exclusions are reported; "
                   "default: none)")
    _add_duckdb(q)
    q.set_defaults(db=None)
    q.add_argument("--format", choices=["csv", "table"], default="table", help="table or csv on stdout (default: table)")

    p = sub.add_parser("show", help="print one input: prompt, references, D and the gate, a_ℓ, every arm's prediction")
    p.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    p.add_argument("--input", required=True, metavar="RUN/TASK/ID",
                   help="the input; RUN is a run_id or the run's directory name")
    p.add_argument("--tau", type=number(-1.0, 1.0, name="--tau"), default=defaults.TAU,
                   help="the fixed threshold τ of the gate decision shown")

    p = sub.add_parser("compact", help="merge a run's part files into one file per table, with a new manifest")
    p.add_argument("run", metavar="RUN", help="the run directory to compact")
    p.add_argument("--out", required=True, metavar="RUN2", help="the new run directory (must not exist)")
    p.add_argument("--rows", type=number(1, 10**12, integer=True, name="--rows"), default=None,
                   help="rows per output file (default: one file per table)")
    p.add_argument("--tasks", default=None, metavar="TASK,...",
                   help="keep only these tasks of the run, e.g. to replace the others by a re-collection "
                   "(default: every task)")

    p = sub.add_parser("index", help="validate logs and write a DuckDB database of views over their parquet files")
    p.add_argument("logs", nargs="+", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    p.add_argument("--db", required=True, metavar="FILE", help="the DuckDB file to write")
    _add_mode(p)
    _add_revalidate(p)
    _add_duckdb(p)
    from pagestats.calibrate import add_parser as _add_calibrate  # issue 24: gate.json for GatedPress
    from pagestats.monitor import add_parser as _add_monitor  # issue 24: a deployed gate's log

    _add_calibrate(sub)
    _add_monitor(sub)
    return parser


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


def _bad_logs_line(err: LogError, logs: list[str]) -> str:
    """One line for bad logs: the count, the first :data:`SHOWN_PROBLEMS` problems, and the
    ``pagestats validate`` command that lists them all."""
    n = len(err.problems)
    shown = "; ".join(str(p) for p in err.problems[:SHOWN_PROBLEMS])
    rest = f"; {n - SHOWN_PROBLEMS} more" if n > SHOWN_PROBLEMS else ""
    command = "pagestats validate " + " ".join(shlex.quote(a) for a in logs)
    return one_line(f"error: {n} problem{'s' if n != 1 else ''} in the logs: {shown}{rest}; run `{command}` "
                    "for the full list")


def _comma_list(text, kind=str, name="option"):
    """A comma-separated option value as a list of ``kind`` (``None`` stays ``None``)."""
    if text is None:
        return None
    items = [s.strip() for s in str(text).split(",") if s.strip()]
    try:
        return [kind(s) for s in items]
    except ValueError:
        raise ValueError(f"{name}: cannot read {text!r} as a comma list of {kind.__name__}") from None


def _by(args) -> list[str]:
    """The ``whatif --by`` keys (the matrix cell when not given)."""
    return _comma_list(args.by, name="--by") if args.by is not None else list(MATRIX_CELL)


def usage_problem(args) -> str | None:
    """Why the parsed options cannot run (one line), or ``None``: every check that needs no log,
    made before any log is read (docs/reliability.md), so that bad usage is one line and exit 2.

    The paths a command writes (``--temp-dir``, ``index --db``, ``report --out``, ``prereg freeze
    --out``, ``whatif -o``) pass :mod:`pagestats.targets`; ``--db`` to read is a file; the what-if
    policy, profile and ``--by`` keys are parsed; a band to check is read and its sha256 compared.
    """
    from pagestats.targets import file_problem, folder_problem

    command = args.command
    if getattr(args, "temp_dir", None) is not None:
        problem = folder_problem(args.temp_dir, "--temp-dir")
        if problem:
            return problem
    if command == "index":
        return file_problem(args.db, "--db", replace="duckdb")
    db = getattr(args, "db", None)
    if db is not None:
        if not db.strip():
            return "--db is empty; name a database written by `pagestats index`"
        if os.path.isdir(db):
            return f"--db {db} is a folder, not a database written by `pagestats index`"
    if command == "whatif":
        from pagestats.columns import WHATIF_CELL
        from pagestats.whatif import WHATIF_FORMATS

        if args.format == "csv" and args.by is not None:
            return "--by groups the summary of --format table; --format csv prints every cell"
        by = _by(args)
        if not by or any(k not in WHATIF_CELL for k in by) or len(set(by)) != len(by):
            return f"--by takes distinct keys among {', '.join(WHATIF_CELL)}; got {','.join(by) or 'nothing'}"
        if args.output is not None:
            problem = file_problem(args.output, "-o", suffixes=WHATIF_FORMATS)
            if problem:
                return problem
        try:
            args.parsed_policy, args.parsed_profile = policy_from_args(args), profile_from_args(args)
        except ValueError as err:
            return str(err)
        for name, kind in (("evictor", str), ("task", str), ("context", int)):
            try:
                _comma_list(getattr(args, name), kind, f"--{name}")
            except ValueError as err:
                return str(err)
    if command == "report":
        from pagestats.report.write import out_problem  # matplotlib: imported only for `report`

        if (args.prereg is None) != (args.prereg_sha256 is None):
            return "--prereg and --prereg-sha256 go together"
        try:
            args.parsed_policy = policy_from_args(args)
        except ValueError as err:
            return str(err)
        problem = out_problem(args.out)
        if problem or args.prereg is None:
            return problem
        return _band_problem(args.prereg, args.prereg_sha256)
    if command == "prereg" and args.step == "freeze":
        return file_problem(args.out, "--out", replace="never")
    if command == "prereg" and args.step == "check":
        return _band_problem(args.band, args.sha256)
    return None


def _band_problem(path: str, sha256: str) -> str | None:
    """Why the frozen band at ``path`` cannot be checked (not a readable band with this sha256)."""
    from pagestats.prereg import load_band

    if not str(path).strip():
        return "the band file name is empty"
    if not os.path.isfile(path):
        return f"{path}: no such band file (write one with `pagestats prereg freeze`)"
    try:
        load_band(path, sha256)
    except PreregistrationError as err:
        return str(err)
    except (OSError, ValueError) as err:  # unreadable, or not JSON: the sha256 matched bytes that are no band
        return f"{path}: not a readable band ({one_line(str(err))[:200]})"
    return None


def _summary_text(summary: pl.DataFrame, args) -> str:
    """The ``whatif`` summary as a compact text table, with one line saying what it shows."""
    body = csv_frame(summary.with_columns(pl.col(pl.Float64).round(3)))  # names escaped for the terminal
    # the full names (a kvpress evictor with its parameters is long): no truncation, no wrapping
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=-1, fmt_str_lengths=1000, tbl_hide_dataframe_shape=True,
                   tbl_hide_column_data_types=True, tbl_formatting="ASCII_MARKDOWN", float_precision=3):
        text = str(body)
    scope = "every budget" if "budget" in summary.columns else "budgets b < 1"
    return (f"{text}\nmean over inputs and {scope} per {', '.join(summary.columns[:summary.columns.index('n_inputs')])}; "
            "the per-cell table: --format csv or -o FILE")


def main(argv: list[str] | None = None) -> int:
    """``pagestats``: exit 0 ok, 1 bad logs, 2 bad usage, 3 out of resources (one line each)."""
    import duckdb

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
    parser = _parser()
    raw = sys.argv[1:] if argv is None else list(argv)
    if raw[:1] == ["--version"] and len(raw) > 1:  # argparse prints the version and ignores the rest
        parser.error(f"--version takes no other arguments, got {' '.join(raw[1:])!r}")
    args = parser.parse_args(raw)
    problem = usage_problem(args)
    if problem:
        print(one_line(f"error: {problem}"), file=sys.stderr)
        return 2
    if args.command == "calibrate":  # issue 24
        from pagestats.calibrate import main as calibrate_main

        return calibrate_main(args)
    if args.command in ("monitor", "validate"):  # issue 24: deployment runs (validate: when LOGS are only those)
        from pagestats.monitor import main as monitor_main, only_deployments

        if args.command == "monitor" or only_deployments(args.logs):
            return monitor_main(args)
    if args.command == "validate":
        checked = checked_runs(args.logs, revalidate=args.revalidate, memory_limit=args.memory_limit,
                               temp_directory=args.temp_dir)
        problems = checked.problems
        for problem in problems:
            print(problem)
        for line in checked.notes:
            print(one_line(line), file=sys.stderr)
        if problems:
            return 1
        from pagestats.io.decoding import decode_profile, limit_warnings

        profile = decode_profile(checked.files)
        print(_decode_table(profile), file=sys.stderr)
        warnings = limit_warnings(profile, decode_limits(checked.manifests))
        for line in warnings:
            print(one_line(line), file=sys.stdout if args.strict else sys.stderr)
        if args.strict and warnings:
            return 1
        print(one_line(f"ok: {', '.join(args.logs)}"), file=sys.stderr)
        return 0

    if args.command == "index":
        try:
            db = index_logs(args.logs, args.db, memory_limit=args.memory_limit, temp_directory=args.temp_dir,
                            mode=args.mode, revalidate=args.revalidate)
        except ExclusionError as err:
            print(one_line(f"error: {'; '.join(p.message for p in err.problems)}"), file=sys.stderr)
            return 2
        except LogError as err:
            print(_bad_logs_line(err, args.logs), file=sys.stderr)
            return 1
        for line in [*db.notes, *(f"excluded: {x}" for x in db.left_out)]:
            print(one_line(line), file=sys.stderr)
        print(one_line(f"indexed {len(db.files)} files of {db.mode} runs into {args.db}"), file=sys.stderr)
        db.close()
        return 0

    if args.command == "compact":
        from pagestats.io import compact_run

        try:
            compact_run(args.run, args.out, rows_per_file=args.rows, tasks=_comma_list(args.tasks, name="--tasks"))
        except LogError as err:
            print(_bad_logs_line(err, [args.run]), file=sys.stderr)
            return 1
        except (ValueError, OSError) as err:
            print(one_line(f"error: {err}"), file=sys.stderr)
            return 2
        print(one_line(f"compacted {args.run} into {args.out} (validated)"), file=sys.stderr)
        return 0

    if args.command == "show":
        from pagestats.show import parse_input_spec, show_input

        try:
            logs = load(args.logs, columns="all", mode=None)  # one input, of whichever mode
        except LogError as err:
            print(_bad_logs_line(err, args.logs), file=sys.stderr)
            return 1
        try:
            run_id, task, input_id = parse_input_spec(args.input, logs)
        except ValueError as err:
            print(one_line(f"error: {err}"), file=sys.stderr)
            return 2
        print(show_input(logs, run_id, task, input_id, policy=FixedTau(args.tau)))
        return 0

    try:
        logs = _open(args)
    except ExclusionError as err:
        print(one_line(f"error: {'; '.join(p.message for p in err.problems)}"), file=sys.stderr)
        return 2
    except LogError as err:
        if args.db is not None:
            print(one_line(f"error: {'; '.join(str(p) for p in err.problems)}"), file=sys.stderr)
        else:
            print(_bad_logs_line(err, args.logs), file=sys.stderr)
        return 1
    except ValueError as err:  # bad usage
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    excluded = [*map(one_line, logs.notes), *(one_line(f"excluded: {line}")
                for line in (logs.exclusion_report() if isinstance(logs, Logs) else logs.left_out))]
    if args.command not in ("whatif", "prereg"):  # those say them once every check passed: one line on bad usage
        print(*excluded, sep="\n", file=sys.stderr, end="\n" if excluded else "")

    if args.command == "whatif":
        from pagestats.whatif import degenerate_messages, filter_whatif, whatif_summary, whatif_table, write_whatif

        try:
            policy, profile = args.parsed_policy, args.parsed_profile
            table = whatif_table(logs, policy=policy, profile=profile, draws=args.draws)
            pilot = _pilot(logs, policy, profile)
            warnings = degenerate_messages(table, profile, args.recalibrate)
            table = filter_whatif(table, evictor=_comma_list(args.evictor), task=_comma_list(args.task),
                                  context_length=_comma_list(args.context, int, "--context"))
            summary = None if args.format == "csv" else whatif_summary(table, by=_by(args))
            if args.output:
                write_whatif(table, args.output)
        except (ValueError, TypeError, OSError) as err:  # bad option values: one line, no traceback
            print(one_line(f"error: {err}"), file=sys.stderr)
            return 2
        limit_lines = _decode_warnings(logs.files, logs.manifests)
        for line in [*excluded, *pilot_lines(pilot), *warnings, *limit_lines]:
            print(one_line(line), file=sys.stderr)
        if args.strict and limit_lines:
            print(one_line(f"error: --strict: {len(limit_lines)} (run, task) cells with answers the decode limit may "
                           "have cut (the warnings above)"), file=sys.stderr)
            return 1
        if args.output:
            print(one_line(f"wrote {table.height} rows × {table.width} columns to {args.output}"), file=sys.stderr)
        if args.format == "csv":
            sys.stdout.write(csv_frame(table).write_csv(float_precision=None))
        else:
            print(_summary_text(summary, args))
        return 0

    if args.command == "report":
        from pagestats.report import build_report  # matplotlib and great_tables: imported only for `report`
        from pagestats.report.context import HeadlineEvictorError, first_draw

        limit_lines = _decode_warnings(logs.files, logs.manifests)
        for line in limit_lines:
            print(one_line(line), file=sys.stderr)
        if args.strict and limit_lines:
            print(one_line(f"error: --strict: {len(limit_lines)} (run, task) cells with answers the decode limit may "
                           "have cut (the warnings above)"), file=sys.stderr)
            return 1
        logs = logs if args.db is None else logs.load()
        if not isinstance(args.parsed_policy, FixedTau):  # a pilot or a sample the logs may not hold
            try:
                replay.gate(first_draw(logs), args.parsed_policy)
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
                                 **({"formats": ("png",)} if args.no_pdf else {}))
        except HeadlineEvictorError as err:  # the one error of an option that needs the logs to check
            print(one_line(f"error: --headline-evictor {err.evictor!r} is not logged; the logs hold "
                           f"{', '.join(err.logged) or 'no evictor'}"), file=sys.stderr)
            return 2
        print(one_line(os.path.join(os.path.dirname(index), "index.html")))  # the page to open; index.md beside it
        return 0

    if args.command == "prereg":
        return _prereg(args, logs if args.db is None else logs.load(), excluded)
    return 2


def _prereg(args, logs, excluded: list[str] = ()) -> int:
    """``pagestats prereg freeze|check`` (§4 "Pre-Registered 32K Test", Table 21)."""
    import dataclasses

    from pagestats import tables
    from pagestats.replay import gated_outcomes

    try:
        if args.step == "freeze":
            fit = list(args.fit_contexts)
            target = int(args.target_context)
            # the target context's outcomes are dropped before anything is computed: only its
            # inputs' full-KV scores (the headroom) enter the band
            at_target = logs.inputs.filter(pl.col("context_length") == target).select("run_id").unique()
            known = dataclasses.replace(logs, outcomes=logs.outcomes.join(at_target, on="run_id", how="anti"))
            band = tables.prediction_band(gated_outcomes(known, FixedTau()), logs.inputs, fit_contexts=fit,
                                          target_context=target, evictor=args.evictor)
            runs = logs.inputs.select("run_id", "context_length").unique()
            meta = {
                "fit_contexts": fit, "target_context": target, "evictor": band["evictor"][0], "by": ["model", "task"],
                "fit_runs": sorted(runs.filter(pl.col("context_length").is_in(fit))["run_id"].to_list()),
                "headroom_runs": sorted(at_target["run_id"].to_list()),
                "files": [{"path": f.path, "sha256": f.sha256} for f in getattr(logs, "files", [])],
            }
            digest = freeze_band(band, meta, args.out)
            print(*excluded, sep="\n", file=sys.stderr, end="\n" if excluded else "")
            print(f"frozen: {band.height} band(s) for {target} tokens → {args.out}", file=sys.stderr)
            print(digest)
            return 0
        meta, band = verified_band(logs, args.band, args.sha256)
    except (PreregistrationError, FileExistsError, ValueError) as err:
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    print(*excluded, sep="\n", file=sys.stderr, end="\n" if excluded else "")
    table = tables.preregistered_table(gated_outcomes(logs, FixedTau()), logs.inputs, band=band,
                                       status=f"pre-registered (frozen {meta['frozen_at']})")
    inside = int(table["inside"].fill_null(False).sum())
    print(f"check: {inside} of {table.height} measured ρ inside the frozen band (sha256 ok, frozen "
          f"{meta['frozen_at']}, before the target runs were created)", file=sys.stderr)
    if args.format == "csv":
        sys.stdout.write(csv_frame(table).write_csv(float_precision=None))
    else:
        with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200, fmt_str_lengths=1000):
            print(csv_frame(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
