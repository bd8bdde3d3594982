"""Validation records (pagestats.io.record): logs that passed every rule are not checked again
while their files are unchanged; any change (a file touched, rewritten, added or removed, a
manifest edited, a new validator) checks every rule again, and a broken file is still refused."""

from __future__ import annotations

import importlib
import io as stdio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pagestats.core import schema
from pagestats.cli import main
from pagestats.io import exclusions, load, record, validate
from pagestats.io import files as io_files
from pagestats.testing import synthetic_logs

load_module = importlib.import_module("pagestats.io.load")  # the module (pagestats.io.load is also the function)

UNCHANGED = "unchanged since validated at"


@pytest.fixture
def runs(tmp_path):
    s = synthetic_logs(models={"m1": (4, 3), "m2": (6, 2)}, n_inputs=6, tasks=("niah_multikey_3", "vt", "fwe"),
                       evictors=("snapkv",), budgets=(0.25, 0.5, 1.0), k_max=32, with_text=False, seed=3)
    return [str(r) for r in s.write(tmp_path / "logs", n_shards=2)]


@pytest.fixture
def rules(monkeypatch):
    """Counts the calls of the row rules (``check_tables``) in the loader and in streaming
    validation, calling the real ones."""
    calls = []
    real = load_module.check_tables
    assert validate.check_tables is real

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(load_module, "check_tables", counted)
    monkeypatch.setattr(validate, "check_tables", counted)
    return calls


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _csv(text):
    return pl.read_csv(stdio.StringIO(text))


def _part(run, table="outcomes", i=0):
    return Path(run) / table / f"part-{i:05d}.parquet"


def test_second_whatif_skips_the_rules_and_gives_the_same_table(runs, rules, capsys, validation_cache):
    code, cold, err = _run(capsys, "whatif", *runs, "--format", "csv")
    assert code == 0 and UNCHANGED not in err and len(rules) == len(runs)  # one run at a time
    assert len(list((validation_cache / "validated").glob("*.json"))) == len(runs)  # the env var's folder
    code, warm, err = _run(capsys, "whatif", *runs, "--format", "csv")
    assert code == 0 and len(rules) == len(runs)  # not called again
    (line,) = [x for x in err.splitlines() if UNCHANGED in x]
    assert line.startswith("logs unchanged since validated at ") and line.endswith("`--revalidate` to check again")
    assert_frame_equal(_csv(warm), _csv(cold), check_exact=False, rel_tol=0, abs_tol=1e-12)


def test_revalidate_checks_every_rule_again(runs, rules, capsys):
    assert _run(capsys, "whatif", *runs, "--format", "csv")[0] == 0
    code, _, err = _run(capsys, "whatif", *runs, "--format", "csv", "--revalidate")
    assert code == 0 and UNCHANGED not in err and len(rules) == 2 * len(runs)
    code, _, err = _run(capsys, "validate", *runs, "--revalidate")
    assert code == 0 and UNCHANGED not in err and len(rules) == 3 * len(runs)
    code, _, err = _run(capsys, "validate", *runs)
    assert code == 0 and UNCHANGED in err and len(rules) == 3 * len(runs)


def test_validate_then_whatif_then_index_share_the_record(runs, rules, capsys, tmp_path):
    assert _run(capsys, "validate", *runs)[0] == 0
    code, _, err = _run(capsys, "whatif", *runs)
    assert code == 0 and UNCHANGED in err
    code, _, err = _run(capsys, "index", *runs, "--db", str(tmp_path / "x.duckdb"))
    assert code == 0 and UNCHANGED in err and len(rules) == len(runs)
    code, _, err = _run(capsys, "whatif", "--db", str(tmp_path / "x.duckdb"), "--revalidate")
    assert code == 2 and "--revalidate" in err and len(err.splitlines()) == 1


