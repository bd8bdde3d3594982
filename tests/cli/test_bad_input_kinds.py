"""Issue 27, bad input round 2: one test per kind the independent campaign found.

Usage errors are one line and exit 2 before any log is read (the tests pass LOGS that do not
exist, or that are corrupt, so that an option checked after reading would give exit 1 or a
traceback instead); manifests that are well-typed but inconsistent are refused by ``validate``,
``whatif`` and ``report`` alike; the readers agree on file names, links, permissions and
undecodable names; names from the logs are escaped for the format they are written into.
"""

from __future__ import annotations

import contextlib
import io as stdio
import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest

from pagestats import testing
from pagestats.core import escape, schema
from pagestats.cli import main
from pagestats.io import validate_paths

from logbuild import assert_problem, messages, refresh_manifest, write_run

SMALL = dict(models={"m": (6, 3)}, context_lengths=(512,), tasks=("niah_multikey_3", "vt"), n_inputs=3,
             evictors=("snapkv", "h2o"), budgets=(0.25, 0.5, 1.0), with_topk=False, with_text=False, seed=1)


def _cli(argv) -> tuple[int, str, str]:
    out, err = stdio.StringIO(), stdio.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return testing.synthetic_logs(**SMALL).write(tmp_path_factory.mktemp("r2") / "logs", n_shards=2)[0]


@pytest.fixture
def fresh(tmp_path) -> Path:
    return testing.synthetic_logs(**SMALL).write(tmp_path / "logs", n_shards=2)[0]


# --------------------------------------------------------------------------- usage: checked up front

BAD_MEMORY = ["lots", "0", "", "0GB", "-1", "none", "2GBx", "1e3", "150%", "99999999TB"]


@pytest.mark.parametrize("value", BAD_MEMORY)
@pytest.mark.parametrize("command", ["whatif", "index", "report", "validate"])
def test_memory_limit_follows_duckdbs_grammar_up_front(tmp_path, command, value):
    extra = {"index": ["--db", tmp_path / "x.db"], "report": ["--out", tmp_path / "rep"]}.get(command, [])
    code, out, err = _cli([command, tmp_path / "no-such-logs", f"--memory-limit={value}", *extra])
    assert code == 2 and "--memory-limit" in _one_line(err)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["2GB", "1.5GiB", "500 MB", "50%", "4 gigabytes"])
def test_good_memory_limits_are_read(run, value):
    code, _, err = _cli(["whatif", run, "--memory-limit", value, "--format", "csv"])
    assert code == 0, err


@pytest.mark.parametrize("command", ["report", "validate", "whatif-load"])
def test_memory_limit_is_honoured_by_every_command_that_connects(fresh, tmp_path, command):
    """1 KB is too little for any query: a command that honours the limit runs out of memory
    (exit 3, one line); ``report`` (and ``whatif`` with --exclude, read through ``load``) ignored it."""
    run_id = json.loads((fresh / "manifest.json").read_text())["run_id"]
    argv = {"report": ["report", fresh, "--out", tmp_path / "rep"], "validate": ["validate", fresh],
            "whatif-load": ["whatif", fresh, "--exclude", f"{run_id}/vt"]}[command]
    code, _, err = _cli([*argv, "--memory-limit", "1KB", "--revalidate"])
    assert code == 3 and "out of memory" in _one_line(err)


