"""Module boxes: the dependency graph drawn as a network is read, modules around their nodes.

Node names are dotted module paths: ``NeuralDbg`` names a module's output ``model.blocks.2.fc1``, its
parameters ``model.blocks.2.fc1.parameters`` and a second call ``model.relu#1``; ``Recorder.track_module``
names the parameters of ``model[0]`` ``model.0``. Every dotted prefix shared by two or more nodes is a
*module box* (a box and the single box inside it that holds the same nodes are one box, the inner one). A
box is *collapsed* (drawn as one node standing for everything inside) or *expanded* (drawn as a frame
around its contents), so a 500-node network opens as a few dozen boxes and unfolds where one looks.

:func:`visible_graph` turns a graph and the set of collapsed boxes into what is drawn: visible nodes and
collapsed boxes, the frames of expanded boxes, and the edges between what is visible (several edges
between the contents of two boxes are one edge with a count). It also

- splits edges into a later iteration (``iteration``) by what they carry: ``recurrent`` when they feed a
  node that comes earlier or is the same (state fed back; they do not order columns), ``across`` when they
  go on forward (a loss summed over the iterations' outputs; they order columns like ``forward`` edges);
- leaves out edges implied by a longer path (``a -> c`` beside ``a -> b -> c``: the skip connections a
  residual stream shows from every block to every later one), which changes no node's ancestors;
- leaves out parameter nodes without any edge (parameters the step did not use).

Pure functions over :mod:`comgra_ndbg.graph.model` values; no dash, no I/O.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from comgra_ndbg.graph.groups import merge_boxes
from comgra_ndbg.graph.layout import back_edges, implied_edges
from comgra_ndbg.graph.model import (KIND_FORWARD, KIND_ITERATION, KIND_MANUAL, PARAMETER_ROLE, DependencyGraph,
                                     GraphError)

__all__ = ["BOX_PREFIX", "KIND_ACROSS", "KIND_RECURRENT", "LAYERING", "ModuleBoxes", "VisibleEdge", "VisibleGraph",
           "VisibleItem", "box_id", "default_collapsed", "edge_kinds", "module_boxes", "natural_key", "reveal", "toggle", "unused_parameters", "visible_graph"]

BOX_PREFIX = "box:"  # ids of boxes, so that a box and a node of the same name (a module and its output) differ
KIND_RECURRENT = "recurrent"  # into a later iteration, back to the same or an earlier node
KIND_ACROSS = "across"  # into a later iteration, on forward
LAYERING = (KIND_FORWARD, KIND_MANUAL, KIND_ACROSS)  # the kinds that order columns
DEFAULT_LIMIT = 40  # things drawn (nodes and collapsed boxes) the first view aims at
_KIND_RANK = {KIND_FORWARD: 0, KIND_ACROSS: 1, KIND_MANUAL: 2, KIND_RECURRENT: 3}


def natural_key(name: str) -> tuple:
    """Sort key that orders the numbers inside names by value: ``blocks.2`` before ``blocks.10``.

    >>> sorted(["b.10", "b.2", "a"], key=natural_key)
    ['a', 'b.2', 'b.10']
    """
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part)


def box_id(path: str) -> str:
    """The element id of the box of module ``path``.

    >>> box_id("model.blocks.0")
    'box:model.blocks.0'
    """
    return BOX_PREFIX + path


@dataclass(frozen=True)
class ModuleBoxes:
    """The boxes of a set of node names: ``paths`` outer first; ``parent`` of every node and box (the path
    of the innermost box around it, None at the top); ``members`` the nodes inside each box, in name
    order; ``depth`` of each box (0 at the top)."""

    names: tuple[str, ...]
    paths: tuple[str, ...]
    parent: Mapping[str, str | None] = field(hash=False)
    members: Mapping[str, tuple[str, ...]] = field(hash=False)
    depth: Mapping[str, int] = field(hash=False)
    contents: Mapping[str | None, tuple[tuple[str, bool], ...]] = field(hash=False, default_factory=dict)

    def ancestors(self, name: str, *, box: bool = False) -> list[str]:
        """The boxes around node (or, with ``box=True``, box) ``name``, outermost first."""
        chain = []
        parent = self.parent.get(box_id(name) if box else name)
        while parent is not None:
            chain.append(parent)
            parent = self.parent.get(box_id(parent))
        return chain[::-1]

    def children(self, path: str | None) -> list[tuple[str, bool]]:
        """``(name, is_box)`` of what lies directly in box ``path`` (None: the top), boxes by path and nodes by
        name, in name order."""
        return list(self.contents.get(path, ()))


def _within(name: str, path: str) -> bool:
    return name == path or name.startswith(path + ".")


def module_boxes(names: Iterable[str], groups: Mapping[str, Sequence[str]] | None = None) -> ModuleBoxes:
    """The module boxes of ``names``: each dotted prefix shared by at least two names; with ``groups`` (a
    box path -> its nodes, :func:`comgra_ndbg.graph.groups.parameter_groups`) those boxes too, each drawn
    whole (:func:`comgra_ndbg.graph.groups.merge_boxes`).

    >>> boxes = module_boxes(["input", "model.enc.0", "model.enc.0.parameters", "model.enc.1", "model.head"])
    >>> boxes.paths
    ('model', 'model.enc', 'model.enc.0')
    >>> boxes.parent["model.enc.0.parameters"], boxes.members["model.enc"]
    ('model.enc.0', ('model.enc.0', 'model.enc.0.parameters', 'model.enc.1'))
    """
    names = tuple(sorted(set(names)))
    found: dict[str, list[str]] = {}
    for name in names:
        parts = name.split(".")
        for k in range(1, len(parts) + 1):
            found.setdefault(".".join(parts[:k]), []).append(name)
    members = {p: tuple(m) for p, m in found.items() if len(m) >= 2}
    if groups:
        members, box_parent, node_parent = merge_boxes(names, members, groups)
        return _nested(names, members, {**{box_id(p): q for p, q in box_parent.items()}, **node_parent})
    by_content: dict[tuple[str, ...], str] = {}
    for path in sorted(members, key=lambda p: (p.count("."), p)):
        by_content[members[path]] = path  # of equal boxes the inner (longer) one stays
    kept = set(by_content.values())

    def innermost(name: str, *, own: bool) -> str | None:
        parts = name.split(".")
        for k in range(len(parts) if own else len(parts) - 1, 0, -1):
            if ".".join(parts[:k]) in kept:
                return ".".join(parts[:k])
        return None

    paths = sorted(kept, key=lambda p: (p.count("."), p))
    parent: dict[str, str | None] = {box_id(p): innermost(p, own=False) for p in paths}
    parent.update({name: innermost(name, own=True) for name in names})
    return _nested(names, {p: members[p] for p in paths}, parent)


def _nested(names: tuple[str, ...], members: Mapping[str, tuple[str, ...]],
            parent: dict[str, str | None]) -> ModuleBoxes:
    """The boxes ``members`` (path -> nodes) nested by ``parent`` (of each box id and node name)."""
    paths = sorted(members, key=lambda p: (p.count("."), p))
    depth: dict[str, int] = {}
    for path in paths:  # outer first, so a parent's depth is known
        depth[path] = _depth(path, parent, depth)
    contents: dict[str | None, list[tuple[str, bool]]] = {}
    for path in paths:
        contents.setdefault(parent[box_id(path)], []).append((path, True))
    for name in names:
        contents.setdefault(parent[name], []).append((name, False))
    return ModuleBoxes(names, tuple(sorted(paths, key=lambda p: (depth[p], p))), parent, dict(members), depth,
                       {k: tuple(sorted(v, key=lambda c: natural_key(c[0]))) for k, v in contents.items()})


def _depth(path: str, parent: Mapping[str, str | None], depth: dict[str, int]) -> int:
    above = parent[box_id(path)]
    if above is None:
        return 0
    if above not in depth:  # a group's parent need not have fewer dots than the group
        depth[above] = _depth(above, parent, depth)
    return depth[above] + 1


def _drawn(boxes: ModuleBoxes, collapsed: frozenset[str], path: str | None = None) -> int:
    """How many things are drawn inside box ``path`` (None: everything) with ``collapsed`` boxes closed."""
    count = 0
    for name, is_box in boxes.children(path):
        count += (1 if name in collapsed else _drawn(boxes, collapsed, name)) if is_box else 1
    return count


def default_collapsed(boxes: ModuleBoxes, limit: int = DEFAULT_LIMIT) -> tuple[str, ...]:
    """The boxes to collapse so that at most about ``limit`` things are drawn: every box from the deepest
    depth at which the count fits, then boxes of that depth opened one by one (those that add least first)
    while it still fits. A graph that fits whole is drawn whole.

    >>> names = [f"m.b{i}.{part}" for i in range(30) for part in ("fc", "act")] + ["input", "loss"]
    >>> collapsed = default_collapsed(module_boxes(names))
    >>> len(collapsed), collapsed[:2]
    (22, ('m.b8', 'm.b9'))
    >>> default_collapsed(module_boxes(names), limit=100)
    ()
    """
    chosen = frozenset(boxes.paths)
    for depth in range(max(boxes.depth.values(), default=-1) + 2):
        candidate = frozenset(p for p in boxes.paths if boxes.depth[p] >= depth)
        if _drawn(boxes, candidate) > limit:
            break
        chosen = candidate
    count = _drawn(boxes, chosen)
    frontier = [p for p in boxes.paths if p in chosen and all(a not in chosen for a in boxes.ancestors(p, box=True))]
    for cost, _, path in sorted((len(boxes.children(p)) - 1, natural_key(p), p) for p in frontier):
        if count + cost <= limit:
            chosen, count = chosen - {path}, count + cost
    return tuple(sorted(chosen, key=lambda p: (boxes.depth[p], natural_key(p))))


def reveal(boxes: ModuleBoxes, collapsed: Iterable[str], name: str) -> tuple[str, ...]:
    """``collapsed`` without the boxes around node ``name``, so that it is drawn."""
    around = set(boxes.ancestors(name))
    return tuple(p for p in collapsed if p not in around)


def toggle(collapsed: Iterable[str], path: str) -> tuple[str, ...]:
    """``collapsed`` with box ``path`` opened when it was closed, closed when it was open.

    >>> toggle(("a", "b"), "a"), toggle(("b",), "a")
    (('b',), ('a', 'b'))
    """
    collapsed = tuple(collapsed)
    return tuple(p for p in collapsed if p != path) if path in collapsed else tuple(sorted((*collapsed, path)))


@dataclass(frozen=True)
class VisibleItem:
    """Something drawn: a ``node`` (id = its name), a collapsed ``box`` or the ``frame`` of an expanded box
    (id ``box:<path>``); ``parent`` the id of the frame around it; ``label`` its name relative to that
    frame; ``members`` the graph nodes it shows; ``role`` the node's role (``module`` for boxes)."""

    id: str
    name: str
    kind: str
    role: str
    parent: str | None
    label: str
    members: tuple[str, ...]


