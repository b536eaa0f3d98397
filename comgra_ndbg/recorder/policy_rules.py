"""The decision protocol and the stateless recording rules.

:class:`Decision` and :class:`Policy` are the protocol the recorder speaks; :class:`EveryK`,
:class:`FirstN`, :class:`StepList`, :class:`Always` and :class:`Never` depend on the step number only;
:class:`AnyOf` and :class:`AllOf` combine policies (also written ``p | q`` and ``p & q``). The stateful
rules (:class:`~comgra_ndbg.recorder.policy.PerTypeBackoff`, ``Predicate``) and the ``as_policy`` parser
live in :mod:`comgra_ndbg.recorder.policy`, which re-exports everything here; import from there.

Every rule builds its :class:`Decision` objects once, in its constructor, so ``decide`` on the hot path
is a comparison or two and returns a shared object.
"""
from __future__ import annotations

import abc
import dataclasses
import numbers
from typing import Iterable

from comgra_ndbg.errors import ComgraError

__all__ = [
    "Decision",
    "PolicyError",
    "Policy",
    "Always",
    "Never",
    "EveryK",
    "FirstN",
    "StepList",
    "AnyOf",
    "AllOf",
]

UNDECIDED = "undecided: step type not known yet"


class PolicyError(ComgraError, ValueError):
    """A recording policy was built from an argument it cannot use (a negative k, a non-int step, ...)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """Whether a step is recorded, why (for people, stable wording) and which rule decided (a short tag).

    >>> Decision(True, "every 10 steps", "every")
    Decision(record=True, reason='every 10 steps', rule='every')
    """

    record: bool
    reason: str
    rule: str


class Policy(abc.ABC):
    """Decides per step whether the recorder records it; one policy for summaries, one for snapshots.

    The recorder calls :meth:`could_record` or :meth:`decide` at the start of a step, and :meth:`commit`
    once at its end. A subclass must implement :meth:`decide` and ``__repr__``; stateful ones also
    :meth:`commit`. A stateful policy object belongs to one recorder slot: do not share one instance
    between the summary and the snapshot policy.

    >>> p = EveryK(10) | FirstN(3)
    >>> p
    EveryK(10) | FirstN(3)
    >>> [step for step in range(25) if p.could_record(step)]
    [0, 1, 2, 10, 20]
    >>> p.decide(20, "train")
    Decision(record=True, reason='every 10 steps', rule='every')
    """

    __slots__ = ()

    @abc.abstractmethod
    def decide(self, step: int, step_type: str | None) -> Decision:
        """Decide whether ``step`` of type ``step_type`` is recorded; a pure query that changes no state.

        ``step_type=None`` means the type is not known yet (it is given at the end of the step). Then
        ``record`` is True if the step could still be recorded for some type; rules that depend on the
        type say so with a reason that starts with ``"undecided"``.
        """

    def could_record(self, step: int) -> bool:
        """Whether any step type could be recorded at ``step`` (cheap; same as ``decide(step, None)``)."""
        return self.decide(step, None).record

    def commit(self, step: int, step_type: str, recorded: bool) -> None:
        """Report the end of ``step``: its final type and whether it was recorded. Stateless rules ignore it.

        Steps may be committed out of order or not at all.
        """

    @abc.abstractmethod
    def __repr__(self) -> str:
        """A readable expression that builds an equivalent policy, e.g. ``EveryK(10) | FirstN(5)``."""

    def __or__(self, other: Policy) -> Policy:
        if not isinstance(other, Policy):
            return NotImplemented
        return AnyOf(self, other)

    def __and__(self, other: Policy) -> Policy:
        if not isinstance(other, Policy):
            return NotImplemented
        return AllOf(self, other)


def check_int(value: object, what: str, minimum: int, hint: str) -> int:
    """Return ``value`` as an int if it is an integer (not a bool) >= ``minimum``, else raise PolicyError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise PolicyError(
            f"{what} must be an int >= {minimum}, got {value!r} ({type(value).__name__}); {hint}"
        )
    if value < minimum:
        raise PolicyError(f"{what} must be an int >= {minimum}, got {value!r}; {hint}")
    return int(value)


def _plural_steps(n: int) -> str:
    return "step" if n == 1 else f"{n} steps"


class Always(Policy):
    """Records every step.

    >>> Always().decide(7, "train")
    Decision(record=True, reason='always', rule='always')
    """

    __slots__ = ("_yes",)

    def __init__(self) -> None:
        self._yes = Decision(True, "always", "always")

    def decide(self, step: int, step_type: str | None) -> Decision:
        return self._yes

    def could_record(self, step: int) -> bool:
        return True

    def __repr__(self) -> str:
        return "Always()"


