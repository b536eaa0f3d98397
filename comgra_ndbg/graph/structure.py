"""Build the node-level dependency graph from tensor edges, and regroup parameter nodes.

Pure functions over the value objects of :mod:`comgra_ndbg.graph.model`. The node level is always derived
from the tensor level by one rule (:func:`build_graph`), so collapsing a module's parameters into one node
and expanding them back are rebuilds with a different grouping, never edits of edges.

Edge kinds at node level, decided per tensor edge by timing first:

- ``"iteration"``: the source is in an earlier iteration than the target (state carried forward); kept
  even when both ends are the same node, as a self loop;
- ``"forward"``: same iteration, found by autograd;
- ``"manual"``: same iteration, declared by the user and not found by autograd.

A same-iteration edge between two tensors of one node is internal to the node and not shown.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from comgra_ndbg.graph.model import (
    KIND_FORWARD,
    KIND_ITERATION,
    KIND_MANUAL,
    PARAMETER_ROLE,
    DependencyGraph,
    GraphEdge,
    GraphError,
    GraphNode,
    TensorEdge,
    TensorInfo,
)

__all__ = ["build_graph", "collapse_modules", "expand_modules", "tensor_metadata"]

# A node's role is the most specific role among its tensors; roles not listed here rank after these,
# alphabetically.
ROLE_PRECEDENCE = ("loss", "output", "target", "input", "intermediate")


def build_graph(
    tensor_edges: Iterable[TensorEdge],
    metadata: Mapping[str, tuple[str, str, str]],
    *,
    manual_edges: Iterable[TensorEdge] = (),
) -> DependencyGraph:
    """The dependency graph of discovered (and optionally manual) tensor edges.

    ``metadata`` maps every tensor name to ``(node name, role, module path or "")``; parameters have role
    ``"parameter"`` and, by the recorder's convention, the owning module's path as node name. Every
    tensor named in an edge must be in ``metadata``; tensors in ``metadata`` without edges become isolated
    nodes. Raises :class:`GraphError` for a tensor without metadata.

    >>> graph = build_graph(
    ...     [TensorEdge("model.fc.weight", "out", 0, 0), TensorEdge("out", "out", 0, 1)],
    ...     {"model.fc.weight": ("model.fc", "parameter", "model.fc"), "out": ("out", "output", "")},
    ... )
    >>> graph.edges
    (GraphEdge(source='model.fc', target='out', kind='forward'), \
GraphEdge(source='out', target='out', kind='iteration'))
    >>> graph.node("model.fc").roles
    ('weight',)
    """
    infos = tuple(sorted(TensorInfo(name, *_metadata_entry(name, entry)) for name, entry in metadata.items()))
    discovered = frozenset(tensor_edges)
    manual = frozenset(manual_edges) - discovered
    return _assemble(infos, discovered, manual)


def tensor_metadata(graph: DependencyGraph) -> dict[str, tuple[str, str, str]]:
    """The ``metadata`` argument of :func:`build_graph` that rebuilds ``graph``'s grouping."""
    return {info.name: (info.node, info.role, info.module) for info in graph.tensors}


def collapse_modules(graph: DependencyGraph, prefix: str) -> DependencyGraph:
    """``graph`` with every parameter of the module ``prefix`` and its submodules in one node ``prefix``.

    Raises :class:`GraphError` when no parameter belongs to a module under ``prefix``.

    >>> graph = build_graph(
    ...     [TensorEdge("m.enc.0.weight", "h", 0, 0), TensorEdge("m.enc.2.weight", "h", 0, 0)],
    ...     {"m.enc.0.weight": ("m.enc.0", "parameter", "m.enc.0"),
    ...      "m.enc.2.weight": ("m.enc.2", "parameter", "m.enc.2"), "h": ("h", "intermediate", "")},
    ... )
    >>> collapsed = collapse_modules(graph, "m.enc")
    >>> collapsed.node_names, collapsed.node("m.enc").roles
    (('h', 'm.enc'), ('0.weight', '2.weight'))
    >>> expand_modules(collapsed, "m.enc") == graph
    True
    """
    if not prefix:
        raise GraphError("collapse_modules needs a module path such as 'model.encoder', not ''")
    infos = []
    matched = False
    for info in graph.tensors:
        if info.role == PARAMETER_ROLE and _is_under(info.module, prefix):
            matched = True
            info = TensorInfo(info.name, prefix, info.role, info.module)
        infos.append(info)
    if not matched:
        modules = sorted({i.module for i in graph.tensors if i.role == PARAMETER_ROLE})
        raise GraphError(f"no parameter belongs to module {prefix!r} or below; parameter modules: {modules[:20]}")
    return _assemble(tuple(sorted(infos)), frozenset(graph.tensor_edges), frozenset(graph.manual_edges))