def test_a_touched_file_is_checked_again(runs, rules, capsys):
    assert _run(capsys, "whatif", *runs, "--format", "csv")[0] == 0
    part = _part(runs[0])
    st = part.stat()
    os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    code, _, err = _run(capsys, "whatif", *runs, "--format", "csv")
    assert code == 0 and len(rules) == len(runs) + 1  # the touched run only
    assert "1 of 2 runs unchanged since validated at" in err and "the others checked now" in err


def test_a_rewritten_file_that_breaks_a_rule_is_refused(runs, capsys):
    assert _run(capsys, "whatif", *runs, "--format", "csv")[0] == 0
    part = _part(runs[0])
    frame = pl.read_parquet(part)
    frame = frame.with_columns(pl.when(pl.int_range(pl.len()) == 2).then(1.5).otherwise(pl.col("score")).alias("score"))
    mtime = part.stat().st_mtime_ns
    schema.write_parquet("outcomes", frame, part)
    man = json.loads((Path(runs[0]) / "manifest.json").read_text())
    man.pop("files")
    schema.write_manifest(Path(runs[0]), man)  # the new sha256: only the row rule can see it
    os.utime(part, ns=(mtime, mtime))  # the modification time put back: the inode and ctime still differ
    code, out, err = _run(capsys, "whatif", *runs, "--format", "csv")
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("error: 2 problems in the logs: ") and f"{part}:row 2: score outside [0, 1]" in err


def test_a_file_rewritten_in_place_is_refused(runs, capsys):
    assert _run(capsys, "validate", *runs)[0] == 0
    part = _part(runs[0], "inputs")
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, same inode
    with open(part, "r+b") as fh:
        fh.write(data)
    code, out, err = _run(capsys, "validate", *runs)
    assert code == 1 and "1 of 2 runs unchanged" in err and str(part) in out  # the other run only


def test_an_added_file_is_refused(runs, capsys):
    assert _run(capsys, "whatif", *runs, "--format", "csv")[0] == 0
    extra = Path(runs[1]) / "outcomes" / "part-00009.parquet"
    shutil.copyfile(_part(runs[1]), extra)
    code, out, err = _run(capsys, "whatif", *runs, "--format", "csv")
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert f"{extra}: not listed in" in err


def test_a_removed_file_is_refused(runs, capsys):
    assert _run(capsys, "whatif", *runs, "--format", "csv")[0] == 0
    _part(runs[0], "outcomes", 1).unlink()
    code, _, err = _run(capsys, "whatif", *runs, "--format", "csv")
    assert code == 1 and "'outcomes/part-00001.parquet' is listed but missing" in err


def test_an_edited_manifest_is_checked_again(runs, rules, capsys):
    assert _run(capsys, "validate", *runs)[0] == 0
    path = Path(runs[0]) / "manifest.json"
    man = json.loads(path.read_text())
    man["notes"] = "edited"  # a key the rules allow: the logs stay valid
    path.write_text(json.dumps(man))
    code, _, err = _run(capsys, "validate", *runs)
    assert code == 0 and len(rules) == len(runs) + 1 and "1 of 2 runs" in err


@pytest.mark.parametrize("text", ["{not json", "[]", '{"format": 1}', "\udcff"])
def test_a_corrupt_record_is_ignored_with_one_note(runs, rules, capsys, validation_cache, text):
    assert _run(capsys, "whatif", runs[0], "--format", "csv")[0] == 0
    (path,) = (validation_cache / "validated").glob("*.json")
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    code, _, err = _run(capsys, "whatif", runs[0], "--format", "csv")
    assert code == 0 and len(rules) == 2 and UNCHANGED not in err
    (note,) = err.splitlines()
    assert note.startswith("note: ") and str(path) in note and note.endswith("checking every rule again")
    code, _, err = _run(capsys, "whatif", runs[0], "--format", "csv")  # written afresh
    assert code == 0 and len(rules) == 2 and UNCHANGED in err


