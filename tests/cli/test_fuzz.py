"""Property-based fuzz of the reader, ``whatif`` and ``report`` (issue 12), with hypothesis.

A small synthetic run (:func:`pagestats.testing.synthetic_logs`: 2 tasks × 3 inputs, 2
evictors × 3 budgets, L = 6, H = 3, top-k lists of k_max = 32, two parts per table) is
copied and damaged by one mutation drawn from nine families:

* bytes — a part or the manifest truncated, a byte flipped, bytes appended, emptied
  (the manifest is *not* refreshed: its sha256 is what guards the bytes);
* manifest — a field set to a wrong type, a huge or non-finite number, a nested or odd
  string, or deleted; the whole manifest nested or oversized;
* columns — a column dropped, renamed, nulled, or an unknown one added;
* types — a column cast to another arrow type (int32, float32, string, int64 lists …);
* rows — a row dropped or duplicated, a part emptied or split in two, rows shuffled, a
  cell set to an invalid value (NaN, ±inf, out of range, a wrong top-k list, a null
  element inside a list);
* kinds — a part replaced by a FIFO, a folder, a symbolic link to ``/dev/zero`` or to a
  copy outside the run, deleted, or its table folder replaced by a file;
* names — a part renamed with glob characters, spaces, control characters, a backslash,
  non-ASCII letters, or another suffix;
* labels — a task, the model, an evictor or the run_id renamed consistently in every table
  and the manifest, to a name with control or format characters, markup, quotes, 300
  letters, a numeric or path-like look;
* cli — one to three options of ``whatif`` or ``report`` on the clean run, good, bad or at
  their bounds (non-finite and non-ASCII numbers, huge integers, abbreviations, odd paths).

The manifest is refreshed (files[] rewritten with their sha256 and rows) after the
column, type, row and name mutations, as a faithful but buggy writer would do, so that
the content rules rather than the hashes must find the damage.

Then ``pagestats validate``, ``whatif`` (the default policy and ``--k 16``, which replays
from the top-k lists) and ``report`` run in this process through :func:`pagestats.cli.main`.
The property: each either succeeds with numbers equal to the clean run's (the what-if
tables, and every report table written in both reports, to float32 precision, 1e-6 relative:
the schema accepts float32 for float columns, so a cast to it is no corruption), or exits 1
with output that names a file — one line per problem for ``validate``, exactly one line
for ``whatif`` and ``report`` — and validate, whatif and report agree on which. An exception
(a traceback), another exit code, or different numbers fail the example. A relabelled run is
compared with the name put back, leaving out the outputs that depend on that name by design
(seeded by a hash of the input identity, or ordered by name), which a control relabelling to a
plain name finds. A cli example passes with exit 0, or exit 1 or 2 and one line on stderr.

Only the first report in :data:`PDF_EVERY` writes PDF figures; the others draw each figure
once, as PNG (``report --no-pdf``, half the time of an accepted example). The clean run's
numbers are computed once per process (a module fixture). The reports that only give numbers to
compare with, the clean run's and the controls', write the tables alone (:func:`_tables_only`:
two thirds of the time of a report without PDF); every judged report writes every figure.

``PAGESTATS_FUZZ_EXAMPLES`` sets the example budget (default :data:`CI_EXAMPLES`, drawn
deterministically); ``PAGESTATS_FUZZ_TALLY=FILE`` records the outcome of every example in
FILE (JSON) instead of stopping at the first failure, for long campaigns.
"""

from __future__ import annotations

import contextlib
import io as stdio
import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pagestats import testing
from pagestats.core import escape, schema# noqa: E402
from pagestats.cli import main  # noqa: E402
from pagestats.io.validation.problems import one_line  # noqa: E402

#: Examples drawn in ``make test`` (deterministic), half from each half of :data:`FAMILIES`;
#: ``PAGESTATS_FUZZ_EXAMPLES`` overrides.
CI_EXAMPLES = 12
EXAMPLES = int(os.environ.get("PAGESTATS_FUZZ_EXAMPLES", CI_EXAMPLES))
TALLY = os.environ.get("PAGESTATS_FUZZ_TALLY")

RUN = dict(models={"m": (6, 3)}, context_lengths=(512,), tasks=("niah_multikey_3", "vt"), n_inputs=3,
           evictors=("snapkv", "h2o"), budgets=(0.25, 0.5, 1.0), k_max=32, with_text=False, seed=3)
TABLES = ("inputs", "outcomes", "topk")
WHATIF_ARGS = ([], ["--k", "16"])


# --------------------------------------------------------------------------- running the CLI


def _cli(argv: list[str]) -> tuple[int | str, str, str]:
    """(exit code, or "traceback: …" if an exception escaped; stdout; stderr)."""
    out, err = stdio.StringIO(), stdio.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except Exception as exc:  # the property under test: never an exception
        code = f"traceback: {type(exc).__name__}: {one_line(str(exc))[:300]}"
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _tables_only():
    """``report`` writes the tables of its catalogue and no figure, through the same CLI: for the
    reports whose tables are only references (the clean run's, the controls'); no table reads a figure."""
    from unittest import mock

    from pagestats.report.table_entries import TABLES as TABLE_ENTRIES

    with mock.patch("pagestats.report.build.catalogue", lambda: TABLE_ENTRIES):
        yield


