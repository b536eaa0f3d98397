"""Output registration: module outputs, the model's output and their gradients, eager and compiled.

``OutputRegistration`` is a mixin of ``NeuralDbg`` and works on its state. An eager module's output is
registered in its forward hook, before a later in-place op can change it; a compiled region's outputs are
stashed by the traced hooks and registered, detached, when the model's forward pass returns, with the
edges of one eager pass over the same inputs (``hooks.discover_compiled``) and their gradients from the
``grad_tap`` custom op or a hook on the output tensor.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import torch

from comgra_ndbg.instrument.hooks import (CompiledStructure, discover_compiled, from_compiled_code, node_name,
                                          output_names, tensor_leaves)
from comgra_ndbg.recorder.grad_hook import on_gradient

__all__ = ["OutputRegistration"]


class OutputRegistration:
    """Output registration of ``NeuralDbg`` (see the module docstring); not used on its own."""

    def _on_output(self, path: str, output: Any) -> None:
        """Forward hook of a chosen module, eager: register its output now."""
        leaves = list(tensor_leaves(output))
        if any(from_compiled_code(tensor) for _, tensor in leaves):
            self._hooks.stash.append((path, output, ()))  # a compiled region's output: registered with the rest
            return
        self._safely("recording a module output", self._register_outputs, path, leaves,
                     "output" if path == "" else "intermediate")

    def _register_outputs(self, path: str, leaves: list[tuple[str, torch.Tensor]], role: str) -> None:
        node = node_name(path)
        for name, tensor in output_names(node, leaves, self._counts):
            self.recorder.register_tensor(name, tensor, role=role, node=node, module=node)
            self._eager_names.append(name)
            self._outputs_seen += path != ""
            if path == "":
                self._output_names.append(name)

    def _register_compiled(self, stashed: list[tuple[str, Any, tuple[int, ...]]], output: Any) -> None:
        """Register what a compiled forward pass stashed, detached, with the edges of an eager pass."""
        rec = self.recorder
        self._compiled_pass = True
        rec._declare_all_edges()
        key = tuple(path for path, _, _ in stashed)
        structure = self._structures.get(key)
        if structure is None:
            structure = self._structures[key] = self._discover()
        iteration = self._iteration
        # Eagerly registered outputs count too: with only some submodules compiled, the eager pass's edges
        # are the only link between them and the compiled region's outputs (registered detached).
        known = self._parameter_names | set(self._input_names) | set(self._eager_names)
        items = [(path, list(tensor_leaves(out)), tapped) for path, out, tapped in stashed]
        if not self._root_selected:
            items.append(("", list(tensor_leaves(output)), ()))
        for path, leaves, tapped in items:
            node = node_name(path)
            for leaf, (name, tensor) in enumerate(output_names(node, leaves, self._counts)):
                rec.register_tensor(name, tensor.detach(), role="output" if path == "" else "intermediate",
                                    node=node, module=node, bounds=structure.bounds.get(name))
                known.add(name)
                self._outputs_seen += path != ""
                if path == "":
                    self._output_names.append(name)
                if not tensor.requires_grad:
                    continue
                if leaf in tapped:
                    self._taps.setdefault((path, leaf), []).append((name, iteration))
                else:
                    self._tensor_handles.append(on_gradient(tensor, partial(self._on_grad, name, iteration,
                                                                            not self._compiled_pass)))
        for edge in structure.edges:
            if edge.source in known and edge.target in known:
                rec.add_dependency(edge.source, edge.target, discovered=True)

    def _discover(self) -> CompiledStructure:
        """Edges of a compiled model, from one eager pass on this pass's inputs (no graph if that fails)."""
        if self._pass_args is None:
            return CompiledStructure()
        args, kwargs = self._pass_args
        try:
            return discover_compiled(self._root, args, kwargs, self._hooks, root_output=not self._root_selected)
        except Exception as error:  # no graph is better than a broken training run
            self._warn_once("discovery", f"discovering the dependency graph of the compiled model failed "
                                         f"({type(error).__name__}: {error}); it is recorded without edges")
            return CompiledStructure()

    def _on_tap_grad(self, path: str, leaf: int, grad: torch.Tensor) -> None:
        pending = self._taps.get((path, leaf))
        if pending:
            name, iteration = pending.pop()  # backward meets a module's calls in reverse order
            self._on_grad(name, iteration, False, grad)

    def _on_grad(self, name: str, iteration: int, deferred: bool, grad: torch.Tensor) -> None:
        """``deferred`` for eager passes: summarised with the other gradients when the backward pass ends."""
        if not self._closed and self.recorder.current_step is not None:
            self._safely("recording a gradient", partial(self.recorder.record_gradient, name, grad,
                                                         iteration=iteration, deferred=deferred))
