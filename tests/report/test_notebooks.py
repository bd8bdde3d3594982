"""The example notebooks: committed executed on the shipped logs, with their figures; each runs
end to end (nbclient) on data/ (or small synthetic logs when data/ holds no run) and shows at
least the figures it promises (``metadata.pagestats.min_images``); the committed cells are
exactly what notebooks/build_notebooks.py writes."""

from __future__ import annotations

import glob
import importlib.util
import os
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    shipped = sorted((ROOT / "data").glob("smollm2-*/manifest.json"))
    if shipped:
        return str(ROOT / "data" / "smollm2-*")
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


def _sources(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_executed_with_figures(path):
    """The committed notebook was run (make notebooks): every code cell has run, none failed,
    and it holds the figures it promises, so it shows them before anyone runs it."""
    builder = _builder()
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), f"{path.name}: run make notebooks"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    promised = nb.metadata["pagestats"]["min_images"]
    assert promised == builder.MIN_IMAGES[path.name] >= 2
    assert builder.image_outputs(nb) >= promised


def test_builder_reproduces_committed_cells(tmp_path):
    for built in _builder().build(tmp_path):
        fresh = nbformat.read(built, as_version=4)
        committed = nbformat.read(NB_DIR / built.name, as_version=4)
        assert _sources(fresh) == _sources(committed), f"rebuild {built.name}: run make notebooks"
        assert fresh.metadata["pagestats"] == committed.metadata["pagestats"]


# A notebook test has pyproject's 2 minutes (pytest-timeout) like any other; a hung cell fails before that, named,
# at build_notebooks.CELL_TIMEOUT.


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_shows_its_figures(path, logs_location, monkeypatch):
    monkeypatch.setenv("PAGESTATS_LOGS", logs_location)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # run the cells as written, not the stored outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    _builder().client(nb, NB_DIR).execute()  # each cell within CELL_TIMEOUT: a hang fails there, named
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "run(s)" in text
    if path.name.startswith("01") and importlib.util.find_spec("ipywidgets") is None:
        assert "static sweep" in text  # the fallback ran
    assert _builder().image_outputs(nb) >= nb.metadata["pagestats"]["min_images"], path.name


def _runs(location: str) -> list[str]:
    """The runs under a location the notebooks accept: a folder of runs, a run, or a glob of them."""
    roots = glob.glob(location) if any(ch in location for ch in "*?[") else [location]
    return sorted(str(m.parent) for root in roots for m in Path(root).glob("**/manifest.json"))


def test_quickstart_reads_a_log_database(logs_location, monkeypatch, tmp_path):
    """With PAGESTATS_DB the notebook reads the logs through `pagestats index`'s database: same counts.
    Its cells run up to the one that loads the logs; what follows reads the same frames
    (tests/io/test_logdb.py: a database's load equals load) and runs in full above."""
    from pagestats import io

    runs = _runs(logs_location)
    db = str(tmp_path / "logs.duckdb")
    io.index_logs(runs, db).close()
    logs = io.load(runs)
    monkeypatch.setenv("PAGESTATS_LOGS", logs_location)
    monkeypatch.setenv("PAGESTATS_DB", db)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NB_DIR / "01_quickstart.ipynb", as_version=4)
    loads = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "logs = load_logs()" in c.source)
    nb.cells = nb.cells[:loads + 1]
    _builder().client(nb, NB_DIR).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert f"{logs.inputs.height} inputs, {logs.outcomes.height} outcome rows" in text


def test_a_wrong_logs_location_is_an_error_not_a_demo(tmp_path, monkeypatch):
    """PAGESTATS_LOGS naming a folder without runs stops the notebook at its set-up cell with the
    location named; it does not fall back to synthetic logs (only an unset PAGESTATS_LOGS may)."""
    empty = tmp_path / "no-runs-here"
    empty.mkdir()
    monkeypatch.setenv("PAGESTATS_LOGS", str(empty))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(NB_DIR / "01_quickstart.ipynb", as_version=4)
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="names no run") as err:
        _builder().client(nb, NB_DIR).execute()
    assert str(empty) in str(err.value) and "synthetic" not in "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_quickstart_summary_is_the_librarys(logs_location, monkeypatch):
    """Notebook 01's summary is `whatif.whatif_summary` (means over budgets b < 1), not a mean that
    also takes the b = 1 rows: its Δ per cell equals the CLI's."""
    from pagestats import io
    from pagestats.replay import whatif
    from pagestats.replay import FixedTau

    nb = nbformat.read(NB_DIR / "01_quickstart.ipynb", as_version=4)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "whatif.whatif_summary(fixed)" in source
    runs = _runs(logs_location)
    logs = io.load(runs, mode="query-aware")
    table = whatif.whatif_table(logs, FixedTau(0.07))
    keys = ["model", "context_length", "evictor", *(["draw"] if "draw" in table.columns else [])]  # draws apart
    by_hand = table.filter(pl.col("budget") < 1).group_by(keys).agg(
        ((pl.col("delta") * pl.col("n_inputs")).sum() / pl.col("n_inputs").sum()).alias("d"))
    got = whatif.whatif_summary(table).join(by_hand, on=keys)
    assert got.height == by_hand.height and ((got["delta"] - got["d"]).abs() < 1e-12).all()


def test_a_headless_run_sends_nothing_on_the_shell_channel_while_a_widget_cell_runs():
    """The cause of a 900 s idle wait: nbclient's stand-in for the Output widget answered each output
    the τ explorer's slider captured with a comm_msg on the shell channel, sent raw beside the asyncio
    poll of the cell's execute_reply, which could then be read only when the cell's timeout ran out.
    The headless client (build_notebooks.client) sends nothing there during a cell; what the widget
    shows is still an output of the cell."""
    pytest.importorskip("ipywidgets")
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell(
        "import ipywidgets as widgets\n"
        "widgets.interact(lambda x=1: print(f'drawn at {x}'), x=widgets.IntSlider(value=3, min=0, max=5))")],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    run = _builder().client(nb, NB_DIR)
    sent = []

    def watch_shell(cell, cell_index):
        send = run.kc.shell_channel.send
        run.kc.shell_channel.send = lambda msg: (sent.append(msg["header"]["msg_type"]), send(msg))

    run.on_cell_execute = watch_shell  # just before the execute_request goes out
    run.execute()
    assert sent == ["execute_request"]
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "drawn at 3" in text
