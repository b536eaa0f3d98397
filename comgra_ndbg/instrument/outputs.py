"""Output registration: module outputs, the model's output and their gradients, eager and compiled.

``OutputRegistration`` is a mixin of ``NeuralDbg`` and works on its state. An eager module's output is
registered in its forward hook, before a later in-place op can change it; a compiled region's outputs are
stashed by the traced hooks and registered, detached, when the model's forward pass returns, with their
gradients from the ``grad_tap`` custom op or a hook on the output tensor. Each call of a module is a node
of its own (``model.relu``, ``model.relu#1``), so a module reused around others forms a chain, not a cycle.

A pass whose structure autograd does not show — compiled, with a frozen part or a reentrant checkpoint
(module outputs that do not require grad), or under ``torch.autocast`` — takes all its edges from one
structure pass over the same inputs (``structure.discover_structure``), once per distinct set of names.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import torch

from comgra_ndbg.instrument.hooks import call_node, from_compiled_code, node_name, output_names, tensor_leaves
from comgra_ndbg.instrument.structure import (ModelStructure, autocast_active, discover_structure, hidden_from_autograd,
                                              saved_tensors_hooked, top_saved_tensors_hooks)
from comgra_ndbg.recorder.grad_hook import hook_method, on_gradient

__all__ = ["OutputRegistration"]

_PYTHON_NODE, _SAVED_HOOKS = 1, 2
"""The bits of the C++ part's ``output_flags``: a node defined in Python, saved-tensor hooks active."""


def _python_flags() -> int:
    """``output_flags`` without the C++ part: any node may be defined in Python (its class name then tells)."""
    return _PYTHON_NODE | (_SAVED_HOOKS if top_saved_tensors_hooks(False) is not None else 0)


