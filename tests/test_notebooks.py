"""The example notebooks run end to end (nbclient) against the shipped logs in data/ when a
run exists there, otherwise against small synthetic logs written to a temporary folder; the
committed notebooks carry no outputs and are exactly what notebooks/build_notebooks.py writes."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", NB_DIR / "build_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def logs_location(tmp_path_factory):
    shipped = sorted((ROOT / "data").glob("**/manifest.json"))
    if shipped:
        return str(ROOT / "data")
    from pagestats import testing

    tmp = tmp_path_factory.mktemp("nb-logs")
    syn = testing.synthetic_logs(models={"nb-8L4H": (8, 4)}, evictors=("snapkv", "h2o"),
                                 tasks=("niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "vt", "fwe"),
                                 context_lengths=(4096, 8192), n_inputs=6, budgets=(0.125, 0.5, 1.0),
                                 with_topk=True, k_max=32, with_text=False)
    syn.write(tmp)
    return str(tmp)


def test_four_notebooks_exist():
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_regenerate_paper.ipynb",
                                           "03_calibration_transfer.ipynb", "04_depth_profile.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} stores outputs"


def test_builder_reproduces_committed(tmp_path):
    for built in _builder().build(tmp_path):
        assert built.read_text() == (NB_DIR / built.name).read_text(), f"rebuild {built.name}: run notebooks/build_notebooks.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, logs_location, monkeypatch):
    monkeypatch.setenv("PAGESTATS_LOGS", logs_location)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NB_DIR)}})
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "run(s)" in text
    if path.name.startswith("01") and importlib.util.find_spec("ipywidgets") is None:
        assert "static sweep" in text  # the fallback ran
    assert elapsed < 120, f"{path.name} took {elapsed:.0f}s"


def test_quickstart_reads_a_log_database(logs_location, monkeypatch, tmp_path):
    """With PAGESTATS_DB the notebook reads the logs through `pagestats index`'s database: same counts."""
    from pagestats import io

    runs = sorted(str(m.parent) for m in Path(logs_location).glob("**/manifest.json"))
    db = str(tmp_path / "logs.duckdb")
    io.index_logs(runs, db).close()
    logs = io.load(runs)
    monkeypatch.setenv("PAGESTATS_LOGS", logs_location)
    monkeypatch.setenv("PAGESTATS_DB", db)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NB_DIR / "01_quickstart.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NB_DIR)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert f"{logs.inputs.height} inputs, {logs.outcomes.height} outcome rows" in text
