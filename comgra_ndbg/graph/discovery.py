"""Discover which registered tensors each registered tensor was computed from, by reading autograd.

The recorder calls :func:`discover_edges` at the end of a step's forward pass, while the autograd graphs
are alive and before ``backward``. The result is the autograd graph with every unregistered operation
skipped: two architectures that compute the same registered tensors with different operations give the
same edges.

How tensors are recognised in the autograd graph:

- a registered non-leaf tensor is the pair ``(grad_fn, output_nr)``; the outputs of one function
  (``q, k, v = linear(x).chunk(3, -1)``) are therefore distinct tensors;
- a leaf that requires grad (a parameter, an input with ``requires_grad=True``) is the ``.variable`` of
  its ``AccumulateGrad`` node;
- a tensor without ``grad_fn`` that does not require grad (integer indices, data, anything detached or made
  under ``no_grad``) is invisible to autograd: it is a source only, and links to it come from manual
  connections (:func:`merge_manual_edges`).

Views are ordinary tensors here: ``h.view(...)`` registered as ``"h_flat"`` has its own ``ViewBackward``
node, so it gets the edge ``h -> h_flat`` and its consumers depend on ``h_flat``, not on ``h``. A tensor
registered twice (the very same tensor object, or an op such as ``contiguous()`` that returns its input)
forms a chain in registration order: each later registration depends on the previous one, and a consumer
depends on the latest registration made before it.

The walk is iterative (no recursion limit) and memoised over autograd nodes: for each node it computes
once the set of registered tensors reachable first, so the cost is linear in the size of the autograd
graph, however many paths it has. It only reads ``grad_fn``, ``output_nr``, ``requires_grad``,
``next_functions`` and ``variable``; it never modifies a tensor or the autograd graph, and never calls
backward. This module does not import torch.

Current limitations (autograd does not record what is needed):

- a frozen parameter (``requires_grad=False``) and an input that does not require grad have no edges;
- a tensor modified in place after registration is identified by its new ``grad_fn``: tensors computed
  from it before the in-place op link to what it was computed from instead;
- a reentrant ``torch.utils.checkpoint`` region runs its forward under ``no_grad``: tensors registered
  inside it have no ``grad_fn`` (the non-reentrant default is fine);
- a ``torch.compile`` region is one node: see :func:`find_compiled_tensors`;
- a parameter tied under two names (shared weights) is reported under the first name in ``parameters``.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from comgra_ndbg.graph.model import GraphError, TensorEdge

if TYPE_CHECKING:
    import torch

__all__ = ["discover_edges", "find_compiled_tensors", "merge_manual_edges", "validate_manual_edges"]

_ACCUMULATE_GRAD = "AccumulateGrad"
_COMPILED_PREFIX = "CompiledFunction"


def discover_edges(
    tensors: Sequence[tuple[str, int, torch.Tensor]],
    parameters: Mapping[str, torch.Tensor],
) -> list[TensorEdge]:
    """Edges between registered tensors and parameters, read from the alive autograd graphs.

    ``tensors`` lists ``(name, iteration, tensor)`` for every registered non-parameter tensor in
    registration order; ``parameters`` maps each parameter's tensor name to the ``nn.Parameter``. Each path
    back from a registered tensor's ``grad_fn`` stops at the first registered tensor or parameter on it.
    Returns the edges sorted and without duplicates.

    >>> import torch
    >>> torch.manual_seed(0) and None
    >>> fc = torch.nn.Linear(3, 2)
    >>> x = torch.randn(4, 3, requires_grad=True)
    >>> y = torch.relu(fc(x) * 2)
    >>> for edge in discover_edges([("x", 0, x), ("y", 0, y)], {"fc.weight": fc.weight}):
    ...     print(edge)
    TensorEdge(source='fc.weight', target='y', source_iteration=0, target_iteration=0)
    TensorEdge(source='x', target='y', source_iteration=0, target_iteration=0)
    """
    walker = _Walker(tensors, parameters)
    return walker.edges()


def merge_manual_edges(
    discovered: Iterable[TensorEdge], manual: Iterable[TensorEdge | tuple[str, str, int, int]]
) -> list[TensorEdge]:
    """Discovered edges plus the user's manual connections, sorted and without duplicates.

    Manual connections are the links autograd cannot see: a ``detach()``, integer indices, a
    non-differentiable step. Each is a :class:`TensorEdge` or a ``(source, target, source_iteration,
    target_iteration)`` tuple; an edge may not point back in time.

    >>> merge_manual_edges([TensorEdge("a", "b", 0, 0)], [("tokens", "a", 0, 0), ("a", "b", 0, 0)])
    [TensorEdge(source='a', target='b', source_iteration=0, target_iteration=0), \
TensorEdge(source='tokens', target='a', source_iteration=0, target_iteration=0)]
    """
    return sorted(set(discovered) | set(validate_manual_edges(manual)))


def validate_manual_edges(manual: Iterable[TensorEdge | tuple[str, str, int, int]]) -> list[TensorEdge]:
    """Manual connections as :class:`TensorEdge`, checked; raises :class:`GraphError` on a bad one."""
    result = []
    for item in manual:
        edge = item if isinstance(item, TensorEdge) else _edge_from_tuple(item)
        for name in (edge.source, edge.target):
            if not isinstance(name, str) or not name:
                raise GraphError(f"manual connection {item!r}: tensor names must be non-empty strings")
        for iteration in (edge.source_iteration, edge.target_iteration):
            if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
                raise GraphError(f"manual connection {item!r}: iterations must be integers >= 0")
        if edge.source_iteration > edge.target_iteration:
            raise GraphError(
                f"manual connection {item!r} points back in time (iteration {edge.source_iteration} -> "
                f"{edge.target_iteration}); swap source and target"
            )
        if (edge.source, edge.source_iteration) == (edge.target, edge.target_iteration):
            raise GraphError(f"manual connection {item!r} connects a tensor to itself; remove it")
        result.append(edge)
    return result


def find_compiled_tensors(tensors: Sequence[tuple[str, int, torch.Tensor]]) -> list[str]:
    """Names of registered tensors produced by a ``torch.compile`` region (in registration order).

    A compiled region's backward is one ``CompiledFunctionBackward`` node, so dependencies between its
    outputs are invisible to :func:`discover_edges`. When this list is not empty, discover the structure
    eagerly with :func:`comgra_ndbg.graph.eager.discover_module_structure`.
    """
    names: dict[str, None] = {}
    for name, _iteration, tensor in tensors:
        grad_fn = tensor.grad_fn
        if grad_fn is not None and type(grad_fn).__name__.startswith(_COMPILED_PREFIX):
            names[name] = None
    return list(names)


def _edge_from_tuple(item: Any) -> TensorEdge:
    try:
        source, target, source_iteration, target_iteration = item
    except (TypeError, ValueError):
        raise GraphError(
            f"manual connection {item!r} must be a TensorEdge or (source, target, source_iteration, "
            "target_iteration)"
        ) from None
    return TensorEdge(source, target, source_iteration, target_iteration)


class _Walker:
    """One discovery pass: identities of registered tensors, then a memoised walk of autograd."""

    def __init__(
        self, tensors: Sequence[tuple[str, int, torch.Tensor]], parameters: Mapping[str, torch.Tensor]
    ) -> None:
        self.names: list[tuple[str, int]] = []  # registration index -> (name, iteration)
        self.roots: list[Any] = []  # registration index -> grad_fn or None
        self.slot_of: list[int | None] = []  # registration index -> slot (None: invisible to autograd)
        self.output_slot: dict[tuple[Any, int], int] = {}  # (grad_fn, output_nr) -> slot
        self.leaf_slot: dict[int, int] = {}  # id(leaf tensor) -> slot; the caller keeps the tensors alive
        self.registrations: list[list[int]] = []  # slot -> registration indices, ascending
        self.parameter_name: dict[int, str] = {}  # slot -> parameter name, for parameter slots
        self.memo: dict[Any, frozenset[int]] = {}  # autograd node -> slots reachable first
        self.accumulate_types: dict[type, bool] = {}
        for index, (name, iteration, tensor) in enumerate(tensors):
            grad_fn = tensor.grad_fn
            self.names.append((name, iteration))
            self.roots.append(grad_fn)
            slot = self._slot(tensor, grad_fn)
            self.slot_of.append(slot)
            if slot is not None:
                self.registrations[slot].append(index)
        for name, parameter in parameters.items():
            slot = self._slot(parameter, parameter.grad_fn)
            if slot is not None and not self.registrations[slot] and slot not in self.parameter_name:
                self.parameter_name[slot] = name

    def _slot(self, tensor: torch.Tensor, grad_fn: Any) -> int | None:
        """The slot of a tensor's identity, created on first sight; ``None`` if autograd cannot see it."""
        if grad_fn is not None:
            table: dict[Any, int] = self.output_slot
            key: Any = (grad_fn, tensor.output_nr)
        elif tensor.requires_grad:
            table, key = self.leaf_slot, id(tensor)
        else:
            return None
        slot = table.get(key)
        if slot is None:
            slot = table[key] = len(self.registrations)
            self.registrations.append([])
        return slot

    def edges(self) -> list[TensorEdge]:
        found: set[TensorEdge] = set()
        for index, (name, iteration) in enumerate(self.names):
            slot = self.slot_of[index]
            if slot is not None:
                chain = self.registrations[slot]
                position = bisect_left(chain, index)
                if position > 0:
                    source, source_iteration = self.names[chain[position - 1]]
                    found.add(TensorEdge(source, name, source_iteration, iteration))
                    continue
            root = self.roots[index]
            if root is None:
                continue
            for source_slot in self._reach(root):
                source, source_iteration = self._resolve(source_slot, index, iteration)
                if (source, source_iteration) != (name, iteration):
                    found.add(TensorEdge(source, name, source_iteration, iteration))
        return sorted(found)

    def _resolve(self, slot: int, consumer: int, iteration: int) -> tuple[str, int]:
        """The name and iteration a consumer (a registration index) reads a slot as."""
        if slot in self.parameter_name:
            return self.parameter_name[slot], iteration
        chain = self.registrations[slot]
        position = bisect_left(chain, consumer) - 1
        return self.names[chain[max(position, 0)]]

    def _is_accumulate(self, node: Any) -> bool:
        kind = type(node)
        known = self.accumulate_types.get(kind)
        if known is None:
            known = self.accumulate_types[kind] = kind.__name__ == _ACCUMULATE_GRAD
        return known

    def _inputs(self, node: Any) -> tuple[set[int], list[Any]]:
        """Slots read directly by ``node``, and the unregistered autograd nodes it reads."""
        direct: set[int] = set()
        children: list[Any] = []
        for child, output_nr in node.next_functions:
            if child is None:
                continue
            slot = self.output_slot.get((child, output_nr))
            if slot is None and self._is_accumulate(child):
                slot = self.leaf_slot.get(id(child.variable))
                if slot is None:
                    continue  # an unregistered leaf: a path that reaches nothing registered
            if slot is None:
                children.append(child)
            else:
                direct.add(slot)
        return direct, children

    def _reach(self, root: Any) -> frozenset[int]:
        """Slots reachable first from ``root``: iterative post-order over the DAG, memoised per node."""
        memo = self.memo
        if root in memo:
            return memo[root]
        expanded: dict[Any, tuple[set[int], list[Any]]] = {}
        stack = [root]
        while stack:
            node = stack[-1]
            if node in memo:
                stack.pop()
                continue
            pending = expanded.get(node)
            if pending is None:
                expanded[node] = self._inputs(node)
                stack.extend(child for child in expanded[node][1] if child not in memo)
                continue
            direct, children = pending
            for child in children:
                direct |= memo[child]
            memo[node] = frozenset(direct)
            del expanded[node]
            stack.pop()
        return memo[root]
