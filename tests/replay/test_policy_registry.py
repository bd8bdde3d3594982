"""The policies by short name (pagestats.core.registry): one table that the command line, calibrate and the gate
file read, each registered class a Policy under its own name; and no caller outside the policy classes asks
which policy it has."""

from __future__ import annotations

import pathlib
import re

import pytest

from pagestats.core import registry
from pagestats.cli import build_parser
from pagestats.deploy.gatefile import Gate
from pagestats.replay import CustomPolicy, FixedTau, Midpoint, Policy, RecalibratedTau, TaskOracle, ZScored

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _choices(command: str) -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return next(a for a in sub.choices[command]._actions if a.dest == "policy").choices


def test_every_registered_class_is_a_policy_under_its_own_name():
    assert list(registry.POLICIES) == ["fixed", "z", "midpoint", "oracle", "risk"]
    for name in registry.POLICIES:
        cls = registry.policy_class(name)
        assert issubclass(cls, Policy) and registry.short_name(cls) == name
    assert [FixedTau().short, ZScored().short, Midpoint().short, TaskOracle().short] == ["fixed", "z", "midpoint",
                                                                                         "oracle"]
    assert RecalibratedTau().short is None and CustomPolicy(lambda f: f["drop"] > 0).short is None
    with pytest.raises(ValueError, match="unknown policy 'nope'; expected one of fixed, z, midpoint, oracle, risk"):
        registry.policy_class("nope")


def test_the_registry_says_which_policies_need_harm_labels():
    """``harm_labels`` (what routes ``calibrate`` to the harm options, read without importing the class) is
    true exactly where the registered class reads the harm label."""
    assert registry.labelled() == ["risk"]
    for name, entry in registry.POLICIES.items():
        assert entry.harm_labels == ("harmed" in registry.policy_class(name).reads)


def test_the_command_line_and_the_gate_file_read_the_registry():
    assert _choices("whatif") == _choices("report") == registry.replayed() == ["fixed", "z", "midpoint", "oracle"]
    assert _choices("calibrate") == registry.deployable() == ["fixed", "z", "midpoint", "risk"]
    for name in registry.deployable():
        assert Gate(tau=0.1, policy=name).policy == name
    with pytest.raises(ValueError, match="policy must be one of fixed, z, midpoint, risk, got 'oracle'"):
        Gate(tau=0.1, policy="oracle")


def test_a_policy_says_what_its_callers_ask():
    fixed, z, mid = FixedTau(0.05), ZScored(pilot_split="random"), Midpoint()
    assert (fixed.fixed_tau, z.fixed_tau, mid.fixed_tau, TaskOracle().fixed_tau) == (0.05, None, None, None)
    assert [p.has_pilot for p in (fixed, z, mid, TaskOracle())] == [False, True, True, False]
    assert (ZScored().held_out, z.held_out, fixed.held_out) == (True, False, False)
    assert RecalibratedTau().reads == ("reference_drop",) and CustomPolicy(lambda f: f).reads == ("agreement",)
    assert not CustomPolicy(lambda f: f).per_draw and fixed.per_draw
    assert fixed.recalibrated("z", pilot_n=7, pilot_by=("model",), pilot_split="first", seed=2) == RecalibratedTau(
        tau=0.05, pilot_n=7, pilot_split="first", seed=2)
    with pytest.raises(ValueError, match="applies to a fixed τ"):
        z.recalibrated("z")


#: A type check of a policy: isinstance against a policy class, its class or class name compared, or a
#: policy variable compared with a registered short name.
_NAMES = "|".join(registry.POLICIES)
_TYPE_CHECK = re.compile(r"isinstance\([^)]*(Policy|FixedTau|ZScored|RecalibratedTau|Midpoint|TaskOracle|_POLICIES)"
                         r"|type\([a-z_.]*policy\)|__name__\s*==\s*[\"'](FixedTau|ZScored|Midpoint|TaskOracle)"
                         rf"|policy\w*\s*[!=]=\s*[\"']({_NAMES})[\"']|[\"']({_NAMES})[\"']\s*[!=]=\s*[\w.]*policy")


def test_the_type_check_finder_finds_a_planted_one():
    assert _TYPE_CHECK.search("if isinstance(policy, FixedTau):")
    assert _TYPE_CHECK.search('x = type(self.policy).__name__ == "FixedTau"')
    assert _TYPE_CHECK.search('if args.policy == "risk":') and _TYPE_CHECK.search("if args.policy != 'z':")
    assert not _TYPE_CHECK.search("if policy.fixed_tau is None:")


def test_no_caller_asks_which_policy_it_has():
    """Outside the policy classes, code reads a policy's attributes; the only type checks left refuse
    what is not a Policy at all (the entry points of a replay)."""
    found = []
    for path in sorted((ROOT / "pagestats").rglob("*.py")) + sorted((ROOT / "collectors").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("pagestats/replay/policies.py", "pagestats/replay/calibration.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _TYPE_CHECK.search(line) and "isinstance(policy, Policy)" not in line:
                found.append(f"{rel}:{n}: {line.strip()}")
    assert found == []


def test_every_policy_decides_through_one_calibrate():
    """calibrate(con, source) of a CustomPolicy (Python on the rows, joined back) and of the oracle decides as
    their rules say, row for row, whatever the frame's row order; the oracle refuses an input without a class."""
    import polars as pl

    from pagestats.replay.calibration import calibration

    frame = pl.DataFrame({"run_id": ["r"] * 6, "task": ["vt", "niah_multikey_3"] * 3, "input_id": [3, 1, 2, 0, 5, 4],
                          "model": ["m"] * 6, "context_length": [4096] * 6,
                          "task_class": ["dilution-prone", "capacity-bound"] * 3,
                          "drop": [0.3, 0.01, 0.2, 0.05, 0.1, 0.0],
                          "agreement": [[0.5, float(i)] for i in range(6)]})
    custom = CustomPolicy(lambda f: (f["agreement"].list.get(1) >= 3).to_numpy(), name="late")
    decided, record = calibration(custom, frame)
    assert decided["gate_open"].to_list() == [i >= 3 for i in range(6)] and record == []
    assert decided["tau"].null_count() == 6 and not decided["in_pilot"].any()
    oracle = calibration(TaskOracle(), frame)[0]
    assert oracle["gate_open"].to_list() == [True, False] * 3
    with pytest.raises(ValueError, match="task_class is null"):
        TaskOracle().decide(frame.with_columns(pl.lit(None, pl.String).alias("task_class")))
    fixed = FixedTau(0.1).decide(frame)
    assert fixed["gate_open"].to_list() == [d >= 0.1 for d in frame["drop"]]
    assert fixed["tau"].to_list() == [0.1] * 6 and not fixed["in_pilot"].any()
