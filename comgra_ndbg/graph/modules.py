"""The module hierarchy of tracked parameters, with parameter counts per module.

Parameter tensor names are dotted paths (``"model.encoder.0.weight"``): everything before the last dot is
the owning module, and every prefix of it an ancestor. From names and element counts alone this module
rebuilds the tree the GUI shows next to the graph and that :func:`comgra_ndbg.graph.structure.collapse_modules`
takes prefixes from. Pure: no torch, no module objects.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from comgra_ndbg.graph.model import GraphError

__all__ = ["ModuleInfo", "module_tree"]


@dataclass(frozen=True)
class ModuleInfo:
    """One module: its path, parent (``None`` for a top module), depth (0 for a top module), the
    parameter elements it owns directly and in total (with its submodules), and its own parameters' names.
    The root module of a bare model, which owns the parameters whose names have no dot, has path ``""`` and
    is then the parent of every top module."""

    path: str
    parent: str | None
    depth: int
    own_parameters: int
    total_parameters: int
    parameter_names: tuple[str, ...]
    children: tuple[str, ...]


def module_tree(named_parameters: Mapping[str, int]) -> list[ModuleInfo]:
    """Modules in depth-first order, children in the order their first parameter appears.

    ``named_parameters`` maps parameter names to element counts, e.g.
    ``{name: p.numel() for name, p in model.named_parameters()}``; raises :class:`GraphError` for an
    empty name or a negative count.

    >>> for info in module_tree({"m.enc.weight": 6, "m.enc.bias": 2, "m.head.weight": 4}):
    ...     print(info.path, info.depth, info.own_parameters, info.total_parameters)
    m 0 0 12
    m.enc 1 8 8
    m.head 1 4 4
    """
    own: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    children: dict[str | None, list[str]] = {None: []}
    has_root = any("." not in name for name in named_parameters)
    for name, count in named_parameters.items():
        if not name or name.startswith(".") or name.endswith(".") or ".." in name:
            raise GraphError(f"parameter name {name!r} is not a dotted path such as 'model.encoder.weight'")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise GraphError(f"parameter {name!r} has element count {count!r}; pass p.numel() (an int >= 0)")
        module = name.rpartition(".")[0]
        parts = module.split(".") if module else []
        paths = [""] if has_root else []
        paths += [".".join(parts[: i + 1]) for i in range(len(parts))]
        parent: str | None = None
        for path in paths:
            if path not in own:
                own[path] = []
                counts[path] = 0
                children[path] = []
                children[parent].append(path)
            counts[path] += count
            parent = path
        own[module].append(name)
    result: list[ModuleInfo] = []
    stack = [(path, None, 0) for path in reversed(children[None])]
    while stack:
        path, parent, depth = stack.pop()
        result.append(
            ModuleInfo(
                path=path,
                parent=parent,
                depth=depth,
                own_parameters=sum(named_parameters[name] for name in own[path]),
                total_parameters=counts[path],
                parameter_names=tuple(own[path]),
                children=tuple(children[path]),
            )
        )
        stack.extend((child, path, depth + 1) for child in reversed(children[path]))
    return result
