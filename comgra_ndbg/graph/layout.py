"""Node positions for the dependency graph: a layered (Sugiyama-style) drawing, left to right.

The GUI passes these positions to dash-cytoscape as a ``preset`` layout, because a layout computed in the
browser does not scale. Steps, all deterministic (ties are broken by node name):

1. *cycles*: only ``forward`` and ``manual`` edges order columns (``iteration`` edges and self loops are
   drawn but do not count); a cycle among them (possible only through manual edges) is broken by
   reversing the edges that close it in a depth-first search in name order;
2. *layering*: longest path from the sources gives each node its column; then every source that is not
   an input (parameters, targets, constants) moves to the column just before its first consumer;
3. *ordering*: edges implied by a longer path (``a -> c`` beside ``a -> b -> c``: the skip connections of
   residual networks, which autograd shows from every earlier block to every later one) do not take part;
   the others, when longer than one column, get dummy points in the columns they cross, and a few
   barycenter sweeps (down, then up) reorder each column; the order with the fewest crossings is kept;
4. *coordinates*: ``column_spacing`` pixels between columns, ``row_spacing`` between rows, each column
   centred on ``y = 0``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from comgra_ndbg.graph.model import LAYERING_KINDS, DependencyGraph

__all__ = ["assign_layers", "back_edges", "count_crossings", "layered_layout", "ordered_columns", "implied_edges"]

INPUT_ROLE = "input"


def layered_layout(
    graph: DependencyGraph,
    *,
    column_spacing: float = 180.0,
    row_spacing: float = 80.0,
    sweeps: int = 4,
) -> dict[str, tuple[float, float]]:
    """Pixel position ``(x, y)`` of every node; ``sweeps=0`` keeps name order within each column.

    >>> from comgra_ndbg.graph.model import GraphEdge, GraphNode
    >>> def node(name, role="intermediate"):
    ...     return GraphNode(name, role, "", (name,), role == "parameter", (role,))
    >>> graph = DependencyGraph(
    ...     (node("fc", "parameter"), node("h"), node("out"), node("x", "input")),
    ...     (GraphEdge("fc", "h", "forward"), GraphEdge("h", "out", "forward"), GraphEdge("x", "h", "forward")),
    ... )
    >>> layered_layout(graph)
    {'fc': (0.0, -40.0), 'h': (180.0, 0.0), 'out': (360.0, 0.0), 'x': (0.0, 40.0)}
    """
    names = [node.name for node in graph.nodes]
    index = {name: i for i, name in enumerate(names)}
    columns = ordered_columns(len(names), _layering_pairs(graph, index),
                              [_pulls_right(node.role) for node in graph.nodes], sweeps=sweeps)
    positions: dict[str, tuple[float, float]] = {}
    for column_number, column in enumerate(columns):
        real = [v for v in column if v < len(names)]
        middle = (len(real) - 1) / 2
        for row, v in enumerate(real):
            positions[names[v]] = (float(column_number * column_spacing), float((row - middle) * row_spacing))
    return dict(sorted(positions.items()))


def ordered_columns(count: int, edges: Iterable[tuple[int, int]], pulls_right: Sequence[bool], *,
                    sweeps: int = 4) -> list[list[int]]:
    """Steps 1–3 on a graph of ``count`` nodes given as index pairs: the columns, left to right, each a list
    of node indices top to bottom. ``pulls_right[v]``: a source that moves next to its first consumer.

    >>> ordered_columns(4, [(0, 1), (1, 2), (0, 2), (3, 2)], [False, True, True, True])
    [[0], [1, 3], [2]]
    """
    acyclic = _acyclic_edges(count, edges)
    layer = _layers(count, acyclic, pulls_right)
    implied = implied_edges(count, acyclic)
    return [[v for v in column if v < count]
            for column in _order(count, layer, [e for e in acyclic if e not in implied], sweeps)]


def implied_edges(count: int, edges: Sequence[tuple[int, int]]) -> set[tuple[int, int]]:
    """The edges of a DAG (index pairs) that a longer path also connects: ``(0, 2)`` beside ``0 -> 1 -> 2``.
    Removing them keeps every node's ancestors and descendants (the transitive reduction).

    >>> sorted(implied_edges(3, [(0, 1), (1, 2), (0, 2)]))
    [(0, 2)]
    """
    successors: list[list[int]] = [[] for _ in range(count)]
    for u, v in edges:
        successors[u].append(v)
    reach = [0] * count  # bit w of reach[u]: w is a descendant of u
    for u in reversed(_topological(count, edges)):
        for v in successors[u]:
            reach[u] |= reach[v] | (1 << v)
    implied = set()
    for u in range(count):
        beyond = 0
        for v in successors[u]:
            beyond |= reach[v]
        implied.update((u, v) for v in successors[u] if beyond >> v & 1)
    return implied


def assign_layers(graph: DependencyGraph) -> dict[str, int]:
    """The column of every node (steps 1 and 2 of the module doc), by name."""
    names = [node.name for node in graph.nodes]
    index = {name: i for i, name in enumerate(names)}
    edges = _acyclic_edges(len(names), _layering_pairs(graph, index))
    layer = _layers(len(names), edges, [_pulls_right(node.role) for node in graph.nodes])
    return {name: layer[i] for i, name in enumerate(names)}


def count_crossings(graph: DependencyGraph, positions: Mapping[str, tuple[float, float]]) -> int:
    """Pairs of ``forward``/``manual`` edges that cross between two neighbouring columns of ``positions``.

    Only edges from one column to the next are counted (drawn as straight segments, two of them cross
    when their ends are in opposite order); longer edges and edges within a column are ignored.
    """
    columns = sorted({x for x, _y in positions.values()})
    column_of = {x: i for i, x in enumerate(columns)}
    by_column: dict[int, list[tuple[float, float]]] = {}
    for source, target in sorted({(e.source, e.target) for e in graph.edges if e.kind in LAYERING_KINDS}):
        (x0, y0), (x1, y1) = positions[source], positions[target]
        if column_of[x1] == column_of[x0] + 1:
            by_column.setdefault(column_of[x0], []).append((y0, y1))
    return sum(_inversions(pairs) for pairs in by_column.values())


def _pulls_right(role: str) -> bool:
    return role != INPUT_ROLE


def _layering_pairs(graph: DependencyGraph, index: Mapping[str, int]) -> list[tuple[int, int]]:
    pairs = {
        (index[e.source], index[e.target])
        for e in graph.edges
        if e.kind in LAYERING_KINDS and e.source != e.target
    }
    return sorted(pairs)


def back_edges(count: int, edges: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    """Edges closing a cycle in an iterative depth-first search from nodes in index order."""
    successors: list[list[int]] = [[] for _ in range(count)]
    for u, v in edges:
        successors[u].append(v)
    state = [0] * count  # 0 unseen, 1 on the DFS path, 2 done
    back: set[tuple[int, int]] = set()
    for start in range(count):
        if state[start]:
            continue
        state[start] = 1
        stack = [(start, 0)]
        while stack:
            u, i = stack[-1]
            if i == len(successors[u]):
                state[u] = 2
                stack.pop()
                continue
            stack[-1] = (u, i + 1)
            v = successors[u][i]
            if state[v] == 1:
                back.add((u, v))
            elif state[v] == 0:
                state[v] = 1
                stack.append((v, 0))
    return back


def _acyclic_edges(count: int, edges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``edges`` with those closing a cycle reversed."""
    edges = list(edges)
    back = back_edges(count, edges)
    return sorted({(v, u) if (u, v) in back else (u, v) for u, v in edges})


