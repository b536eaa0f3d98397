"""Recording policies: pure decision objects that say, per step, whether to take summaries or snapshots.

The recorder holds one policy for summaries and one for snapshots. At the start of a step it asks
``could_record(step)`` or ``decide(step, step_type)`` (``step_type=None`` while the type is not known
yet); at the end of the step it calls ``commit(step, step_type, recorded)`` once, and stateful rules
update there. ``decide`` and ``could_record`` run on every training step and cost a few attribute checks.

Rules: :class:`EveryK`, :class:`FirstN`, :class:`StepList`, :class:`Always`, :class:`Never` (step only),
:class:`PerTypeBackoff` (per step type, stateful), :class:`Predicate` (a user function), combined with
:class:`AnyOf` / ``|`` and :class:`AllOf` / ``&``. :func:`as_policy` turns the recorder's shorthand
arguments (``summary_every=1``, ``snapshot_every=[0, 100]``) into policies.

>>> p = as_policy(100) | FirstN(3)
>>> [step for step in range(250) if p.decide(step, "train").record]
[0, 1, 2, 100, 200]
"""
from __future__ import annotations

import math
import numbers
import warnings
from typing import Callable, Iterable, Mapping, Optional, Union

from comgra_ndbg.recorder.policy_rules import (
    UNDECIDED,
    AllOf,
    Always,
    AnyOf,
    Decision,
    EveryK,
    FirstN,
    Never,
    Policy,
    PolicyError,
    StepList,
    check_int,
)

__all__ = [
    "Decision",
    "PolicyError",
    "Policy",
    "PolicySpec",
    "Always",
    "Never",
    "EveryK",
    "FirstN",
    "StepList",
    "PerTypeBackoff",
    "Predicate",
    "AnyOf",
    "AllOf",
    "as_policy",
]

PolicySpec = Union[Policy, bool, int, None, Iterable[int], Callable[[int, Optional[str]], bool]]


class _Clock:
    """One step type's backoff state: the gap that led to ``next_step`` and the two possible decisions."""

    __slots__ = ("next_step", "gap", "due", "wait")

    def __init__(self, step_type: str, recorded_at: int, gap: float) -> None:
        due_at = recorded_at + gap
        self.next_step = math.ceil(due_at) if math.isfinite(due_at) else math.inf
        self.gap = gap
        self.due = Decision(True, f"step type {step_type!r} backoff (due at {self.next_step})", "per_type")
        self.wait = Decision(False, f"step type {step_type!r} backoff (next at {self.next_step})", "per_type")


