"""Causal compression on a small hand-made graph: literal links, chains and coupled failures."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.causal import chain_from, coupled_failures, descendants, first_occurrences, link_events
from comgra_ndbg.analysis.events import Event
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.synthetic import summary_rows
from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode

ROLES = {"x": "input", "w": "parameter", "a": "intermediate", "b": "intermediate", "c": "output", "loss": "loss"}


def node(name: str) -> GraphNode:
    return GraphNode(name, ROLES[name], "", (name,), ROLES[name] == "parameter")


GRAPH = DependencyGraph(tuple(node(n) for n in sorted(ROLES)),
                        (GraphEdge("a", "b", "forward"), GraphEdge("b", "c", "forward"),
                         GraphEdge("c", "loss", "forward"), GraphEdge("w", "b", "forward")))


def run():
    rows = {(n, "value"): summary_rows(rms=np.ones(10)) for n in ROLES}
    return build_series(rows, roles=ROLES, kpis={}, graph=GRAPH)


def event(family: str, node_name: str, kind: str, state: str, onset: int) -> Event:
    return Event(family, node_name, kind, "normal", state, onset, 9, 1.0, 0.5)


def test_descendants_follow_forward_edges_and_inputs_feed_everything() -> None:
    below = descendants(GRAPH, ROLES)
    assert sorted(below["a"]) == ["a", "b", "c", "loss"]
    assert sorted(below["w"]) == ["b", "c", "loss", "w"]
    assert sorted(below["x"]) == ["a", "b", "c", "loss", "x"]


def test_forward_backward_and_same_node_links() -> None:
    shrink_b = event("activation_regime", "b", "value", "vanishing", 5)
    dead_c = event("activation_regime", "c", "value", "dead", 6)
    grad_a = event("gradient_health", "a", "grad", "vanishing", 5)
    nan_b = event("nonfinite", "b", "value", "non-finite", 7)
    # c depends on b: its gradient is the derivative of what follows c, taken at the values b fed it
    downstream = event("gradient_health", "c", "grad", "exploding", 5)
    links = link_events([nan_b, grad_a, dead_c, downstream, shrink_b], run())
    assert [(x.cause.node, x.cause.to_state, x.effect.node, x.effect.to_state, x.lag, x.via) for x in links] == [
        ("b", "vanishing", "c", "exploding", 0, "forward"),
        ("b", "vanishing", "a", "vanishing", 0, "backward"),
        ("b", "vanishing", "c", "dead", 1, "forward"),
        ("b", "vanishing", "b", "non-finite", 2, "same-node"),
        ("c", "exploding", "a", "vanishing", 0, "backward"),
        ("c", "exploding", "c", "dead", 1, "same-node"),
    ]


def test_a_value_change_reaches_the_gradients_after_it_within_the_pass_and_a_gradient_does_not() -> None:
    scaled_input = event("data_shift", "x", "value", "shifted", 5)
    vanishing_b = event("gradient_health", "b", "grad", "vanishing", 6)
    much_later = event("gradient_health", "c", "grad", "vanishing", 9)  # beyond the pass's propagation lag
    assert [(x.cause.node, x.effect.node, x.via) for x in link_events([scaled_input, vanishing_b, much_later], run())
            ] == [("x", "b", "forward")]
    grad_a = event("gradient_health", "a", "grad", "exploding", 5)
    assert link_events([grad_a, vanishing_b], run()) == []  # a gradient reaches values only through an update


def test_chain_and_coupled_failures() -> None:
    shrink_b = event("activation_regime", "b", "value", "vanishing", 5)
    grad_a = event("gradient_health", "a", "grad", "vanishing", 5)
    dead_c = event("activation_regime", "c", "value", "dead", 6)
    links = link_events([shrink_b, grad_a, dead_c], run())
    assert sorted((x.cause.node, x.effect.node, x.via) for x in links) == [
        ("b", "a", "backward"), ("b", "c", "forward")]
    chain = chain_from(shrink_b, links)
    assert [x.effect.node for x in chain.links] == ["a", "c"]
    assert [e.node for e in chain.events] == ["b", "a", "c"]
    assert [(x.cause.label, x.effect.label) for x in coupled_failures(links)] == [
        ("activation_regime:vanishing", "gradient_health:vanishing")]


def test_effects_too_late_or_in_unconnected_nodes_are_not_linked() -> None:
    cause = event("activation_regime", "b", "value", "vanishing", 5)
    late = event("activation_regime", "c", "value", "dead", 40)  # more than max_lag after both
    upstream_value = event("activation_regime", "a", "value", "exploding", 6)  # b does not feed a
    assert link_events([cause, late, upstream_value], run()) == []


def test_optimizer_events_explain_what_follows_and_first_occurrences() -> None:
    optimizer = event("optimizer_stability", "optimizer", "update", "unstable", 5)
    dead = event("activation_regime", "c", "value", "dead", 12)
    [link] = link_events([optimizer, dead], run())
    assert (link.cause.node, link.effect.node, link.lag, link.via) == ("optimizer", "c", 7, "optimizer")
    firsts = first_occurrences([dead, optimizer, event("activation_regime", "b", "value", "dead", 13)], run())
    assert {k: (v.node, v.onset) for k, v in firsts.items()} == {
        "optimizer_stability:unstable": ("optimizer", 5), "activation_regime:dead": ("c", 12)}
