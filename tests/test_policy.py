"""Recording policies: exact decisions, per-type backoff clocks, undecided types, failing predicates,
the ``as_policy`` shorthand and its errors, and readable reprs."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from comgra_ndbg.errors import ComgraError
from comgra_ndbg.recorder.policy import (
    AllOf,
    Always,
    AnyOf,
    Decision,
    EveryK,
    FirstN,
    Never,
    PerTypeBackoff,
    Policy,
    PolicyError,
    Predicate,
    StepList,
    as_policy,
)


def run(policy: Policy, step_types: list[tuple[int, str]]) -> list[int]:
    """Drive ``policy`` the way the recorder does: decide at the start, commit at the end of each step."""
    recorded = []
    for step, step_type in step_types:
        decision = policy.decide(step, step_type)
        policy.commit(step, step_type, decision.record)
        if decision.record:
            recorded.append(step)
    return recorded


def one_type(num_steps: int) -> list[tuple[int, str]]:
    return [(step, "train") for step in range(num_steps)]


def interleaved(num_steps: int) -> list[tuple[int, str]]:
    """A rare type 'rare' on every 7th step (0, 7, 14, ...), a frequent type 'often' on all others."""
    return [(step, "rare" if step % 7 == 0 else "often") for step in range(num_steps)]


def recorded_of(policy: Policy, steps: list[tuple[int, str]], step_type: str) -> list[int]:
    types = dict(steps)
    return [step for step in run(policy, steps) if types[step] == step_type]


# ---- stateless rules and compositions, steps 0..200 --------------------------------------------------

STEP_RULES = [
    (EveryK(50), [0, 50, 100, 150, 200]),
    (EveryK(30, offset=7), [7, 37, 67, 97, 127, 157, 187]),
    (EveryK(60, offset=125), [125, 185]),
    (EveryK(1), list(range(201))),
    (FirstN(5), [0, 1, 2, 3, 4]),
    (FirstN(0), []),
    (StepList([199, 3, 50, 500, 3]), [3, 50, 199]),
    (StepList([]), []),
    (Always(), list(range(201))),
    (Never(), []),
    (AnyOf(EveryK(50), FirstN(3)), [0, 1, 2, 50, 100, 150, 200]),
    (EveryK(50) | FirstN(3), [0, 1, 2, 50, 100, 150, 200]),
    (AllOf(EveryK(10), FirstN(35)), [0, 10, 20, 30]),
    (EveryK(10) & FirstN(35), [0, 10, 20, 30]),
    (EveryK(40) | StepList([7, 9]) & FirstN(8), [0, 7, 40, 80, 120, 160, 200]),
    ((EveryK(40) | StepList([7, 9])) & FirstN(8), [0, 7]),
    (EveryK(25) & EveryK(10), [0, 50, 100, 150, 200]),
]


@pytest.mark.parametrize(("policy", "expected"), STEP_RULES, ids=[repr(p) for p, _ in STEP_RULES])
def test_step_rules_record_exactly_these_steps(policy: Policy, expected: list[int]) -> None:
    assert run(policy, one_type(201)) == expected
    assert [step for step in range(201) if policy.could_record(step)] == expected
    assert [step for step in range(201) if policy.decide(step, None).record] == expected


DECISIONS = [
    (EveryK(10), 20, "train", Decision(True, "every 10 steps", "every")),
    (EveryK(10), 21, "train", Decision(False, "every 10 steps: not this step", "every")),
    (EveryK(1), 3, None, Decision(True, "every step", "every")),
    (EveryK(10, offset=5), 5, "train", Decision(True, "every 10 steps from step 5", "every")),
    (FirstN(5), 4, "train", Decision(True, "first 5 steps", "first")),
    (FirstN(5), 5, "train", Decision(False, "after the first 5 steps", "first")),
    (FirstN(1), 0, None, Decision(True, "first step", "first")),
    (StepList([3]), 3, "train", Decision(True, "step list", "steps")),
    (StepList([3]), 4, "train", Decision(False, "not in step list", "steps")),
    (Always(), 9, None, Decision(True, "always", "always")),
    (Never(), 9, "train", Decision(False, "never", "never")),
    (EveryK(10) | FirstN(5), 2, "train", Decision(True, "first 5 steps", "first")),
    (FirstN(5) | EveryK(2), 2, "train", Decision(True, "first 5 steps", "first")),
    (EveryK(10) | FirstN(5), 7, "train", Decision(False, "none of: EveryK(10) | FirstN(5)", "any")),
    (EveryK(2) & FirstN(5), 4, "train", Decision(True, "every 2 steps and first 5 steps", "all")),
    (EveryK(2) & FirstN(5), 6, "train", Decision(False, "after the first 5 steps", "first")),
    (EveryK(2) & FirstN(5), 3, "train", Decision(False, "every 2 steps: not this step", "every")),
    (PerTypeBackoff(10), 3, "train", Decision(True, "step type 'train' first seen", "per_type")),
    (PerTypeBackoff(10), 3, None, Decision(True, "undecided: step type not known yet", "per_type")),
    (
        EveryK(10) & PerTypeBackoff(10),
        10,
        None,
        Decision(True, "every 10 steps and undecided: step type not known yet", "all"),
    ),
    (EveryK(10) & PerTypeBackoff(10), 5, None, Decision(False, "every 10 steps: not this step", "every")),
]


@pytest.mark.parametrize(("policy", "step", "step_type", "expected"), DECISIONS)
def test_decisions_carry_exact_reason_and_rule(
    policy: Policy, step: int, step_type: str | None, expected: Decision
) -> None:
    assert policy.decide(step, step_type) == expected


def test_decision_is_frozen() -> None:
    decision = EveryK(10).decide(0, "train")
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.record = False  # type: ignore[misc]


# ---- per-type backoff --------------------------------------------------------------------------------

def test_backoff_factor_2_doubles_the_gap_after_each_recording() -> None:
    assert run(PerTypeBackoff(10, factor=2), one_type(401)) == [0, 20, 60, 140, 300]


def test_backoff_factor_1_keeps_recordings_min_gap_apart() -> None:
    assert run(PerTypeBackoff(10), one_type(51)) == [0, 10, 20, 30, 40, 50]


def test_backoff_fractional_factor_waits_until_the_first_step_at_or_after_the_due_step() -> None:
    # gaps 15, 22.5, 33.75, 50.625, 75.9375: due at 15, 37.5, 71.25, 121.875, 197.8125 -> rounded up
    assert run(PerTypeBackoff(10, factor=1.5), one_type(201)) == [0, 15, 38, 72, 123, 199]


def test_backoff_gives_each_type_its_own_clock_factor_1() -> None:
    steps = interleaved(201)
    assert recorded_of(PerTypeBackoff(10), steps, "often") == [
        1, 11, 22, 32, 43, 53, 64, 74, 85, 95, 106, 116, 127, 137, 148, 158, 169, 179, 190, 200,
    ]
    assert recorded_of(PerTypeBackoff(10), steps, "rare") == [
        0, 14, 28, 42, 56, 70, 84, 98, 112, 126, 140, 154, 168, 182, 196,
    ]


def test_backoff_gives_each_type_its_own_clock_factor_2() -> None:
    steps = interleaved(401)
    assert recorded_of(PerTypeBackoff(10, factor=2), steps, "often") == [1, 22, 62, 142, 302]
    assert recorded_of(PerTypeBackoff(10, factor=2), steps, "rare") == [0, 21, 63, 147, 308]


def test_backoff_first_false_starts_the_clock_without_recording() -> None:
    assert run(PerTypeBackoff(10, first=False), one_type(51)) == [10, 20, 30, 40, 50]
    assert run(PerTypeBackoff(10, factor=2, first=False), one_type(401)) == [20, 60, 140, 300]


def test_backoff_vetoed_by_all_of_stays_due() -> None:
    assert run(PerTypeBackoff(10) & EveryK(3), one_type(61)) == [0, 12, 24, 36, 48, 60]


def test_backoff_clock_ignores_steps_an_any_of_sibling_recorded() -> None:
    assert run(PerTypeBackoff(10) | StepList([5, 25]), one_type(31)) == [0, 5, 10, 20, 25, 30]


def test_backoff_undecided_type_records_when_any_type_could() -> None:
    eager = PerTypeBackoff(10, factor=2)
    run(eager, one_type(30))
    assert [step for step in range(30, 40) if eager.decide(step, None).record] == list(range(30, 40))
    assert eager.decide(35, "train").record is False

    lazy = PerTypeBackoff(10, first=False)
    assert lazy.decide(0, None) == Decision(False, "undecided: no step type is due yet", "per_type")
    lazy.commit(0, "a", False)
    assert lazy.decide(9, None) == Decision(False, "undecided: no step type is due (next at 10)", "per_type")
    assert lazy.decide(10, None) == Decision(True, "undecided: step type not known yet", "per_type")
    assert lazy.decide(10, "b") == Decision(
        False, "step type 'b' first seen, starts its clock (first=False)", "per_type"
    )
    lazy.commit(3, "b", False)
    lazy.commit(10, "a", True)
    assert [step for step in range(10, 25) if lazy.could_record(step)] == [
        13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
    ]


def test_backoff_commit_out_of_order_and_skipped_steps() -> None:
    policy = PerTypeBackoff(10)
    policy.commit(30, "a", True)
    policy.commit(20, "a", True)  # older step committed late: not due, clock unchanged
    assert policy.decide(39, "a") == Decision(False, "step type 'a' backoff (next at 40)", "per_type")
    assert policy.decide(40, "a") == Decision(True, "step type 'a' backoff (due at 40)", "per_type")
    policy.commit(55, "a", True)  # steps 40..54 were never committed
    policy.commit(50, "a", True)
    assert [step for step in range(50, 80) if policy.decide(step, "a").record] == list(range(65, 80))


def test_backoff_commit_of_unrecorded_or_undue_steps_changes_nothing() -> None:
    policy = PerTypeBackoff(10)
    policy.commit(0, "a", False)  # first seen but not recorded (vetoed): still first seen
    assert policy.decide(1, "a") == Decision(True, "step type 'a' first seen", "per_type")
    policy.commit(1, "a", True)
    policy.commit(5, "a", True)  # recorded by another rule, not due here
    policy.commit(11, "a", False)  # due but not recorded: stays due
    assert [step for step in range(1, 30) if policy.decide(step, "a").record] == list(range(11, 30))


def _comgra_reference(min_gap: int, factor: float, steps: list[tuple[int, str]]) -> list[int]:
    """Comgra's DecisionMakerForRecordingsFrequencyPerType, which updates its clock inside the query."""
    last: dict[str, tuple[int, float]] = {}
    recorded = []
    for step, step_type in steps:
        if step_type not in last:
            last[step_type] = (step, min_gap * factor)
            recorded.append(step)
        elif step >= last[step_type][0] + last[step_type][1]:
            last[step_type] = (step, last[step_type][1] * factor)
            recorded.append(step)
    return recorded