def _tables(report_dir: Path, infer: bool = True) -> dict[str, pl.DataFrame]:
    return {p.name: pl.read_csv(p, infer_schema=infer) for p in sorted((report_dir / "tables").glob("*.csv"))}


def _equal(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    if a.columns != b.columns or a.height != b.height:
        return False
    for c in a.columns:
        x, y = a[c], b[c]
        if x.dtype.is_numeric() and y.dtype.is_numeric():
            xv, yv = x.cast(pl.Float64).to_numpy(), y.cast(pl.Float64).to_numpy()
            if not np.allclose(xv, yv, rtol=1e-6, atol=1e-9, equal_nan=True):
                return False
        elif x.cast(pl.String).to_list() != y.cast(pl.String).to_list():
            return False
    return True


def _whatif(run: Path) -> list:
    return [_cli(["whatif", str(run), "--format", "csv", *extra]) for extra in WHATIF_ARGS]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The clean run (a template to copy) and its numbers."""
    root = tmp_path_factory.mktemp("fuzz-clean")
    run = testing.synthetic_logs(**RUN).write(root / "logs", n_shards=2)[0]
    assert _cli(["validate", str(run)])[0] == 0
    whatif = _whatif(run)
    assert all(code == 0 for code, _, _ in whatif), whatif
    with _tables_only():
        code, out, err = _cli(["report", str(run), "--out", str(root / "report")])
    assert code == 0, err
    return {"run": run, "whatif": [pl.read_csv(stdio.StringIO(o)) for _, o, _ in whatif],
            "report": _tables(root / "report")}


# --------------------------------------------------------------------------- mutations


def _parts(run: Path, table: str | None = None) -> list[Path]:
    tables = [table] if table else TABLES
    return sorted(p for t in tables for p in (run / t).iterdir())


def _refresh(run: Path) -> None:
    man = json.loads((run / "manifest.json").read_text())
    man.pop("files", None)
    schema.write_manifest(run, man)


def _rewrite(path: Path, table: pa.Table) -> None:
    pq.write_table(table, path, compression="zstd")


BAD_VALUES = [None, True, "1024", 1024.5, -1, 0, 2**63, [], {}, "x/y", "a\nb", "$\\frac{a$", "", [1, [2, [3]]],
              2**63 - 1, -(2**63), 2**62, 2**16 + 1, "bfloAt16", "float64", "torch.float32", "2000-13-01",
              "\x1b[2J", "strict"]
MANIFEST_FIELDS = ["schema_version", "run_id", "created_at", "device", "context_length", "seed", "tasks", "evictors",
                   "budgets", "software", "files", "model", "model.name", "model.n_layers", "model.n_heads",
                   "model.n_kv_heads", "model.head_dim", "model.dtype", "gate", "gate.w", "gate.k",
                   "gate.k_max_stored", "gate.bins", "protection.n_sink", "protection.n_recent", "files.0",
                   "files.0.path", "files.0.sha256", "files.0.rows", "tasks.vt", "gate.convention", "mode",
                   "model.attn_impl"]
TEXTUAL = {"int400": str(10**400), "nan": "NaN", "inf": "Infinity", "e400": "1e400", "deep": "[" * 5000 + "]" * 5000}


def _set_field(man, where: str, value):
    keys = where.split(".")
    holder = man
    for k in keys[:-1]:
        holder = holder[int(k)] if isinstance(holder, list) else holder[k]
    last = keys[-1]
    if isinstance(holder, list):
        holder[int(last)] = value
    elif value is _DELETE:
        holder.pop(last, None)
    else:
        holder[last] = value


_DELETE = object()


#: The mutation families; the test draws from each half in its own case, so that two xdist workers share them.
FAMILIES = ("bytes", "manifest", "columns", "types", "rows", "kinds", "names", "labels", "cli", "consistency")


@st.composite
def mutations(draw, families=FAMILIES):
    """One mutation: (family, description, function of the run directory)."""
    family = draw(st.sampled_from(families))
    table = draw(st.sampled_from(TABLES))
    part = draw(st.integers(0, 1))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)

    if family == "bytes":
        target = draw(st.sampled_from(["part", "manifest"]))
        how = draw(st.sampled_from(["truncate", "flip", "append", "empty"]))

        def apply(run):
            f = run / "manifest.json" if target == "manifest" else _parts(run, table)[part]
            data = bytearray(f.read_bytes())
            if how == "truncate":
                data = data[: int(rng.integers(0, len(data)))]
            elif how == "flip":
                i = int(rng.integers(0, len(data)))
                data[i] ^= 1 << int(rng.integers(0, 8))
            elif how == "append":
                data += bytes(rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8))
            else:
                data = bytearray()
            f.write_bytes(bytes(data))

        return family, f"{how} {target if target == 'manifest' else f'{table}[{part}]'} (seed {seed})", apply

    if family == "manifest":
        where = draw(st.sampled_from(MANIFEST_FIELDS + ["<whole>"]))
        value = draw(st.sampled_from(["<delete>", *TEXTUAL, *range(len(BAD_VALUES))]))

        def apply(run):
            path = run / "manifest.json"
            man = json.loads(path.read_text())
            if where == "<whole>":
                text = {"int400": TEXTUAL["int400"], "nan": "NaN", "inf": "[Infinity]", "e400": "{}",
                        "deep": "[" * 200_000}.get(value, json.dumps(BAD_VALUES[value]) if isinstance(value, int)
                                                  else "")
                path.write_text(text)
                return
            if isinstance(value, str) and value in TEXTUAL:
                _set_field(man, where, "__TEXTUAL__")
                path.write_text(json.dumps(man).replace('"__TEXTUAL__"', TEXTUAL[value]))
                return
            _set_field(man, where, _DELETE if value == "<delete>" else BAD_VALUES[value])
            path.write_text(json.dumps(man))

        return family, f"manifest {where} = {value if isinstance(value, str) else repr(BAD_VALUES[value])}", apply

    if family in ("columns", "types", "rows"):
        column = draw(st.sampled_from([c.name for c in schema.columns(table) if c.name not in
                                       ("prompt", "full_prediction", "prediction", "references")]))
        if family == "columns":
            how = draw(st.sampled_from(["drop", "rename", "nulls", "extra"]))
        elif family == "types":
            how = draw(st.sampled_from(["int32", "int64", "float32", "float64", "string", "bool", "list_int64",
                                        "list_float64", "struct"]))
        else:
            how = draw(st.sampled_from(["drop_row", "dup_row", "empty", "split", "shuffle", "nan", "inf", "neg",
                                        "big", "short_list", "long_list", "dup_index", "null_element", "slash"]))

        def apply(run):
            f = _parts(run, table)[part]
            t = pq.read_table(f)
            n = t.num_rows
            i = int(rng.integers(0, max(n, 1)))
            if family == "columns":
                if column not in t.column_names:
                    return
                if how == "drop":
                    t = t.drop([column])
                elif how == "rename":
                    t = t.rename_columns([c + "_x" if c == column else c for c in t.column_names])
                elif how == "nulls":
                    idx = t.column_names.index(column)
                    t = t.set_column(idx, column, pa.nulls(n, t.schema.field(column).type))
                else:
                    t = t.append_column("unknown_extra", pa.array(np.arange(n)))
            elif family == "types":
                if column not in t.column_names:
                    return
                target = {"int32": pa.int32(), "int64": pa.int64(), "float32": pa.float32(), "float64": pa.float64(),
                          "string": pa.string(), "bool": pa.bool_(), "list_int64": pa.list_(pa.int64()),
                          "list_float64": pa.list_(pa.float64()), "struct": pa.struct([("v", pa.float64())])}[how]
                col = t.column(column)
                try:
                    cast = col.cast(target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    cast = pa.array([None] * n, type=target) if how != "string" else pa.array(
                        [json.dumps(v, default=str) for v in col.to_pylist()])
                t = t.set_column(t.column_names.index(column), column, cast)
            else:
                frame = pl.from_arrow(t)
                if how == "drop_row" and n:
                    frame = pl.concat([frame.head(i), frame.slice(i + 1)])
                elif how == "dup_row" and n:
                    frame = pl.concat([frame, frame.slice(i, 1)])
                elif how == "empty":
                    frame = frame.head(0)
                elif how == "split" and n > 1:
                    frame.slice(i).write_parquet(f.with_name(f.stem + "-b.parquet"))
                    frame = frame.head(i)
                elif how == "shuffle":
                    frame = frame.sample(fraction=1.0, shuffle=True, seed=seed)
                elif n:
                    frame = _bad_cell(frame, column, i, how)
                t = frame.to_arrow()
            _rewrite(f, t)
            _refresh(run)

        return family, f"{how} {table}[{part}].{column} (seed {seed})", apply

    if family == "kinds":
        how = draw(st.sampled_from(["fifo", "folder", "dev_zero", "outside", "delete", "table_is_file",
                                    "manifest_outside", "chmod"]))

        def apply(run):
            f = _parts(run, table)[part]
            if how == "table_is_file":
                shutil.rmtree(run / table)
                (run / table).write_text("not a folder")
                return
            if how == "manifest_outside":
                outside = run.parent / "manifest-elsewhere.json"
                shutil.move(run / "manifest.json", outside)
                os.symlink(outside, run / "manifest.json")
                return
            if how == "chmod":
                os.chmod(f, 0)
                return
            if how == "outside":
                copy = run.parent / f.name
                shutil.copy(f, copy)
            f.unlink()
            if how == "fifo":
                os.mkfifo(f)
            elif how == "folder":
                f.mkdir()
            elif how == "dev_zero":
                os.symlink("/dev/zero", f)
            elif how == "outside":
                os.symlink(copy, f)

        return family, f"{how} {table}[{part}]", apply

    if family == "labels":
        column, old = draw(st.sampled_from(RELABEL))
        new = draw(st.sampled_from(LABELS))

        def apply(run):
            return {"relabel": (_relabel(run, column, old, new), new), "key": (column, old)}

        return family, f"relabel {column} {old!r} to {new!r}", apply

    if family == "consistency":
        how = draw(st.sampled_from(sorted(INCONSISTENT)))

        def apply(run):
            path = run / "manifest.json"
            man = json.loads(path.read_text())
            INCONSISTENT[how](man)
            path.write_text(json.dumps(man))
            return {"must_refuse": True}

        return family, f"manifest {how}", apply

    if family == "cli":
        command = draw(st.sampled_from(["whatif"] * 4 + ["report"] * 2 + sorted(OTHER_OPTIONS)))
        pool = {"whatif": WHATIF_OPTIONS, "report": REPORT_OPTIONS, **OTHER_OPTIONS}[command]
        options = draw(st.lists(st.sampled_from(sorted(pool)), min_size=1, max_size=3, unique=True))
        chosen = [(o, draw(st.sampled_from(pool[o]))) for o in options]

        def apply(run):
            return {"argv": _cli_argv(command, run, chosen)}

        return family, f"{command} {' '.join(f'{o} {v!r}' if v is not None else o for o, v in chosen)}", apply

    name = draw(st.sampled_from(["part-*.parquet", "part-?.parquet", "part-[0].parquet", "p a r t.parquet",
                                 "part\n1.parquet", "part\\1.parquet", "pärt-ü.parquet", "part{a,b}.parquet",
                                 "part.PARQUET", "part.txt", ".hidden.parquet", "part.parquet.bak",
                                 "part\x1b[2J.parquet", "part\r.parquet", "part\u2028.parquet", "part\t.parquet",
                                 "-part.parquet", "part%s%n.parquet", "part\x7f.parquet"]))

    def apply(run):
        f = _parts(run, table)[part]
        f.rename(f.with_name(name))
        _refresh(run)

    return family, f"rename {table}[{part}] to {name!r}", apply


#: Names relabelled consistently in every table and the manifest: (column, clean name). snapkv, the
#: headline evictor, is not relabelled (that changes which evictor the report headlines, not a corruption).
RELABEL = [("task", "vt"), ("task", "niah_multikey_3"), ("model", "m"), ("evictor", "h2o"), ("run_id", None)]
#: Names with control and format characters, markup, quoting, very long, numeric-looking or path-like.
LABELS = ["a\nb", "a\rb", "\x1b[31mred\x1b[0m", "tab\there", "a\u2028b", "a\u202eb", "nul\x00x", "del\x7f",
          "$\\frac{a$", "<b>x</b>&amp;", "<img src=x onerror=alert(1)>", "[l](http://x)", "**b**", "a|b", "`c`",
          "_u_", "<!-- c -->", "a\rb<i>\x1b", "a,b", 'q"u\'ote', " lead", "trail ", "-dash", "ünï", "𝔘𝔫𝔦", "x" * 300,
          "%s%n{0}", "a\\b", "..", ".", "*", "[0]", "?", "a/b", "", "123", "1e5", "nan", "None", "true"]


#: Manifest fields that are well-typed but contradict the rows or each other (issue 27): each must be refused.
INCONSISTENT = {
    "gate.k above k_max_stored": lambda m: m["gate"].update(k=m["gate"]["k_max_stored"] + 1),
    "a listed task without inputs": lambda m: m["tasks"].update(fwe="dilution-prone"),
    "n_per_task below the inputs": lambda m: m.update(n_per_task=1),
    "n_per_task a string": lambda m: m.update(n_per_task="3"),
    "files[0] without rows": lambda m: m["files"][0].pop("rows"),
    "files[0] without sha256": lambda m: m["files"][0].pop("sha256"),
    "files[0] rows off by one": lambda m: m["files"][0].update(rows=m["files"][0]["rows"] + 1),
    "context_length of another run": lambda m: m.update(context_length=m["context_length"] * 2),
    "another model name": lambda m: m["model"].update(name=m["model"]["name"] + "-2"),
    "n_layers off by one": lambda m: m["model"].update(n_layers=m["model"]["n_layers"] + 1),
    "n_heads off by one": lambda m: m["model"].update(n_heads=m["model"]["n_heads"] + 1, n_kv_heads=1),
    "another draw": lambda m: m.update(draw=m.get("draw", 0) + 1),
    "an evictor without outcomes": lambda m: m["evictors"].append("tova"),
    "a budget without outcomes": lambda m: m["budgets"].append(0.125),
    "k_max_stored of lists not stored": lambda m: m["gate"].update(k_max_stored=m["gate"]["k_max_stored"] * 2),
    "another run_id": lambda m: m.update(run_id=m["run_id"] + "-x"),
}


#: Plain names of the controls of :func:`_name_dependent`: one sorts before, one after every name.
CONTROL_LABELS = ("!plain", "\U0001f600plain")


def _relabel(run: Path, column: str, old: str | None, new: str) -> str:
    """Rename ``old`` (the run_id when None) to ``new`` in the manifest and every part; return ``old``."""
    man = json.loads((run / "manifest.json").read_text())
    if column == "run_id":
        old = man["run_id"]
        man["run_id"] = new
    elif column == "task":
        man["tasks"] = {new if t == old else t: c for t, c in man["tasks"].items()}
    elif column == "model":
        man["model"]["name"] = new
    else:
        man["evictors"] = [new if e == old else e for e in man["evictors"]]
    (run / "manifest.json").write_text(json.dumps(man))
    for f in _parts(run):
        t = pq.read_table(f)
        if column in t.column_names:
            col = pl.from_arrow(t.column(column))
            fixed = pl.select(pl.when(col == old).then(pl.lit(new)).otherwise(col)).to_series().to_arrow()
            t = t.set_column(t.column_names.index(column), column, fixed.cast(t.schema.field(column).type))
            _rewrite(f, t)
    _refresh(run)
    return old


_TMP = "<tmp>"
_RUN_ID = "<run_id>"
_NUMBERS = ["nan", "inf", "-inf", "1e400", "1e-400", "1_0", "٣", "0x1", "-0", " 0.1", "", "--", "1", "-1", "0.5"]
#: Option values of the CLI family: good ones, bad ones, and some at the bounds.
WHATIF_OPTIONS = {
    "--tau": ["0.07", "1.0000001", *_NUMBERS], "--theta": ["1000", "1000.0001", *_NUMBERS],
    "--policy": ["fixed", "z", "midpoint", "oracle", "Z", ""], "--recalibrate": ["none", "z", "midpoint", "x"],
    "--midpoint-tasks": ["niah_multikey_3,vt", "vt,vt", "vt", "vt,", "a\nb,vt", "niah_multikey_3,nosuch", ","],
    "--pilot-n": ["1", "2", "0", "-1", "10000000", "10000001", "99999999999999999999", "3.5", "٣"],
    "--pilot-by": ["model", "model,context_length", "task"], "--pilot-split": ["first", "random", "held-out", "x"],
    "--layers": ["all", "first-half", "second-half", "every-2", "every-4", "early-only", "first-last", "0:3", "3:0",
                 "0,0", "0,5", "5", "6", "-1", "99999999999999999999", "٣", "0:", "a:b", "0,,1", "10000", "10001"],
    "--pairs-fraction": ["0", "1", "0.5", "nan", "2", "1e-9"],
    "--input-draws": ["pooled", "0", "1", "99999999999999999999", "-1", "٣", ""],
    "--pair-draws": ["1", "1000", "1001", "0"], "--seed": ["0", "4294967295", "4294967296", "-1"],
    "--k": ["1", "16", "32", "33", "0", "1000000", "99999999999999999999", "16.5"],
    "--bins": ["1/3", "1/4", "0.5", "0", "1/0", "nan", "2", "0.6", "x/y", "1e400", "3/0", "-1/3", "٣/4"],
    "--strict-bins": [None], "--format": ["csv", "table", "json"],
    "--by": ["model", "task,budget", "evictor", "model,model", "nosuch", "", "task,budget,evictor,context_length,model"],
    "--evictor": ["snapkv", "nosuch", "snapkv,snapkv", "", "h2o,snapkv"], "--task": ["vt", "nosuch", "", "vt\n"],
    "--context": ["512", "1024", "x", "99999999999999999999", ""],
    "--exclude": [_RUN_ID, f"{_RUN_ID}/vt", f"{_RUN_ID}/vt/0", f"{_RUN_ID}/vt/99", "nosuch", "", "/", f"{_RUN_ID}//",
                  f"{_RUN_ID}/vt/x", f"{_RUN_ID}/vt/0/1", f"{_RUN_ID}/niah_multikey_3"],
    "-o": [f"{_TMP}/out.csv", f"{_TMP}/out.parquet", f"{_TMP}/out.json", f"{_TMP}/out.txt", "/dev/null/x", _TMP, "",
           f"{_TMP}/nodir/x.csv", f"{_TMP}/run/manifest.json"],
    "--mode": ["query-aware", "query-agnostic", "x", ""], "--ta": ["0.1"], "--db": [f"{_TMP}/nosuch.db", f"{_TMP}/run/manifest.json", ""],
}
#: ``--memory-limit`` / ``--temp-dir``: DuckDB's grammar (good, bad) and unusable folders.
DUCKDB_OPTIONS = {
    "--memory-limit": ["2GB", "1.5GiB", "500 MB", "50%", "4 gigabytes", "lots", "0", "", "0GB", "-1", "none", "1e3",
                       "150%", "99999999TB", "2GBx"],
    "--temp-dir": [f"{_TMP}/spill", "/dev/null/x", "", f"{_TMP}/run/manifest.json", _TMP],
}
WHATIF_OPTIONS.update(DUCKDB_OPTIONS)
REPORT_OPTIONS = {
    **DUCKDB_OPTIONS,
    "--out": [f"{_TMP}/rep", "", "/dev/null/x", f"{_TMP}/run/manifest.json", _TMP, f"{_TMP}/run", f"{_TMP}/run/inputs"],
    "--prereg": [f"{_TMP}/nosuch.json", f"{_TMP}/run/manifest.json", ""],
    "--prereg-sha256": ["0" * 64, "x", ""], "--dilution-rule": ["rho", "task-class", "x"], "--no-pdf": [None],
    "--exclude": WHATIF_OPTIONS["--exclude"], "--db": WHATIF_OPTIONS["--db"], "--ou": [f"{_TMP}/rep"],
    "--mode": WHATIF_OPTIONS["--mode"],
}


#: The other commands' options (issue 27: option strings for every command), and the required ones
#: each gets when the draw leaves them out (:data:`REQUIRED`).
OTHER_OPTIONS = {
    "validate": {**DUCKDB_OPTIONS, "--revalidate": [None], "--ta": ["x"]},
    "index": {**DUCKDB_OPTIONS, "--db": [f"{_TMP}/x.db", "", _TMP, "/dev/null/x.db", f"{_TMP}/run/manifest.json",
                                         f"{_TMP}/nodir/x.db", f"{_TMP}/run"],
              "--mode": WHATIF_OPTIONS["--mode"], "--revalidate": [None]},
    "prereg freeze": {**DUCKDB_OPTIONS, "--fit-contexts": ["512", "abc", "512,512", "", "0", "512,x", "٥١٢"],
                      "--target-context": ["512", "1024", "abc", "0", ""],
                      "--out": [f"{_TMP}/band.json", "", f"{_TMP}/run/manifest.json", "/dev/null/b.json", _TMP],
                      "--evictor": ["snapkv", "nosuch", ""], "--exclude": WHATIF_OPTIONS["--exclude"]},
    "prereg check": {"BAND": [f"{_TMP}/nosuch.json", f"{_TMP}/run/manifest.json", "", _TMP],
                     "--sha256": ["0" * 64, "x", "", "G" * 64], **DUCKDB_OPTIONS},
    "show": {"--input": [f"{_RUN_ID}/vt/0", "nosuch/vt/0", f"{_RUN_ID}/vt/x", "", "a/b/c/d", f"{_RUN_ID}/vt/99"],
             "--tau": ["0.07", "nan", "2", ""]},
    "compact": {"--out": [f"{_TMP}/c", "", f"{_TMP}/run", "/dev/null/x"], "--rows": ["1", "0", "x", "10", ""],
                "--tasks": ["vt", "nosuch", "", "vt,vt", "vt,niah_multikey_3"]},
    "--version": {"x": [None], "validate": [None], "--version": [None]},
}
REQUIRED = {
    "report": {"--out": f"{_TMP}/rep", "--no-pdf": None},
    "index": {"--db": f"{_TMP}/x.db"},
    "prereg freeze": {"--fit-contexts": "512", "--target-context": "1024", "--out": f"{_TMP}/band.json"},
    "prereg check": {"BAND": f"{_TMP}/nosuch.json", "--sha256": "0" * 64},
    "show": {"--input": f"{_RUN_ID}/vt/0"},
    "compact": {"--out": f"{_TMP}/c"},
}


def _cli_argv(command: str, run: Path, chosen: list[tuple[str, str | None]]) -> list[str]:
    run_id = json.loads((run / "manifest.json").read_text())["run_id"]

    def value(text):
        return text.replace(_TMP, str(run.parent)).replace(_RUN_ID, run_id)

    given = dict(chosen)
    options = [*chosen, *((o, v) for o, v in REQUIRED.get(command, {}).items() if o not in given and o != "--no-pdf")]
    if command == "report" and "--out" not in given:
        options.append(("--no-pdf", None))
    if command == "--version":
        return ["--version", *(o for o, _ in chosen)]
    argv = command.split()
    if command == "prereg check":
        band = dict(options).get("BAND")
        argv.append(value(band))
        options = [(o, v) for o, v in options if o != "BAND"]
    argv.append(str(run))
    for option, text in options:
        argv.append(option)
        if text is not None:
            argv.append(value(text))
    return argv


def _bad_cell(frame: pl.DataFrame, column: str, i: int, how: str) -> pl.DataFrame:
    dtype = frame.schema[column]
    row = pl.int_range(pl.len()) == i
    if isinstance(dtype, pl.List):
        inner = dtype.inner
        current = frame[column][i]
        values = list(current) if current is not None else []
        if how == "short_list":
            values = values[: len(values) // 2]
        elif how == "long_list":
            values = values + list(range(10_000, 10_000 + len(values) + 1))
        elif how == "dup_index":
            values = values[:1] * len(values) if values else [0, 0]
        elif how == "null_element":
            values = [None] + values[1:] if values else [None]
        else:
            values = [-1.0 if inner.is_float() else -1] + values[1:]
        return frame.with_columns(pl.when(row).then(pl.lit(pl.Series([values], dtype=dtype))).otherwise(pl.col(column))
                                  .alias(column))
    if dtype == pl.String:
        value = {"slash": "a/b", "nan": "a\nb", "inf": "$\\frac{a$"}.get(how, "")
        return frame.with_columns(pl.when(row).then(pl.lit(value)).otherwise(pl.col(column)).alias(column))
    if dtype.is_float():
        value = {"nan": float("nan"), "inf": float("inf"), "neg": -1.0, "big": 1e300}.get(how, -0.5)
        return frame.with_columns(pl.when(row).then(pl.lit(value)).otherwise(pl.col(column)).alias(column))
    if dtype.is_integer():
        value = {"neg": -1, "big": 2**62}.get(how, -(2**40))
        return frame.with_columns(pl.when(row).then(pl.lit(value, dtype=dtype)).otherwise(pl.col(column)).alias(column))
    if isinstance(dtype, pl.Struct):
        return frame.with_columns(pl.when(row).then(None).otherwise(pl.col(column)).alias(column))
    return frame


# --------------------------------------------------------------------------- the property


def _names_a_file(line: str, root: str) -> bool:
    return root in line


def check(clean: dict, mutation) -> tuple[str, str]:
    """Apply ``mutation`` to a copy of the clean run; return (outcome, detail).

    Outcomes: ``accepted`` (numbers equal), ``refused`` (exit 1, lines naming files),
    ``accepted_equal_report_skip`` is folded into accepted; failures: ``traceback``,
    ``silently_accepted`` (exit 0, different numbers), ``bad_message``, ``inconsistent``.
    """
    _family, description, apply = mutation
    with tempfile.TemporaryDirectory(prefix="pagestats-fuzz-") as tmp:
        root = Path(tmp)
        run = root / "run"
        shutil.copytree(clean["run"], run, symlinks=True)
        extra = apply(run) or {}
        try:
            if "argv" in extra:
                return _judge_cli(extra["argv"], root)
            outcome, detail = _judge(clean, run, root, extra.get("relabel"), extra.get("key"))
            if extra.get("must_refuse") and outcome == "accepted":
                return "silently_accepted", f"an inconsistent manifest was accepted ({detail})"
            if extra.get("relabel") and outcome == "accepted":
                raw = _unescaped(run, root / "report", extra["relabel"][1])
                if raw:
                    return "unescaped", raw
            return outcome, detail
        finally:
            for d, dirs, files in os.walk(root):  # chmod'ed parts must not stop the clean-up
                for name in dirs + files:
                    p = os.path.join(d, name)
                    if not os.path.islink(p):
                        os.chmod(p, 0o755)


#: One report in PDF_EVERY also writes the PDF copies of its figures; the others draw every figure
#: once, as PNG (``report --no-pdf``), which halves the time of an accepted example.
PDF_EVERY = 8
_reports = iter(range(10**9))


def _judge_cli(argv: list[str], root: Path) -> tuple[str, str]:
    """The CLI family: options of ``whatif`` / ``report`` on the clean run. Exit 0, or exit 1 / 2
    with exactly one line on stderr; never a traceback."""
    code, out, err = _cli(argv)
    if isinstance(code, str) or "Traceback" in out + err:
        return "traceback", f"{code if isinstance(code, str) else err[-300:]}"
    if code not in (0, 1, 2):
        return "bad_exit", f"exited {code}: {err.strip()[:300]}"
    if code == 0:
        return "accepted", f"exit 0 ({len(out)} bytes out)"
    lines = err.strip().splitlines()
    if len(lines) != 1 or "error" not in lines[0]:
        return "bad_message", f"exit {code}: {err[:300]!r}"
    return "refused", f"exit {code}: {lines[0][:200]}"


#: Characters a name must never bring raw into a Markdown or CSV file (issue 27).
_RAW = ("<", ">", "\r", "\n", "\x1b", "\x00", "\u202e", "\u2028", "\x7f")


def _unescaped(run: Path, report_dir: Path, name: str) -> str | None:
    """Where the name ``name`` appears unescaped: raw in a Markdown file of the report (when it holds
    markup or control characters), or with a control character in a CSV output."""
    dangerous = [c for c in _RAW if c in name]
    if not dangerous:
        return None
    for md in [report_dir / "index.md", *sorted((report_dir / "tables").glob("*.md"))]:
        if name in md.read_text(encoding="utf-8", errors="replace"):
            return f"{md.name} holds the name {name!r} raw"
    controls = [c for c in dangerous if c not in "<>"]
    outputs = {"whatif --format csv": _cli(["whatif", str(run), "--format", "csv"])[1]}
    outputs.update({p.name: p.read_text(encoding="utf-8", errors="replace")
                    for p in sorted((report_dir / "tables").glob("*.csv"))})
    for where, text in outputs.items():
        for c in controls:
            if c in text.replace("\r\n", "\n").replace("\n", "") or (c == "\n" and name in text):
                return f"{where} holds {c!r} raw"
    return None


def _same_relabelled(got: pl.DataFrame, reference: pl.DataFrame, relabel) -> bool:
    """``got`` (read as text) equals ``reference`` once the relabelled name is put back in the
    cells that hold exactly that name; columns whose reference cells embed the old name in a longer
    text (labels, sentences) are left out, and rows are sorted (names order the rows)."""
    old, new = relabel
    new = escape.csv_field(new)  # CSV cells hold the name escaped (pagestats.core.escape)
    if got.columns != reference.columns or got.height != reference.height:
        return False
    kept = [c for c in reference.columns if not (reference.schema[c] == pl.String and reference[c].str.contains(
        old, literal=True).fill_null(False).__and__(reference[c] != old).fill_null(False).any())]
    # put the name back only in the columns that hold it: a new name such as "true" must not rewrite a
    # boolean column's text (campaign 9 counted that as a silent acceptance)
    named = {c for c in kept if reference.schema[c] == pl.String and (reference[c] == old).any()}
    fixed = got.select(pl.when(pl.col(c) == new).then(pl.lit(old)).otherwise(pl.col(c)).alias(c) if c in named
                       else pl.col(c) for c in kept)
    fixed = pl.read_csv(stdio.StringIO(fixed.write_csv()))  # types inferred as when the clean table was read
    ref = reference.select(kept)
    return _equal(fixed.sort(kept, nulls_last=True), ref.sort(kept, nulls_last=True))


def _name_dependent(clean: dict, key: tuple[str, str | None]) -> set[str]:
    """Outputs whose numbers depend on the name ``key`` = (column, name) by design: the head-pair
    draws and the held-out pilot are seeded by a hash of the input's identity, and names order the
    rows (ties, bootstrap draws). Found once per key by two controls, the same relabelling to plain
    names that sort first and last."""
    cache = clean.setdefault("name_dependent", {})
    if key not in cache:
        cache[key] = set()
        for plain in CONTROL_LABELS:
            with tempfile.TemporaryDirectory(prefix="pagestats-fuzz-control-") as tmp:
                run = Path(tmp) / "run"
                shutil.copytree(clean["run"], run, symlinks=True)
                relabel = (_relabel(run, key[0], key[1], plain), plain)
                with _tables_only():
                    outputs = _outputs(clean, run, Path(tmp) / "report", pdf=False)
                assert all(code == 0 for _, code, _, _ in outputs), outputs
                cache[key] |= set(_differences(clean, outputs, Path(tmp) / "report", relabel, set()))
    return cache[key]


def _outputs(clean: dict, run: Path, report_dir: Path, pdf: bool) -> list:
    results = [("validate", *_cli(["validate", str(run)]))]
    results += [(f"whatif {' '.join(a)}".strip(), *r) for a, r in zip(WHATIF_ARGS, _whatif(run))]
    results.append(("report", *_cli(["report", str(run), "--out", str(report_dir), *([] if pdf else ["--no-pdf"])])))
    return results


def _differences(clean: dict, results: list, report_dir: Path, relabel, skip: set[str]):
    """Names of the accepted outputs whose numbers differ from the clean run's."""
    if relabel is None:
        same = _equal
        got = _tables(report_dir)
    else:
        def same(a, b):
            return _same_relabelled(a, b, relabel)
        got = _tables(report_dir, infer=False)
    for (name, _, out, _), reference in zip(results[1:3], clean["whatif"]):
        if name not in skip and not same(pl.read_csv(stdio.StringIO(out), infer_schema=relabel is None), reference):
            yield name
    for table, frame in got.items():
        if table in clean["report"] and table not in skip and not same(frame, clean["report"][table]):
            yield table


def _judge(clean: dict, run: Path, root: Path, relabel=None, key=None) -> tuple[str, str]:
    root_text = one_line(str(root))
    report_dir = root / "report"
    pdf = next(_reports) % PDF_EVERY == 0
    results = _outputs(clean, run, report_dir, pdf)
    v_code, v_out = results[0][1], results[0][2]
    for name, code, out, err in results:
        if isinstance(code, str) or "Traceback" in out + err:
            return "traceback", f"{name}: {code if isinstance(code, str) else err[-300:]}"
        if code not in (0, 1):
            return "bad_exit", f"{name} exited {code}: {err.strip()[:300]}"
    codes = {code for _, code, _, _ in results}
    if len(codes) != 1:
        return "inconsistent", "; ".join(f"{n} → {c}" for n, c, _, _ in results)
    if codes == {1}:
        lines = v_out.splitlines()
        if not lines or not all(_names_a_file(line, root_text) for line in lines):
            return "bad_message", f"validate: {v_out[:300]!r}"
        for name, _, out, err in results[1:]:
            err_lines = err.strip().splitlines()
            if len(err_lines) != 1 or not err_lines[0].startswith("error: ") or not _names_a_file(err_lines[0],
                                                                                                   root_text):
                return "bad_message", f"{name}: {err[:300]!r}"
        return "refused", lines[0][:200]
    skip = _name_dependent(clean, key) if relabel is not None else set()
    for name in _differences(clean, results, report_dir, relabel, skip):
        return "silently_accepted", f"{name} differs from the clean run's"
    if pdf and not list((report_dir / "figures").glob("*.pdf")):
        return "silently_accepted", "report: no PDF figure written"
    return "accepted", f"{len(_tables(report_dir)) - len(skip)} report tables equal"


# --------------------------------------------------------------------------- the test

_tally: Counter = Counter()
_failures: list[dict] = []


@pytest.mark.fuzz
@pytest.mark.parametrize("families", [FAMILIES[:5], FAMILIES[5:]], ids=lambda f: f"{f[0]}-to-{f[-1]}")
@settings(max_examples=max(1, EXAMPLES // 2), deadline=None, database=None,
          derandomize="PAGESTATS_FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_every_mutation_is_refused_with_a_named_line_or_changes_no_number(clean, families, data):
    mutation = data.draw(mutations(families), label="mutation")
    outcome, detail = check(clean, mutation)
    family, description, _ = mutation
    if TALLY:
        _tally[(family, outcome)] += 1
        if outcome not in ("accepted", "refused"):
            _failures.append({"family": family, "mutation": description, "outcome": outcome, "detail": detail})
        tmp = Path(f"{TALLY}.tmp")
        tmp.write_text(json.dumps({
            "examples": sum(_tally.values()),
            "by_outcome": dict(Counter(o for (_, o), n in _tally.items() for _ in range(n))),
            "by_family": {f"{f}/{o}": n for (f, o), n in sorted(_tally.items())},
            "failures": _failures,
        }, indent=1) + "\n")
        os.replace(tmp, TALLY)  # readable at any time during a long campaign
        return
    assert outcome in ("accepted", "refused"), f"{description}: {outcome}: {detail}"


@pytest.mark.parametrize("column, old", [("model", "m"), ("task", "vt")])
def test_a_label_that_reads_as_a_boolean_is_accepted_with_equal_numbers(clean, column, old):
    """Campaign 9: relabelling to "true" was judged a silent acceptance because the judge also
    rewrote the text "true" of boolean columns; the relabelled run must compare equal."""
    def apply(run):
        return {"relabel": (_relabel(run, column, old, "true"), "true"), "key": (column, old)}

    outcome, detail = check(clean, ("labels", f"relabel {column} {old!r} to 'true'", apply))
    assert outcome == "accepted", detail