class Never(Policy):
    """Records nothing.

    >>> Never().decide(0, "train")
    Decision(record=False, reason='never', rule='never')
    """

    __slots__ = ("_no",)

    def __init__(self) -> None:
        self._no = Decision(False, "never", "never")

    def decide(self, step: int, step_type: str | None) -> Decision:
        return self._no

    def could_record(self, step: int) -> bool:
        return False

    def __repr__(self) -> str:
        return "Never()"


class EveryK(Policy):
    """Records every k-th step from ``offset`` on: ``step >= offset and (step - offset) % k == 0``.

    ``offset`` is the first recorded step; for ``offset < k`` this is the same as ``step % k == offset``.

    >>> [step for step in range(40) if EveryK(10).could_record(step)]
    [0, 10, 20, 30]
    >>> [step for step in range(40) if EveryK(10, offset=25).could_record(step)]
    [25, 35]
    >>> EveryK(10, offset=5).decide(15, None)
    Decision(record=True, reason='every 10 steps from step 5', rule='every')
    """

    __slots__ = ("k", "offset", "_yes", "_no")

    def __init__(self, k: int, offset: int = 0) -> None:
        self.k = check_int(
            k, "EveryK(k)", 1, "pass e.g. EveryK(10) to record every 10th step, or Never() to record nothing"
        )
        self.offset = check_int(
            offset, "EveryK(offset=...)", 0, "offset is the first recorded step, e.g. EveryK(10, offset=5)"
        )
        reason = f"every {_plural_steps(self.k)}" + (f" from step {self.offset}" if self.offset else "")
        self._yes = Decision(True, reason, "every")
        self._no = Decision(False, f"{reason}: not this step", "every")

    def decide(self, step: int, step_type: str | None) -> Decision:
        if step >= self.offset and (step - self.offset) % self.k == 0:
            return self._yes
        return self._no

    def could_record(self, step: int) -> bool:
        return step >= self.offset and (step - self.offset) % self.k == 0

    def __repr__(self) -> str:
        return f"EveryK({self.k})" if not self.offset else f"EveryK({self.k}, offset={self.offset})"


class FirstN(Policy):
    """Records the first ``n`` steps, ``0 .. n - 1``.

    >>> FirstN(5).decide(4, "train")
    Decision(record=True, reason='first 5 steps', rule='first')
    >>> FirstN(5).decide(5, "train")
    Decision(record=False, reason='after the first 5 steps', rule='first')
    """

    __slots__ = ("n", "_yes", "_no")

    def __init__(self, n: int) -> None:
        self.n = check_int(n, "FirstN(n)", 0, "pass e.g. FirstN(5) to record steps 0 to 4")
        self._yes = Decision(True, f"first {_plural_steps(self.n)}", "first")
        self._no = Decision(False, f"after the first {_plural_steps(self.n)}", "first")

    def decide(self, step: int, step_type: str | None) -> Decision:
        return self._yes if step < self.n else self._no

    def could_record(self, step: int) -> bool:
        return step < self.n

    def __repr__(self) -> str:
        return f"FirstN({self.n})"


class StepList(Policy):
    """Records an explicit collection of steps (held as a frozenset; a ``range`` is kept as the range, which
    answers membership at once however many steps it spans).

    >>> p = StepList([0, 5, 100])
    >>> p.decide(5, "train"), p.could_record(6)
    (Decision(record=True, reason='step list', rule='steps'), False)
    >>> StepList(range(0, 50, 10))
    StepList([0, 10, 20, 30, 40])
    >>> StepList(range(0, 10**12, 200)).could_record(10**11)
    True
    """

    __slots__ = ("steps", "_yes", "_no")

    def __init__(self, steps: Iterable[int]) -> None:
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
            raise PolicyError(
                f"StepList needs a collection of step numbers, got {steps!r} ({type(steps).__name__}); "
                f"pass e.g. StepList([0, 10, 500])"
            )
        if isinstance(steps, range):
            steps = steps[::-1] if steps.step < 0 else steps
            if steps and steps[0] < 0:
                raise PolicyError(f"StepList's steps are step numbers >= 0, got {steps!r}; pass e.g. "
                                  f"range(0, 1000, 50)")
            self.steps: frozenset[int] | range = steps
        else:
            self.steps = frozenset(
                check_int(step, "every step of StepList", 0, "pass step numbers, e.g. StepList([0, 10, 500])")
                for step in steps
            )
        self._yes = Decision(True, "step list", "steps")
        self._no = Decision(False, "not in step list", "steps")

    def decide(self, step: int, step_type: str | None) -> Decision:
        return self._yes if step in self.steps else self._no

    def could_record(self, step: int) -> bool:
        return step in self.steps

    def __repr__(self) -> str:
        if isinstance(self.steps, range) and len(self.steps) > 10:
            return f"StepList({self.steps!r})"
        ordered = sorted(self.steps)
        if len(ordered) <= 10:
            return f"StepList({ordered})"
        return f"StepList(<{len(ordered)} steps: {', '.join(map(str, ordered[:5]))}, ..., {ordered[-1]}>)"


