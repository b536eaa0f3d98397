"""Causal compression: which events plausibly caused which, along the dependency graph and in time.

A link ``cause → effect`` needs the effect to start no earlier in the step order than the cause (see
:func:`~comgra_ndbg.analysis.nonfinite.phase_key`) and at most ``max_lag`` steps later — at most
``propagation_lag`` steps when a value or gradient event reaches another node, since a forward or backward
pass carries it there within its own step — and a path:

- ``forward``: a forward-pass event (value, non-finite value, loss) in a node that depends on the
  cause's node — activations propagate forward — or, from a value event, a gradient event there: a node's
  gradient is the derivative of what follows it, evaluated at the values the pass computed;
- ``backward``: a gradient event in a node the cause's node depends on — gradients propagate backward —
  or an update event of a parameter the cause's node depends on (a whole-model optimizer event only
  within ``same_time`` steps): update sizes follow the gradients;
- ``same-node``: another family's event in the same node (pre-activations shift, then units die);
- ``optimizer``: anything after a whole-model optimizer event.

Coupled failures are the links between events of different families.
"""
from __future__ import annotations

from collections.abc import Sequence

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import CausalChain, CausalLink, Event
from comgra_ndbg.analysis.nonfinite import phase_key
from comgra_ndbg.analysis.optimizer_stability import OPTIMIZER
from comgra_ndbg.analysis.series import RunSeries
from comgra_ndbg.graph.model import LAYERING_KINDS, DependencyGraph

__all__ = ["descendants", "link_events", "chain_from", "coupled_failures", "first_occurrences"]

LOSS_NODE = "loss"


def descendants(graph: DependencyGraph | None, roles: dict[str, str] | None = None) -> dict[str, frozenset[str]]:
    """Node -> every node that depends on it through forward/manual edges (itself included).

    Nodes whose role (in ``roles``) is ``input`` feed every computed node: autograd cannot see an input
    that does not require a gradient, yet everything the forward pass computes depends on it.

    >>> from comgra_ndbg.graph.model import GraphEdge, GraphNode
    >>> n = lambda name: GraphNode(name, "intermediate", "", (name,), False)
    >>> g = DependencyGraph((n("a"), n("b"), n("c")), (GraphEdge("a", "b", "forward"), GraphEdge("b", "c", "forward")))
    >>> sorted(descendants(g)["a"]), sorted(descendants(g)["c"])
    (['a', 'b', 'c'], ['c'])
    """
    if graph is None:
        return {}
    children: dict[str, set[str]] = {name: set() for name in graph.node_names}
    for e in graph.edges:
        if e.kind in LAYERING_KINDS and e.source != e.target:
            children[e.source].add(e.target)
    roles = roles or {}
    computed = {n.name for n in graph.nodes if not n.is_parameter_group and roles.get(n.name, n.role) != "input"}
    for name in graph.node_names:
        if roles.get(name) == "input":
            children[name] |= computed
    out: dict[str, frozenset[str]] = {}
    for name in graph.node_names:
        seen, stack = {name}, [name]
        while stack:
            for child in children[stack.pop()]:
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        out[name] = frozenset(seen)
    return out


def _is_gradient(event: Event) -> bool:
    return event.kind == "grad" or event.kind.startswith("grad:")


def _relation(cause: Event, effect: Event, below: dict[str, frozenset[str]], lag: int, same_time: int) -> str | None:
    """How ``effect`` can follow from ``cause`` through the graph, or None."""
    if cause.node == OPTIMIZER:
        return OPTIMIZER
    if effect.kind == "update":  # update sizes follow the gradients of the step
        if cause.kind not in ("value", "grad") or cause.node == effect.node:
            return "same-node" if cause.node == effect.node else None
        if effect.node == OPTIMIZER:
            return "backward" if lag <= same_time else None
        return "backward" if cause.node in below.get(effect.node, ()) else None
    if effect.node == OPTIMIZER:
        return None
    if cause.node == effect.node:
        return "same-node" if cause.label != effect.label or cause.kind != effect.kind else None
    if _is_gradient(effect):
        reaches = cause.node in below.get(effect.node, ()) or cause.node == LOSS_NODE and cause.kind == "kpi"
        if reaches:
            return "backward"
        # a node's gradient is the derivative of what follows it, taken at the values it computes: a change of
        # the values upstream (inputs scaled 100x saturating a later layer) changes it within the same pass
        return "forward" if cause.kind == "value" and effect.node in below.get(cause.node, ()) else None
    if _is_gradient(cause):  # a gradient reaches the forward pass only through an update
        return None
    if effect.kind == "kpi" and effect.node == LOSS_NODE:  # a loss known only as a KPI ends every forward pass
        graphed = any(LOSS_NODE in reached for reached in below.values())
        return "forward" if LOSS_NODE in below.get(cause.node, {LOSS_NODE}) or not graphed else None
    if effect.kind == "value":
        return "forward" if effect.node in below.get(cause.node, ()) else None
    return None


