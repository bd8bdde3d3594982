"""``pagestats import FORMAT SRC... --out DIR``: released logs of other tools as pagestats runs
(docs/IMPORT.md, :mod:`pagestats.io.imports`). The one format so far is ``page``, the PAGE paper's
own release; its runs are then read by every other command like collected ones.
"""

from __future__ import annotations

import sys

from tqdm import tqdm

from pagestats.cli.options import number
from pagestats.io import validate_paths
from pagestats.io.imports import FORMATS, ImportError_
from pagestats.io.imports import names
from pagestats.io.validation.problems import one_line
from pagestats.core.targets import folder_problem


def add_parser(sub) -> None:
    """The ``pagestats import`` subparser."""
    p = sub.add_parser(
        "import", help="import released logs of another tool (the PAGE paper's: `import page`) as runs",
        description="Import released per-input logs as pagestats runs, one per (model, context, input draw). "
        "`page`: the PAGE paper's release (its repository's experiments/results/, JSON Lines); each file's "
        "schema is recognised from its records; files of other schemas, stubs and INVALID_* folders are "
        "skipped with one line each. Model, context and evictor come from the records (score_policy) and the "
        "file names (docs/IMPORT.md lists the tokens).")
    p.add_argument("format", choices=sorted(FORMATS), help="the release's format")
    p.add_argument("sources", nargs="+", metavar="SRC", help="JSON Lines files or folders (searched recursively)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder the runs are written to (DIR/<run_id>/)")
    p.add_argument("--model", default=None, help="the model of every file: a hub name or file-name token "
                   f"({', '.join(sorted(names.MODELS_BY_NAME))}) (default: from the file names)")
    p.add_argument("--context", type=number(1, 10**7, integer=True, name="--context"), default=None,
                   help="the context length (tokens) of every file (default: from the file names, 4k → 4096)")
    p.add_argument("--evictor", default=None, help="the evictor of every file (default: score_policy, else the "
                   "file name, else snapkv)")
    p.add_argument("--source-commit", default=None, metavar="SHA", help="the release's commit, recorded in the manifests (default: none recorded)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no skipped-file lines (default: both shown, on stderr)")


def usage_problem(args) -> str | None:
    """``--out`` must be a folder that can be written; ``--model`` a known model."""
    if args.model and names.resolve_model(args.model) is None:
        return f"--model {args.model}: not a model of the release ({', '.join(sorted(names.MODELS_BY_NAME))})"
    return folder_problem(args.out, "--out")


def run(args) -> int:
    """Exit 0 with the runs written and validated, 1 on bad records (nothing written), 2 on bad usage."""
    progress = None if args.quiet else (lambda paths: tqdm(paths, desc="import", unit="file", leave=False))
    try:
        report = FORMATS[args.format](args.sources, args.out, model=args.model, context=args.context,
                                      evictor=args.evictor, source_commit=args.source_commit, progress=progress)
    except ImportError_ as err:
        for line in err.lines:
            print(one_line(line), file=sys.stderr)
        print(one_line(f"error: {len(err.lines)} bad record(s); nothing was imported"), file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError) as err:
        print(one_line(f"error: {err}"), file=sys.stderr)
        return 2
    if not args.quiet:
        for line in report.skipped:
            print(one_line(line), file=sys.stderr)
    problems = validate_paths(list(report.runs.values())) if report.runs else []
    if problems:
        for p in problems:
            print(one_line(str(p)), file=sys.stderr)
        return 1
    for run_id, path in report.runs.items():
        print(one_line(f"{run_id}: {path} (validated)"))
    if not report.runs:
        print(one_line("error: no file of the sources holds records this importer reads; nothing was imported"),
              file=sys.stderr)
        return 1
    return 0
