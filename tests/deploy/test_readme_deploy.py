"""The README's "Deploy the gate" runs as written (issue 41): the calibrate command of step 2 and the
Python block of step 3, read from README.md, executed in a scratch folder that sees the repository's
data/ (kvpress venv; the embedded SmolLM2, nothing downloaded)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shlex

import pytest

pytest.importorskip("kvpress")

#: Loads the real SmolLM2 (GGUF, converted on load): slow, within pyproject's 2 minutes like every test.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]


def deploy_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Deploy the gate")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def blocks(section: str, language: str) -> list[str]:
    """The fenced code blocks of ``language`` in ``section``, their indentation removed."""
    out = []
    for match in re.finditer(rf"^( *)```{language}\n(.*?)^\1```", section, flags=re.S | re.M):
        indent = len(match[1])
        out.append("\n".join(line[indent:] for line in match[2].splitlines()))
    return out


def test_the_readme_deploy_snippet_runs_as_written(tmp_path, capsys):
    from gguf_once import gguf_parsed_once
    from pagestats.cli import main as pagestats_main

    section = deploy_section()
    (command,) = blocks(section, "bash")
    (code,) = blocks(section, "python")
    args = shlex.split(command)
    assert args[:2] == ["pagestats", "calibrate"]
    (tmp_path / "data").symlink_to(ROOT / "data")
    with contextlib.chdir(tmp_path):
        assert pagestats_main(args[1:]) == 0
        assert os.path.isfile("gate.json")
        namespace: dict = {}
        with gguf_parsed_once():  # the snippet's load_model() of the embedded GGUF: 14 s of CPU less
            exec(compile(code, "README.md (Deploy the gate)", "exec"), namespace)
    press = namespace["press"]
    assert press.last is not None and press.last.n_tokens > press.window
    assert press.gate.mode == press.mode == "query-agnostic" and press.gate.prompt_style == "ruler"
    assert isinstance(namespace["answer"], str)
    printed = capsys.readouterr().out
    assert "GateDecision(" in printed