@dataclass(frozen=True, order=True)
class VisibleEdge:
    """An edge between two drawn things, standing for ``count`` edges between the nodes they show."""

    source: str
    target: str
    kind: str
    count: int = 1


@dataclass(frozen=True)
class VisibleGraph:
    """What is drawn (see the module doc): ``items`` (nodes and collapsed boxes), ``frames``, ``edges``;
    ``implied`` edges and ``unused`` parameter nodes left out; ``shown_as`` maps each graph node to the id
    of the item that shows it (nodes left out have none)."""

    items: tuple[VisibleItem, ...]
    frames: tuple[VisibleItem, ...]
    edges: tuple[VisibleEdge, ...]
    implied: int
    unused: tuple[str, ...]
    shown_as: Mapping[str, str] = field(hash=False)
    boxes: ModuleBoxes = field(hash=False)

    def item(self, item_id: str) -> VisibleItem:
        for item in self.items + self.frames:
            if item.id == item_id:
                return item
        raise GraphError(f"nothing drawn has id {item_id!r}")


def unused_parameters(graph: DependencyGraph) -> tuple[str, ...]:
    """Parameter nodes without any edge: parameters the step did not use."""
    linked = {e.source for e in graph.edges} | {e.target for e in graph.edges}
    return tuple(n.name for n in graph.nodes if n.role == PARAMETER_ROLE and n.name not in linked)


