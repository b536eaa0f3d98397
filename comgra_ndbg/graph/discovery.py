"""Discover which registered tensors each registered tensor was computed from, by reading autograd.

The recorder calls :func:`discover_edges` at the end of a step's forward pass, while the autograd graphs
are alive and before ``backward``. The result is the autograd graph with every unregistered operation
skipped: two architectures that compute the same registered tensors with different operations give the
same edges.

How tensors are recognised in the autograd graph:

- a registered non-leaf tensor is the pair ``(grad_fn, output_nr)`` it had when it was registered (the
  recorder passes that pair along, see :func:`discover_edges`); the outputs of one function
  (``q, k, v = linear(x).chunk(3, -1)``) are therefore distinct tensors, and an in-place op after the
  registration (``out += identity`` in a residual block) makes a new node that reads the registered tensor
  and what was added: consumers of the modified tensor depend on both;
- a leaf that requires grad (a parameter, an input with ``requires_grad=True``) is the ``.variable`` of
  its ``AccumulateGrad`` node;
- a tensor without ``grad_fn`` that does not require grad (input data, integer indices, targets, masks,
  anything detached or made under ``no_grad``) and a frozen parameter have no autograd node: they are
  found among the tensors autograd saved for backward (below), and are sources only.

Saved tensors. Until ``backward`` frees them, an autograd node keeps what its backward needs:
``AddmmBackward0._saved_mat1`` is a ``Linear``'s input, ``EmbeddingBackward0._saved_indices`` the token
ids, ``NllLossBackward0._saved_target`` the classes of ``cross_entropy``, ``MulBackward0._saved_other`` a
mask multiplied in. For each node it visits, the walk reads them (the names once per node type, from
``dir``: every ``_raw_saved_<name>`` with its unpacked ``_saved_<name>``, or ``saved_tensors`` for a
custom ``autograd.Function``; single tensors and tuples of tensors) and matches each one that does not
require grad against the registered grad-less tensors by storage, never by value:

- same device and ``untyped_storage().data_ptr()``, and the saved tensor's bytes lie within the registered
  tensor's (``x.view(B, -1)`` or ``mask.unsqueeze(-1)`` saved by the op is a view of ``x`` or ``mask``);
- a registered tensor with the saved tensor's exact offset, shape, stride and dtype wins; otherwise the
  smallest registered tensors containing it (an input ``x`` and its slice ``x[0]`` both registered: a
  view of ``x[0]`` belongs to ``x[0]``).

A match is an input of the node, like its ``next_functions``: the grad-less tensor feeds the registered
tensor whose walk reached the node, and it joins the node's memo. Saved tensors that require grad are
skipped (they are in the graph already; ``TanhBackward0._saved_result`` is the node's own output, which
would otherwise tie a registered ``h.detach()`` to the tensor it was detached from). A saved tensor with
an unpack hook (non-reentrant ``torch.utils.checkpoint``, ``save_on_cpu``) is never unpacked: the hook
would recompute the checkpointed region or copy from the CPU. After ``backward`` (without
``retain_graph``) reading a saved tensor raises ``RuntimeError``, which counts as no match: discovery
after backward gives the edges found through gradients only. This work is done only when a grad-less
tensor or a frozen parameter is registered.

Views are ordinary tensors here: ``h.view(...)`` registered as ``"h_flat"`` has its own ``ViewBackward``
node, so it gets the edge ``h -> h_flat`` and its consumers depend on ``h_flat``, not on ``h``. A tensor
registered twice (the very same tensor object, or an op such as ``contiguous()`` that returns its input)
forms a chain in registration order: each later registration depends on the previous one, and a consumer
depends on the latest registration made before it. Grad-less tensors registered twice (or two with the
same storage, offset, shape, stride and dtype) are one tensor to their consumers in the same way, but get
no edge between the registrations.

Outputs are sinks. Tensors named in ``outputs`` (the model's return values, which ``NeuralDbg`` registers
when the forward pass returns, after every module inside it) may alias a tensor the model went on
computing with (``h = tanh(l1(x)); return h, l2(h)``): a consumer registered before such a registration
looks through it to what it was computed from (``l1 -> l2``), instead of depending on an output it
preceded (which would put ``model`` between ``l1`` and ``l2`` in a cycle).

The walk is iterative (no recursion limit) and memoised over autograd nodes: for each node it computes
once the set of registered tensors reachable first, so the cost is linear in the size of the autograd
graph, however many paths it has. It only reads ``grad_fn``, ``output_nr``, ``requires_grad``,
``next_functions``, ``variable`` and saved tensors; it never modifies a tensor or the autograd graph, and
never calls backward. This module does not import torch.

Current limitations (autograd does not record what is needed):

- a grad-less tensor is linked only where an op saved it (or a view of it) for backward. Ops whose
  backward does not need it save nothing: ``h + x``, ``h - x``, ``torch.cat``/``torch.stack`` with ``x``,
  ``torch.lerp(h, x, w)``, the branch values of ``torch.where(cond, h, x)`` (the condition is saved).
  Products, matrix products, ``Linear``, convolutions, ``embedding``, indexing, ``gather``,
  ``masked_fill`` and the losses' targets are saved. An op on grad-less tensors only (``x / 255``,
  ``x.float()``, ``x.to(device)``, ``(x - mean) / std``) builds no node, and its result is a new tensor
  that matches nothing unless it is registered itself;
- a grad-less tensor modified in place after an op saved it, or saved under a saved-tensor hook, is not
  matched; neither is a tensor a custom ``autograd.Function`` keeps as a ``ctx`` attribute instead of
  ``save_for_backward``;
- after ``backward`` (without ``retain_graph``) grad-less tensors and frozen parameters have no edges;
- containment is by byte range: a saved view of one strided slice (``x[:, 1]``) whose range overlaps a
  second registered slice's can be attributed to both when neither matches exactly;
- a tensor registered without its registration-time ``(grad_fn, output_nr)`` and modified in place
  afterwards is identified by its new ``grad_fn``: tensors computed from it before the in-place op link to
  what it was computed from instead;
- a reentrant ``torch.utils.checkpoint`` region runs its forward under ``no_grad``: tensors registered
  inside it have no ``grad_fn`` (the non-reentrant default is fine);
- a ``torch.compile`` region is one node: see :func:`find_compiled_tensors`;
- a parameter tied under two names (shared weights) is reported under the first name in ``parameters``.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from comgra_ndbg.graph.model import GraphError, TensorEdge

if TYPE_CHECKING:
    import torch

__all__ = ["Registration", "autograd_origin", "discover_edges", "find_compiled_tensors", "merge_manual_edges",
           "validate_manual_edges"]

_ACCUMULATE_GRAD = "AccumulateGrad"
_COMPILED_PREFIX = "CompiledFunction"
_RAW_SAVED_PREFIX = "_raw_saved_"
# The unpacked counterpart of ``_raw_saved_<name>``: generated C++ nodes, then custom autograd Functions.
_UNPACKED_PREFIXES = ("_saved_", "saved_")

_StorageKey = tuple[Any, int]  # (device, storage address)
Registration = Union[tuple[str, int, "torch.Tensor"], tuple[str, int, "torch.Tensor", tuple[Any, int]]]
"""``(name, iteration, tensor)``, optionally with ``(grad_fn, output_nr)`` taken at registration."""


def discover_edges(
    tensors: Sequence[Registration],
    parameters: Mapping[str, torch.Tensor],
    *,
    outputs: Collection[str] = (),
) -> list[TensorEdge]:
    """Edges between registered tensors and parameters, read from the alive autograd graphs.

    ``tensors`` lists ``(name, iteration, tensor)`` for every registered non-parameter tensor in
    registration order, or ``(name, iteration, tensor, (grad_fn, output_nr))`` with the tensor's autograd
    identity at registration (:func:`autograd_origin`), which an in-place op may have changed since;
    ``parameters`` maps each parameter's tensor name to the ``nn.Parameter``; ``outputs`` names the model's
    outputs, which consumers registered before them look through (see the module doc). Each path back from
    a registered tensor's ``grad_fn`` stops at the first registered tensor or parameter on it. Returns the
    edges sorted and without duplicates.

    >>> import torch
    >>> torch.manual_seed(0) and None
    >>> fc = torch.nn.Linear(3, 2)
    >>> x = torch.randn(4, 3, requires_grad=True)
    >>> y = torch.relu(fc(x) * 2)
    >>> for edge in discover_edges([("x", 0, x), ("y", 0, y)], {"fc.weight": fc.weight}):
    ...     print(edge)
    TensorEdge(source='fc.weight', target='y', source_iteration=0, target_iteration=0)
    TensorEdge(source='x', target='y', source_iteration=0, target_iteration=0)

    An input that does not require grad is found in what the ``Linear`` saved for backward
    (``AddmmBackward0._saved_mat1``), as long as backward has not freed it:

    >>> data = torch.randn(4, 3)
    >>> hidden = fc(data)
    >>> [(e.source, e.target) for e in discover_edges([("data", 0, data), ("hidden", 0, hidden)], {})]
    [('data', 'hidden')]
    >>> hidden.sum().backward()
    >>> discover_edges([("data", 0, data), ("hidden", 0, hidden)], {})
    []
    """
    walker = _Walker(tensors, parameters, outputs)
    return walker.edges()


def autograd_origin(tensor: torch.Tensor) -> tuple[Any, int]:
    """``(grad_fn, output_nr)`` of a tensor now: what a registration keeps, so that an in-place op on the
    tensor after its registration does not move its identity in the graph.

    >>> import torch
    >>> h = torch.ones(2, requires_grad=True) * 2
    >>> origin = autograd_origin(h)
    >>> h += 1
    >>> type(origin[0]).__name__, type(h.grad_fn).__name__
    ('MulBackward0', 'AddBackward0')
    """
    return tensor.grad_fn, tensor.output_nr


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


def _locate(tensor: torch.Tensor) -> tuple[_StorageKey, int, int, tuple[Any, ...]] | None:
    """``(storage, first byte, end byte, layout)`` of a tensor's elements within its storage.

    ``None`` for a tensor without addressable elements (empty, sparse, nested, meta, some subclasses).
    Bytes are counted from the storage's start; ``layout`` is ``(first byte, shape, stride, dtype)``.
    """
    try:
        if tensor.numel() == 0:
            return None
        address = tensor.untyped_storage().data_ptr()
        shape, stride = tuple(tensor.shape), tensor.stride()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    if address == 0:
        return None
    itemsize = tensor.element_size()
    start = tensor.storage_offset() * itemsize
    extent = 1 + sum((size - 1) * abs(step) for size, step in zip(shape, stride))
    return (tensor.device, address), start, start + extent * itemsize, (start, shape, stride, tensor.dtype)


class _Walker:
    """One discovery pass: identities of registered tensors, then a memoised walk of autograd."""

    def __init__(
        self, tensors: Sequence[Registration], parameters: Mapping[str, torch.Tensor], outputs: Collection[str] = ()
    ) -> None:
        self.names: list[tuple[str, int]] = []  # registration index -> (name, iteration)
        self.roots: list[Any] = []  # registration index -> grad_fn or None
        self.slot_of: list[int | None] = []  # registration index -> slot (None: invisible to autograd)
        self.output_slot: dict[tuple[Any, int], int] = {}  # (grad_fn, output_nr) -> slot
        self.slot_node: dict[int, Any] = {}  # slot of a non-leaf tensor -> the node that produced it
        self.sinks: set[int] = set()  # slots first registered as a model output (see the module doc)
        self.leaf_slot: dict[int, int] = {}  # id(leaf tensor) -> slot; the caller keeps the tensors alive
        self.registrations: list[list[int]] = []  # slot -> registration indices, ascending
        self.parameter_name: dict[int, str] = {}  # slot -> parameter name, for parameter slots
        self.memo: dict[Any, frozenset[int]] = {}  # autograd node -> slots reachable first
        self.accumulate_types: dict[type, bool] = {}
        # Grad-less tensors, found through saved tensors: per storage the byte ranges, and exact layouts.
        self.plain_ranges: dict[_StorageKey, list[tuple[int, int, int]]] = {}  # -> [(start, end, slot)]
        self.plain_slot: dict[tuple[_StorageKey, tuple[Any, ...]], int] = {}  # (storage, layout) -> slot
        self.saved_attributes: dict[type, tuple[tuple[str, str], ...]] = {}  # node type -> (raw, unpacked)
        outputs = set(outputs)
        for index, entry in enumerate(tensors):
            name, iteration, tensor = entry[0], entry[1], entry[2]
            grad_fn, output_nr = entry[3] if len(entry) > 3 else (tensor.grad_fn, tensor.output_nr)
            self.names.append((name, iteration))
            self.roots.append(grad_fn)
            slot = self._slot(tensor, grad_fn, output_nr)
            self.slot_of.append(slot)
            if slot is None:
                slot = self._plain_slot(tensor)
            if slot is not None:
                if not self.registrations[slot] and name in outputs and grad_fn is not None:
                    self.sinks.add(slot)
                self.registrations[slot].append(index)
        for name, parameter in parameters.items():
            slot = self._slot(parameter, parameter.grad_fn, parameter.output_nr)
            if slot is None:
                slot = self._plain_slot(parameter)
            if slot is not None and not self.registrations[slot] and slot not in self.parameter_name:
                self.parameter_name[slot] = name

    def _slot(self, tensor: torch.Tensor, grad_fn: Any, output_nr: int) -> int | None:
        """The slot of a tensor's identity, created on first sight; ``None`` if autograd cannot see it."""
        if grad_fn is not None:
            table: dict[Any, int] = self.output_slot
            key: Any = (grad_fn, output_nr)
        elif tensor.requires_grad:
            table, key = self.leaf_slot, id(tensor)
        else:
            return None
        slot = table.get(key)
        if slot is None:
            slot = table[key] = len(self.registrations)
            self.registrations.append([])
            if grad_fn is not None:
                self.slot_node[slot] = grad_fn
        return slot

    def _plain_slot(self, tensor: torch.Tensor) -> int | None:
        """The slot of a grad-less tensor (by storage and layout), created on first sight; ``None`` without
        addressable storage. Its registrations resolve like any slot's but never form a chain of edges."""
        located = _locate(tensor)
        if located is None:
            return None
        storage, start, end, layout = located
        slot = self.plain_slot.get((storage, layout))
        if slot is None:
            slot = self.plain_slot[(storage, layout)] = len(self.registrations)
            self.registrations.append([])
            self.plain_ranges.setdefault(storage, []).append((start, end, slot))
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
            for source, source_iteration in self._sources(root, index, iteration):
                if (source, source_iteration) != (name, iteration):
                    found.add(TensorEdge(source, name, source_iteration, iteration))
        return sorted(found)

    def _sources(self, root: Any, consumer: int, iteration: int) -> set[tuple[str, int]]:
        """``(name, iteration)`` of what the registration ``consumer`` (its node ``root``) depends on; a model
        output registered only after the consumer is looked through (see the module doc)."""
        found: set[tuple[str, int]] = set()
        pending, done = list(self._reach(root)), set()
        while pending:
            slot = pending.pop()
            if slot in done:
                continue
            done.add(slot)
            if slot in self.sinks and self.registrations[slot][0] > consumer:
                pending.extend(self._reach(self.slot_node[slot]))
                continue
            found.add(self._resolve(slot, consumer, iteration))
        return found

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
        if self.plain_ranges:
            direct |= self._saved_sources(node)
        return direct, children

    def _saved_sources(self, node: Any) -> set[int]:
        """Slots of the grad-less tensors ``node`` saved for backward (nothing once backward freed them)."""
        found: set[int] = set()
        for raw_name, unpacked_name in self._saved_names(node):
            try:
                raw = getattr(node, raw_name)
                packed = raw if isinstance(raw, (tuple, list)) else (raw,)
                if any(getattr(item, "unpack_hook", None) is not None for item in packed):
                    continue  # unpacking would run the hook: recompute a checkpointed region, copy from CPU
                value = getattr(node, unpacked_name)
            except RuntimeError:
                continue  # freed by backward, or modified in place since it was saved
            for tensor in value if isinstance(value, (tuple, list)) else (value,):
                if getattr(tensor, "requires_grad", True) is False:  # None, ints and SymInts have no flag
                    found.update(self._matches(tensor))
        return found

    def _saved_names(self, node: Any) -> tuple[tuple[str, str], ...]:
        """``(_raw_saved_<name>, unpacked name)`` pairs of the node's type, from ``dir`` once per type."""
        kind = type(node)
        names = self.saved_attributes.get(kind)
        if names is None:
            available = set(dir(node))
            pairs = []
            for raw_name in sorted(available):
                if raw_name.startswith(_RAW_SAVED_PREFIX):
                    suffix = raw_name[len(_RAW_SAVED_PREFIX):]
                    unpacked = [prefix + suffix for prefix in _UNPACKED_PREFIXES if prefix + suffix in available]
                    if unpacked:
                        pairs.append((raw_name, unpacked[0]))
            names = self.saved_attributes[kind] = tuple(pairs)
        return names

    def _matches(self, tensor: torch.Tensor) -> list[int]:
        """Slots of the registered grad-less tensors a saved tensor is, or is a view of (see the module doc)."""
        located = _locate(tensor)
        if located is None:
            return []
        storage, start, end, layout = located
        ranges = self.plain_ranges.get(storage)
        if not ranges:
            return []
        exact = self.plain_slot.get((storage, layout))
        if exact is not None:
            return [exact]
        containing = [(range_end - range_start, slot) for range_start, range_end, slot in ranges
                      if range_start <= start and end <= range_end]
        if not containing:
            return []
        smallest = min(width for width, _slot in containing)
        return [slot for width, slot in containing if width == smallest]

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
