"""`pagestats power rho|harm|delta|claims` (issue 43) against searches and counts written here with
statsmodels' Wilson interval (method named), scipy's exact binomial test and NumPy."""

from __future__ import annotations

import io

import numpy as np
import polars as pl
import pytest
from scipy.stats import binom, binomtest, norm
from statsmodels.stats.proportion import proportion_confint

from pagestats.cli import main
from pagestats.testing import synthetic_logs


def run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_rho_is_the_first_n_of_a_brute_search(capsys):
    rc, out, err = run(["power", "rho", "--expected", "0.3", "--threshold", "0.1", "--power", "0.9"], capsys)
    first = None
    for n in range(1, 400):
        k = np.arange(n + 1)
        low, high = proportion_confint(k, n, alpha=0.05, method="wilson")
        if np.sum(binom.pmf(k, n, 0.3) * ((0.1 < low) | (0.1 > high))) >= 0.9:
            first = n
            break
    assert rc == 0 and out == f"n = {first}\n" and "Wilson" in err


def test_harm_is_the_first_n_of_a_brute_search(capsys):
    rc, out, _ = run(["power", "harm", "--bound", "0.2", "--expected", "0.05", "--power", "0.8"], capsys)
    first = None
    for n in range(1, 300):
        shown = [binomtest(k, n, 0.2, alternative="less").proportion_ci(0.95, method="exact").high < 0.2
                 for k in range(n + 1)]
        if np.sum(binom.pmf(np.arange(n + 1), n, 0.05) * shown) >= 0.8:
            first = n
            break
    assert rc == 0 and out == f"n = {first}\n"
    rc, out, err = run(["power", "harm", "--bound", "0.1", "--expected", "0.2"], capsys)
    assert rc == 0 and out == "n = none\n" and "no n up to" in err


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    s = synthetic_logs(models={"m": (4, 2)}, n_inputs=30, tasks=("niah_multikey_3", "vt", "fwe"),
                       evictors=("snapkv", "h2o"), budgets=(0.125, 0.25, 0.5, 1.0), seed=5)
    return s, [str(p) for p in s.write(tmp_path_factory.mktemp("power"))]


def test_delta_n_from_the_cells_input_means(logs, capsys):
    s, paths = logs
    rc, out, _ = run(["power", "delta", *paths, "--effect", "0.05", "--cell", "evictor=snapkv", "--simulations", "0",
                      "--format", "csv"], capsys)
    assert rc == 0
    table = pl.read_csv(io.StringIO(out))
    assert table["evictor"].to_list() == ["snapkv"]
    # by hand: the gate at the fixed tau 0.07 (Eq. 2), each input's mean paired difference over b < 1
    inputs = s.inputs.select("run_id", "task", "input_id", "drop", "full_score")
    rows = s.outcomes.filter((pl.col("evictor") == "snapkv") & (pl.col("budget") < 1)).join(inputs, on=["run_id", "task", "input_id"])
    rows = rows.with_columns(pl.when(pl.col("drop") >= 0.07).then(pl.col("score")).otherwise(pl.col("full_score")).alias("g"))
    means = rows.group_by("run_id", "task", "input_id").agg((pl.col("g") - pl.col("score")).mean().alias("m"))["m"].to_numpy()
    expected = int(np.ceil(((norm.ppf(0.975) + norm.ppf(0.8)) * means.std(ddof=1) / 0.05) ** 2))
    assert table["n_needed"][0] == max(2, expected) and table["n_inputs"][0] == means.size


def test_claims_settled_as_the_wilson_intervals_say(logs, capsys):
    _, paths = logs
    rc, out, err = run(["power", "claims", *paths, "--format", "csv", "--harm-bound", "0.3", "--budget", "0.125"], capsys)
    assert rc == 0 and "claims settled" in err
    table = pl.read_csv(io.StringIO(out))
    rho = table.filter(pl.col("claim").str.starts_with("rho"))
    assert rho.height > 0
    for r in rho.iter_rows(named=True):
        k = round(r["estimate"] * r["n"])
        low, high = proportion_confint(k, r["n"], alpha=0.05, method="wilson")
        assert r["settled"] == bool(low >= 0.05 or high < 0.05) and r["under_powered"] == (not r["settled"])
    harm = table.filter(pl.col("claim").str.starts_with("harm"))
    for r in harm.iter_rows(named=True):
        k = round(r["estimate"] * r["n"])
        upper = binomtest(k, r["n"], 0.3, alternative="less").proportion_ci(0.95, method="exact").high
        assert r["settled"] == bool(upper < 0.3)
    assert set(table.filter(pl.col("claim").str.starts_with("delta"))["evictor"]) == {"snapkv", "h2o"}


@pytest.mark.parametrize("argv,text", [
    (["power", "rho", "--expected", "0.1", "--power", "1"], "--power 1.0 is not in (0, 1)"),
    (["power", "delta", "x", "--effect", "0"], "--effect must be non-zero"),
    (["power", "delta", "x", "--effect", "0.1", "--cell", "task=vt"], "--cell 'task=vt'"),
    (["power", "claims", "x", "--harm-bound", "0.1"], "--harm-bound and --budget go together"),
])
def test_bad_usage(capsys, argv, text):
    rc, out, err = run(argv, capsys)
    assert rc == 2 and text in err and err.count("\n") == 1 and out == ""
