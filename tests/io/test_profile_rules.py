"""The rules on every value of the profile lists, read in NumPy from the Arrow buffers of record
batches (pagestats.io.validation.inputs): each fires on its own planted breach and on no other row,
whatever the batch boundaries, and a null element is a hole, not a bad value.

The expected rows are written from the mutations below, not from the code under test.
"""

from __future__ import annotations

import pytest

from logbuild import assert_problem, input_row, write_run
from pagestats.io import validate_paths
from pagestats.io.validation import inputs

HOLE = "inputs column 'agreement' has null elements"
PAIR_HOLE = "inputs column 'pair_jaccard' has null elements"
BAD_A = "agreement has values outside [0, 1] or NaN"
BAD_P = "pair_jaccard has values outside [0, 1] or NaN"
MEANS = "agreement differs from the layer means of pair_jaccard"


def _mutate(ins, ocs, tks, man):
    ins[input_row(0, 0)]["pair_jaccard"][3] = float("nan")  # a bad value only
    ins[input_row(0, 1)]["agreement"][1] = None  # a hole only: not a bad value
    ins[input_row(0, 2)]["agreement"][0] = None  # a hole beside a bad value
    ins[input_row(0, 2)]["agreement"][2] = 2.0
    ins[input_row(1, 0)]["pair_jaccard"][0] = None  # a hole in the pair Jaccards
    ins[input_row(1, 1)]["pair_jaccard"] = None  # a null list: no hole, no bad value
    ins[input_row(1, 2)]["agreement"][4] = float("-inf")


# 2: batches that cut the rows into pieces of unequal list lengths; 32768: one batch
@pytest.mark.parametrize("batch", [2, 32768])
def test_each_profile_rule_fires_on_its_breach_only(tmp_path, monkeypatch, batch):
    monkeypatch.setattr(inputs, "_BATCH", batch)
    run = write_run(tmp_path, mutate=_mutate)
    problems = validate_paths([str(run)])
    f = run / "inputs" / "part-0000.parquet"
    assert_problem(problems, f, input_row(0, 0), BAD_P)
    assert_problem(problems, f, input_row(0, 1), HOLE, "1 of")
    assert_problem(problems, f, input_row(0, 2), HOLE, "1 of")
    assert_problem(problems, f, input_row(0, 2), BAD_A)
    assert_problem(problems, f, input_row(1, 0), PAIR_HOLE, "1 of")
    assert_problem(problems, f, input_row(1, 1), "inputs column 'pair_jaccard' is null")
    assert_problem(problems, f, input_row(1, 2), BAD_A)
    expected = {BAD_P: {input_row(0, 0)}, HOLE: {input_row(0, 1), input_row(0, 2)}, BAD_A: {input_row(0, 2), input_row(1, 2)},
                PAIR_HOLE: {input_row(1, 0)}}
    for rule, rows in expected.items():
        assert {p.row for p in problems if p.message.startswith(rule)} == rows, rule
    # a NaN difference (a NaN value or a hole in either list) is left to the rules above; -inf differs by inf
    assert {p.row for p in problems if p.message.startswith(MEANS)} == {input_row(1, 2)}