@pytest.mark.parametrize(("min_gap", "factor"), [(1, 1.0), (3, 1.0), (10, 2.0), (4, 1.5), (7, 3.0)])
def test_backoff_matches_comgra_when_every_due_step_is_recorded(min_gap: int, factor: float) -> None:
    rng = np.random.default_rng(min_gap)
    steps = [(step, str(rng.choice(["a", "a", "a", "b", "c"]))) for step in range(2000)]
    assert run(PerTypeBackoff(min_gap, factor=factor), steps) == _comgra_reference(min_gap, factor, steps)


def test_backoff_decide_is_a_pure_query() -> None:
    policy = PerTypeBackoff(10)
    first = [policy.decide(step, "a").record for step in range(20)]
    second = [policy.decide(step, "a").record for step in range(20)]
    assert first == second == [True] * 20


def test_backoff_commit_without_a_type_says_what_to_pass() -> None:
    with pytest.raises(PolicyError, match=r"commit\(step=4\) needs the step's final type, got None"):
        PerTypeBackoff(10).commit(4, None, True)  # type: ignore[arg-type]


# ---- predicate -----------------------------------------------------------------------------------------

def _flaky(step: int, step_type: str) -> bool:
    if step % 3 == 0:
        return bool(1 // (step % 3))
    if step % 5 == 0:
        raise KeyError("no such batch")
    return True


def test_predicate_that_raises_records_nothing_and_warns_once_per_exception_type() -> None:
    policy = Predicate(_flaky, "flaky")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run(policy, one_type(21)) == [1, 2, 4, 7, 8, 11, 13, 14, 16, 17, 19]
    messages = [str(w.message) for w in caught]
    assert [w.category for w in caught] == [RuntimeWarning, RuntimeWarning]
    assert "raised ZeroDivisionError: integer division or modulo by zero at step 0 (step type 'train')" in (
        messages[0]
    )
    assert "raised KeyError: 'no such batch' at step 5 (step type 'train')" in messages[1]
    assert "Predicate(_flaky, 'flaky')" in messages[0]
    assert policy.decide(9, "train") == Decision(
        False, "predicate 'flaky' raised ZeroDivisionError", "predicate"
    )


def test_predicate_truth_value_that_raises_is_caught() -> None:
    policy = Predicate(lambda step, step_type: np.array([True, False]), "ambiguous")
    with pytest.warns(RuntimeWarning, match="raised ValueError"):
        assert policy.decide(0, "train").record is False


def test_predicate_lets_keyboard_interrupt_through() -> None:
    def interrupted(step: int, step_type: str) -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Predicate(interrupted).decide(0, "train")


def test_predicate_decisions_and_undecided_type() -> None:
    calls = []

    def long_steps(step: int, step_type: str) -> bool:
        calls.append((step, step_type))
        return step_type == "long"

    policy = Predicate(long_steps, "long steps")
    assert run(policy, [(0, "short"), (1, "long"), (2, "short"), (3, "long")]) == [1, 3]
    assert policy.decide(4, "short") == Decision(False, "predicate 'long steps' is false", "predicate")
    assert policy.decide(5, None) == Decision(True, "undecided: step type not known yet", "predicate")
    assert policy.could_record(5) is True
    assert calls == [(0, "short"), (1, "long"), (2, "short"), (3, "long"), (4, "short")]
    narrowed = EveryK(10) & policy
    assert [step for step in range(25) if narrowed.could_record(step)] == [0, 10, 20]


# ---- could_record agrees with decide(step, None) ----------------------------------------------------

@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_could_record_matches_undecided_decide_for_every_rule() -> None:
    policies = [p for p, _ in STEP_RULES] + [
        PerTypeBackoff(10, factor=2),
        PerTypeBackoff(7, first=False),
        Predicate(_flaky),
        PerTypeBackoff(5, first=False) | FirstN(3),
        PerTypeBackoff(5, first=False) & EveryK(2),
    ]
    for policy in policies:
        run(policy, interleaved(40)[::3])
        could = [policy.could_record(step) for step in range(120)]
        assert could == [policy.decide(step, None).record for step in range(120)], policy


# ---- as_policy ------------------------------------------------------------------------------------------

def _named_predicate(step: int, step_type: str) -> bool:
    return step == 2


AS_POLICY = [
    (10, "EveryK(10)"),
    (1, "EveryK(1)"),
    (np.int64(25), "EveryK(25)"),
    (0, "Never()"),
    (None, "Never()"),
    (False, "Never()"),
    (True, "Always()"),
    ([5, 0, 5], "StepList([0, 5])"),
    ({3, 1}, "StepList([1, 3])"),
    ((2,), "StepList([2])"),
    (frozenset(), "StepList([])"),
    (range(0, 30, 10), "StepList([0, 10, 20])"),
    (np.array([4, 8]), "StepList([4, 8])"),
    (iter([6, 9]), "StepList([6, 9])"),
    (_named_predicate, "Predicate(_named_predicate)"),
]


@pytest.mark.parametrize(("spec", "expected"), AS_POLICY, ids=[repr(r) for _, r in AS_POLICY])
def test_as_policy_converts_shorthand(spec: object, expected: str) -> None:
    assert repr(as_policy(spec)) == expected  # type: ignore[arg-type]


def test_as_policy_returns_a_policy_unchanged() -> None:
    policy = EveryK(10) | FirstN(5)
    assert as_policy(policy) is policy


def test_as_policy_shorthand_decides_like_the_rule() -> None:
    assert run(as_policy(10), one_type(31)) == [0, 10, 20, 30]
    assert run(as_policy([3, 4]), one_type(31)) == [3, 4]
    assert run(as_policy(_named_predicate), one_type(31)) == [2]


BAD_SPECS = [
    (-1, ["snapshot_every=-1 is negative", "pass an int k >= 1 (every k steps)", "EveryK(10) | FirstN(5)"]),
    ("10", ["snapshot_every='10' is a str", "did you mean snapshot_every=10?"]),
    ("often", ["snapshot_every='often' is a str; pass an int k >= 1"]),
    (b"5", ["is a bytes", "did you mean snapshot_every=5?"]),
    (2.5, ["snapshot_every=2.5 is a float, not an int; pass an int k >= 1"]),
    (10.0, ["snapshot_every=10.0 is a float, not an int; did you mean snapshot_every=10?"]),
    (float("nan"), ["snapshot_every=nan is a float, not an int; pass"]),
    ([1, "a"], [
        "snapshot_every holds 'a' (str), which is not a step number", "e.g. snapshot_every=[0, 10, 500]",
    ]),
    ([1, -2], ["snapshot_every holds -2 (int), which is not a step number", "ints >= 0"]),
    ([1.5], ["holds 1.5 (float)"]),
    ([True], ["holds True (bool)"]),
    ({"every": 10}, ["snapshot_every={'every': 10} is a dict", "a list, set or range of step numbers"]),
    (EveryK, ["snapshot_every=EveryK is a class, not a policy; pass an instance, e.g. EveryK(10)"]),
    (object(), ["is a object; pass an int k >= 1"]),
]


@pytest.mark.parametrize(("spec", "fragments"), BAD_SPECS, ids=[repr(s) for s, _ in BAD_SPECS])
def test_as_policy_rejects_bad_input_with_a_helpful_message(spec: object, fragments: list[str]) -> None:
    with pytest.raises(PolicyError) as info:
        as_policy(spec, name="snapshot_every")  # type: ignore[arg-type]
    assert isinstance(info.value, ComgraError) and isinstance(info.value, ValueError)
    for fragment in fragments:
        assert fragment in str(info.value)


BAD_CONSTRUCTORS = [
    (
        lambda: EveryK(0),
        "EveryK(k) must be an int >= 1, got 0; pass e.g. EveryK(10) to record every 10th step, "
        "or Never() to record nothing",
    ),
    (lambda: EveryK(-3), "EveryK(k) must be an int >= 1, got -3"),
    (lambda: EveryK(2.5), "EveryK(k) must be an int >= 1, got 2.5 (float)"),
    (lambda: EveryK(True), "EveryK(k) must be an int >= 1, got True (bool)"),
    (
        lambda: EveryK(10, offset=-1),
        "EveryK(offset=...) must be an int >= 0, got -1; offset is the first recorded step",
    ),
    (lambda: FirstN(-1), "FirstN(n) must be an int >= 0, got -1; pass e.g. FirstN(5) to record steps 0 to 4"),
    (
        lambda: StepList(5),
        "StepList needs a collection of step numbers, got 5 (int); pass e.g. StepList([0, 10, 500])",
    ),
    (lambda: StepList("0, 10"), "StepList needs a collection of step numbers, got '0, 10' (str)"),
    (lambda: StepList([1, None]), "every step of StepList must be an int >= 0, got None (NoneType)"),
    (lambda: PerTypeBackoff(0), "PerTypeBackoff(min_gap) must be an int >= 1, got 0"),
    (
        lambda: PerTypeBackoff(10, factor=0.5),
        "PerTypeBackoff(factor=...) must be a finite number >= 1, got 0.5; 1 keeps the gap fixed",
    ),
    (lambda: PerTypeBackoff(10, factor=float("inf")), "must be a finite number >= 1, got inf"),
    (
        lambda: PerTypeBackoff(10, first="yes"),
        "PerTypeBackoff(first=...) must be True or False, got 'yes' (str)",
    ),
    (lambda: Predicate(5), "Predicate needs a function (step, step_type) -> bool, got 5 (int)"),
    (
        lambda: Predicate(EveryK(3)),
        "Predicate needs a function (step, step_type) -> bool, got EveryK(3) (EveryK)",
    ),
    (lambda: Predicate(_named_predicate, 3), "Predicate(description=...) must be a str, got 3 (int)"),
    (lambda: AnyOf(), "AnyOf() needs at least one policy, e.g. AnyOf(EveryK(10), FirstN(5))"),
    (lambda: AllOf(), "AllOf() needs at least one policy"),
    (
        lambda: AnyOf(EveryK(1), 3),
        "AnyOf combines Policy objects, got 3 (int); convert it first with as_policy(...)",
    ),
]


@pytest.mark.parametrize(("build", "message"), BAD_CONSTRUCTORS, ids=[m[:40] for _, m in BAD_CONSTRUCTORS])
def test_constructors_reject_bad_arguments(build, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        build()
    assert message in str(info.value)


def test_operators_need_policies_on_both_sides() -> None:
    with pytest.raises(TypeError):
        EveryK(10) | 5  # type: ignore[operator]
    with pytest.raises(TypeError):
        EveryK(10) & [1, 2]  # type: ignore[operator]


# ---- repr ---------------------------------------------------------------------------------------------

REPRS = [
    (EveryK(10) | FirstN(5), "EveryK(10) | FirstN(5)"),
    (
        (EveryK(10) | FirstN(5)) & PerTypeBackoff(10, factor=2),
        "(EveryK(10) | FirstN(5)) & PerTypeBackoff(10, factor=2)",
    ),
    (EveryK(10) & FirstN(5) | Never(), "EveryK(10) & FirstN(5) | Never()"),
    ((EveryK(1) | EveryK(2)) | EveryK(3), "EveryK(1) | EveryK(2) | EveryK(3)"),
    (AllOf(AllOf(EveryK(1), EveryK(2)), EveryK(3)), "EveryK(1) & EveryK(2) & EveryK(3)"),
    (AnyOf(EveryK(1)), "AnyOf(EveryK(1))"),
    (AllOf(AnyOf(EveryK(1)), Always()), "AnyOf(EveryK(1)) & Always()"),
    (EveryK(10, offset=3), "EveryK(10, offset=3)"),
    (PerTypeBackoff(10), "PerTypeBackoff(10)"),
    (PerTypeBackoff(10, factor=1.5, first=False), "PerTypeBackoff(10, factor=1.5, first=False)"),
    (StepList(list(range(100))), "StepList(<100 steps: 0, 1, 2, 3, 4, ..., 99>)"),
    (StepList(range(100)), "StepList(range(0, 100))"),
    (Predicate(_named_predicate), "Predicate(_named_predicate)"),
    (Predicate(_named_predicate, "loss spike"), "Predicate(_named_predicate, 'loss spike')"),
]


@pytest.mark.parametrize(("policy", "expected"), REPRS, ids=[r for _, r in REPRS])
def test_repr_is_readable(policy: Policy, expected: str) -> None:
    assert repr(policy) == expected


def test_composition_flattens_and_forwards_commit_to_all_children() -> None:
    fast, slow = PerTypeBackoff(5), PerTypeBackoff(20)
    policy = (fast | FirstN(1)) | slow
    assert policy.policies == (fast, policy.policies[1], slow)  # type: ignore[attr-defined]
    assert run(policy, one_type(41)) == [0, 5, 10, 15, 20, 25, 30, 35, 40]
    assert slow.decide(59, "train") == Decision(False, "step type 'train' backoff (next at 60)", "per_type")
