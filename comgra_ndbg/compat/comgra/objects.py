"""Comgra's decision makers: which training steps Comgra "records" (here: which steps get snapshots).

The same classes, fields and rules as ``comgra.objects`` of Comgra 0.11.5, so a script that builds one
keeps working after its import line changes. ``ComgraRecorder`` asks the decision maker at the start of
every step (``is_record_on_this_step``) and tells it about every step that was recorded
(``mark_recording_on_this_step``), as Comgra does; a decision maker of your own that subclasses
:class:`DecisionMakerForRecordings` (or Comgra's own class) works the same way.

>>> maker = DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10, exponential_backoff_factor=2)
>>> recorded = []
>>> for step in range(100):
...     if maker.is_record_on_this_step(step, "train"):
...         maker.mark_recording_on_this_step(step, "train")
...         recorded.append(step)
>>> recorded
[0, 20, 60]
"""
from __future__ import annotations

import abc
import dataclasses
import math
import numbers

from comgra_ndbg.errors import InvalidArgumentError

__all__ = ["DecisionMakerForRecordings", "DecisionMakerForRecordingsHardcoded",
           "DecisionMakerForRecordingsFrequencyPerType"]


class DecisionMakerForRecordings(abc.ABC):
    """Decides per training step and type of execution whether Comgra records the step."""

    @abc.abstractmethod
    def is_record_on_this_step(self, training_step: int, type_of_execution: str | None) -> bool:
        """Whether ``training_step`` of ``type_of_execution`` is recorded; must not change any state."""

    @abc.abstractmethod
    def mark_recording_on_this_step(self, training_step: int, type_of_execution: str) -> None:
        """Called once at the end of every recorded step."""


@dataclasses.dataclass
class DecisionMakerForRecordingsHardcoded(DecisionMakerForRecordings):
    """Records exactly the training steps in ``fixed_training_steps``, whatever their type.

    >>> DecisionMakerForRecordingsHardcoded({0, 5}).is_record_on_this_step(5, "test")
    True
    """

    fixed_training_steps: set[int]

    def is_record_on_this_step(self, training_step: int, type_of_execution: str | None) -> bool:
        return training_step in self.fixed_training_steps

    def mark_recording_on_this_step(self, training_step: int, type_of_execution: str) -> None:
        """Nothing to remember: the chosen steps are fixed in advance (Comgra's class does the same)."""


@dataclasses.dataclass
class DecisionMakerForRecordingsFrequencyPerType(DecisionMakerForRecordings):
    """Records each type of execution at its first step and then once at least ``min_training_steps_difference``
    steps after its last recording; the difference is multiplied by ``exponential_backoff_factor`` after each
    recording (Comgra's rule, so a rare type is recorded as regularly as a frequent one).

    A step whose type is not known yet (``None``) is not recorded by this rule.
    """

    min_training_steps_difference: int
    exponential_backoff_factor: float = 1.0
    identifier_to_last_recorded_step_and_min_difference: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        difference = self.min_training_steps_difference
        if isinstance(difference, bool) or not isinstance(difference, numbers.Real) or not difference >= 0:
            raise InvalidArgumentError(f"min_training_steps_difference must be a number >= 0, got {difference!r}; "
                                       f"e.g. 1000 records each type of execution at most every 1000 steps")
        factor = self.exponential_backoff_factor
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real) or not (math.isfinite(factor)
                                                                                     and factor >= 1.0):
            raise InvalidArgumentError(f"exponential_backoff_factor must be a finite number >= 1.0, got {factor!r}; "
                                       f"1.0 keeps the difference fixed, 2.0 doubles it after every recording")

    def is_record_on_this_step(self, training_step: int, type_of_execution: str | None) -> bool:
        if type_of_execution is None:
            return False
        last_recorded_step, min_difference = self.identifier_to_last_recorded_step_and_min_difference.get(
            type_of_execution, (None, self.min_training_steps_difference))
        if last_recorded_step == training_step:
            return True
        return last_recorded_step is None or training_step >= last_recorded_step + min_difference

    def mark_recording_on_this_step(self, training_step: int, type_of_execution: str) -> None:
        _, min_difference = self.identifier_to_last_recorded_step_and_min_difference.get(
            type_of_execution, (None, self.min_training_steps_difference))
        self.identifier_to_last_recorded_step_and_min_difference[type_of_execution] = (
            training_step, min_difference * self.exponential_backoff_factor)