def test_an_unwritable_cache_is_said_and_the_rules_still_run(runs, rules, capsys, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("PAGESTATS_CACHE_DIR", str(blocker))  # a file: no folder can be made in it
    code, out, err = _run(capsys, "whatif", runs[0], "--format", "csv")
    assert code == 0 and out and len(rules) == 1
    assert "note: cannot write the validation record" in err and "the next call checks every rule again" in err
    assert _run(capsys, "whatif", runs[0], "--format", "csv")[0] == 0 and len(rules) == 2


def test_a_new_validator_makes_old_records_stale(runs, rules, capsys, monkeypatch):
    assert _run(capsys, "validate", *runs)[0] == 0
    monkeypatch.setattr(record, "validator_digest", lambda: "another rule set")
    code, _, err = _run(capsys, "validate", *runs)
    assert code == 0 and UNCHANGED not in err and len(rules) == 2 * len(runs)


def test_the_validator_digest_covers_every_module_the_rules_run_in():
    code = ("import sys, pagestats.io.load, pagestats.io.database; "
            "print('\\n'.join(m.__file__ for n, m in sys.modules.items() if n.startswith('pagestats')))")
    files = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    root = Path(record.__file__).resolve().parent.parent
    covered = {p.resolve() for pattern in record.VALIDATOR_SOURCES for p in root.glob(pattern)}
    assert files and {Path(f).resolve() for f in files} <= covered


def test_a_racily_clean_file_is_hashed_again(runs):
    """A change within the timestamp granularity keeps a file's identity; the recorded start
    time makes lookup hash such a file, and only that catches the change."""
    checked = validate.check_paths([runs[0]])
    assert not checked.problems and not checked.reused
    disc = io_files._discover([runs[0]])
    files, manifests = io_files._record_key(disc, exclusions._of_mode(disc, None))
    path = record.record_path(files)
    assert record.lookup(files, manifests)[0] is not None
    part = os.path.realpath(_part(runs[0]))
    data = bytearray(Path(part).read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(part, "r+b") as fh:
        fh.write(data)
    saved = json.loads(path.read_text())
    saved["files"][part].update(record._identity(part))  # as if the change kept every field of the identity
    path.write_text(json.dumps(saved))
    assert record.lookup(files, manifests)[0] is None  # the bytes were hashed: the change is seen
    saved["started_ns"] = Path(part).stat().st_mtime_ns + 2 * record.RACY_NS  # no file racy: identity trusted
    path.write_text(json.dumps(saved))
    assert record.lookup(files, manifests)[0] is not None


def test_load_reuses_the_record_without_exclusions_only(runs, rules):
    cold = load(runs)
    assert len(rules) == 1 and not any(UNCHANGED in n for n in cold.notes)
    warm = load(runs)
    assert len(rules) == 1 and any(UNCHANGED in n for n in warm.notes)
    assert_frame_equal(warm.inputs, cold.inputs) and [f.sha256 for f in warm.files] == [f.sha256 for f in cold.files]
    run_id = cold.inputs["run_id"][0]
    load(runs, exclude=[f"{run_id}/vt"])
    assert len(rules) == 2  # other rows: every rule again
    load(runs, columns="all")
    assert len(rules) == 3
    load(runs, revalidate=True)
    assert len(rules) == 4


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGESTATS_CACHE_DIR", str(tmp_path / "own"))
    assert record.cache_dir() == tmp_path / "own"
    monkeypatch.delenv("PAGESTATS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert record.cache_dir() == tmp_path / "xdg" / "pagestats"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # the XDG spec: ignored unless absolute
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert record.cache_dir() == tmp_path / "home" / ".cache" / "pagestats"


@pytest.mark.parametrize("warm", [False, True])
def test_whatif_at_a_fixed_tau_imports_no_scipy_or_matplotlib(runs, warm):
    cmd = [sys.executable, "-X", "importtime", "-m", "pagestats", "whatif", runs[0], "--format", "csv"]
    if warm:
        subprocess.run(cmd, check=True, capture_output=True)
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "pagestats.replay.whatif" in imported and (UNCHANGED in done.stderr) == warm
    assert not {m for m in imported if m.split(".")[0] in ("scipy", "matplotlib", "statsmodels", "great_tables")}
