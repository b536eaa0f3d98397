"""A dependency graph as plain JSON-able data, and its identity: a hash of that data.

The store saves :func:`graph_to_dict` as a JSON string once per distinct structure, under the key
:func:`structure_hash`. The hash is SHA-256 of the canonical JSON (sorted keys, no whitespace, ASCII) of
that dict, first 16 hex digits: the same in every process and run, unlike Python's salted ``hash()``.
Any change of nodes, edges, grouping or tensor edges changes it; so does a change of
:data:`GRAPH_FORMAT_VERSION`, which is the intent.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from comgra_ndbg.graph.model import (
    EDGE_KINDS,
    DependencyGraph,
    GraphEdge,
    GraphError,
    GraphNode,
    TensorEdge,
    TensorInfo,
)

__all__ = ["GRAPH_FORMAT", "GRAPH_FORMAT_VERSION", "graph_from_dict", "graph_to_dict", "structure_hash"]

GRAPH_FORMAT = "comgra_ndbg.dependency_graph"
GRAPH_FORMAT_VERSION = 1
HASH_LENGTH = 16


def graph_to_dict(graph: DependencyGraph) -> dict[str, Any]:
    """``graph`` as a dict of strings, ints, bools and lists, ready for ``json.dumps``.

    Edges are compact lists: ``[source, target, kind]`` and ``[source, target, source_iteration,
    target_iteration]``; tensors are ``[name, node, role, module]``.
    """
    return {
        "format": GRAPH_FORMAT,
        "version": GRAPH_FORMAT_VERSION,
        "nodes": [
            {
                "name": node.name,
                "role": node.role,
                "module": node.module,
                "tensors": list(node.tensors),
                "roles": list(node.roles),
                "is_parameter_group": node.is_parameter_group,
            }
            for node in graph.nodes
        ],
        "edges": [[edge.source, edge.target, edge.kind] for edge in graph.edges],
        "tensors": [[info.name, info.node, info.role, info.module] for info in graph.tensors],
        "tensor_edges": [_tensor_edge_row(edge) for edge in graph.tensor_edges],
        "manual_edges": [_tensor_edge_row(edge) for edge in graph.manual_edges],
    }


def graph_from_dict(data: dict[str, Any]) -> DependencyGraph:
    """The graph that :func:`graph_to_dict` described; raises :class:`GraphError` on anything else.

    >>> from comgra_ndbg.graph.structure import build_graph
    >>> graph = build_graph([TensorEdge("x", "y", 0, 0)], {"x": ("x", "input", ""), "y": ("y", "output", "")})
    >>> graph_from_dict(json.loads(json.dumps(graph_to_dict(graph)))) == graph
    True
    """
    if not isinstance(data, dict) or data.get("format") != GRAPH_FORMAT:
        raise GraphError(f"not a dependency graph description: expected format {GRAPH_FORMAT!r}")
    if data.get("version") != GRAPH_FORMAT_VERSION:
        raise GraphError(
            f"dependency graph format version {data.get('version')!r} cannot be read by this version "
            f"(reads {GRAPH_FORMAT_VERSION}); upgrade comgra_ndbg"
        )
    try:
        nodes = tuple(
            GraphNode(
                name=_text(node["name"]),
                role=_text(node["role"]),
                module=_text(node["module"]),
                tensors=tuple(_text(t) for t in node["tensors"]),
                is_parameter_group=_flag(node["is_parameter_group"]),
                roles=tuple(_text(r) for r in node["roles"]),
            )
            for node in data["nodes"]
        )
        edges = tuple(GraphEdge(_text(s), _text(t), _kind(k)) for s, t, k in data["edges"])
        tensors = tuple(TensorInfo(*(_text(part) for part in row)) for row in data["tensors"])
        tensor_edges = tuple(_tensor_edge(row) for row in data["tensor_edges"])
        manual_edges = tuple(_tensor_edge(row) for row in data["manual_edges"])
    except (KeyError, TypeError, ValueError) as error:
        raise GraphError(f"malformed dependency graph description: {error!r}") from None
    return DependencyGraph(nodes, edges, tensors, tensor_edges, manual_edges)


def structure_hash(graph: DependencyGraph) -> str:
    """Deterministic identity of ``graph``: 16 hex digits of SHA-256 over its canonical JSON.

    >>> from comgra_ndbg.graph.structure import build_graph
    >>> graph = build_graph([TensorEdge("x", "y", 0, 0)], {"x": ("x", "input", ""), "y": ("y", "output", "")})
    >>> len(structure_hash(graph)), structure_hash(graph) == structure_hash(graph_from_dict(graph_to_dict(graph)))
    (16, True)
    """
    canonical = json.dumps(graph_to_dict(graph), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()[:HASH_LENGTH]


def _tensor_edge_row(edge: TensorEdge) -> list[Any]:
    return [edge.source, edge.target, edge.source_iteration, edge.target_iteration]


def _tensor_edge(row: list[Any]) -> TensorEdge:
    source, target, source_iteration, target_iteration = row
    return TensorEdge(_text(source), _text(target), _integer(source_iteration), _integer(target_iteration))


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _kind(value: Any) -> str:
    if value not in EDGE_KINDS:
        raise ValueError(f"edge kind {value!r} is not one of {EDGE_KINDS}")
    return value
