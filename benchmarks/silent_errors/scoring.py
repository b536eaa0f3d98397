"""Scoring of one case: was the bug detected near its first effect, was its cause named, did the fixed
variant raise a false alarm. Pure: diagnoses in, a frozen :class:`Score` out.

>>> from comgra_ndbg.analysis.events import Diagnosis
>>> healthy = Diagnosis(trial="fixed", num_steps=60, last_step=59, events=(), coupled=(), hypotheses=())
>>> s = score("case", "project #1", ("stale_gradients",), [healthy], 1, [healthy])
>>> (s.detected, s.cause_named, s.false_alarm)
(False, False, False)
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from comgra_ndbg.analysis.events import Diagnosis, Hypothesis

__all__ = ["Score", "score", "WINDOW"]

WINDOW = 2
"""A hypothesis or event counts as detecting the bug when its onset is within this many steps of the first
effect."""


@dataclass(frozen=True)
class Score:
    """One case's result. ``found`` describes the buggy run's first hypothesis in the window (or its top
    hypothesis, marked "late"/"early", or the first event in the window when no hypothesis is), ``alarm``
    the fixed run's top hypothesis; both ``"-"`` when there is none."""

    case: str
    origin: str
    first_effect: int | None
    detected: bool
    cause_named: bool
    false_alarm: bool
    found: str
    alarm: str
    expected: tuple[str, ...]


def _near(onset: int, first_effect: int | None, window: int) -> bool:
    return first_effect is not None and abs(onset - first_effect) <= window


def _describe(h: Hypothesis) -> str:
    return f"{h.type} ({h.origin}{': ' + h.node if h.node else ''}) @{h.onset}"


def score(case: str, origin: str, expected: Sequence[str], buggy: Sequence[Diagnosis], first_effect: int | None,
          fixed: Sequence[Diagnosis], *, window: int = WINDOW) -> Score:
    """Score a case from the diagnoses of its buggy trials (one per rank) and its fixed trials.

    Detected: a hypothesis or an event of a buggy trial starts within ``window`` steps of ``first_effect``.
    Cause named: such a hypothesis has one of the ``expected`` types. False alarm: a fixed trial has any
    hypothesis.
    """
    hypotheses = [h for d in buggy for h in d.hypotheses]
    near = [h for h in hypotheses if _near(h.onset, first_effect, window)]
    events = [e for d in buggy for e in d.events if _near(e.onset, first_effect, window)]
    if near:
        found = _describe(near[0])
    elif hypotheses:
        found = _describe(hypotheses[0]) + (" late" if first_effect is None or hypotheses[0].onset > first_effect
                                            else " early")
    elif events:
        found = f"event {events[0].label} @{events[0].onset}"
    else:
        found = "-"
    alarms = [h for d in fixed for h in d.hypotheses]
    return Score(case=case, origin=origin, first_effect=first_effect, detected=bool(near or events),
                 cause_named=any(h.type in expected for h in near), false_alarm=bool(alarms),
                 found=found, alarm=_describe(alarms[0]) if alarms else "-", expected=tuple(expected))
