"""What the graph says about a node: its module class, whether it passes a signal through unit by unit, and
which nodes share one signal.

A dead unit or a saturated element is a property of a *signal*, and a signal keeps its identity through
modules that act unit by unit — a dropout, a scaling, a normalisation, an activation, an identity wrapper.
A jump in a linear layer's output followed, one or two such modules later, by dead units is one fault of
that layer: the analysis reads it along these *pass-through chains*, never along one direct edge only.

A node passes its signal through when its module class acts unit by unit (see :data:`PASSTHROUGH`), or —
for nodes whose class is unknown (tensors registered by hand) or a module without parameters of its own (a
container returning its last layer's output, a custom scaling) — when it has exactly one computed input,
no parameter of rank 2 or more (a weight matrix or kernel mixes units) and the same shape as that input (or
no known shape).

>>> from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode
>>> n = lambda name, role="intermediate": GraphNode(name, role, "", (name,), role == "parameter")
>>> g = DependencyGraph((n("fc"), n("drop"), n("act"), n("out"), n("fc.parameters", "parameter")),
...                     (GraphEdge("fc", "drop", "forward"), GraphEdge("drop", "act", "forward"),
...                      GraphEdge("act", "out", "forward"), GraphEdge("fc.parameters", "fc", "forward")))
>>> info = {"fc": NodeInfo("Linear"), "drop": NodeInfo("Dropout"), "act": NodeInfo("ReLU"),
...         "out": NodeInfo("Linear")}
>>> sorted(signal_chain(g, info, "fc"))
['act', 'drop', 'fc']
>>> consumers(g, "fc.parameters")
('fc',)
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from comgra_ndbg.graph.model import LAYERING_KINDS, DependencyGraph

__all__ = ["NodeInfo", "PASSTHROUGH", "passes_through", "signal_chain", "consumers", "children", "parents"]

PASSTHROUGH = frozenset({
    "ReLU", "ReLU6", "LeakyReLU", "PReLU", "RReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Tanh",
    "Sigmoid", "Hardtanh", "Hardsigmoid", "Hardswish", "Softplus", "Softsign", "Tanhshrink", "Threshold",
    "LogSigmoid", "Softshrink", "Hardshrink", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
    "FeatureAlphaDropout", "Identity", "LayerNorm", "GroupNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d",
    "BatchNorm3d", "SyncBatchNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LocalResponseNorm",
    "Softmax", "LogSoftmax", "Softmax2d",
})
"""Module classes that act on each unit of their input alone (or normalise it), keeping its shape."""


@dataclass(frozen=True)
class NodeInfo:
    """What the recording says about a node besides its series: the class of the module that produced it
    (``""`` when unknown), the shape of its first recorded value, the ranks of its parameters (for a
    parameter node), how many parameters the module holds itself, and the dtype its first tensor was recorded
    in (``"float32"``; ``""`` when unknown), which a comparison with a reference run reads."""

    module_type: str = ""
    shape: tuple[int, ...] = ()
    parameter_ranks: tuple[int, ...] = ()
    own_parameters: int = -1  # parameters the module holds itself (-1: unknown)
    dtype: str = ""


def children(graph: DependencyGraph | None, name: str) -> tuple[str, ...]:
    """Nodes computed directly from ``name`` (forward and manual edges)."""
    if graph is None:
        return ()
    return tuple(dict.fromkeys(e.target for e in graph.edges
                               if e.source == name and e.kind in LAYERING_KINDS and e.target != name))


def parents(graph: DependencyGraph | None, name: str) -> tuple[str, ...]:
    """Nodes ``name`` is computed from directly (forward and manual edges), parameters included."""
    if graph is None:
        return ()
    return tuple(dict.fromkeys(e.source for e in graph.edges
                               if e.target == name and e.kind in LAYERING_KINDS and e.source != name))


def consumers(graph: DependencyGraph | None, parameter_node: str) -> tuple[str, ...]:
    """The computed nodes a parameter node feeds directly."""
    return children(graph, parameter_node)


def passes_through(graph: DependencyGraph | None, info: Mapping[str, NodeInfo], name: str) -> bool:
    """Whether node ``name`` carries its input's signal unit by unit (see the module docstring)."""
    own = info.get(name, NodeInfo())
    if own.module_type in PASSTHROUGH:
        return True
    if own.module_type and own.own_parameters != 0:
        return False  # a module with weights of its own (or of unknown holdings): it mixes units
    inputs = parents(graph, name)
    computed = [p for p in inputs if not info.get(p, NodeInfo()).parameter_ranks]
    weights = [p for p in inputs if any(r >= 2 for r in info.get(p, NodeInfo()).parameter_ranks)]
    if len(computed) != 1 or weights:
        return False
    source = info.get(computed[0], NodeInfo())
    return not own.shape or not source.shape or own.shape == source.shape


def signal_chain(graph: DependencyGraph | None, info: Mapping[str, NodeInfo], name: str,
                 max_hops: int = 6) -> frozenset[str]:
    """``name`` and every node reached from it through pass-through nodes only (at most ``max_hops`` deep):
    the nodes that carry the same signal, unit for unit."""
    reached = {name}
    frontier = [name]
    for _ in range(max_hops):
        following = []
        for node in frontier:
            for child in children(graph, node):
                if child not in reached and passes_through(graph, info, child):
                    reached.add(child)
                    following.append(child)
        if not following:
            break
        frontier = following
    return frozenset(reached)
