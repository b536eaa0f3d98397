"""Value objects of the dependency graph: tensor edges, tensor metadata, nodes, node edges, the graph.

Everything here is a frozen dataclass with plain fields (strings, ints, tuples), so a graph is hashable,
comparable, safe to share between the recorder, the store, the analysis and the GUI, and trivially turned
into JSON (see :mod:`comgra_ndbg.graph.serialize`). No torch, no I/O.

Two levels:

- *tensor level*: :class:`TensorEdge` ``source@source_iteration -> target@target_iteration`` between
  registered tensor names, as discovered from autograd (or declared by the user), plus one
  :class:`TensorInfo` per tensor saying which node it belongs to;
- *node level*: :class:`GraphNode` groups tensors (a module's parameters form one node) and
  :class:`GraphEdge` connects nodes, with a ``kind`` that says how the link was found.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from comgra_ndbg.errors import GraphError, UnknownSeriesError

__all__ = [
    "EDGE_KINDS",
    "KIND_FORWARD",
    "KIND_ITERATION",
    "KIND_MANUAL",
    "LAYERING_KINDS",
    "PARAMETER_ROLE",
    "DependencyGraph",
    "GraphEdge",
    "GraphError",
    "GraphNode",
    "TensorEdge",
    "TensorInfo",
]

KIND_FORWARD = "forward"  # autograd link inside one iteration
KIND_MANUAL = "manual"  # link the user declared inside one iteration (detach, indices, non-differentiable)
KIND_ITERATION = "iteration"  # link from an earlier iteration to a later one (state carried forward)
EDGE_KINDS = (KIND_FORWARD, KIND_MANUAL, KIND_ITERATION)
LAYERING_KINDS = (KIND_FORWARD, KIND_MANUAL)  # the kinds that decide left-to-right order in a layout

PARAMETER_ROLE = "parameter"


@dataclass(frozen=True, order=True)
class TensorEdge:
    """``target`` (in ``target_iteration``) was computed from ``source`` (in ``source_iteration``).

    A parameter has no iteration of its own: it is read in the iteration of the tensor that consumes it,
    so a parameter edge carries the target's iteration on both ends.

    >>> TensorEdge("hidden", "hidden", 0, 1)
    TensorEdge(source='hidden', target='hidden', source_iteration=0, target_iteration=1)
    """

    source: str
    target: str
    source_iteration: int
    target_iteration: int


@dataclass(frozen=True, order=True)
class TensorInfo:
    """Where a registered tensor sits: its node, its role, and the path of the module that owns it.

    ``role`` is the role given at registration (``"input"``, ``"output"``, ``"loss"``, ``"intermediate"``,
    ...) and ``"parameter"`` for parameters of a tracked module; ``module`` is ``""`` when no module owns
    the tensor.
    """

    name: str
    node: str
    role: str
    module: str


@dataclass(frozen=True)
class GraphNode:
    """A node of the dependency graph: one or more tensors shown (and analysed) as one thing.

    ``tensors`` are sorted; ``roles`` names each of them inside the node, in the same order: the tensor's
    role for registered tensors, the parameter's name relative to the node (``"weight"``, ``"0.bias"``) for
    parameter groups. ``role`` is the node's role: ``"parameter"`` for a parameter group, otherwise the
    most specific role among its tensors (loss, output, target, input, then intermediate).
    """

    name: str
    role: str
    module: str
    tensors: tuple[str, ...]
    is_parameter_group: bool
    roles: tuple[str, ...] = ()


@dataclass(frozen=True, order=True)
class GraphEdge:
    """Node ``target`` depends on node ``source``; ``kind`` is one of :data:`EDGE_KINDS`.

    ``"iteration"`` edges may be self loops (a recurrent state feeding itself in the next iteration).
    """

    source: str
    target: str
    kind: str


@dataclass(frozen=True)
class DependencyGraph:
    """The dependency graph of one step structure, at node level with its tensor-level origin.

    ``nodes`` are sorted by name and ``edges`` sorted; ``tensors`` and the two tensor edge lists are what
    the node level was derived from (see :func:`comgra_ndbg.graph.structure.build_graph`), so regrouping
    (collapsing a module's parameters, expanding it back) is a pure rebuild. ``tensor_edges`` are the
    links autograd showed; ``manual_edges`` the user-declared links autograd did not show.
    """

    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    tensors: tuple[TensorInfo, ...] = ()
    tensor_edges: tuple[TensorEdge, ...] = ()
    manual_edges: tuple[TensorEdge, ...] = ()

    @cached_property
    def _by_name(self) -> dict[str, GraphNode]:
        return {node.name: node for node in self.nodes}

    @property
    def node_names(self) -> tuple[str, ...]:
        """Names of all nodes, sorted."""
        return tuple(node.name for node in self.nodes)

    def node(self, name: str) -> GraphNode:
        """The node called ``name``; raises :class:`UnknownSeriesError` (a ``KeyError``) if absent."""
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownSeriesError(
                f"the dependency graph has no node {name!r}; its nodes are {list(self._by_name)[:20]}"
            ) from None

    def predecessors(self, name: str, kinds: tuple[str, ...] = EDGE_KINDS) -> tuple[str, ...]:
        """Sorted names of the nodes with an edge of one of ``kinds`` into ``name``."""
        self.node(name)
        return tuple(sorted({e.source for e in self.edges if e.target == name and e.kind in kinds}))

    def successors(self, name: str, kinds: tuple[str, ...] = EDGE_KINDS) -> tuple[str, ...]:
        """Sorted names of the nodes with an edge of one of ``kinds`` out of ``name``."""
        self.node(name)
        return tuple(sorted({e.target for e in self.edges if e.source == name and e.kind in kinds}))
