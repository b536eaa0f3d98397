"""Discover a structure once: a cheap signature of a step's registrations, and a cache keyed by it.

Discovery walks the whole autograd graph; doing it every recorded step would cost as much as the
statistics themselves. The recorder computes :func:`structure_signature` (a few attribute reads per
registered tensor, no tensor work) and asks :class:`GraphCache` for the graph of ``(signature, step
type)``: only a signature not seen before pays for discovery.

The signature covers what cheaply tells structures apart: registered names and iterations, rank, dtype,
whether grad is required, the type of the producing autograd function and its output index, and the
parameter names with whether each is frozen (a frozen parameter is reached only through saved tensors). It
leaves out sizes, so a changed batch size or sequence length does not trigger a rediscovery. Control flow
that changes edges without changing any of these (a branch between two ops of the same type) is not
detected; give such steps different step types.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from comgra_ndbg.graph.discovery import Registration
from comgra_ndbg.graph.model import DependencyGraph, GraphError
from comgra_ndbg.graph.serialize import structure_hash

if TYPE_CHECKING:
    import torch

__all__ = ["CachedGraph", "GraphCache", "registration_key", "signature_of", "structure_signature"]

_REQUIRES_GRAD = attrgetter("requires_grad")


def registration_key(name: str, iteration: int, tensor: torch.Tensor, origin: tuple[Any, int]) -> tuple:
    """One registration's part of :func:`structure_signature`: its name and iteration, the tensor's rank, dtype
    and whether it requires grad, and the type of its producing function (``origin``: ``(grad_fn,
    output_nr)`` as the registration saw them) with its output index. The recorder keeps these as tensors
    are registered, so a step's signature is one tuple of them.

    >>> import torch
    >>> registration_key("h", 0, torch.ones(2, 3), (None, 0))
    ('h', 0, (2, torch.float32, False, <class 'NoneType'>), 0)
    """
    return name, iteration, (tensor.ndim, tensor.dtype, tensor.requires_grad, type(origin[0])), origin[1]


def structure_signature(tensors: Sequence[Registration], parameters: Mapping[str, torch.Tensor]) -> tuple:
    """A key for the structure a step's registrations imply (see the module doc), for this process's
    cache: a tuple of attribute reads, no string formatting and no hashing beyond the dict lookup. The
    producing function is the one at registration when the entry carries it (``discover_edges``).

    >>> import torch
    >>> a = torch.ones(2, 3, requires_grad=True) * 2
    >>> b = torch.ones(5, 3, requires_grad=True) * 2
    >>> structure_signature([("h", 0, a)], {}) == structure_signature([("h", 0, b)], {})
    True
    >>> structure_signature([("h", 0, a)], {}) == structure_signature([("h", 1, a)], {})
    False
    """
    registered = tuple(registration_key(entry[0], entry[1], entry[2], entry[3] if len(entry) > 3 else
                                        (entry[2].grad_fn, entry[2].output_nr)) for entry in tensors)
    return signature_of(registered, parameters)


def signature_of(keys: Sequence[tuple], parameters: Mapping[str, torch.Tensor]) -> tuple:
    """:func:`structure_signature` from the registrations' :func:`registration_key`, in C-level passes."""
    return tuple(keys), tuple(parameters), tuple(map(_REQUIRES_GRAD, parameters.values()))


@dataclass(frozen=True)
class CachedGraph:
    """What :meth:`GraphCache.get_or_build` returns.

    ``built`` says whether ``build`` ran for this call; ``new_structure`` whether this hash was never
    returned by the cache before, i.e. whether the store still has to save the graph.
    """

    graph: DependencyGraph
    structure_hash: str
    built: bool
    new_structure: bool


class GraphCache:
    """Graphs by ``(signature, step type)``, least recently used first out beyond ``max_entries``.

    >>> from comgra_ndbg.graph.structure import build_graph
    >>> cache = GraphCache()
    >>> build = lambda: build_graph([], {"x": ("x", "input", "")})
    >>> cache.get_or_build("sig", "train", build).built
    True
    >>> second = cache.get_or_build("sig", "train", build)
    >>> second.built, second.new_structure, cache.hits, cache.misses
    (False, False, 1, 1)
    """

    def __init__(self, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise GraphError(f"GraphCache needs max_entries >= 1, got {max_entries}")
        self._max_entries = max_entries
        self._entries: OrderedDict[tuple[Hashable, str], tuple[DependencyGraph, str]] = OrderedDict()
        self._known_hashes: set[str] = set()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, signature: Hashable, step_type: str) -> CachedGraph | None:
        """The cached graph for this key, or ``None``; counts a hit or a miss."""
        entry = self._entries.get((signature, step_type))
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end((signature, step_type))
        return CachedGraph(entry[0], entry[1], built=False, new_structure=False)

    def put(self, signature: Hashable, step_type: str, graph: DependencyGraph) -> CachedGraph:
        """Remember ``graph`` for this key; returns it with its hash and whether the hash is new."""
        digest = structure_hash(graph)
        new_structure = digest not in self._known_hashes
        self._known_hashes.add(digest)
        self._entries[(signature, step_type)] = (graph, digest)
        self._entries.move_to_end((signature, step_type))
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return CachedGraph(graph, digest, built=True, new_structure=new_structure)

    def get_or_build(
        self, signature: Hashable, step_type: str, build: Callable[[], DependencyGraph]
    ) -> CachedGraph:
        """The cached graph for this key, or ``build()``'s graph, remembered; ``build`` runs only on a miss."""
        cached = self.get(signature, step_type)
        return cached if cached is not None else self.put(signature, step_type, build())

    def clear(self) -> None:
        """Forget every graph and hash (a new recording starts)."""
        self._entries.clear()
        self._known_hashes.clear()
        self.hits = 0
        self.misses = 0
