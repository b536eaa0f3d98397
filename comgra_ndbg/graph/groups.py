"""Parameter groups: boxes of parameter nodes chosen by name prefixes, beside the module boxes.

Module boxes (:mod:`comgra_ndbg.graph.compound`) follow the dots of node names. A *parameter group* is a
box the user asks for by a prefix of parameter names, as Comgra's
``prefixes_for_grouping_module_parameters_visually`` does: every parameter node belongs to the first
prefix it starts with (more specific prefixes come first), whether or not the prefix ends at a dot
(``"model.attn_"`` groups ``model.attn_q`` and ``model.attn_k``). A group of fewer than two nodes, and the
prefix ``""`` (everything), draw no box.

:func:`merge_boxes` joins the two kinds into one nested family: a group takes the place of a module box
with the same members or the same path, and a module box that would cut through a group (holding part of
it and something outside it) is dropped, so the group is drawn whole. Pure functions over names; no I/O.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from comgra_ndbg.graph.model import DependencyGraph

__all__ = ["merge_boxes", "parameter_groups"]


def parameter_groups(graph: DependencyGraph, prefixes: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Each prefix with the parameter nodes of ``graph`` it is the first to match, sorted; prefixes that
    match fewer than two nodes, and ``""``, are left out.

    >>> from comgra_ndbg.graph.model import GraphNode
    >>> def parameter(name):
    ...     return GraphNode(name, "parameter", name, (name + ".weight",), True)
    >>> nodes = tuple(parameter(n) for n in ("m.attn_k", "m.attn_q", "m.ff", "m.head"))
    >>> parameter_groups(DependencyGraph(nodes, ()), ["m.attn_", "m"])
    {'m.attn_': ('m.attn_k', 'm.attn_q'), 'm': ('m.ff', 'm.head')}
    """
    found: dict[str, list[str]] = {prefix: [] for prefix in prefixes if prefix}
    for node in graph.nodes:
        if node.is_parameter_group:
            prefix = next((p for p in prefixes if node.name.startswith(p)), None)
            if prefix:
                found[prefix].append(node.name)
    return {prefix: tuple(sorted(names)) for prefix, names in found.items() if len(names) >= 2}


def merge_boxes(names: Iterable[str], modules: Mapping[str, tuple[str, ...]],
                groups: Mapping[str, Sequence[str]]) -> tuple[dict[str, tuple[str, ...]], dict[str, str | None],
                                                              dict[str, str | None]]:
    """The boxes drawn when ``groups`` join the module boxes ``modules`` (path -> members, before equal
    boxes are merged): ``(members, parent of each box path, parent of each node)``. The groups are disjoint
    and the module boxes nest, so what is kept nests: each node's parent is the smallest box holding it,
    each box's parent the smallest box holding more.

    >>> modules = {"m": ("m.attn_k", "m.attn_k.x", "m.attn_q", "m.out"), "m.attn_k": ("m.attn_k", "m.attn_k.x")}
    >>> members, box_parent, node_parent = merge_boxes(["m.attn_k", "m.attn_k.x", "m.attn_q", "m.out"], modules,
    ...                                                {"m.attn_": ("m.attn_k", "m.attn_q")})
    >>> sorted(members), box_parent, node_parent["m.attn_q"], node_parent["m.attn_k.x"]
    (['m', 'm.attn_'], {'m': None, 'm.attn_': 'm'}, 'm.attn_', 'm')
    """
    names = tuple(names)
    chosen: dict[str, frozenset[str]] = {path: frozenset(members) for path, members in groups.items()}
    taken = set(chosen.values())
    for path, members in sorted(modules.items(), key=lambda item: (-item[0].count("."), item[0])):
        box = frozenset(members)
        if path in chosen or box in taken or any(_crosses(box, group) for group in chosen.values()):
            continue  # a group of that name or content stands for it; a box that cuts a group is not drawn
        chosen[path] = box
        taken.add(box)
    order = sorted(chosen, key=lambda p: (-len(chosen[p]), p))  # larger boxes first: the last holder is smallest
    box_parent: dict[str, str | None] = {}
    for path in order:
        holders = [other for other in order if other != path and chosen[path] < chosen[other]]
        box_parent[path] = holders[-1] if holders else None
    node_parent: dict[str, str | None] = {}
    for name in names:
        holders = [path for path in order if name in chosen[path]]
        node_parent[name] = holders[-1] if holders else None
    return {path: tuple(sorted(chosen[path])) for path in order}, box_parent, node_parent


def _crosses(box: frozenset[str], group: frozenset[str]) -> bool:
    return bool(box & group) and not box <= group and not group <= box