def _index_targets(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    plain = tmp_path / "notes.txt"
    plain.write_text("not a database\n")
    return {"empty": "", "folder": folder, "under a file": "/dev/null/x.db", "another file": plain}


@pytest.mark.parametrize("target", ["empty", "folder", "under a file", "another file"])
def test_index_db_target_is_checked_and_nothing_is_left_behind(run, tmp_path, target):
    db = _index_targets(tmp_path)[target]
    before = sorted(p.name for p in tmp_path.iterdir())
    code, _, err = _cli(["index", run, "--db", db])
    assert code == 2 and "--db" in _one_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no .tmp database
    if target == "another file":
        assert Path(db).read_text() == "not a database\n"


def test_index_still_replaces_a_database(run, tmp_path):
    db = tmp_path / "logs.db"
    assert _cli(["index", run, "--db", db])[0] == 0
    assert _cli(["index", run, "--db", db])[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs.db"]


@pytest.mark.parametrize("argv, needle", [
    (["whatif", "LOGS", "--format", "csv", "--by", "nonsense"], "--by"),
    (["whatif", "LOGS", "--format", "csv", "--by", "model"], "--by"),
    (["whatif", "LOGS", "--by", "nonsense"], "--by"),
    (["whatif", "LOGS", "--temp-dir", "/dev/null/x"], "--temp-dir"),
    (["report", "LOGS", "--out", "OUT", "--temp-dir", "/dev/null/x"], "--temp-dir"),
    (["whatif", "LOGS", "-o", "/dev/null/x.csv"], "-o"),
    (["whatif", "LOGS", "-o", "OUT/t.xlsx"], "extension"),
    (["whatif", "LOGS", "--layers", "a:b"], "--layers"),
    (["whatif", "LOGS", "--bins", "x/y"], "--bins"),
    (["whatif", "LOGS", "--theta", "1"], "--theta"),
    (["whatif", "LOGS", "--context", "4k"], "--context"),
    (["whatif", "--db", ""], "--db"),
    (["whatif", "--db", "OUT"], "--db"),
    (["prereg", "freeze", "LOGS", "--fit-contexts", "abc", "--target-context", "512", "--out", "OUT/b.json"],
     "--fit-contexts"),
    (["prereg", "freeze", "LOGS", "--fit-contexts", "512,512", "--target-context", "1024", "--out", "OUT/b.json"],
     "twice"),
    (["prereg", "freeze", "LOGS", "--fit-contexts", "512", "--target-context", "1024", "--out", "EXISTING"],
     "exists"),
    (["prereg", "check", "OUT/nosuch.json", "--sha256", "0" * 64, "LOGS"], "no such band"),
    (["prereg", "check", "EXISTING", "--sha256", "xyz", "LOGS"], "--sha256"),
    (["report", "LOGS", "--out", "OUT/r", "--prereg", "OUT/nosuch.json", "--prereg-sha256", "0" * 64],
     "no such band"),
    (["report", "LOGS", "--out", "OUT/r", "--prereg", "EXISTING", "--prereg-sha256", "xyz"], "--prereg-sha256 must"),
    (["--version", "x"], "--version"),
])
def test_usage_errors_are_one_line_before_any_log_is_read(tmp_path, argv, needle):
    existing = tmp_path / "existing.json"
    existing.write_text("{}")
    argv = [str(existing) if a == "EXISTING" else a.replace("LOGS", str(tmp_path / "no-such-logs"))
            .replace("OUT", str(tmp_path)) for a in argv]
    code, out, err = _cli(argv)
    line = _one_line(err)
    assert code == 2 and out == "" and needle in line, line
    assert "invalid literal" not in line


def test_prereg_usage_error_after_a_validation_record_is_one_line(fresh, tmp_path):
    """The record's "logs unchanged" line was printed before the error: two lines."""
    assert _cli(["validate", fresh])[0] == 0
    code, _, err = _cli(["prereg", "freeze", fresh, "--fit-contexts", "512", "--target-context", "4096",
                         "--out", tmp_path / "band.json"])
    assert code == 2 and _one_line(err).startswith("error: ")


# --------------------------------------------------------------------------- manifests validate missed


def _edit_manifest(run: Path, edit) -> None:
    man = json.loads((run / "manifest.json").read_text())
    edit(man)
    (run / "manifest.json").write_text(json.dumps(man))


MANIFEST_KINDS = {
    "gate.k above k_max_stored": (lambda m: m["gate"].update(k=m["gate"]["k_max_stored"] + 1),
                                  "larger than gate.k_max_stored"),
    "a listed task without rows": (lambda m: m["tasks"].update(fwe="dilution-prone"), "'fwe', but the run has no"),
    "n_per_task a string": (lambda m: m.update(n_per_task="3"), "n_per_task '3' is not an integer"),
    "n_per_task below the rows": (lambda m: m.update(n_per_task=2), "more than the manifest's n_per_task 2"),
    "files[] without rows": (lambda m: m["files"][0].pop("rows"), "has rows missing"),
    "files[] without sha256": (lambda m: m["files"][0].pop("sha256"), "has sha256 missing"),
}


@pytest.mark.parametrize("kind", sorted(MANIFEST_KINDS))
def test_inconsistent_manifests_are_refused(tmp_path, kind):
    edit, needle = MANIFEST_KINDS[kind]
    run = write_run(tmp_path)
    _edit_manifest(run, edit)
    assert_problem(validate_paths([str(run)]), run / "manifest.json", None, needle)


@pytest.mark.parametrize("kind", ["gate.k above k_max_stored", "a listed task without rows", "n_per_task a string",
                                  "files[] without rows"])
def test_validate_whatif_and_report_agree_on_inconsistent_manifests(fresh, tmp_path, kind):
    edit, needle = MANIFEST_KINDS[kind]
    if kind == "gate.k above k_max_stored":
        def edit(m):
            m["gate"].update(k_max_stored=8, k=16)
    _edit_manifest(fresh, edit)
    code, out, _ = _cli(["validate", fresh])
    assert code == 1 and out
    for argv in (["whatif", fresh], ["report", fresh, "--out", tmp_path / "rep", "--no-pdf"]):
        code, _, err = _cli(argv)
        assert code == 1 and "manifest.json" in _one_line(err), (argv, err)


def test_n_per_task_at_or_above_the_rows_is_accepted(tmp_path):
    run = write_run(tmp_path)
    for n in (3, 50):
        _edit_manifest(run, lambda m, n=n: m.update(n_per_task=n))
        assert validate_paths([str(run)]) == []


def test_excluding_a_listed_task_is_not_a_task_without_rows(fresh):
    run_id = json.loads((fresh / "manifest.json").read_text())["run_id"]
    code, _, err = _cli(["whatif", fresh, "--exclude", f"{run_id}/vt"])
    assert code == 0, err


@pytest.mark.parametrize("table", ["topk", "inputs"])
def test_a_part_with_junk_magic_bytes_is_refused_even_resealed(tmp_path, table):
    """pyarrow and DuckDB read only the footer's magic: a part whose first four bytes are junk
    was read (the top-k files are read by the rules), and accepted once the manifest was resealed."""
    run = write_run(tmp_path)
    part = run / table / "part-0000.parquet"
    data = bytearray(part.read_bytes())
    data[:4] = b"JUNK"
    part.write_bytes(bytes(data))
    refresh_manifest(run)
    assert_problem(validate_paths([str(run)]), part, None, "magic bytes PAR1")


# --------------------------------------------------------------------------- disagreements


def test_an_upper_case_suffix_is_read_by_every_command(fresh, tmp_path):
    part = sorted((fresh / "outcomes").glob("*.parquet"))[0]
    reference = _cli(["whatif", fresh, "--format", "csv"])
    part.rename(part.with_name("UPPER.PARQUET"))
    refresh_manifest(fresh)
    assert _cli(["validate", fresh])[0] == 0
    code, out, err = _cli(["whatif", fresh, "--format", "csv"])
    assert code == 0 and out == reference[1], err
    assert _cli(["index", fresh, "--db", tmp_path / "x.db"])[0] == 0
    assert _cli(["whatif", "--db", tmp_path / "x.db", "--format", "csv"])[1] == reference[1]


def test_a_listed_part_linking_inside_the_run_is_read(tmp_path):
    run = write_run(tmp_path)
    part = run / "outcomes" / "part-0001.parquet"
    (run / "store").mkdir()
    shutil.move(part, run / "store" / "x.parquet")
    part.symlink_to(Path("..") / "store" / "x.parquet")
    assert validate_paths([str(run)]) == []


def test_two_names_of_one_file_are_one_problem_not_two_contradicting(tmp_path):
    run = write_run(tmp_path)
    second = run / "outcomes" / "part-0001.parquet"
    shutil.copy(second, run / "outcomes" / "keep.parquet")
    second.unlink()
    second.symlink_to("part-0000.parquet")
    refresh_manifest(run)
    problems = validate_paths([str(run)])
    assert_problem(problems, second, None, "is the same file as")
    assert not [m for m in messages(problems) if "listed but missing" in m or "not listed" in m], messages(problems)


def test_permission_denied_is_not_called_corrupt(tmp_path, monkeypatch):
    run = write_run(tmp_path)
    denied = os.path.normpath(run / "outcomes" / "part-0001.parquet")
    import pagestats.io.read as read

    real = read._magic_problem

    def magic(path):
        if os.path.normpath(path) == denied:
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(read, "_magic_problem", magic, raising=False)
    problems = validate_paths([str(run)])
    assert_problem(problems, denied, None, "cannot read: Permission denied")
    assert not [m for m in messages(problems) if "corrupt" in m], messages(problems)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file without permissions")
def test_an_unreadable_file_says_permission_denied(tmp_path):
    run = write_run(tmp_path)
    part = run / "outcomes" / "part-0001.parquet"
    part.chmod(0)
    assert_problem(validate_paths([str(run)]), part, None, "Permission denied")


def test_a_non_utf8_file_name_is_named_not_a_codec_error(tmp_path):
    run = write_run(tmp_path)
    os.rename(os.fsencode(run / "outcomes" / "part-0001.parquet"), os.fsencode(run / "outcomes") + b"/p-\xff.parquet")
    problems = validate_paths([str(run)])
    assert any("not UTF-8 (byte 0xff)" in m for m in messages(problems)), messages(problems)
    assert not [m for m in messages(problems) if "codec" in m], messages(problems)


# --------------------------------------------------------------------------- names, escaped

MARKUP = "<img src=x onerror=alert(1)>"
CONTROLS = "a\rb\x1b[31mc\x00d\u202ee"


def _relabel_model(run: Path, name: str) -> None:
    _edit_manifest(run, lambda m: m["model"].update(name=name))
    for part in sorted((run / "inputs").glob("*.parquet")):
        frame = pl.read_parquet(part).with_columns(pl.lit(name).alias("model"))
        schema.write_parquet("inputs", frame, part)
    refresh_manifest(run)


def test_markup_in_a_name_is_escaped_in_every_markdown_file(fresh, tmp_path):
    _relabel_model(fresh, MARKUP)
    out = tmp_path / "rep"
    code, _, err = _cli(["report", fresh, "--out", out, "--no-pdf"])
    assert code == 0, err
    markdown = [out / "index.md", *sorted((out / "tables").glob("*.md"))]
    shown = [p for p in markdown if escape.markdown(MARKUP) in p.read_text()]
    assert shown, "the name is in no Markdown file"
    raw = [p.name for p in markdown if "<img" in p.read_text()]
    assert not raw, raw


def test_control_characters_in_names_are_escaped_in_csv_and_on_the_terminal(fresh, tmp_path):
    _relabel_model(fresh, CONTROLS)
    for argv in (["whatif", fresh, "--format", "csv"], ["whatif", fresh], ["validate", fresh]):
        code, out, err = _cli(argv)
        assert code == 0, err
        for ch in "\r\x1b\x00\u202e":
            assert ch not in out + err, (argv, ch)
    assert escape.csv_field(CONTROLS) in _cli(["whatif", fresh, "--format", "csv"])[1]
    assert _cli(["whatif", fresh, "-o", tmp_path / "t.csv"])[0] == 0
    assert "\r" not in (tmp_path / "t.csv").read_text() and escape.csv_field(CONTROLS) in (tmp_path / "t.csv").read_text()
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = _cli(["report", fresh, "--out", tmp_path / "rep", "--no-pdf"])
    assert code == 0 and "\r" not in err and "\x1b" not in err, err
    assert not [w for w in caught if "\r" in str(w.message) or "\x1b" in str(w.message)], caught
    for table in (tmp_path / "rep" / "tables").glob("*.csv"):
        assert "\r" not in table.read_text(), table


def test_a_report_of_clean_logs_prints_no_dependency_warning(run, tmp_path):
    """statsmodels' divide-by-zero RuntimeWarning (a one-row binomial fit) was printed by every report
    of one context; every warning is recorded here, so one raised earlier in the process counts too."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = _cli(["report", run, "--out", tmp_path / "rep", "--no-pdf"])
    assert code == 0 and "Warning" not in err, err
    assert not [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)], caught


def test_binomial_fit_on_one_row_warns_nothing():
    import warnings

    from pagestats.stats.fit import binomial_origin_fit

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = binomial_origin_fit([0.5], [3], [10])
    assert fit.slope == pytest.approx(0.6) and fit.se == pytest.approx((0.3 * 0.7 / 10) ** 0.5 / 0.5)


@pytest.mark.parametrize("text, md", [
    (MARKUP, "&lt;img src=x onerror=alert(1)&gt;"), ("niah_multikey_3", "niah_multikey_3"), ("_a_", r"\_a\_"),
    ("a|b", r"a\|b"), ("[x](y)", r"\[x\](y)"), ("a\nb", r"a\\nb"),
])
def test_markdown_escaping(text, md):
    assert escape.markdown(text) == md
