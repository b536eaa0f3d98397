"""The post-mortem reasoner: ranked hypotheses over origins, one plain sentence each.

Roots are events that no earlier event explains (no causal link into them). Faults present from the first
steps are explained first (origin: the architecture or initialisation); then mid-run roots in step order
(:func:`~comgra_ndbg.analysis.nonfinite.phase_key`). Each root is read as a failure type and an origin:

| root event | type | origin |
|---|---|---|
| non-finite input | nonfinite_data | data |
| non-finite loss (its inputs finite) | nonfinite_loss | loss |
| non-finite elsewhere | exploding | node |
| value scale jump / drop (+ dead / saturated units in it or right after) | exploding / vanishing (dead_units / saturation) | node |
| scale shift of the input | data_shift | data |
| dead / saturated units | dead_units / saturation | node |
| gradient ratio shift with no forward cause (backward only) | exploding / vanishing | node |
| update jumps in most parameters at once | optimizer_divergence (loss ≥ 100× or non-finite) / optimizer_instability | optimizer |
| one parameter's update jump (≥ ``isolated_update_decades``) | optimizer_instability | node |
| zero updates under non-zero gradients | update_stagnation | node |
| transient loss spike | loss_spike | data |
| loss divergence with no other root | optimizer_divergence | optimizer |

Confidence comes from :mod:`~comgra_ndbg.analysis.calibration`, on the features of :func:`features`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from comgra_ndbg.analysis.calibration import calibrated_confidence
from comgra_ndbg.analysis.causal import chain_from
from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import CausalChain, CausalLink, Event, Hypothesis
from comgra_ndbg.analysis.nonfinite import phase_key
from comgra_ndbg.analysis.optimizer_stability import OPTIMIZER
from comgra_ndbg.analysis.series import RunSeries

__all__ = ["rank_hypotheses", "interpret", "features", "sentence", "TYPE_TEXT", "ORIGINS"]

ORIGINS = ("node", "optimizer", "loss", "data", "architecture")
TYPE_TEXT = {
    "vanishing": "Vanishing signal",
    "exploding": "Exploding signal",
    "dead_units": "Dead units",
    "saturation": "Saturation",
    "optimizer_divergence": "Optimizer divergence",
    "optimizer_instability": "Optimizer instability",
    "nonfinite_loss": "A non-finite loss",
    "nonfinite_data": "Non-finite input data",
    "data_shift": "A shift of the input data",
    "loss_spike": "A transient loss spike",
    "update_stagnation": "Update stagnation",
}
_START_PRIORITY = ("activation_regime:dead", "activation_regime:saturated", "gradient_health:vanishing",
                   "gradient_health:exploding", "optimizer_stability:frozen", "optimizer_stability:unstable",
                   "nonfinite:non-finite")
MAX_HYPOTHESES = 5


@dataclass(frozen=True)
class Reading:
    """What a root event means: failure type, origin kind, the node to show, and the events that refined it."""

    type: str
    origin: str
    node: str
    refined_by: tuple[Event, ...] = ()


def interpret(root: Event, links: Sequence[CausalLink], series: RunSeries, events: Sequence[Event],
              thresholds: Thresholds = Thresholds()) -> Reading:
    """Read a root event as a failure type and an origin (see the module table)."""
    role = _role(series, root.node)
    if root.at_start:
        start_type = {"activation_regime:dead": "dead_units", "activation_regime:saturated": "saturation",
                      "gradient_health:vanishing": "vanishing", "gradient_health:exploding": "exploding",
                      "optimizer_stability:unstable": "optimizer_divergence",
                      "nonfinite:non-finite": "exploding"}
        if root.label == "optimizer_stability:frozen":
            return Reading("update_stagnation", "node", root.node)
        if root.node == OPTIMIZER:
            return Reading("optimizer_divergence", "optimizer", "")
        return Reading(start_type.get(root.label, root.to_state), "architecture", root.node)
    if root.family == "nonfinite":
        if role == "input":
            return Reading("nonfinite_data", "data", root.node)
        if role == "loss" or root.node == "loss":
            return Reading("nonfinite_loss", "loss", root.node)
        return Reading("exploding", "node", root.node)
    if root.family == "activation_regime":
        if role == "input":
            return Reading("data_shift", "data", root.node)
        if root.to_state in ("dead", "saturated"):
            return Reading("dead_units" if root.to_state == "dead" else "saturation", "node", root.node)
        regimes = [e for e in events if e.to_state in ("dead", "saturated") and e.family == root.family
                   and 0 <= e.onset - root.onset <= thresholds.same_time and _adjacent(series, root.node, e.node)]
        if regimes:
            regime = regimes[0]
            return Reading("dead_units" if regime.to_state == "dead" else "saturation", "node", root.node, (regime,))
        return Reading(root.to_state, "node", root.node)
    if root.family == "gradient_health":
        return Reading(root.to_state, "node", root.node)
    if root.to_state == "frozen":
        return Reading("update_stagnation", "node", root.node)
    if root.node == OPTIMIZER or root.to_state == "diverging":
        return Reading(_optimizer_type(root, events, series, thresholds), "optimizer", "")
    if root.to_state == "spike":
        return Reading("loss_spike", "data", _input_node(series))
    return Reading("optimizer_instability", "node", root.node)


def _optimizer_type(root: Event, events: Sequence[Event], series: RunSeries, t: Thresholds) -> str:
    if root.to_state == "diverging":
        return "optimizer_divergence"
    horizon = root.onset + t.max_lag
    for e in events:
        if root.onset <= e.onset <= horizon and (e.family == "nonfinite" or e.to_state == "diverging"):
            return "optimizer_divergence"
    loss = series.loss
    i = int(np.searchsorted(series.steps, root.onset))
    before = loss[max(0, i - t.window):i]
    after = loss[i:int(np.searchsorted(series.steps, horizon, side="right"))]
    if np.isfinite(before).any() and len(after):
        base = float(np.nanmedian(before))
        if base > 0 and (~np.isfinite(after) | (after >= t.divergence_factor * base)).any():
            return "optimizer_divergence"
    return "optimizer_instability"


def _role(series: RunSeries, name: str) -> str:
    for node in series.nodes:
        if node.name == name:
            return node.role
    return ""


def _input_node(series: RunSeries) -> str:
    return next((n.name for n in series.nodes if n.role == "input"), "")


def _adjacent(series: RunSeries, a: str, b: str) -> bool:
    if a == b:
        return True
    if series.graph is None:
        return False
    return any(e.source == a and e.target == b for e in series.graph.edges)


def features(root: Event, chain: CausalChain, rank: int, num_roots: int) -> tuple[float, ...]:
    """Calibration features: root strength, log(1 + chain links), root at start, rank, log(1 + other roots)."""
    return (root.strength, float(np.log1p(len(chain.links))), float(root.at_start), float(rank),
            float(np.log1p(max(num_roots - 1, 0))))


def sentence(reading: Reading, root: Event, chain: CausalChain, confidence: float) -> str:
    """One plain sentence, e.g. "Dead units originated in 'blocks.3.pre' at step 200, after its value rms
    rose 1.6 decades and 'blocks.3.out' went dead (confidence 0.93)."."""
    where = {"optimizer": "the optimizer", "loss": f"the loss ('{reading.node}')",
             "data": f"the input data ('{reading.node}')" if reading.node else "the input data",
             "architecture": f"the architecture or initialisation (first seen in '{reading.node}')"}.get(
        reading.origin, f"'{reading.node}'")
    onset = "from the first step" if root.at_start else f"at step {root.onset}"
    because = _describe(root)
    if reading.refined_by:
        regime = reading.refined_by[0]
        because += f" and '{regime.node}' went {regime.to_state}"
    effects = [link.effect for link in chain.links]
    tail = ""
    if effects:
        nodes = {e.node for e in effects}
        first = effects[0]
        tail = (f"; {len(effects)} later event{'s' if len(effects) > 1 else ''} in {len(nodes)} "
                f"node{'s' if len(nodes) > 1 else ''} follow{'s' if len(effects) == 1 else ''} from it "
                f"(first: {first.family.replace('_', ' ')} "
                f"{first.to_state} in '{first.node}' at step {first.onset})")
    return f"{TYPE_TEXT.get(reading.type, reading.type)} originated in {where} {onset}, {because}{tail} " \
           f"(confidence {confidence:.2f})."