def edge_kinds(graph: DependencyGraph) -> dict[tuple[str, str, str], str]:
    """Each edge ``(source, target, kind)`` of ``graph`` -> the kind it is drawn as: ``iteration`` edges become
    ``recurrent`` or ``across`` (see the module doc); the others keep theirs."""
    successors: dict[str, set[str]] = {}
    for e in graph.edges:
        if e.kind in (KIND_FORWARD, KIND_MANUAL):
            successors.setdefault(e.source, set()).add(e.target)

    def reaches(start: str, goal: str) -> bool:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in successors.get(frontier.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        return False

    kinds = {}
    for e in graph.edges:
        kind = e.kind
        if kind == KIND_ITERATION:
            kind = KIND_RECURRENT if e.source == e.target or reaches(e.target, e.source) else KIND_ACROSS
        kinds[(e.source, e.target, e.kind)] = kind
    return kinds


def visible_graph(graph: DependencyGraph, collapsed: Iterable[str] = (), *, show_implied: bool = False,
                  show_unused: bool = False, boxes: ModuleBoxes | None = None) -> VisibleGraph:
    """What is drawn of ``graph`` with the boxes ``collapsed`` closed (paths that are no box are ignored).

    ``boxes`` are the module boxes of all of ``graph``'s nodes (computed when not given); a box holding only
    unused parameters is not drawn while they are left out."""
    unused = unused_parameters(graph)
    hidden = set() if show_unused else set(unused)
    roles = {n.name: n.role for n in graph.nodes}
    boxes = boxes if boxes is not None else module_boxes(graph.node_names)
    closed = set(collapsed) & set(boxes.paths)
    shown_as: dict[str, str] = {}
    for name in boxes.names:
        if name in hidden:
            continue
        shut = [p for p in boxes.ancestors(name) if p in closed]
        shown_as[name] = box_id(shut[0]) if shut else name
    items, frames = [], []
    for path in boxes.paths:
        if any(a in closed for a in boxes.ancestors(path, box=True)) or set(boxes.members[path]) <= hidden:
            continue
        parent = boxes.parent[box_id(path)]
        shown = tuple(m for m in boxes.members[path] if m not in hidden)
        entry = VisibleItem(box_id(path), path, "box" if path in closed else "frame", "module",
                            box_id(parent) if parent else None, _relative(path, parent), shown)
        (items if path in closed else frames).append(entry)
    for name in boxes.names:
        if shown_as.get(name) == name:
            parent = boxes.parent[name]
            items.append(VisibleItem(name, name, "node", roles[name], box_id(parent) if parent else None,
                                     _relative(name, parent), (name,)))
    edges, implied = _edges(graph, shown_as, show_implied)
    frames.sort(key=lambda f: (f.name.count("."), f.id))
    return VisibleGraph(tuple(_distinct_labels(sorted(items, key=lambda i: i.id))), tuple(_distinct_labels(frames)),
                        edges, implied, unused, shown_as, boxes)


def _relative(name: str, parent: str | None) -> str:
    if parent is None:
        return name
    return name[len(parent) + 1:] if name.startswith(parent + ".") else name.rpartition(".")[2]


def _distinct_labels(items: Sequence[VisibleItem]) -> list[VisibleItem]:
    """Labels relative to the frame are distinct among its contents, except for a node named like its own
    frame (a module's output beside the module's parts), labelled by its last part: when that meets a
    sibling's label, the node shows its full name."""
    seen: dict[tuple[str | None, str], int] = {}
    for item in items:
        seen[(item.parent, item.label)] = seen.get((item.parent, item.label), 0) + 1
    return [replace(item, label=item.name) if seen[(item.parent, item.label)] > 1 else item for item in items]


def _edges(graph: DependencyGraph, shown_as: Mapping[str, str], show_implied: bool
           ) -> tuple[tuple[VisibleEdge, ...], int]:
    kinds = edge_kinds(graph)
    counts: dict[tuple[str, str], int] = {}
    kind_of: dict[tuple[str, str], str] = {}
    for e in graph.edges:
        if e.source not in shown_as or e.target not in shown_as:
            continue
        source, target, kind = shown_as[e.source], shown_as[e.target], kinds[(e.source, e.target, e.kind)]
        if source == target and (kind != KIND_RECURRENT or source != e.source):
            continue  # inside one box; a node's own recurrent loop stays
        pair = (source, target)
        counts[pair] = counts.get(pair, 0) + 1
        if pair not in kind_of or _KIND_RANK[kind] < _KIND_RANK[kind_of[pair]]:
            kind_of[pair] = kind
    edges = [VisibleEdge(s, t, kind_of[(s, t)], counts[(s, t)]) for s, t in sorted(counts)]
    if show_implied:
        return tuple(edges), 0
    ids = sorted({x for s, t in counts for x in (s, t)})
    index = {x: i for i, x in enumerate(ids)}
    layering = [(index[e.source], index[e.target]) for e in edges if e.kind in LAYERING and e.source != e.target]
    back = back_edges(len(ids), layering)
    implied = implied_edges(len(ids), [p for p in layering if p not in back])
    kept = [e for e in edges if (index[e.source], index[e.target]) not in implied or e.kind not in LAYERING]
    return tuple(kept), len(edges) - len(kept)
