"""The recorder's side of the dependency graph: collect a step's registrations, discover once per structure.

Discovery itself lives in ``comgra_ndbg.graph``; this shell keeps the tensors of the current step only
until the graph is known (or its signature is found in the cache), then stores new structures, with their
layout, in the catalog.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

import torch

from comgra_ndbg.graph import (GraphCache, TensorEdge, build_graph, discover_edges, graph_to_dict, layered_layout,
                               merge_manual_edges)
from comgra_ndbg.graph.cache import signature_of
from comgra_ndbg.graph.discovery import Registration, validate_manual_edges
from comgra_ndbg.store.catalog import Catalog

__all__ = ["StructureTracker"]


class StructureTracker:
    """Collects (name, iteration, tensor) registrations and manual edges of one step at a time."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.cache = GraphCache()
        # (name, iteration, tensor, its (grad_fn, output_nr) then) and their ``graph.cache.registration_key``, in the
        # same order: ``add`` appends to both, and so does a planned registration (``registration.py``) inline
        self.registered: list[Registration] = []
        self.keys: list[tuple] = []
        self._manual: list[TensorEdge] = []
        self._found: list[TensorEdge] = []  # edges autograd showed elsewhere (an eager pass of a compiled model)
        self.pending = False  # something was registered or declared since the last discovery (it would do work)
        self.autograd = True  # False: this step's edges are all declared (an eager pass of a compiled model)
        self._last: tuple | None = None  # (signature, step type, structure hash) of the last discovery
        self._before: tuple | None = None  # (_last, graph of each step type) when the step began
        self._graphs: tuple | None = None  # (the catalog's graph of each step type, its version, a copy of it)

    def add(self, name: str, iteration: int, tensor: torch.Tensor, shape_key: tuple | None = None) -> None:
        """Register ``tensor`` as ``name`` in ``iteration``. ``shape_key`` is the rank, dtype, requires_grad
        and producing function's type of its ``registration_key`` when the caller knows them already (a
        registration plan: the tensor matched them)."""
        origin = (tensor.grad_fn, tensor.output_nr)  # as now: a later in-place op must not move it in the graph
        self.registered.append((name, iteration, tensor, origin))
        self.keys.append((name, iteration, (tensor.ndim, tensor.dtype, tensor.requires_grad, type(origin[0]))
                           if shape_key is None else shape_key, origin[1]))  # ``registration_key``, inline
        self.pending = True

    def name_of(self, grad_fn: object) -> str | None:
        """The name of the tensor registered since the last discovery that ``grad_fn`` produced, or None."""
        return next((name for name, _, _, origin in self.registered if origin[0] is grad_fn), None)

    def add_edge(self, edge: TensorEdge, *, discovered: bool = False) -> None:
        (self._found if discovered else self._manual).append(edge)
        self.pending = bool(self.registered)

    def clear(self) -> None:
        self.registered, self.keys, self._manual, self._found = [], [], [], []
        self.pending = False
        self.autograd = True
        graphs, version = self.catalog.graph_of_type, self.catalog.version
        if self._graphs is None or self._graphs[0] is not graphs or self._graphs[1] != version:
            self._graphs = (graphs, version, dict(graphs))  # copied again only after the catalog changed
        self._before = (self._last, self._graphs[2])

    def rollback(self) -> None:
        """Forget what the discoveries of the step being discarded changed: each step type points at the
        graph it had when the step began (a graph the step added stays stored, unreferenced)."""
        if self._before is None:
            return
        self._last, graphs = self._before
        for step_type, structure_hash in graphs.items():
            self.catalog.set_graph_of_type(step_type, structure_hash)
        for step_type in set(self.catalog.graph_of_type) - set(graphs):
            del self.catalog.graph_of_type[step_type]
            self.catalog.version += 1
        self.clear()

    def discover(self, step_type: str, parameters: Mapping[str, torch.Tensor]) -> None:
        """Find this step's graph (from the cache when its signature was seen).

        Called at the first gradient hook of the step (backward has just begun, so the tensors autograd
        saved for backward can still link inputs that need no gradient) and again at the end of the step,
        which only works if something was registered since.
        """
        if not self.pending:
            return
        registered, manual, found = self.registered, self._manual, self._found
        self.pending = False
        signature = (signature_of(self.keys, parameters), tuple(sorted(manual)), tuple(sorted(set(found))),
                     self.autograd)
        last = self._last
        if last is not None and last[1] == step_type and last[0] == signature:  # the common case: as last step
            self.catalog.set_graph_of_type(step_type, last[2])
            return
        cached = self.cache.get_or_build(signature, step_type,
                                         lambda: self._build(registered, parameters, manual, found))
        if cached.new_structure:
            positions = layered_layout(cached.graph)
            self.catalog.add_graph(cached.structure_hash, json.dumps(
                {"graph": graph_to_dict(cached.graph), "positions": {k: list(v) for k, v in positions.items()}},
                sort_keys=True))
        self.catalog.set_graph_of_type(step_type, cached.structure_hash)
        self._last = (signature, step_type, cached.structure_hash)

    def _build(self, registered: list, parameters: Mapping[str, torch.Tensor], manual: list[TensorEdge],
               found: list[TensorEdge] = ()):
        names = {entry[0] for entry in registered} | set(parameters)
        infos = [info for info in self.catalog.tensors if info.name in names]
        outputs = {info.name for info in infos if info.role == "output"}
        walked = discover_edges(registered, parameters, outputs=outputs) if self.autograd else []
        discovered = merge_manual_edges(walked, found)
        metadata = {info.name: (info.node, info.role, info.module) for info in infos}
        # only the discovered edges as tensor_edges: build_graph marks the manual ones autograd did not show
        return build_graph(discovered, metadata, manual_edges=validate_manual_edges(manual))