def expand_modules(graph: DependencyGraph, prefix: str | None = None) -> DependencyGraph:
    """``graph`` with parameters in nodes at or under ``prefix`` (all if ``None``) back in their own module's node.

    Each parameter returns to the node named by its owning module path, the recorder's default grouping;
    expanding what was never collapsed changes nothing.
    """
    infos = []
    for info in graph.tensors:
        if info.role == PARAMETER_ROLE and (prefix is None or _is_under(info.node, prefix)):
            info = TensorInfo(info.name, info.module or info.node, info.role, info.module)
        infos.append(info)
    return _assemble(tuple(sorted(infos)), frozenset(graph.tensor_edges), frozenset(graph.manual_edges))


def _metadata_entry(name: str, entry: tuple[str, str, str]) -> tuple[str, str, str]:
    try:
        node, role, module = entry
    except (TypeError, ValueError):
        raise GraphError(
            f"metadata of tensor {name!r} must be (node name, role, module path), got {entry!r}"
        ) from None
    if not all(isinstance(part, str) for part in (node, role, module)) or not node or not role:
        raise GraphError(f"metadata of tensor {name!r} must be non-empty strings (module may be ''), got {entry!r}")
    return node, role, module


def _assemble(
    infos: tuple[TensorInfo, ...], discovered: frozenset[TensorEdge], manual: frozenset[TensorEdge]
) -> DependencyGraph:
    node_of = {info.name: info.node for info in infos}
    missing = sorted({name for edge in discovered | manual for name in (edge.source, edge.target)} - node_of.keys())
    if missing:
        raise GraphError(
            f"tensors {missing[:10]} appear in edges but have no metadata; pass (node, role, module) for each"
        )
    edges: set[GraphEdge] = set()
    for edge, declared in [(e, False) for e in discovered] + [(e, True) for e in manual]:
        source, target = node_of[edge.source], node_of[edge.target]
        if edge.source_iteration != edge.target_iteration:
            kind = KIND_ITERATION
        elif source == target:
            continue
        else:
            kind = KIND_MANUAL if declared else KIND_FORWARD
        edges.add(GraphEdge(source, target, kind))
    members: dict[str, list[TensorInfo]] = {}
    for info in infos:
        members.setdefault(info.node, []).append(info)
    nodes = tuple(_node(name, members[name]) for name in sorted(members))
    return DependencyGraph(nodes, tuple(sorted(edges)), infos, tuple(sorted(discovered)), tuple(sorted(manual)))


def _node(name: str, infos: list[TensorInfo]) -> GraphNode:
    is_parameter_group = all(info.role == PARAMETER_ROLE for info in infos)
    roles = tuple(
        _relative(info.name, name) if info.role == PARAMETER_ROLE else info.role for info in infos
    )
    if is_parameter_group:
        role = PARAMETER_ROLE
    else:
        role = min((i.role for i in infos if i.role != PARAMETER_ROLE), key=_role_rank)
    return GraphNode(
        name=name,
        role=role,
        module=_common_module([info.module for info in infos]),
        tensors=tuple(info.name for info in infos),
        is_parameter_group=is_parameter_group,
        roles=roles,
    )


def _role_rank(role: str) -> tuple[int, str]:
    if role in ROLE_PRECEDENCE:
        return ROLE_PRECEDENCE.index(role), ""
    return len(ROLE_PRECEDENCE), role


def _relative(tensor: str, node: str) -> str:
    return tensor[len(node) + 1 :] if tensor.startswith(node + ".") else tensor


def _is_under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _common_module(modules: list[str]) -> str:
    """The longest dotted path every module is at or under; ``""`` if there is none."""
    split = [module.split(".") for module in modules if module]
    if len(split) != len(modules) or not split:
        return ""
    common = split[0]
    for parts in split[1:]:
        length = 0
        while length < min(len(common), len(parts)) and common[length] == parts[length]:
            length += 1
        common = common[:length]
    return ".".join(common)