def _describe(e: Event) -> str:
    subject = "the optimizer's updates" if e.node == OPTIMIZER else f"'{e.node}'"
    if e.family == "nonfinite":
        what = "loss" if e.kind == "kpi" else {"value": "values", "update": "updates"}.get(e.kind, "gradients")
        return f"where {what} of {subject} first turned non-finite"
    if e.to_state in ("dead", "saturated"):
        share = "units" if e.to_state == "dead" else "elements"
        return f"after {e.magnitude:.0%} of the {share} of {subject} went {e.to_state}"
    if e.to_state == "frozen":
        return f"after the updates of {subject} stayed exactly 0 for {e.magnitude:.0f} steps under non-zero gradients"
    if e.to_state == "spike":
        return f"after the loss jumped {e.magnitude:.0f}× its recent median and recovered"
    if e.to_state == "diverging":
        return f"after the loss rose {e.magnitude:.0f}× its recent median"
    what = {"value": "value rms", "grad": "gradient (relative to the output's)",
            "update": "update/weight ratio"}.get(e.kind, e.kind)
    direction = "rose" if e.to_state in ("exploding", "unstable") else "fell"
    history = "is" if e.at_start else "against its recent history"
    if e.at_start:
        return f"where the {what} of {subject} {history} {e.magnitude:.1f} decades off"
    return f"after the {what} of {subject} {direction} {e.magnitude:.1f} decades {history}"


