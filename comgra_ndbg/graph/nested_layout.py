"""Positions for a graph drawn with module frames: a layered layout inside every frame, frames as blocks.

The flat layered layout (:mod:`comgra_ndbg.graph.layout`) places nodes in columns by their longest path;
drawn with frames around modules, its columns would interleave one module's nodes with another's and the
frames would overlap. Here every expanded box is laid out on its own, innermost first — its contents
(nodes, collapsed boxes, inner frames as blocks of their size) in columns by the edges among them (an
edge from or into a frame's contents counts as the frame's) — and then placed as one block in the layout
of the box around it. So frames never overlap, and the forward direction stays left to right at every
level. Sizes are in the pixels the explorer draws with: a node's label lies under it, a collapsed box
holds its label.
"""
from __future__ import annotations

from collections.abc import Mapping

from comgra_ndbg.graph.compound import LAYERING, VisibleGraph, VisibleItem
from comgra_ndbg.graph.layout import ordered_columns

__all__ = ["FRAME_PADDING", "FRAME_TITLE", "item_size", "nested_layout"]

FRAME_PADDING = 14.0  # px between a frame's edge and its contents (the stylesheet's compound padding)
FRAME_TITLE = 18.0  # px above a frame taken by its label
NODE_SIZE = 26.0
BOX_HEIGHT = 40.0  # two lines: the name with its node count, and the diagnosis badge
CHARACTER = 6.6  # px per character of an 11 px label


def item_size(item: VisibleItem) -> tuple[float, float]:
    """Width and height a drawn item takes, label included.

    >>> item_size(VisibleItem("h", "h", "node", "intermediate", None, "hidden", ("h",)))
    (39.6, 44.0)
    """
    if item.kind == "box":
        return round(max(64.0, CHARACTER * (len(item.label) + 6) + 16.0), 1), BOX_HEIGHT
    return round(max(NODE_SIZE + 4.0, CHARACTER * len(item.label)), 1), NODE_SIZE + 18.0


def nested_layout(view: VisibleGraph, *, gap_x: float = 46.0, gap_y: float = 22.0,
                  sizes: Mapping[str, tuple[float, float]] | None = None) -> dict[str, tuple[float, float]]:
    """The centre of every item of ``view`` (nodes and collapsed boxes; frames take the bounds of their
    contents), in pixels. ``sizes`` overrides :func:`item_size` per item id.

    >>> from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode
    >>> from comgra_ndbg.graph.compound import visible_graph
    >>> def node(name, role="intermediate"):
    ...     return GraphNode(name, role, "", (name,), role == "parameter", (role,))
    >>> graph = DependencyGraph((node("input", "input"), node("m.a"), node("m.b"), node("out", "output")),
    ...     (GraphEdge("input", "m.a", "forward"), GraphEdge("m.a", "m.b", "forward"),
    ...      GraphEdge("m.b", "out", "forward")))
    >>> nested_layout(visible_graph(graph))
    {'input': (16.5, 45.0), 'm.a': (108.0, 54.0), 'm.b': (184.0, 54.0), 'out': (274.0, 45.0)}
    """
    sizes = dict(sizes or {})
    parents = {item.id: item.parent for item in view.items + view.frames}
    contents: dict[str | None, list[VisibleItem]] = {}
    for item in view.frames + view.items:
        contents.setdefault(item.parent, []).append(item)
    edges = [(e.source, e.target) for e in view.edges if e.kind in LAYERING and e.source != e.target]
    inputs = {m for item in view.items if item.kind == "node" and item.role == "input" for m in item.members}

    def chain(item_id: str) -> list[str]:
        found = [item_id]
        while parents.get(found[-1]) is not None:
            found.append(parents[found[-1]])  # type: ignore[arg-type]
        return found

    chains = {item_id: chain(item_id) for item_id in parents}

    def place(frame: str | None) -> tuple[dict[str, tuple[float, float]], float, float]:
        children = sorted(contents.get(frame, []), key=lambda i: i.id)
        index = {child.id: i for i, child in enumerate(children)}
        inner: dict[str, tuple[dict[str, tuple[float, float]], float, float]] = {}
        size = []
        for child in children:
            if child.kind == "frame":
                inner[child.id] = place(child.id)
                _, width, height = inner[child.id]
                size.append((width + 2 * FRAME_PADDING, height + 2 * FRAME_PADDING + FRAME_TITLE))
            else:
                size.append(sizes.get(child.id) or item_size(child))
        pairs = set()
        for source, target in edges:
            a = next((x for x in chains[source] if x in index), None)
            b = next((x for x in chains[target] if x in index), None)
            if a is not None and b is not None and a != b:
                pairs.add((index[a], index[b]))
        pulls = [not set(child.members) <= inputs for child in children]
        columns = ordered_columns(len(children), sorted(pairs), pulls)
        widths = [max(size[v][0] for v in column) for column in columns]
        heights = [sum(size[v][1] for v in column) + gap_y * (len(column) - 1) for column in columns]
        total_width = sum(widths) + gap_x * max(len(columns) - 1, 0)
        total_height = max(heights, default=0.0)
        placed: dict[str, tuple[float, float]] = {}
        x = -total_width / 2
        for column, width, height in zip(columns, widths, heights):
            y = -height / 2
            for v in column:
                child = children[v]
                cx, cy = x + width / 2, y + size[v][1] / 2
                if child.kind == "frame":
                    offset = FRAME_TITLE / 2  # the title sits above the contents
                    for item_id, (ix, iy) in inner[child.id][0].items():
                        placed[item_id] = (cx + ix, cy + offset + iy)
                else:
                    placed[child.id] = (cx, cy)
                y += size[v][1] + gap_y
            x += width + gap_x
        return placed, total_width, total_height

    positions, width, height = place(None)
    return {k: (round(x + width / 2, 1), round(y + height / 2, 1)) for k, (x, y) in sorted(positions.items())}
