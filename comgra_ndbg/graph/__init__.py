"""The dependency graph between registered tensors: discovered from autograd, identified, laid out.

Data flows one way through the modules of this package:

- :mod:`~comgra_ndbg.graph.discovery`: tensor edges from the alive autograd graphs (the recorder calls
  :func:`discover_edges` at the end of a step's forward pass), plus the user's manual connections;
- :mod:`~comgra_ndbg.graph.eager`: the same for compiled models, by one eager pass (imports torch, so it
  is not imported here: ``from comgra_ndbg.graph.eager import discover_module_structure``);
- :mod:`~comgra_ndbg.graph.structure`: the node-level :class:`DependencyGraph`, and regrouping of
  parameter nodes by module;
- :mod:`~comgra_ndbg.graph.serialize`: plain-dict form and the deterministic :func:`structure_hash`;
- :mod:`~comgra_ndbg.graph.cache`: discover once per structure signature and step type;
- :mod:`~comgra_ndbg.graph.layout` and :mod:`~comgra_ndbg.graph.modules`: positions for the GUI and the
  module tree.

Nothing imported here imports torch, so the analysis and the GUI can use graphs without it.
"""
from __future__ import annotations

from comgra_ndbg.graph.cache import CachedGraph, GraphCache, structure_signature
from comgra_ndbg.graph.discovery import discover_edges, find_compiled_tensors, merge_manual_edges
from comgra_ndbg.graph.layout import assign_layers, count_crossings, layered_layout
from comgra_ndbg.graph.model import (
    EDGE_KINDS,
    DependencyGraph,
    GraphEdge,
    GraphError,
    GraphNode,
    TensorEdge,
    TensorInfo,
)
from comgra_ndbg.graph.modules import ModuleInfo, module_tree
from comgra_ndbg.graph.serialize import graph_from_dict, graph_to_dict, structure_hash
from comgra_ndbg.graph.structure import build_graph, collapse_modules, expand_modules, tensor_metadata

__all__ = [
    "EDGE_KINDS",
    "CachedGraph",
    "DependencyGraph",
    "GraphCache",
    "GraphEdge",
    "GraphError",
    "GraphNode",
    "ModuleInfo",
    "TensorEdge",
    "TensorInfo",
    "assign_layers",
    "build_graph",
    "collapse_modules",
    "count_crossings",
    "discover_edges",
    "expand_modules",
    "find_compiled_tensors",
    "graph_from_dict",
    "graph_to_dict",
    "layered_layout",
    "merge_manual_edges",
    "module_tree",
    "structure_hash",
    "structure_signature",
    "tensor_metadata",
]