def _topological(count: int, edges: Sequence[tuple[int, int]]) -> list[int]:
    indegree = [0] * count
    successors: list[list[int]] = [[] for _ in range(count)]
    for u, v in edges:
        successors[u].append(v)
        indegree[v] += 1
    ready = [v for v in range(count) if indegree[v] == 0]
    ready.reverse()
    order = []
    while ready:
        u = ready.pop()
        order.append(u)
        for v in successors[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    return order


def _layers(count: int, edges: Sequence[tuple[int, int]], pulls_right: Sequence[bool]) -> list[int]:
    """Longest-path layering, then non-input sources moved next to their first consumer."""
    predecessors: list[list[int]] = [[] for _ in range(count)]
    successors: list[list[int]] = [[] for _ in range(count)]
    for u, v in edges:
        predecessors[v].append(u)
        successors[u].append(v)
    layer = [0] * count
    for v in _topological(count, edges):
        if predecessors[v]:
            layer[v] = max(layer[u] for u in predecessors[v]) + 1
    for v in range(count):
        if pulls_right[v] and not predecessors[v] and successors[v]:
            layer[v] = min(layer[w] for w in successors[v]) - 1
    lowest = min(layer, default=0)
    return [value - lowest for value in layer]


def _order(count: int, layer: Sequence[int], edges: Sequence[tuple[int, int]], sweeps: int) -> list[list[int]]:
    """Columns of node indices (dummy points have indices >= ``count``), ordered to reduce crossings."""
    layer = list(layer)
    successors: list[list[int]] = [[] for _ in range(count)]
    predecessors: list[list[int]] = [[] for _ in range(count)]
    for u, v in edges:
        previous = u
        for column in range(layer[u] + 1, layer[v]):
            dummy = len(layer)
            layer.append(column)
            successors.append([])
            predecessors.append([])
            successors[previous].append(dummy)
            predecessors[dummy].append(previous)
            previous = dummy
        successors[previous].append(v)
        predecessors[v].append(previous)
    columns: list[list[int]] = [[] for _ in range(max(layer, default=-1) + 1)]
    for v in range(len(layer)):  # names are sorted, so index order is name order; dummy points last
        columns[layer[v]].append(v)
    best = [list(column) for column in columns]
    best_crossings = _total_crossings(columns, successors)
    for _ in range(sweeps):
        for i in range(1, len(columns)):
            _reorder(columns[i], columns[i - 1], predecessors)
        for i in range(len(columns) - 2, -1, -1):
            _reorder(columns[i], columns[i + 1], successors)
        crossings = _total_crossings(columns, successors)
        if crossings < best_crossings:
            best, best_crossings = [list(column) for column in columns], crossings
    return best


def _reorder(column: list[int], fixed: list[int], neighbours: list[list[int]]) -> None:
    """Sort ``column`` in place by the mean position of each node's neighbours in the ``fixed`` column."""
    position = {v: i for i, v in enumerate(fixed)}
    current = {v: i for i, v in enumerate(column)}

    def barycenter(v: int) -> float:
        near = [position[w] for w in neighbours[v] if w in position]
        if not near:
            return current[v] * len(fixed) / max(len(column), 1)
        return sum(near) / len(near)

    column.sort(key=lambda v: (barycenter(v), current[v]))


def _total_crossings(columns: list[list[int]], successors: list[list[int]]) -> int:
    total = 0
    for i in range(len(columns) - 1):
        position = {v: p for p, v in enumerate(columns[i + 1])}
        pairs = [(p, position[w]) for p, v in enumerate(columns[i]) for w in successors[v] if w in position]
        total += _inversions(pairs)
    return total


def _inversions(pairs: list[tuple[float, float]]) -> int:
    """Pairs of segments ``(a, b)`` with ``a1 < a2`` and ``b1 > b2``: a Fenwick tree over ranks of ``b``."""
    pairs = sorted(pairs)
    ranks = {b: r for r, b in enumerate(sorted({b for _a, b in pairs}), start=1)}
    tree = [0] * (len(ranks) + 1)
    inversions = 0
    seen = 0
    start = 0
    while start < len(pairs):
        end = start
        while end < len(pairs) and pairs[end][0] == pairs[start][0]:
            end += 1
        for _a, b in pairs[start:end]:  # segments sharing a left end never cross each other
            r, not_greater = ranks[b], 0
            while r > 0:
                not_greater += tree[r]
                r -= r & -r
            inversions += seen - not_greater
        for _a, b in pairs[start:end]:
            r = ranks[b]
            while r < len(tree):
                tree[r] += 1
                r += r & -r
            seen += 1
        start = end
    return inversions