class PerTypeBackoff(Policy):
    """Records each step type on its own clock, so a rare type is recorded as regularly as a frequent one.

    The rule (Comgra's ``DecisionMakerForRecordingsFrequencyPerType``): each type ``t`` keeps the step
    ``s`` it was last recorded at and a gap ``g``.

    - A type seen for the first time is recorded at once (``first=True``); its clock starts with
      ``s = step`` and ``g = min_gap * factor``. With ``first=False`` its first occurrence is not recorded
      but starts the clock in the same way, as if it had been.
    - A step of type ``t`` is recorded iff ``step >= ceil(s + g)``, i.e. at the first step of that type at
      or after the due step. Recording it sets ``s = step`` and ``g = g * factor``.

    So the n-th gap of a type is ``min_gap * factor**n``: gap 10, factor 2 on a type that occurs every
    step records 0, 20, 60, 140, 300, 620, ...; factor 1 keeps recordings of each type ``min_gap`` steps
    apart. Unlike Comgra, which moves the clock inside the query, the clock moves in :meth:`commit`, and
    only when the step was recorded *and* this rule was due: a step that ``AllOf`` vetoed stays due, and
    a step that an ``AnyOf`` sibling recorded does not restart the clock. A commit of a step that is not
    due (e.g. an older step committed late) leaves the clock unchanged. Types are compared with ``==``.

    With ``step_type=None`` (type not known yet) the answer is ``record=True`` whenever some type could be
    recorded: always with ``first=True`` (an unseen type may come), else when a known type is due.

    >>> p = PerTypeBackoff(10, factor=2)
    >>> recorded = []
    >>> for step in range(400):
    ...     decision = p.decide(step, "train")
    ...     p.commit(step, "train", decision.record)
    ...     if decision.record:
    ...         recorded.append(step)
    >>> recorded
    [0, 20, 60, 140, 300]
    >>> p.decide(301, "train")
    Decision(record=False, reason="step type 'train' backoff (next at 620)", rule='per_type')
    >>> p.decide(301, "eval")
    Decision(record=True, reason="step type 'eval' first seen", rule='per_type')
    """

    __slots__ = ("min_gap", "factor", "first", "_clocks", "_earliest", "_undecided_yes", "_undecided_no")

    def __init__(self, min_gap: int, factor: float = 1.0, first: bool = True) -> None:
        self.min_gap = check_int(
            min_gap, "PerTypeBackoff(min_gap)", 1,
            "pass e.g. PerTypeBackoff(10) to record each step type at most every 10 steps",
        )
        real = isinstance(factor, numbers.Real) and not isinstance(factor, bool)
        if not real or not math.isfinite(factor) or factor < 1:
            raise PolicyError(
                f"PerTypeBackoff(factor=...) must be a finite number >= 1, got {factor!r}; "
                f"1 keeps the gap fixed, 2 doubles it after every recording of a type"
            )
        if not isinstance(first, bool):
            raise PolicyError(
                f"PerTypeBackoff(first=...) must be True or False, got {first!r} ({type(first).__name__})"
            )
        self.factor = float(factor)
        self.first = first
        self._clocks: dict[str, _Clock] = {}
        self._earliest: float = 0 if first else math.inf
        self._undecided_yes = Decision(True, UNDECIDED, "per_type")
        self._undecided_no = Decision(False, "undecided: no step type is due yet", "per_type")

    def decide(self, step: int, step_type: str | None) -> Decision:
        if step_type is None:
            return self._undecided_yes if step >= self._earliest else self._undecided_no
        clock = self._clocks.get(step_type)
        if clock is None:
            if self.first:
                return Decision(True, f"step type {step_type!r} first seen", "per_type")
            reason = f"step type {step_type!r} first seen, starts its clock (first=False)"
            return Decision(False, reason, "per_type")
        return clock.due if step >= clock.next_step else clock.wait

    def could_record(self, step: int) -> bool:
        return step >= self._earliest

    def commit(self, step: int, step_type: str, recorded: bool) -> None:
        if step_type is None:
            raise PolicyError(
                f"PerTypeBackoff.commit(step={step}) needs the step's final type, got None; "
                f"pass the type the step ended with (a default such as 'train' when the user gave none)"
            )
        clock = self._clocks.get(step_type)
        if clock is None:
            if self.first and not recorded:
                return
            self._clocks[step_type] = _Clock(step_type, step, self.min_gap * self.factor)
        elif recorded and step >= clock.next_step:
            self._clocks[step_type] = _Clock(step_type, step, clock.gap * self.factor)
        else:
            return
        if not self.first:
            self._earliest = min(c.next_step for c in self._clocks.values())
            reason = f"undecided: no step type is due (next at {self._earliest})"
            self._undecided_no = Decision(False, reason, "per_type")

    def __repr__(self) -> str:
        factor = int(self.factor) if self.factor.is_integer() else self.factor
        options = "" if factor == 1 else f", factor={factor!r}"
        options += "" if self.first else ", first=False"
        return f"PerTypeBackoff({self.min_gap}{options})"


