"""Option values of the command line: argparse ``type`` functions, and the options → :class:`Policy` /
:class:`ProfileSpec` parse of ``whatif``, ``report`` and ``calibrate`` (docs/CLI.md).

Every value is checked before any log is read (docs/reliability.md, "What the command line refuses"):
a value that ``float``/``int`` would read but a person would not mean is refused with one line, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from fractions import Fraction

from pagestats.core import defaults
from pagestats.io.duck import MEMORY_LIMIT
from pagestats.io.validation.problems import one_line
from pagestats.core.registry import policy_class, replayed
from pagestats.replay import LAYER_SUBSETS, PILOT_SPLITS, Policy, ProfileSpec, recalibrate
import duckdb
from pagestats.io.duck import connect
from pagestats.core.targets import folder_problem

#: Bounds of the numeric options: beyond them a value is a typo, or a run of hours.
MAX_DRAWS = 1000
MAX_LAYER = 10_000
MAX_PILOT = 10_000_000
MAX_K = 1_000_000
MAX_SEED = 2**32 - 1

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
        connect().execute(f"SET memory_limit = '{text}'")
    except (duckdb.ParserException, duckdb.InvalidInputException) as err:
        raise argparse.ArgumentTypeError(f"--memory-limit {text!r}: {one_line(str(err).splitlines()[0])}") from None
    return text


memory_limit.__name__ = "--memory-limit"


def fit_contexts(text: str) -> list[int]:
    """``prereg freeze --fit-contexts``: a comma list of distinct positive context lengths."""
    parse = number(1, 10**9, integer=True, name="--fit-contexts")
    items = [s.strip() for s in str(text).split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"--fit-contexts {text!r} is not a comma list of context lengths")
    values = [parse(s) for s in items]
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"--fit-contexts {text!r} names a context length twice")
    return values


fit_contexts.__name__ = "--fit-contexts"


def input_draws(text: str):
    """``--input-draws`` value: ``pooled`` or a draw number."""
    text = str(text).strip()
    if text == "pooled":
        return text
    if not re.fullmatch(r"[0-9]+", text):
        raise argparse.ArgumentTypeError(f"--input-draws takes pooled or a draw number, got {text!r}")
    return int(text)


def comma_list(text, kind=str, name="option"):
    """A comma-separated option value as a list of ``kind`` (``None`` stays ``None``)."""
    if text is None:
        return None
    items = [s.strip() for s in str(text).split(",") if s.strip()]
    try:
        return [kind(s) for s in items]
    except ValueError:
        raise ValueError(f"{name}: cannot read {text!r} as a comma list of {kind.__name__}") from None


def _given(args, name: str) -> bool:
    """Whether the user passed ``--name`` (options that only some policies read default to None)."""
    return getattr(args, name, None) is not None


#: The policy options and the policy parameter each sets (a field of the policy classes).
POLICY_OPTIONS = {"tau": "tau", "theta": "theta_z", "pilot_n": "pilot_n", "pilot_by": "pilot_by",
                  "pilot_split": "pilot_split", "midpoint_tasks": "capacity_tasks"}


def _fields(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(policy_class(name))}


def _readers(option: str) -> str:
    """``--policy NAME`` of every registered policy that reads ``option``, joined by "or"."""
    return " or ".join(f"--policy {n}" for n in replayed() if POLICY_OPTIONS[option] in _fields(n))


def check_options(args) -> None:
    """Refuse options that the chosen policy and profile do not read (docs/CLI.md: exit 2).

    An option applies to a policy with the parameter it sets (:data:`POLICY_OPTIONS`): ``--theta``
    to ``--policy z``; ``--pilot-n``, ``--pilot-by`` and ``--pilot-split`` to a policy with a
    pilot size (``--policy z``, or ``--recalibrate z``); ``--midpoint-tasks`` to ``--policy
    midpoint``; ``--pair-draws`` to ``--pairs-fraction``; ``--seed`` to a head-pair draw or a hashed pilot.
    """
    name = getattr(args, "policy", None) or "fixed"
    fields = _fields(name)
    recal = getattr(args, "recalibrate", None) or "none"
    has_pilot = "pilot_n" in fields or recal == "z"
    for opt in ("theta", "midpoint_tasks"):
        if _given(args, opt) and POLICY_OPTIONS[opt] not in fields:
            raise ValueError(f"--{opt.replace('_', '-')} applies to {_readers(opt)}, not the {name} policy")
    for opt in ("pilot_n", "pilot_by", "pilot_split"):
        if _given(args, opt) and not has_pilot:
            raise ValueError(f"--{opt.replace('_', '-')} applies to a pilot ({_readers('pilot_n')} or --recalibrate z), "
                             f"not the {name} policy")
    if _given(args, "tau") and "tau" not in fields:
        raise ValueError(f"--tau applies to the fixed policy, not --policy {name}")
    if _given(args, "pair_draws") and getattr(args, "pairs_fraction", None) is None:
        raise ValueError("--pair-draws applies to --pairs-fraction (head-pair subsampling)")
    split = getattr(args, "pilot_split", None) or defaults.PILOT_SPLIT
    if _given(args, "seed") and getattr(args, "pairs_fraction", None) is None and not (has_pilot and split != "first"):
        raise ValueError("--seed applies to --pairs-fraction draws or a random/held-out pilot")


def _pilot_by(args) -> tuple[str, ...]:
    text = getattr(args, "pilot_by", None) or "model"
    return tuple(s.strip() for s in str(text).split(",") if s.strip())


def _midpoint_samples(text: str) -> dict:
    """``--midpoint-tasks`` → the two samples of :class:`Midpoint`: ``class`` pools by task class."""
    if str(text).strip() == "class":
        return {"capacity_tasks": None, "dilution_tasks": None}
    parts = [t.strip() for t in str(text).split(",")]
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise ValueError(f"--midpoint-tasks takes two different tasks CAPACITY_TASK,DILUTION_TASK "
                         f"(e.g. niah_multikey_3,vt), got {text!r}")
    return {"capacity_tasks": (parts[0],), "dilution_tasks": (parts[1],)}


def policy_from_args(args) -> Policy:
    """The gate policy named by the ``pagestats whatif`` options.

    ``--policy NAME`` (default ``fixed``) is the class of :data:`pagestats.core.registry.POLICIES`,
    built with the options given for its parameters (:data:`POLICY_OPTIONS`; the class's defaults
    otherwise, the paper's: τ = 0.07, θ_z = −0.69, a held-out pilot of 100 inputs per model, the
    midpoint recipe's 20 NIAH-MK3 and 20 VT inputs, App. A.3.4 and Table 7). ``--midpoint-tasks
    CAP,DIL`` names two other tasks, ``--midpoint-tasks class`` pools every capacity-bound against
    every dilution-prone input. ``--recalibrate z|midpoint`` then re-derives a fixed τ on the
    changed statistic (:func:`pagestats.replay.recalibrate`, App. A.3.1). Options the policy does
    not read are refused (:func:`check_options`).
    """
    check_options(args)
    name = getattr(args, "policy", None) or "fixed"
    seed = int(getattr(args, "seed", None) or 0)
    pilot_n = int(getattr(args, "pilot_n", None) or defaults.PILOT_N)
    split = getattr(args, "pilot_split", None) or defaults.PILOT_SPLIT
    recal = getattr(args, "recalibrate", None) or "none"
    given = {"tau": getattr(args, "tau", None), "theta_z": getattr(args, "theta", None),
             "pilot_n": getattr(args, "pilot_n", None), "pilot_split": getattr(args, "pilot_split", None),
             "pilot_by": _pilot_by(args) if _given(args, "pilot_by") else None, "seed": getattr(args, "seed", None)}
    given = {k: v for k, v in given.items() if v is not None}  # the options given; the class's defaults else
    if _given(args, "midpoint_tasks"):
        given.update(_midpoint_samples(args.midpoint_tasks))
    fields = _fields(name)
    policy = policy_class(name)(**{k: v for k, v in given.items() if k in fields})
    return recalibrate(policy, recal, pilot_n=pilot_n, pilot_by=_pilot_by(args), pilot_split=split, seed=seed)


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
        pair_draws=int(getattr(args, "pair_draws", None) or defaults.PAIR_DRAWS),
        seed=int(getattr(args, "seed", None) or 0),
        k=getattr(args, "k", None),
    )


def usage_problem(args) -> str | None:
    """Why the options every command shares cannot run (one line), or ``None``: ``--temp-dir``
    passes :mod:`pagestats.core.targets` (each command module's ``usage_problem`` checks the rest)."""

    if getattr(args, "temp_dir", None) is not None:
        return folder_problem(args.temp_dir, "--temp-dir")
    return None


def database_problem(args) -> str | None:
    """Why ``--db`` (a database to read) cannot be opened, before it is: empty, or a folder."""
    db = getattr(args, "db", None)
    if db is not None:
        if not db.strip():
            return "--db is empty; name a database written by `pagestats index`"
        if os.path.isdir(db):
            return f"--db {db} is a folder, not a database written by `pagestats index`"
    return None


# --------------------------------------------------------------------------- option groups shared by commands

def add_duckdb(p: argparse.ArgumentParser) -> None:
    """``--memory-limit`` and ``--temp-dir`` of every command that opens DuckDB."""
    p.add_argument("--memory-limit", type=memory_limit, default=MEMORY_LIMIT, help=f"DuckDB memory limit (default: {MEMORY_LIMIT}); "
                   "larger queries spill to --temp-dir")
    p.add_argument("--temp-dir", default=None, help="DuckDB spill directory (default: the system temp dir)")


def add_mode(p: argparse.ArgumentParser) -> None:
    """``--mode``: the collection mode analysed."""
    p.add_argument("--mode", choices=defaults.MODES, default=defaults.MODE,
                   help="collection mode to analyse (manifest 'mode'; none means query-aware); runs of the other mode "
                   "are left out, with one line on stderr, so the two modes never pool into one cell "
                   f"(default: {defaults.MODE}, the paper's setting)")


def add_revalidate(p: argparse.ArgumentParser) -> None:
    """``--revalidate``: check logs again whatever their validation record says."""
    p.add_argument("--revalidate", action="store_true",
                   help="check every rule again even on log files unchanged since they passed (default: files "
                   "whose validation record in $PAGESTATS_CACHE_DIR, else ~/.cache/pagestats, still holds are "
                   "not checked again, with one line on stderr)")


def add_strict(p: argparse.ArgumentParser) -> None:
    """``--strict``: answers the decode limit may have cut are bad logs."""
    p.add_argument("--strict", action="store_true",
                   help="treat answers the decode limit may have cut as bad logs: a (run, task) whose full-KV "
                   "answers stop at the limit without looping on more than 5 %% of inputs, or end inside a "
                   "reference at all, exits 1 (default: one warning line each)")


def add_midpoint_tasks(p: argparse.ArgumentParser) -> None:
    """``--midpoint-tasks`` of ``whatif`` and ``calibrate`` (read by :func:`policy_from_args`)."""
    p.add_argument("--midpoint-tasks", default=None, metavar="CAP,DIL|class",
                   help="midpoint policy: the tasks of its two samples, or class to pool every capacity-bound "
                   f"against every dilution-prone input (default: {','.join(defaults.MIDPOINT_TASKS)}, the "
                   "paper's 20 NIAH-MK3 and 20 VT inputs, App. A.3.4)")


def add_policy(p: argparse.ArgumentParser) -> None:
    """The gate policy options of ``whatif`` and ``report`` (read by :func:`policy_from_args`)."""
    pol = p.add_mutually_exclusive_group()
    pol.add_argument("--tau", type=number(-1.0, 1.0, name="--tau"), help=f"fixed threshold τ (default: {defaults.TAU})")
    pol.add_argument("--policy", choices=replayed(), help="gate policy (default: fixed, τ = 0.07)")
    p.add_argument("--theta", type=number(-1e3, 1e3, name="--theta"), default=None,
                   help=f"θ_z of the z-scored policy (default: {defaults.THETA_Z})")
    add_midpoint_tasks(p)
    p.add_argument("--pilot-n", type=number(1, MAX_PILOT, integer=True, name="--pilot-n"), default=None,
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


def add_logs(p: argparse.ArgumentParser) -> None:
    """LOGS or ``--db``, with the options of reading them (``whatif``, ``report``, ``prereg freeze``)."""
    p.add_argument("logs", nargs="*", metavar="LOGS", help="run directories, parquet/jsonl files or globs")
    add_mode(p)
    add_revalidate(p)
    add_strict(p)
    p.add_argument("--db", default=None, metavar="FILE",
                   help="read the logs through a database written by `pagestats index` instead of LOGS "
                   "(default: read LOGS)")
    add_duckdb(p)
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="RUN[/TASK[/INPUT_ID]]",
        help="leave out a run, a task of a run, or one input; RUN is a run_id or the run's directory name "
        "(repeatable; exclusions are reported; default: none)",
    )
