"""The optional dependencies of the collector, by extra of ``pyproject.toml``: what is missing, in one line.

``pagestats`` itself needs none of them. ``pagestats-collect`` and :mod:`collectors.deploy` need the
``collect`` extra (torch, transformers, ...); kvpress presses need the ``kvpress`` extra, ``--ray`` the
``ray`` extra. Each entry point checks its extra first and, when a module is missing, says which
extra installs it — one line, no traceback (docs/COLLECTION.md, "Install").
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["EXTRAS", "MissingExtraError", "missing", "require"]

#: Extra → the modules it installs (the names of ``[project.optional-dependencies]``; a test keeps them equal).
EXTRAS = {
    "collect": ("torch", "transformers", "gguf", "accelerate", "wonderwords"),
    "kvpress": ("kvpress",),
    "ray": ("ray",),
}
#: What to run before ``pip install 'pagestats[collect]'``: pip would otherwise pull a CUDA build of torch.
_TORCH_FIRST = "pip install torch (a CPU build: --index-url https://download.pytorch.org/whl/cpu), then "


class MissingExtraError(ImportError):
    """An entry point's extra is not installed; the message is the one line to show."""


def missing(extra: str, needed_by: str) -> str | None:
    """The one line saying that ``needed_by`` needs ``extra`` and which of its modules cannot be
    imported, with the command that installs it; ``None`` when every module imports."""
    absent = [name for name in EXTRAS[extra] if not _importable(name)]
    if not absent:
        return None
    first = _TORCH_FIRST if "torch" in absent else ""
    return (f"{needed_by} needs the '{extra}' extra ({', '.join(absent)} cannot be imported): "
            f"{first}pip install 'pagestats[{extra}]'")


def _importable(name: str) -> bool:
    """Whether ``import name`` can find the module (without importing it: torch takes seconds)."""
    if name in sys.modules:
        return sys.modules[name] is not None  # None: an import that is blocked on purpose
    return importlib.util.find_spec(name) is not None


def require(extra: str, needed_by: str) -> None:
    """Raise :class:`MissingExtraError` with :func:`missing`'s line when ``extra`` is not installed."""
    line = missing(extra, needed_by)
    if line is not None:
        raise MissingExtraError(line)
