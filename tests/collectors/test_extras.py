"""Every entry point names its missing extra in one line, without a traceback: ``pagestats-collect``
and ``python -m collectors`` without torch, ``collectors.deploy`` without torch, ``GatedPress``
without kvpress; ``pagestats`` needs no extra. torch (or kvpress) is blocked in a subprocess by a
``sitecustomize`` that sets ``sys.modules[name] = None``, as if it were not installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from collectors.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _blocked(tmp_path, *names) -> dict:
    """The environment of a subprocess in which ``import name`` fails for each of ``names``."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text("import sys\n" + "".join(f"sys.modules[{n!r}] = None\n" for n in names))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def _one_line_naming(result, extra: str, module: str):
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert len(err) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"needs the '{extra}' extra ({module}" in err[0] and f"pip install 'pagestats[{extra}]'" in err[0]


def test_the_extras_are_pyprojects():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        names = [re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0] for req in extras[extra]]
        assert tuple(names) == modules, extra


@pytest.mark.parametrize("argv", [[str(BIN / "pagestats-collect"), "--help"],
                                  [str(BIN / "pagestats-collect"), "--tasks", "vt", "--context-length", "256",
                                   "--n", "1", "--out", "never-written"],
                                  [sys.executable, "-m", "collectors", "--help"]])
def test_collect_without_torch_names_the_extra(tmp_path, argv):
    out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=_blocked(tmp_path, "torch"))
    _one_line_naming(out, "collect", "torch")
    assert "--index-url https://download.pytorch.org/whl/cpu" in out.stderr  # torch before the extra
    assert not (tmp_path / "never-written").exists()


def test_deploy_without_torch_raises_one_line_naming_the_extra(tmp_path):
    code = ("import collectors.deploy\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_blocked(tmp_path, "torch"))
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1
    assert last.startswith("collectors.extras.MissingExtraError: collectors.deploy needs the 'collect' extra (torch")
    assert "import torch" not in out.stderr  # refused before any module imports torch


def test_gated_press_without_kvpress_names_the_extra(tmp_path):
    code = ("import collectors.deploy as d\n"
            "try:\n    d.GatedPress\nexcept ImportError as err:\n    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_blocked(tmp_path, "kvpress"))
    assert out.returncode == 0 and len(out.stdout.strip().splitlines()) == 1, out.stderr
    assert "GatedPress needs kvpress" in out.stdout and "pip install 'pagestats[kvpress]'" in out.stdout


def test_pagestats_needs_no_extra(tmp_path):
    env = _blocked(tmp_path, "torch", "transformers", "kvpress", "ray")
    for argv in (["--version"], ["whatif", "--help"], ["report", "--help"]):
        out = subprocess.run([str(BIN / "pagestats"), *argv], capture_output=True, text=True, env=env)
        assert out.returncode == 0 and out.stderr == "", (argv, out.stderr)


def test_collect_with_a_kvpress_evictor_without_kvpress_names_the_extra(tmp_path):
    argv = [str(BIN / "pagestats-collect"), "--tasks", "vt", "--context-length", "640", "--n", "1",
            "--evictors", "kvpress:SnapKVPress", "--out", "never-written"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=_blocked(tmp_path, "kvpress"))
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "pip install 'pagestats[kvpress]'" in err[0] and not (tmp_path / "never-written").exists()
