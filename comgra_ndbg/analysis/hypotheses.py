"""The post-mortem reasoner: ranked hypotheses over origins, one plain sentence and one remedy each.

Roots are events that no earlier event explains (no causal link into them). Faults present from the first
steps are explained first (origin: the architecture or initialisation); then mid-run roots in step order
(:func:`~comgra_ndbg.analysis.nonfinite.phase_key`). Each root is read as a failure type and an origin
(:mod:`~comgra_ndbg.analysis.reading`), and kept only when it describes harm
(:mod:`~comgra_ndbg.analysis.harm`): a relative change that nothing bad follows is training doing its
work, not a failure. When the evidence leaves the type open, the hypothesis says so (type ``unclear``, the
candidates in ``alternatives``; :mod:`~comgra_ndbg.analysis.abstention`). Confidence comes from :mod:`~comgra_ndbg.analysis.calibration`, on the features of
:func:`features`; the remedy from :mod:`~comgra_ndbg.analysis.remedies`.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from comgra_ndbg.analysis.abstention import alternatives
from comgra_ndbg.analysis.calibration import calibrated_confidence
from comgra_ndbg.analysis.causal import chain_from
from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import CausalChain, CausalLink, Event, Hypothesis
from comgra_ndbg.analysis.harm import harmful, is_hard, loss_worsening
from comgra_ndbg.analysis.nonfinite import phase_key
from comgra_ndbg.analysis.optimizer_stability import OPTIMIZER
from comgra_ndbg.analysis.reading import Reading, interpret
from comgra_ndbg.analysis.remedies import remedy
from comgra_ndbg.analysis.sentences import TYPE_TEXT, sentence
from comgra_ndbg.analysis.series import RunSeries

__all__ = ["rank_hypotheses", "interpret", "features", "sentence", "TYPE_TEXT", "ORIGINS", "FEATURES"]

ORIGINS = ("node", "optimizer", "loss", "data", "architecture")
FEATURES = ("strength", "log_chain_links", "at_start", "rank", "log_other_roots", "hard_root", "hard_effect",
            "loss_worsening", "edit_root", "abstained")
"""Names of the calibration features, in the order of :func:`features`."""
_START_PRIORITY = ("output_range:out_of_reach", "activation_regime:dead", "activation_regime:saturated", "gradient_health:vanishing",
                   "gradient_health:exploding", "optimizer_stability:frozen", "optimizer_stability:unstable",
                   "nonfinite:non-finite")
MAX_HYPOTHESES = 5


def features(root: Event, chain: CausalChain, rank: int, num_roots: int, series: RunSeries | None = None,
             refined_by: tuple[Event, ...] = (), alternatives: tuple[str, ...] = ()) -> tuple[float, ...]:
    """Calibration features (see :data:`FEATURES`): the root's strength, log(1 + chain links), whether it is a
    start-of-run fault, its rank, log(1 + other roots), whether the root and any of its effects are hard
    evidence, how many decades the loss worsened after it (clipped to [-1, 3]; 0 without a loss), whether
    the root is a parameter edit, and whether the type was left open (an abstention)."""
    effects = [link.effect for link in chain.links] + list(refined_by)
    worse = 0.0
    if series is not None and len(series.steps):
        decades = loss_worsening(series.loss, int(np.searchsorted(series.steps, root.onset)), window=20)
        worse = float(np.clip(decades, -1.0, 3.0)) if not np.isnan(decades) else 0.0
    return (root.strength, float(np.log1p(len(chain.links))), float(root.at_start), float(rank),
            float(np.log1p(max(num_roots - 1, 0))), float(is_hard(root)), float(any(is_hard(e) for e in effects)),
            worse, float(root.family == "parameter_edit"), float(bool(alternatives)))


def _minor(event: Event, t: Thresholds) -> bool:
    """A root too weak to explain a failure alone: one parameter's update jump below
    ``isolated_update_decades`` (Adam amplifies updates of near-zero gradients in healthy runs)."""
    return (event.family == "optimizer_stability" and event.to_state == "unstable" and event.node != OPTIMIZER
            and not event.at_start and event.magnitude < t.isolated_update_decades)


def _roots(events: Sequence[Event], links: Sequence[CausalLink], series: RunSeries, t: Thresholds) -> list[Event]:
    explained = {link.effect.key for link in links}
    start = [e for e in events if e.at_start and e.key not in explained]
    start.sort(key=lambda e: (_START_PRIORITY.index(e.label) if e.label in _START_PRIORITY else len(_START_PRIORITY),
                              phase_key(e, series)))
    later = sorted((e for e in events if not e.at_start and e.key not in explained), key=lambda e: phase_key(e, series))
    return [e for e in start + later if not _minor(e, t)]


def rank_hypotheses(events: Sequence[Event], links: Sequence[CausalLink], series: RunSeries,
                    thresholds: Thresholds = Thresholds()) -> list[Hypothesis]:
    """Ranked hypotheses (best first, at most five); empty when no root describes a failure — a healthy run."""
    t = thresholds
    roots = _roots(events, links, series, t)
    out: list[Hypothesis] = []
    seen: set[tuple[str, str, str]] = set()
    for root in roots:
        reading = interpret(root, events, series, t)
        if reading is None or (reading.type, reading.origin, reading.node) in seen:
            continue
        chain = chain_from(root, links)
        if not harmful(root, [link.effect for link in chain.links] + list(reading.refined_by), series, t):
            continue
        seen.add((reading.type, reading.origin, reading.node))
        open_types = alternatives(reading, root, events, links, series, t)
        out.append(_hypothesis(reading, root, chain, len(out), len(roots), series, open_types))
        if len(out) >= MAX_HYPOTHESES:
            break
    return out


def _hypothesis(reading: Reading, root: Event, chain: CausalChain, rank: int, num_roots: int,
                series: RunSeries, open_types: tuple[str, ...] = ()) -> Hypothesis:
    f = features(root, chain, rank, num_roots, series, reading.refined_by, open_types)
    confidence = calibrated_confidence(f)
    advice = remedy(reading, root, series)
    if open_types:
        advice = (f"tell {' from '.join(open_types)} apart in the explorer at '{reading.node or root.node}', step "
                  f"{root.onset}; if it is {open_types[0].replace('_', ' ')}: {advice}")
    return Hypothesis("unclear" if open_types else reading.type, reading.origin, reading.node, root.onset,
                      confidence, sentence(reading, root, chain, confidence, open_types), chain, f, advice,
                      open_types)