def _children(kind: type, policies: tuple[Policy, ...]) -> tuple[Policy, ...]:
    if not policies:
        raise PolicyError(
            f"{kind.__name__}() needs at least one policy, e.g. {kind.__name__}(EveryK(10), FirstN(5))"
        )
    flat: list[Policy] = []
    for policy in policies:
        if not isinstance(policy, Policy):
            raise PolicyError(
                f"{kind.__name__} combines Policy objects, got {policy!r} ({type(policy).__name__}); "
                f"convert it first with as_policy(...), e.g. as_policy(10) for EveryK(10)"
            )
        flat.extend(policy.policies if type(policy) is kind else (policy,))
    return tuple(flat)


class AnyOf(Policy):
    """Records a step if any of its policies does; the decision is the first one that fired (``p | q``).

    :meth:`commit` goes to every child, so each keeps the state it would have on its own: a step that
    another child recorded does not count as "recorded" for a backoff child that was not due.

    >>> p = AnyOf(FirstN(2), StepList([7]))
    >>> [step for step in range(10) if p.decide(step, "train").record]
    [0, 1, 7]
    >>> p.decide(3, "train")
    Decision(record=False, reason='none of: FirstN(2) | StepList([7])', rule='any')
    """

    __slots__ = ("policies", "_no")

    def __init__(self, *policies: Policy) -> None:
        self.policies = _children(AnyOf, policies)
        self._no = Decision(False, f"none of: {self!r}", "any")

    def decide(self, step: int, step_type: str | None) -> Decision:
        for policy in self.policies:
            decision = policy.decide(step, step_type)
            if decision.record:
                return decision
        return self._no

    def could_record(self, step: int) -> bool:
        for policy in self.policies:
            if policy.could_record(step):
                return True
        return False

    def commit(self, step: int, step_type: str, recorded: bool) -> None:
        for policy in self.policies:
            policy.commit(step, step_type, recorded)

    def __repr__(self) -> str:
        if len(self.policies) == 1:
            return f"AnyOf({self.policies[0]!r})"
        return " | ".join(map(repr, self.policies))


class AllOf(Policy):
    """Records a step only if all its policies do (``p & q``); a refusal names the first child that refused.

    A backoff child that is due but vetoed by a sibling stays due, so ``PerTypeBackoff(10) & EveryK(3)``
    records each type at the first multiple of 3 at least 10 steps after its last recording.

    >>> p = AllOf(EveryK(2), FirstN(5))
    >>> [step for step in range(10) if p.could_record(step)]
    [0, 2, 4]
    >>> p.decide(4, "train")
    Decision(record=True, reason='every 2 steps and first 5 steps', rule='all')
    >>> p.decide(3, "train")
    Decision(record=False, reason='every 2 steps: not this step', rule='every')
    """

    __slots__ = ("policies",)

    def __init__(self, *policies: Policy) -> None:
        self.policies = _children(AllOf, policies)

    def decide(self, step: int, step_type: str | None) -> Decision:
        reasons = []
        for policy in self.policies:
            decision = policy.decide(step, step_type)
            if not decision.record:
                return decision
            reasons.append(decision.reason)
        return Decision(True, " and ".join(reasons), "all")

    def could_record(self, step: int) -> bool:
        for policy in self.policies:
            if not policy.could_record(step):
                return False
        return True

    def commit(self, step: int, step_type: str, recorded: bool) -> None:
        for policy in self.policies:
            policy.commit(step, step_type, recorded)

    def __repr__(self) -> str:
        if len(self.policies) == 1:
            return f"AllOf({self.policies[0]!r})"
        return " & ".join(
            f"({p!r})" if isinstance(p, AnyOf) and len(p.policies) > 1 else repr(p) for p in self.policies
        )
