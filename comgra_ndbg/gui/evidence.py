"""What a diagnosis rule fired on, ready to draw: the event a chosen hypothesis or event row stands for,
its evidence, and the threshold the rule compared it with.

Written against the general fields of the analysis' results — an evidence ``series`` named
``node/kind/statistic`` (or a ratio ``a÷b``, or ``kpi/name``), its ``baseline`` (NaN for an absolute
rule) and the ``Diagnosis.thresholds`` the analysis ran with — never against a list of event families, so
new families are drawn without a change here. The threshold is found by the names the analysis gives its
parameters (see :func:`threshold_for`); when no parameter fits, the onset, baseline and evidence are drawn
without a threshold line.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from comgra_ndbg.analysis.events import Diagnosis, Event, Evidence, Hypothesis
from comgra_ndbg.gui.timelines import EvidenceMarks

__all__ = ["Focus", "evidence_marks", "focus_of", "threshold_for"]


@dataclass(frozen=True)
class Focus:
    """The diagnosis item chosen (``h0``: the first hypothesis, ``e3``: the fourth event): the event whose
    evidence is shown (a hypothesis' root event) and the hypothesis, if one was chosen."""

    item: str
    event: Event
    hypothesis: Hypothesis | None = None

    @property
    def evidence(self) -> Evidence | None:
        return self.event.evidence[0] if self.event.evidence else None


def focus_of(diagnosis: Diagnosis | None, item: str) -> Focus | None:
    """The :class:`Focus` of ``item`` in ``diagnosis``; None when it names nothing there."""
    if diagnosis is None or len(item) < 2 or not item[1:].isdigit():
        return None
    index = int(item[1:])
    if item[0] == "h" and index < len(diagnosis.hypotheses):
        hypothesis = diagnosis.hypotheses[index]
        return Focus(item, hypothesis.chain.root, hypothesis)
    if item[0] == "e" and index < len(diagnosis.events):
        return Focus(item, diagnosis.events[index])
    return None


def _statistic(series: str) -> str:
    return series.split("÷", 1)[0].rsplit("/", 1)[-1]


GRADIENT_SIDES = ("vanishing_decades", "exploding_decades")  # set (not None) only for the gradient rule's sides


def threshold_for(event: Event, evidence: Evidence, thresholds: Mapping[str, float]
                  ) -> tuple[float, str] | None:
    """``(value, name)`` of the threshold the rule compared ``evidence`` with, in the units of the series:

    - a relative rule (finite baseline) fires when the series moves a number of decades away from its
      baseline: the parameter ``<x>_decades`` whose ``<x>`` begins the new state (``collapse_decades`` for
      ``collapsed``, ``imbalance_decades`` for ``imbalanced``, ``vanishing_decades`` for a gradient's
      ``vanishing`` when it was set), else ``enter_decades``; a loss against its
      median uses ``spike_factor`` or ``divergence_factor`` (a factor, not decades);
    - an absolute rule on a share (``*_fraction``) uses ``<state>_enter`` (``dead_enter``);
    - an update against its weight (``update/l2÷value/l2``) uses ``update_ratio_high``;
    - a gradient ratio present from the start uses ``start_gradient_decades``, below 1 when vanishing.

    >>> saturated = Event("activation_regime", "h", "value", "normal", "saturated", 10, 20, 0.9, 0.7)
    >>> threshold_for(saturated, Evidence("h/value/saturated_fraction", (10,), (0.9,)), {"saturated_enter": 0.5})
    (0.5, 'saturated_enter')
    >>> grew = Event("activation_regime", "h", "value", "normal", "exploding", 60, 70, 1.4, 0.9)
    >>> threshold_for(grew, Evidence("h/value/rms", (60, 61), (30.0, 40.0), 2.0), {"enter_decades": 1.0})
    (20.0, 'enter_decades')
    """
    statistic = _statistic(evidence.series)
    finite_values = [v for v in evidence.values if np.isfinite(v)]
    if statistic.endswith("_fraction") and f"{event.to_state}_enter" in thresholds:
        name = f"{event.to_state}_enter"
        return float(thresholds[name]), name
    if finite_values and not any(finite_values):
        return None  # a rule on values that are exactly zero has no level to draw
    if np.isfinite(evidence.baseline) and evidence.baseline != 0:
        upward = not finite_values or float(np.median(finite_values)) >= evidence.baseline
        if evidence.series.startswith("kpi/"):
            name = "divergence_factor" if event.to_state.startswith("diverg") else "spike_factor"
            if name in thresholds:
                return float(evidence.baseline * float(thresholds[name])), name
            return None
        name = next((key for key in sorted(thresholds) if key.endswith("_decades") and thresholds[key] is not None
                     and event.to_state.startswith(key[:-len("_decades")])
                     and (key not in GRADIENT_SIDES or event.family == "gradient_health")), "enter_decades")
        if name not in thresholds:
            return None
        factor = 10 ** float(thresholds[name])
        return float(evidence.baseline * (factor if upward else 1 / factor)), name
    if "update/l2÷value/l2" in evidence.series and "update_ratio_high" in thresholds:
        return float(thresholds["update_ratio_high"]), "update_ratio_high"
    if "÷" in evidence.series and "/grad/" in evidence.series and "start_gradient_decades" in thresholds:
        decades = float(thresholds["start_gradient_decades"])
        return float(10 ** (-decades if event.to_state == "vanishing" else decades)), "start_gradient_decades"
    return None


def evidence_marks(event: Event, evidence: Evidence, thresholds: Mapping[str, float]) -> EvidenceMarks:
    """The marks of ``evidence`` on a plot of its series (see :class:`~comgra_ndbg.gui.timelines.EvidenceMarks`)."""
    found = threshold_for(event, evidence, thresholds)
    return EvidenceMarks(int(event.onset), int(event.end), tuple(int(s) for s in evidence.steps),
                         tuple(float(v) for v in evidence.values), float(evidence.baseline),
                         None if found is None else found[0], "" if found is None else found[1])
