"""Breakpoint conditions: when a ``NeuralDbg.break_at`` breakpoint fires, checked on one tensor.

A condition is one of

- ``"always"``: every time;
- ``"nonfinite"``: the tensor holds a NaN or ±Inf element (the same as ``"nonfinite > 0"``);
- ``"<statistic> <comparison> <number>"``, e.g. ``"abs_max > 1e3"``, ``"dead_fraction >= 0.9"``,
  ``"std < 1e-6"``: the statistic is any summary statistic the recording holds
  (``comgra_ndbg.stats.statistics.STATISTICS``: ``abs_max``, ``abs_mean``, ``mean``, ``std``, ``min``, ``max``,
  ``l2``, ``rms``, ``nonfinite``, ``nan``, ``inf``, ``zero_fraction``, ``dead_fraction``, …), the comparison
  one of ``< <= > >= == !=``, the number a float literal (``1e3``, ``-0.5``, ``inf``);
- a function of the tensor returning true or false (``lambda t: t.abs().max() > 10``).

A statistic is computed by the recorder's own ``summarize`` and ``derive`` (one formula for both), over
the finite elements; a statistic the tensor has no value for (``mean`` of an all-NaN tensor) is NaN, and
NaN compares false. Checking a statistic costs one summary pass over the tensor and one host copy.

>>> condition = parse_condition("abs_max > 1e3")
>>> condition.check(torch.tensor([1.0, -2000.0]))
'abs_max 2e+03 > 1000'
>>> condition.check(torch.ones(3)) is None
True
>>> parse_condition("nonfinite").check(torch.tensor([0.0, float("nan")]))
'nonfinite 1 > 0'
"""
from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.stats.reducer import summarize
from comgra_ndbg.stats.statistics import STATISTICS, derive_one

__all__ = ["Condition", "parse_condition"]

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt}
_PATTERN = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|==|!=|<|>)\s*(\S+)\s*$")
_GRAMMAR = ("a condition is 'always', 'nonfinite', '<statistic> <comparison> <number>' (e.g. 'abs_max > 1e3'; "
            "comparisons < <= > >= == !=) or a function of the tensor returning True or False")


@dataclass(frozen=True)
class Condition:
    """A parsed condition (see the module docstring): ``always``, a statistic compared with ``threshold``,
    or ``fn``. ``text`` is how it was written."""

    text: str
    always: bool = False
    statistic: str | None = None
    comparison: str | None = None
    threshold: float = 0.0
    fn: Callable[[torch.Tensor], Any] | None = None

    def check(self, tensor: torch.Tensor) -> str | None:
        """Why the condition holds for ``tensor`` (e.g. ``"abs_max 2e+03 > 1000"``), or None when it does not.
        An exception in a user's function propagates: it is the user's code."""
        if self.always:
            return "always"
        if self.fn is not None:
            return f"{self.text} is true" if bool(self.fn(tensor)) else None
        value = statistic_of(tensor, self.statistic)
        if _OPERATORS[self.comparison](value, self.threshold):
            return f"{self.statistic} {value:.3g} {self.comparison} {self.threshold:g}"
        return None


def statistic_of(tensor: torch.Tensor, statistic: str) -> float:
    """One summary statistic of ``tensor``, as the recording would hold it (a batch: its first axis).

    >>> statistic_of(torch.tensor([[3.0, -4.0]]), "l2")
    5.0
    """
    with torch.no_grad():
        row = summarize(tensor.detach(), batched=tensor.dim() >= 2)
    return float(derive_one(row[None], statistic)[0])


def parse_condition(when: str | Callable[[torch.Tensor], Any]) -> Condition:
    """The :class:`Condition` ``when`` describes; an :class:`InvalidArgumentError` naming the grammar and the
    closest statistic names when it describes none.

    >>> parse_condition("dead_fraction >= 0.9").statistic
    'dead_fraction'
    >>> try:
    ...     parse_condition("abs_maxx > 1")
    ... except InvalidArgumentError as error:
    ...     print(str(error)[:80])
    unknown statistic 'abs_maxx' in condition 'abs_maxx > 1'; did you mean 'abs_max'
    """
    if callable(when):
        return Condition(getattr(when, "__name__", "condition"), fn=when)
    if not isinstance(when, str):
        raise InvalidArgumentError(f"when= takes a str or a function of the tensor, got {type(when).__name__}; "
                                   f"{_GRAMMAR}")
    text = when.strip()
    if text == "always":
        return Condition(text, always=True)
    if text == "nonfinite":
        return Condition(text, statistic="nonfinite", comparison=">", threshold=0.0)
    match = _PATTERN.match(text)
    if match is None:
        raise InvalidArgumentError(f"cannot read condition {when!r}: {_GRAMMAR}")
    statistic, comparison, number = match.groups()
    if statistic not in STATISTICS:
        close = difflib.get_close_matches(statistic, list(STATISTICS), n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise InvalidArgumentError(f"unknown statistic {statistic!r} in condition {when!r}; {hint}statistics are "
                                   f"{sorted(STATISTICS)}")
    try:
        threshold = float(number)
    except ValueError:
        raise InvalidArgumentError(f"condition {when!r} compares with {number!r}, which is not a number; write a "
                                   f"float literal such as 1e3, -0.5 or inf") from None
    return Condition(text, statistic=statistic, comparison=comparison, threshold=threshold)
