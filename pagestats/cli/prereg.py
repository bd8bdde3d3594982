"""``pagestats prereg freeze|check``: two-step pre-registration of the scaling prediction
(PAGE §4 "Pre-Registered 32K Test", Table 21; :mod:`pagestats.io.prereg`, docs/CLI.md)."""

from __future__ import annotations

import dataclasses
import os
import sys

import polars as pl

from pagestats.cli.logs import open_for, print_lines
from pagestats.cli.options import (
    add_duckdb,
    add_logs,
    add_mode,
    add_revalidate,
    database_problem,
    fit_contexts,
    number,
)
from pagestats.core.escape import csv_frame
from pagestats.io.validation.problems import one_line
from pagestats.io.prereg import PreregistrationError, freeze_band, is_sha256, load_band, verified_band
from pagestats.replay import FixedTau, gated_outcomes
from pagestats.core.targets import file_problem


def add_parser(sub) -> None:
    """The ``pagestats prereg freeze|check`` subparsers."""
    p = sub.add_parser("prereg", help="two-step pre-registration of the scaling prediction (Table 21)")
    steps = p.add_subparsers(dest="step", required=True)
    q = steps.add_parser("freeze", help="write the prediction band from the fitting contexts and the target's "
                         "full-KV scores; print its sha256")
    add_logs(q)
    q.add_argument("--fit-contexts", required=True, type=fit_contexts, metavar="N[,N…]",
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
    add_mode(q)
    add_revalidate(q)
    q.add_argument("--exclude", action="append", default=[], metavar="RUN_ID[/TASK[/INPUT_ID]]",
                   help="leave out a run, a task of a run, or one input (repeatable; exclusions are reported; "
                   "default: none)")
    add_duckdb(q)
    q.set_defaults(db=None)
    q.add_argument("--format", choices=["csv", "table"], default="table", help="table or csv on stdout (default: table)")


def band_problem(path: str, sha256: str, flag: str) -> str | None:
    """Why the frozen band at ``path`` cannot be checked (not a readable band with this sha256, given
    by the option ``flag``)."""
    if not is_sha256(sha256):
        return f"{flag} must be 64 hexadecimal characters, got {sha256!r}"
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


def usage_problem(args) -> str | None:
    """Why the options cannot run (one line), before any log is read: ``--db``; for ``freeze`` the band
    file to write (:mod:`pagestats.core.targets`), for ``check`` the band (read, its sha256 compared)."""
    problem = database_problem(args)
    if problem:
        return problem
    if args.step == "freeze":
        return file_problem(args.out, "--out", replace="never")
    return band_problem(args.band, args.sha256, "--sha256")


def run(args) -> int:
    """Exit 0 with the band frozen (its sha256 on stdout) or checked (the table on stdout), 1 on bad
    logs, 2 on bad usage or a band that does not check."""
    opened = open_for(args)
    if isinstance(opened, int):
        return opened
    logs, excluded = opened
    return _prereg(args, logs if args.db is None else logs.load(), excluded)


def _prereg(args, logs, excluded: list[str] = ()) -> int:
    """``pagestats prereg freeze|check`` (§4 "Pre-Registered 32K Test", Table 21)."""
    from pagestats import tables  # SciPy and statsmodels: imported only for `prereg` (ARCHITECTURE.md)

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
                "files": [{"path": f.path, "sha256": f.sha256} for f in logs.files],
            }
            digest = freeze_band(band, meta, args.out)
            print_lines(excluded)
            print(f"frozen: {band.height} band(s) for {target} tokens → {args.out}", file=sys.stderr)
            print(digest)
            return 0
        meta, band = verified_band(logs, args.band, args.sha256)
    except (PreregistrationError, FileExistsError, ValueError) as err:
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    print_lines(excluded)
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
