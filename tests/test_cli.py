"""The command line for people: ``--version``, help text with a default on every option, and
no citation of a document the repository does not hold (docs/CLI.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import pagestats
from pagestats.cli import _parser, main

ROOT = Path(__file__).resolve().parents[1]


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"pagestats {pagestats.__version__}"


def _subparsers():
    parser = _parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices


def test_every_option_has_help_with_its_default():
    for name, sub in _subparsers().items():
        formatter = sub._get_formatter()
        for action in sub._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, f"{name} {action.option_strings[0]} has no help"
            text = formatter._expand_help(action)
            if action.required:
                continue
            # an option that is off, unset or empty by default says what that means in its help
            assert "default" in text, f"{name} {action.option_strings[0]}: help does not state the default: {text!r}"
            if action.default not in (None, False, []) and not isinstance(action.default, bool):
                assert str(action.default) in text or "default:" in text, (name, text)


def test_help_runs_for_every_command():
    for name in _subparsers():
        out = subprocess.run([sys.executable, "-m", "pagestats.cli", name, "--help"], capture_output=True, text=True,
                             cwd=ROOT)
        assert out.returncode == 0 and "usage: pagestats" in out.stdout, out.stderr


def test_nothing_cites_a_document_outside_the_repo():
    hits = []
    for folder in ("pagestats", "collectors", "docs", "notebooks", "bench", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".md", ".ipynb"} and path.name != "test_cli.py":
                if re.search(r"\bDESIGN\b", path.read_text(encoding="utf-8", errors="replace")):
                    hits.append(str(path.relative_to(ROOT)))
    for name in ("README.md", "data/README.md"):
        if re.search(r"\bDESIGN\b", (ROOT / name).read_text()):
            hits.append(name)
    assert not hits, f"cite the docs/ page instead of DESIGN in {hits}"
    for page in ("SCHEMA.md", "DEFINITIONS.md", "CLI.md", "COLLECTION.md", "PERFORMANCE.md", "ARCHITECTURE.md"):
        assert (ROOT / "docs" / page).is_file(), page


def test_docs_links_resolve():
    for page in list((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to a missing {target}"