def _minor(event: Event, t: Thresholds) -> bool:
    """A root too weak to explain a failure alone: one parameter's update jump below
    ``isolated_update_decades`` (Adam amplifies updates of near-zero gradients in healthy runs)."""
    return (event.family == "optimizer_stability" and event.to_state == "unstable" and event.node != OPTIMIZER
            and not event.at_start and event.magnitude < t.isolated_update_decades)


def rank_hypotheses(events: Sequence[Event], links: Sequence[CausalLink], series: RunSeries,
                    thresholds: Thresholds = Thresholds()) -> list[Hypothesis]:
    """Ranked hypotheses (best first, at most five); empty when no event is a root — a healthy run."""
    explained = {link.effect.key for link in links}
    start = [e for e in events if e.at_start and e.key not in explained]
    start.sort(key=lambda e: (_START_PRIORITY.index(e.label) if e.label in _START_PRIORITY else len(_START_PRIORITY),
                              phase_key(e, series)))
    later = sorted((e for e in events if not e.at_start and e.key not in explained), key=lambda e: phase_key(e, series))
    roots = [e for e in start + later if not _minor(e, thresholds)]
    out: list[Hypothesis] = []
    seen: set[tuple[str, str, str]] = set()
    for rank, root in enumerate(roots):
        reading = interpret(root, links, series, events, thresholds)
        if (reading.type, reading.origin, reading.node) in seen:
            continue
        seen.add((reading.type, reading.origin, reading.node))
        chain = chain_from(root, links)
        f = features(root, chain, len(out), len(roots))
        confidence = calibrated_confidence(f)
        out.append(Hypothesis(reading.type, reading.origin, reading.node, root.onset, confidence,
                              sentence(reading, root, chain, confidence), chain, f))
        if len(out) >= MAX_HYPOTHESES:
            break
    return out
