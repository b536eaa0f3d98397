"""Abstention: when the evidence does not settle a failure's type, say so instead of guessing.

A confident wrong word misleads more than an honest "unclear: A or B". Two situations leave the type open:

- *a scale shift with a regime change beyond its signal*: a value jumps or collapses at a node and, in the
  same steps, units die or saturate further on, past a module that mixes units (a weight matrix), whose own
  signal shows no scale shift — so the jump did not visibly carry over, and the layer in between may have
  killed them as well; within the jump's own signal (a pass-through chain), or when the shift reached the
  regime change's signal too, the evidence settles it and this does not apply;
- *simultaneous roots*: another root of harm starts in the same step and the same phase of the step (both
  in the forward pass, say), unlinked to this one, and reads as another type — nothing tells which came
  first.

>>> from comgra_ndbg.analysis.events import Event
>>> jump = Event("activation_regime", "fc1", "value", "normal", "exploding", 100, 199, 1.5, 0.8, sudden=True)
>>> dead = Event("activation_regime", "act2", "value", "normal", "dead", 100, 199, 1.0, 1.0)
>>> merge_alternatives("exploding", [("dead_units", dead)])
('exploding', 'dead_units')
"""
from __future__ import annotations

from collections.abc import Sequence

from comgra_ndbg.analysis.causal import descendants
from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import CausalLink, Event
from comgra_ndbg.analysis.harm import is_hard
from comgra_ndbg.analysis.nonfinite import phase_key
from comgra_ndbg.analysis.reading import Reading, interpret
from comgra_ndbg.analysis.series import RunSeries
from comgra_ndbg.analysis.structure import NodeInfo, consumers, parents, passes_through, signal_chain

__all__ = ["alternatives", "merge_alternatives"]

_REGIME_TYPE = {"dead": "dead_units", "saturated": "saturation"}


def merge_alternatives(first: str, others: Sequence[tuple[str, Event]]) -> tuple[str, ...]:
    """``first`` and the other candidate types, each once, in order; a single type means no doubt."""
    return tuple(dict.fromkeys([first] + [kind for kind, _ in others]))


def alternatives(reading: Reading, root: Event, events: Sequence[Event], links: Sequence[CausalLink],
                 series: RunSeries, t: Thresholds = Thresholds()) -> tuple[str, ...]:
    """The candidate types when the evidence leaves ``reading``'s type open (see the module docstring),
    else ``()``."""
    others = _regime_beyond_signal(reading, root, events, series, t) + _simultaneous(reading, root, events,
                                                                                    links, series, t)
    found = merge_alternatives(reading.type, others)
    return found if len(found) > 1 else ()


def _regime_beyond_signal(reading: Reading, root: Event, events: Sequence[Event], series: RunSeries,
                          t: Thresholds) -> list[tuple[str, Event]]:
    if reading.type not in ("exploding", "vanishing") or root.kind != "value":
        return []
    info = series.info or {}
    starts = consumers(series.graph, root.node) if root.family == "parameter_edit" else (root.node,)
    chain: set[str] = set()
    for start in starts:
        chain |= signal_chain(series.graph, info, start)
    below = descendants(series.graph, {n.name: n.role for n in series.nodes})
    reach = set().union(*(below.get(s, frozenset()) for s in starts)) if starts else set()
    scaled = {e.node for e in events if e.family == "activation_regime" and e.to_state in ("exploding", "vanishing")
              and abs(e.onset - root.onset) <= t.same_time}
    return [(_REGIME_TYPE[e.to_state], e) for e in events
            if e.to_state in _REGIME_TYPE and e.family == "activation_regime" and e.node in reach - chain
            and 0 <= e.onset - root.onset <= t.same_time and not _source(series, info, e.node) & scaled]


def _source(series: RunSeries, info: dict, node: str) -> set[str]:
    """The nodes whose signal ``node`` carries: itself and its pass-through ancestors, up to and including
    the first module that mixes units."""
    found, current = {node}, node
    while passes_through(series.graph, info, current):
        inputs = [p for p in parents(series.graph, current) if not info.get(p, NodeInfo()).parameter_ranks]
        if len(inputs) != 1 or inputs[0] in found:
            break
        current = inputs[0]
        found.add(current)
    return found


def _simultaneous(reading: Reading, root: Event, events: Sequence[Event], links: Sequence[CausalLink],
                  series: RunSeries, t: Thresholds) -> list[tuple[str, Event]]:
    if not is_hard(root):
        return []
    explained = {link.effect.key for link in links}
    linked = {link.effect.key for link in links if link.cause.key == root.key}
    linked |= {link.cause.key for link in links if link.effect.key == root.key}
    key = phase_key(root, series)[:2]
    out = []
    for other in events:
        if (other.key == root.key or other.key in explained or other.key in linked or not is_hard(other)
                or phase_key(other, series)[:2] != key or other.at_start != root.at_start):
            continue
        rival = interpret(other, events, series, t)
        if rival is not None and rival.type != reading.type:
            out.append((rival.type, other))
    return out
