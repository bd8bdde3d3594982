"""Every function-local import in pagestats/ and what it keeps off the start of a command
(docs/ARCHITECTURE.md, "Function-local imports").

For each import inside a function: the CPU time (``time.process_time``, median of ``--repeat`` fresh
processes) of importing its targets after ``import pagestats.cli`` (what every command imports) and
the module that holds it, and the heavy libraries that this would load. A cost near 0 means the
import defers nothing.

    .venv/bin/python -m bench.lazy_imports [--repeat N]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"scipy", "statsmodels", "matplotlib", "great_tables", "pandas", "pyarrow", "polars", "duckdb"}
_CHILD = r"""
import importlib, sys, time
for name in sys.argv[2].split(","):
    importlib.import_module(name)
before = set(sys.modules)
start = time.process_time()
for name in sys.argv[1].split(","):
    importlib.import_module(name)
new = {m.split(".")[0] for m in set(sys.modules) - before}
print((time.process_time() - start) * 1000, ",".join(sorted(new & set(sys.argv[3].split(",")))) or "-")
"""


def local_imports(root: Path = ROOT) -> list[tuple[str, str, list[str], str]]:
    """(file, function, imported modules, holding module) of every import inside a function."""
    sys.path.insert(0, str(root))
    found = []
    for path in sorted((root / "pagestats").rglob("*.py")):
        rel = str(path.relative_to(root))
        holder = rel[:-3].replace("/", ".").removesuffix(".__init__")

        def walk(node, function=None):
            for child in ast.iter_child_nodes(node):
                name = function
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{function}.{child.name}" if function else child.name
                if name and isinstance(child, ast.ImportFrom):
                    targets = {f"{child.module}.{a.name}" if _is_module(f"{child.module}.{a.name}") else child.module
                               for a in child.names}
                    found.append((rel, name, sorted(targets), holder))
                elif name and isinstance(child, ast.Import):
                    found.append((rel, name, sorted(a.name for a in child.names), holder))
                walk(child, name)

        walk(ast.parse(path.read_text()))
    return found


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    for rel, function, targets, holder in local_imports():
        runs = [subprocess.run([sys.executable, "-c", _CHILD, ",".join(targets), f"pagestats.cli,{holder}",
                                ",".join(sorted(HEAVY))], capture_output=True, text=True, cwd=ROOT, check=True)
                .stdout.split() for _ in range(args.repeat)]
        kind = "project" if targets[0].startswith("pagestats") else "third-party"
        print(f"{kind:11s} {rel + ':' + function:55s} {' '.join(targets):45s} "
              f"{statistics.median(float(r[0]) for r in runs):6.0f} ms  {runs[0][1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
