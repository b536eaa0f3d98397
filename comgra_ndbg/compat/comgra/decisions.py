"""Comgra's recording decisions as the Recorder's policies.

What Comgra calls a *recording* of a step (the values of every registered tensor, per sample, at that
step) is a *snapshot* here, so Comgra's decision maker becomes the snapshot policy: :class:`ComgraSnapshots`
asks it at the start of each step and marks each step that got its snapshots, exactly when Comgra would.
Summaries (a few statistics of every tensor) follow the library's own policy, every step by default, so
the analysis always has a time series; :class:`ComgraSummaries` only adds Comgra's explicit
``override__recording_is_active=False`` ("do not record this step"), which stops both.

The layer keeps what a decision depends on beyond the step and its type in a :class:`StepState` that it
updates at ``start_batch`` before the Recorder asks the policies.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.recorder.policy import Decision, Policy

__all__ = ["StepState", "ComgraSnapshots", "ComgraSummaries", "check_decision_maker"]

_OVERRIDE_ON = Decision(True, "override__recording_is_active=True", "comgra")
_OVERRIDE_OFF = Decision(False, "override__recording_is_active=False", "comgra")
_UNDECIDED = Decision(True, "undecided: Comgra's type of execution comes with decide_recording_of_batch()", "comgra")
_NONE_DUE = Decision(False, "undecided: no type of execution is due (all were declared encountered)", "comgra")


@dataclass
class StepState:
    """The open step's inputs to Comgra's decision besides its number and type.

    ``override`` is ``start_batch``'s ``override__recording_is_active``; ``none_due`` is Comgra's own early
    "no" for a step without a type once every type was declared encountered and none of them is due;
    ``recorded_types`` maps each type of execution recorded so far to the last step it was recorded at.
    """

    override: bool | None = None
    none_due: bool = False
    declared: bool = False
    recorded_types: dict[str, int] = field(default_factory=dict)


def check_decision_maker(maker: Any) -> None:
    """Raise ``InvalidArgumentError`` unless ``maker`` answers Comgra's two decision-maker calls."""
    for method in ("is_record_on_this_step", "mark_recording_on_this_step"):
        if not callable(getattr(maker, method, None)):
            raise InvalidArgumentError(
                f"decision_maker_for_recordings must be a Comgra decision maker with a {method}() method, got "
                f"{type(maker).__name__}; e.g. DecisionMakerForRecordingsFrequencyPerType(min_training_steps_"
                f"difference=1000) from comgra_ndbg.compat.comgra.objects")


class ComgraSnapshots(Policy):
    """The snapshot policy: Comgra's ``recording_is_active()`` for the step, and Comgra's marks.

    >>> from comgra_ndbg.compat.comgra.objects import DecisionMakerForRecordingsHardcoded
    >>> policy = ComgraSnapshots(DecisionMakerForRecordingsHardcoded({3}), StepState())
    >>> [policy.decide(step, "train").record for step in range(5)]
    [False, False, False, True, False]
    """

    __slots__ = ("decision_maker", "state", "_due", "_wait")

    def __init__(self, decision_maker: Any, state: StepState) -> None:
        check_decision_maker(decision_maker)
        self.decision_maker = decision_maker
        self.state = state
        name = type(decision_maker).__name__
        self._due = Decision(True, f"Comgra's {name}", "comgra")
        self._wait = Decision(False, f"Comgra's {name}", "comgra")

    def decide(self, step: int, step_type: str | None) -> Decision:
        state = self.state
        if state.override is not None:
            return _OVERRIDE_ON if state.override else _OVERRIDE_OFF
        if state.none_due:
            return _NONE_DUE
        if step_type is None:
            return _UNDECIDED
        return self._due if self.decision_maker.is_record_on_this_step(step, step_type) else self._wait

    def commit(self, step: int, step_type: str, recorded: bool) -> None:
        if recorded:
            self.decision_maker.mark_recording_on_this_step(step, step_type)

    def __repr__(self) -> str:
        return f"ComgraSnapshots({self.decision_maker!r})"


class ComgraSummaries(Policy):
    """The summary policy: ``inner`` (the library's default, every step), off on steps started with
    ``override__recording_is_active=False``.

    >>> from comgra_ndbg.recorder.policy import EveryK
    >>> state = StepState()
    >>> policy = ComgraSummaries(EveryK(1), state)
    >>> policy.decide(7, "train").record, (setattr(state, "override", False), policy.decide(7, "train").record)[1]
    (True, False)
    """

    __slots__ = ("inner", "state")

    def __init__(self, inner: Policy, state: StepState) -> None:
        self.inner = inner
        self.state = state

    def decide(self, step: int, step_type: str | None) -> Decision:
        if self.state.override is False:
            return _OVERRIDE_OFF
        return self.inner.decide(step, step_type)

    def commit(self, step: int, step_type: str, recorded: bool) -> None:
        self.inner.commit(step, step_type, recorded)

    def __repr__(self) -> str:
        return f"ComgraSummaries({self.inner!r})"
