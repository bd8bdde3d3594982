"""RULER scoring (collectors.tasks.scoring) on hand-made cases; expected values worked out by hand."""

import pytest

from collectors.tasks import TASK_NAMES, score
from collectors.tasks.scoring import postprocess, string_match_all, string_match_part


def test_postprocess_strips_and_replaces_control_characters():
    assert postprocess("  \tabc\x00def\x1fghi\n ") == "abc\ndef\nghi"
    assert postprocess("\x07\x1b") == ""
    assert postprocess("ünïcode ok") == "ünïcode ok"


@pytest.mark.parametrize(
    "prediction, references, expected",
    [
        ("The numbers are 1234567 and 7654321.", ["1234567", "7654321"], 1.0),
        ("The numbers are 1234567.", ["1234567", "7654321"], 0.5),
        ("nothing here", ["1234567", "7654321", "1111111", "2222222"], 0.0),
        ("a b c", ["A", "B", "z"], 2 / 3),  # case-insensitive
        ("UUID 3F2A-11", ["3f2a-11"], 1.0),
        ("12\x0034567", ["1234567"], 0.0),  # control char becomes a newline, breaking the match
        ("", ["x"], 0.0),
    ],
)
def test_string_match_all(prediction, references, expected):
    assert string_match_all(prediction, references) == pytest.approx(expected)


@pytest.mark.parametrize(
    "prediction, references, expected",
    [
        ("Paris", ["Paris", "paris, France"], 1.0),
        ("It is in PARIS.", ["London", "Paris"], 1.0),
        ("It is in Rome.", ["London", "Paris"], 0.0),
    ],
)
def test_string_match_part(prediction, references, expected):
    assert string_match_part(prediction, references) == expected


def test_score_uses_part_for_qa_and_all_elsewhere():
    refs = ["alpha", "beta"]
    for task in TASK_NAMES:
        expected = 1.0 if task.startswith("qa") else 0.5
        assert score(task, "alpha only", refs) == expected, task


@pytest.mark.parametrize("bad", [[], "alpha"])
def test_bad_references_rejected(bad):
    with pytest.raises(ValueError, match="references"):
        string_match_all("alpha", bad)