def _within_pass(cause: Event) -> bool:
    """Whether ``cause`` reaches other nodes only through the forward and backward pass of its own step (a
    value or gradient event), not through training (an update, an edit of a parameter, the optimizer)."""
    return (cause.kind == "value" or _is_gradient(cause)) and cause.family != "parameter_edit" \
        and cause.node != OPTIMIZER


def link_events(events: Sequence[Event], series: RunSeries, thresholds: Thresholds = Thresholds()) -> list[CausalLink]:
    """Every plausible ``cause → effect`` link among ``events`` (see the module docstring)."""
    below = descendants(series.graph, {n.name: n.role for n in series.nodes})
    ordered = sorted(events, key=lambda e: phase_key(e, series))
    keys = [phase_key(e, series) for e in ordered]
    links: list[CausalLink] = []
    for i, cause in enumerate(ordered):
        for j in range(i + 1, len(ordered)):
            effect = ordered[j]
            lag = effect.onset - cause.onset
            if lag > thresholds.max_lag:
                break
            if keys[j] <= keys[i] or effect.at_start and not cause.at_start:
                continue
            via = _relation(cause, effect, below, lag, thresholds.same_time)
            if via in ("forward", "backward") and _within_pass(cause) and lag > thresholds.propagation_lag:
                continue
            if via is not None:
                links.append(CausalLink(cause, effect, lag, via))
    return links


def chain_from(root: Event, links: Sequence[CausalLink], max_links: int = 24) -> CausalChain:
    """The events reachable from ``root`` through ``links``, each reached once, in order of onset.

    When more than ``max_links`` are reachable, the earliest link to each kind of effect (``family:state``)
    is kept first, so a late but different consequence (values turning non-finite after many scale
    events) is never cut off; the rest are the earliest others.
    """
    by_cause: dict[tuple, list[CausalLink]] = {}
    for link in links:
        by_cause.setdefault(link.cause.key, []).append(link)
    reached = {root.key}
    chain: list[CausalLink] = []
    frontier = [root]
    while frontier:
        current = frontier.pop(0)
        for link in by_cause.get(current.key, ()):
            if link.effect.key not in reached:
                reached.add(link.effect.key)
                chain.append(link)
                frontier.append(link.effect)
    chain.sort(key=lambda link: (link.effect.onset, link.lag))
    if len(chain) > max_links:
        firsts: dict[str, CausalLink] = {}
        for link in chain:
            firsts.setdefault(link.effect.label, link)
        kept = list(firsts.values())[:max_links]
        kept += [link for link in chain if link not in kept][:max_links - len(kept)]
        chain = sorted(kept, key=lambda link: (link.effect.onset, link.lag))
    return CausalChain(root, tuple(chain))


def coupled_failures(links: Sequence[CausalLink]) -> list[CausalLink]:
    """Links between events of different families (one failure mode turning into another), the earliest
    link per (cause label, effect label, effect node)."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for link in sorted(links, key=lambda x: (x.effect.onset, x.lag)):
        if link.cause.family == link.effect.family:
            continue
        key = (link.cause.label, link.effect.label, link.effect.node)
        if key not in seen:
            seen.add(key)
            out.append(link)
    return out


def first_occurrences(events: Sequence[Event], series: RunSeries) -> dict[str, Event]:
    """The first event of each type (``family:state``) in step order."""
    out: dict[str, Event] = {}
    for event in sorted(events, key=lambda e: phase_key(e, series)):
        out.setdefault(event.label, event)
    return out