class OutputRegistration:
    """Output registration of ``NeuralDbg`` (see the module docstring); not used on its own."""

    def _on_output(self, path: str, output: Any) -> None:
        """Forward hook of a chosen module, eager: in an evaluation pass its output goes to the evaluation sums
        (``evaluation``), else it is registered now. An output that is one tensor (the usual) is named from a
        table kept per module call, as a forward pass calls the same modules in the same order at every step,
        and registered here without a call more (this runs for every module of every recorded pass)."""
        if self._eval_capture:
            self._safely("recording an evaluation output", self._eval_output, path, output)
            return
        if not isinstance(output, torch.Tensor):
            self._on_outputs(path, output)
            return
        native = self._native_marks  # (the C++ part answers both questions below in one call)
        flags = native.output_flags(output) if native is not None else _python_flags()
        if flags & _PYTHON_NODE and type(output.grad_fn).__name__.startswith("CompiledFunction"):
            self._hooks.stash.append((path, output, ()))  # ``from_compiled_code``, inline
            return
        if flags & _SAVED_HOOKS:  # ``saved_tensors_hooked``
            self._hidden_pass = True
        try:
            module = self._module_nodes.get(path)
            if module is None:
                module = self._module_nodes[path] = node_name(path)
            counts = self._counts
            calls = counts.get(module, 0)
            counts[module] = calls + 1
            name = module if calls == 0 else self._call_names.get((module, calls))
            if name is None:
                name = self._call_names[(module, calls)] = f"{module}#{calls}"
            self.recorder.register_tensor(name, output, role="output" if path == "" else "intermediate", node=name,
                                          module=module)
            self._eager_names.append(name)
            if path == "":
                self._output_names.append(name)
            else:
                self._outputs_seen += 1
            if not output.requires_grad and (output.is_floating_point() or output.is_complex()):
                self._hidden_pass = True
                self._note_hidden_call(path, [name])
        except Exception as error:  # a recording problem must never break the training loop
            self.recorder._warn("recording a module output", error)

    def _on_outputs(self, path: str, output: Any) -> None:
        """``_on_output`` of an output holding several tensors (or none): tuples, dicts, dataclasses."""
        leaves = list(tensor_leaves(output))
        if any(from_compiled_code(tensor) for _, tensor in leaves):
            self._hooks.stash.append((path, output, ()))  # a compiled region's output: registered with the rest
            return
        if saved_tensors_hooked():
            self._hidden_pass = True
        self._safely("recording a module output", self._register_outputs, path, leaves,
                     "output" if path == "" else "intermediate")

    def _register_outputs(self, path: str, leaves: list[tuple[str, torch.Tensor]], role: str) -> None:
        module = node_name(path)
        named = output_names(module, leaves, self._counts)
        for (name, tensor), (suffix, _) in zip(named, leaves):
            self.recorder.register_tensor(name, tensor, role=role, node=call_node(name, suffix), module=module)
            self._eager_names.append(name)
            self._outputs_seen += path != ""
            if path == "":
                self._output_names.append(name)
        if hidden_from_autograd(leaves):
            self._hidden_pass = True
            self._note_hidden_call(path, [name for name, _ in named])

    def _register_compiled(self, stashed: list[tuple[str, Any, tuple[int, ...]]], output: Any) -> None:
        """Register what a compiled forward pass stashed, detached, with the edges of an eager pass."""
        rec = self.recorder
        self._compiled_pass = True
        self._hooks.pin()  # compiled code guards on the hooks: keep them from now on
        structure = self._structure_of(("compiled",) + tuple(path for path, _, _ in stashed))
        iteration = self._iteration
        # Eagerly registered outputs count too: with only some submodules compiled, the eager pass's edges
        # are the only link between them and the compiled region's outputs (registered detached).
        known = self._parameter_names | set(self._input_names) | set(self._eager_names)
        items = [(path, list(tensor_leaves(out)), tapped) for path, out, tapped in stashed]
        if not self._root_selected:
            items.append(("", list(tensor_leaves(output)), ()))
        for path, leaves, tapped in items:
            module = node_name(path)
            for leaf, (name, tensor) in enumerate(output_names(module, leaves, self._counts)):
                rec.register_tensor(name, tensor.detach(), role="output" if path == "" else "intermediate",
                                    node=call_node(name, leaves[leaf][0]), module=module,
                                    bounds=structure.bounds.get(name))
                known.add(name)
                self._outputs_seen += path != ""
                if path == "":
                    self._output_names.append(name)
                if not tensor.requires_grad:
                    continue
                if leaf in tapped:
                    self._taps.setdefault((path, leaf), []).append((name, iteration))
                else:
                    hook = partial(hook_method(self, self._on_grad), name, iteration, not self._compiled_pass)
                    self._tensor_handles.append(on_gradient(tensor, hook))
        self._declare_edges(structure, known)

    def _needs_structure_pass(self) -> bool:
        """Whether this eager pass hides part of its structure from autograd (see the module docstring)."""
        if self._hidden_pass:
            return True
        return autocast_active(self._pass_inputs)

    def _declare_eager_structure(self) -> None:
        """Edges of an eager pass that autograd does not show, from the structure pass."""
        structure = self._structure_of(("eager",) + tuple(self._eager_names))
        self._declare_edges(structure, self._parameter_names | set(self._input_names) | set(self._eager_names))

    def _declare_edges(self, structure: ModelStructure, known: set[str]) -> None:
        """This step's edges come from ``structure`` (walking autograd would miss or shortcut them)."""
        rec = self.recorder
        rec._declare_all_edges()
        self._declared_edges = True
        for edge in structure.edges:
            if edge.source in known and edge.target in known:
                rec.add_dependency(edge.source, edge.target, source_iteration=self._iteration + edge.source_iteration,
                                   target_iteration=self._iteration + edge.target_iteration, discovered=True)

    def _structure_of(self, key: tuple[str, ...]) -> ModelStructure:
        """The structure of passes registering ``key``'s names, from one structure pass on this pass's
        inputs the first time (no edges if that fails)."""
        structure = self._structures.get(key)
        if structure is not None:
            return structure
        structure = ModelStructure()
        if self._pass_args is not None:
            args, kwargs = self._pass_args
            try:
                structure = discover_structure(self._root, args, kwargs, self._hooks,
                                               root_output=not self._root_selected)
            except Exception as error:  # no graph is better than a broken training run
                self._warn_once("discovery", f"discovering the dependency graph of the model failed "
                                             f"({type(error).__name__}: {error}); it is recorded without edges")
        self._structures[key] = structure
        return structure

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