def _function_name(fn: Callable[..., object]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


class Predicate(Policy):
    """Records a step when ``fn(step, step_type)`` is true; a failing ``fn`` never stops training.

    If ``fn`` raises, the step is not recorded by this rule, and a ``RuntimeWarning`` names the exception
    and the step, once per distinct exception type. While the step type is not known (``step_type=None``)
    ``fn`` is not called and the answer is ``record=True`` ("undecided"); combine it with a step rule,
    e.g. ``EveryK(10) & Predicate(...)``, so that ``could_record`` stays selective.

    >>> p = Predicate(lambda step, step_type: step_type == "long" and step % 5 == 0, "long steps, every 5th")
    >>> p.decide(10, "long")
    Decision(record=True, reason="predicate 'long steps, every 5th'", rule='predicate')
    >>> p.decide(10, "short").record, p.decide(10, None).record
    (False, True)
    """

    __slots__ = ("fn", "description", "_yes", "_no", "_undecided", "_failures")

    def __init__(self, fn: Callable[[int, str], bool], description: str | None = None) -> None:
        if isinstance(fn, Policy) or not callable(fn):
            raise PolicyError(
                f"Predicate needs a function (step, step_type) -> bool, got {fn!r} ({type(fn).__name__}); "
                f"pass e.g. Predicate(lambda step, step_type: step_type == 'long', 'long steps')"
            )
        if description is None:
            description = _function_name(fn)
        if not isinstance(description, str):
            raise PolicyError(
                f"Predicate(description=...) must be a str, got {description!r} "
                f"({type(description).__name__})"
            )
        self.fn = fn
        self.description = description
        self._yes = Decision(True, f"predicate {description!r}", "predicate")
        self._no = Decision(False, f"predicate {description!r} is false", "predicate")
        self._undecided = Decision(True, UNDECIDED, "predicate")
        self._failures: dict[type, Decision] = {}

    def decide(self, step: int, step_type: str | None) -> Decision:
        if step_type is None:
            return self._undecided
        try:
            if self.fn(step, step_type):
                return self._yes
            return self._no
        except Exception as exc:  # noqa: BLE001 - a user function must not crash the training run
            return self._failed(step, step_type, exc)

    def could_record(self, step: int) -> bool:
        return True

    def _failed(self, step: int, step_type: str, exc: Exception) -> Decision:
        kind = type(exc)
        decision = self._failures.get(kind)
        if decision is None:
            decision = Decision(False, f"predicate {self.description!r} raised {kind.__name__}", "predicate")
            self._failures[kind] = decision
            warnings.warn(
                f"recording policy {self!r} raised {kind.__name__}: {exc} at step {step} "
                f"(step type {step_type!r}); this step is not recorded by it and training goes on. "
                f"Later {kind.__name__} errors of this predicate are not reported.",
                RuntimeWarning,
                stacklevel=2,
            )
        return decision

    def __repr__(self) -> str:
        name = _function_name(self.fn)
        if name == self.description:
            return f"Predicate({name})"
        return f"Predicate({name}, {self.description!r})"


_ACCEPTED = (
    "pass an int k >= 1 (every k steps), 0, None or False (never), True (every step), "
    "a list, set or range of step numbers, a function (step, step_type) -> bool, "
    "or a Policy such as EveryK(10) | FirstN(5)"
)


def as_policy(spec: PolicySpec, *, name: str = "policy") -> Policy:
    """Turn the recorder's shorthand into a :class:`Policy`; ``name`` is the argument named in errors.

    ``k`` (int >= 1) is ``EveryK(k)``; ``0``, ``None`` and ``False`` are ``Never()``; ``True`` is
    ``Always()``; a list, set, tuple or range of ints >= 0 is ``StepList``; a function ``(step,
    step_type) -> bool`` is ``Predicate``; a ``Policy`` is returned as it is. Anything else (a negative
    int, a float, a string, a non-int step) raises :class:`PolicyError` saying what to pass instead.

    >>> as_policy(10), as_policy(0), as_policy(True), as_policy(range(0, 30, 10))
    (EveryK(10), Never(), Always(), StepList([0, 10, 20]))
    >>> try:
    ...     as_policy("10", name="snapshot_every")
    ... except PolicyError as exc:
    ...     print(str(exc)[:61])
    snapshot_every='10' is a str; did you mean snapshot_every=10?
    """
    if isinstance(spec, Policy):
        return spec
    if spec is None or spec is False:
        return Never()
    if spec is True:
        return Always()
    if isinstance(spec, numbers.Integral):
        if spec < 0:
            raise PolicyError(f"{name}={spec!r} is negative; {_ACCEPTED}")
        return EveryK(int(spec)) if spec else Never()
    if isinstance(spec, type):
        raise PolicyError(
            f"{name}={spec.__name__} is a class, not a policy; "
            f"pass an instance, e.g. EveryK(10), or {_ACCEPTED}"
        )
    if isinstance(spec, (str, bytes)):
        text = spec.decode(errors="replace") if isinstance(spec, bytes) else spec
        hint = f"did you mean {name}={int(text)}? " if text.strip().isdigit() else ""
        raise PolicyError(f"{name}={spec!r} is a {type(spec).__name__}; {hint}{_ACCEPTED}")
    if isinstance(spec, numbers.Real):
        whole = math.isfinite(spec) and float(spec).is_integer() and spec > 0
        hint = f"did you mean {name}={int(spec)}? " if whole else ""
        raise PolicyError(f"{name}={spec!r} is a {type(spec).__name__}, not an int; {hint}{_ACCEPTED}")
    if callable(spec):
        return Predicate(spec)
    if isinstance(spec, Mapping) or not isinstance(spec, Iterable):
        raise PolicyError(f"{name}={spec!r} is a {type(spec).__name__}; {_ACCEPTED}")
    if isinstance(spec, range):  # kept as a range: a list of every step of a long run costs seconds and GiB
        if spec and min(spec[0], spec[-1]) < 0:
            raise PolicyError(f"{name}={spec!r} holds negative steps; a step list holds ints >= 0, e.g. "
                              f"{name}=range(0, 1000, 50)")
        return StepList(spec)
    steps = list(spec)
    for step in steps:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise PolicyError(
                f"{name} holds {step!r} ({type(step).__name__}), which is not a step number; "
                f"a step list holds ints >= 0, e.g. {name}=[0, 10, 500] or {name}=range(0, 1000, 50)"
            )
    return StepList(steps)
