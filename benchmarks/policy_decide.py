"""Time ``Policy.decide`` and ``Policy.could_record``, the two calls the recorder makes on every step.

Run from the repository root: ``python benchmarks/policy_decide.py`` (after ``make setup``, or with
``PYTHONPATH=.``). Prints microseconds per call for each rule; the target is about 1 µs.
"""
from __future__ import annotations

import timeit

from comgra_ndbg.recorder.policy import (
    Always,
    EveryK,
    FirstN,
    Never,
    PerTypeBackoff,
    Policy,
    Predicate,
    StepList,
)

CALLS = 200_000
REPEATS = 5


def _warmed_backoff() -> Policy:
    policy = PerTypeBackoff(10, factor=2.0)
    for step in range(1000):
        step_type = "rare" if step % 7 == 0 else "often"
        policy.commit(step, step_type, policy.decide(step, step_type).record)
    return policy


def _policies() -> list[Policy]:
    return [
        Always(),
        Never(),
        EveryK(10),
        FirstN(5),
        StepList(range(0, 100_000, 37)),
        _warmed_backoff(),
        Predicate(lambda step, step_type: step_type == "often", "often"),
        EveryK(10) | FirstN(5),
        EveryK(10) & _warmed_backoff(),
        (EveryK(100) | FirstN(5)) & PerTypeBackoff(10) | StepList([3, 7]),
    ]


def _microseconds(statement: str, policy: Policy) -> float:
    timer = timeit.Timer(statement, globals={"p": policy})
    return min(timer.repeat(repeat=REPEATS, number=CALLS)) / CALLS * 1e6


def main() -> None:
    print(f"{'policy':<66} {'decide µs':>10} {'undecided µs':>13} {'could_record µs':>16}")
    for policy in _policies():
        decide = _microseconds("p.decide(12345, 'often')", policy)
        undecided = _microseconds("p.decide(12345, None)", policy)
        could = _microseconds("p.could_record(12345)", policy)
        print(f"{repr(policy):<66} {decide:>10.3f} {undecided:>13.3f} {could:>16.3f}")


if __name__ == "__main__":
    main()
