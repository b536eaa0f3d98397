"""Pure builders of what cytoscape draws: the elements of a drawn graph, its stylesheet per theme, the
diagnosis marks on nodes, and node colours mapped from a statistic.

The elements carry everything the browser needs to react without the server: each item's kind (``node``,
collapsed ``box``, expanded ``frame`` — a cytoscape compound parent), its full name for the hover line,
and its parent frame. The selection's lineage (dependencies ringed blue, dependents red, the rest faded)
and the statistic colours are applied in the browser by classes and a ``heat`` data field
(:mod:`comgra_ndbg.gui.clientside`), so neither a tap nor a step resends the elements or the stylesheet.
No dash import, no I/O.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from comgra_ndbg.analysis.events import Event
from comgra_ndbg.graph.compound import VisibleGraph
from comgra_ndbg.graph.nested_layout import FRAME_PADDING, NODE_SIZE, item_size
from comgra_ndbg.gui.timelines import EVENT_COLOR, viridis

__all__ = ["Mark", "ROLE_COLORS", "event_classes", "graph_elements", "graph_stylesheet", "heat_colours", "item_marks",
           "item_values"]

ROLE_COLORS: dict[str, str] = {
    "input": "#4C9BE8",
    "target": "#8E6CC9",
    "parameter": "#7F8C8D",
    "intermediate": "#F0A030",
    "output": "#3CB371",
    "loss": "#E0474C",
    "module": "#A5B4C8",
}
OTHER_ROLE_COLOR = "#B0B0B0"
MISSING_COLOR = "#9CA3AF"  # a node without the statistic being coloured
UPSTREAM_COLOR = "#1F77B4"
DOWNSTREAM_COLOR = "#D62728"
ORIGIN_COLOR = "#D62728"  # the origin node of the top hypothesis
ITERATION_COLOR = "#8E6CC9"
GRAPH_THEMES = {
    "light": {"text": "#1f2937", "edge": "#9AA5B1", "frame": "#f3f6fa", "frame-border": "#c9d3df",
              "selected": "#111111"},
    "dark": {"text": "#e5e7eb", "edge": "#6b7280", "frame": "#1c2533", "frame-border": "#3b4a5e",
             "selected": "#ffffff"},
}


@dataclass(frozen=True)
class Mark:
    """The diagnosis on one drawn item: its classes (``has-event``, ``event-origin``) and badge text."""

    classes: str
    badge: str


def event_classes(event_nodes: Iterable[str], origin: str | None) -> dict[str, str]:
    """Node -> the classes that mark it in the graph: ``has-event`` for every node with an event,
    ``event-origin`` for the origin node of the top hypothesis.

    >>> event_classes(["h", "out", "h"], "h")
    {'h': 'has-event event-origin', 'out': 'has-event'}
    """
    marks = {node: "has-event" for node in event_nodes}
    if origin:
        marks[origin] = f"{marks[origin]} event-origin" if origin in marks else "event-origin"
    return marks


def item_marks(view: VisibleGraph, events: Iterable[Event], origin: str | None) -> dict[str, Mark]:
    """Drawn item -> its :class:`Mark`: a node names its first event's new state (``⚑ saturated``, ``+2``
    more), a collapsed box counts the events inside it (``⚑ 3 events``)."""
    found: dict[str, list[Event]] = {}
    for event in sorted(events, key=lambda e: (e.onset, e.node)):
        item = view.shown_as.get(event.node)
        if item is not None:
            found.setdefault(item, []).append(event)
    classes = event_classes(found, view.shown_as.get(origin) if origin else None)
    marks = {}
    for item, css in classes.items():
        listed = found.get(item, [])
        if item.startswith("box:"):
            badge = f"⚑ {len(listed)} event{'s' if len(listed) != 1 else ''}" if listed else ""
        else:
            badge = f"⚑ {listed[0].to_state}" + (f" +{len(listed) - 1}" if len(listed) > 1 else "") if listed else ""
        marks[item] = Mark(css, badge)
    return marks


def graph_elements(view: VisibleGraph, positions: Mapping[str, tuple[float, float]],
                   marks: Mapping[str, Mark] | None = None) -> list[dict[str, Any]]:
    """Cytoscape elements: frames (compound parents, placed by their contents), nodes and collapsed boxes at
    their preset positions, and one edge per drawn edge (``source->target:kind``, its ``count``)."""
    marks = marks or {}
    elements: list[dict[str, Any]] = []
    for frame in view.frames:
        data = {"id": frame.id, "label": frame.label, "full": frame.name, "kind": "frame", "role": "module",
                "members": len(frame.members)}
        if frame.parent:
            data["parent"] = frame.parent
        elements.append({"data": data, "classes": "frame"})
    for item in view.items:
        mark = marks.get(item.id)
        badge = f"\n{mark.badge}" if mark and mark.badge else ""
        data = {"id": item.id, "label": item.label + badge, "full": item.name, "kind": item.kind, "role": item.role,
                "members": len(item.members)}
        if item.kind == "box":
            width, height = item_size(item)
            data.update(w=width, h=height, label=f"{item.label} ({len(item.members)}){badge}")
        if item.parent:
            data["parent"] = item.parent
        classes = f"role-{item.role}" + (" parameter" if item.role == "parameter" else "") + \
            (" box" if item.kind == "box" else "") + (f" {mark.classes}" if mark else "")
        x, y = positions.get(item.id, (0.0, 0.0))
        elements.append({"data": data, "position": {"x": float(x), "y": float(y)}, "classes": classes})
    for edge in view.edges:
        elements.append({"data": {"id": f"{edge.source}->{edge.target}:{edge.kind}", "source": edge.source,
                                  "target": edge.target, "kind": edge.kind, "count": edge.count},
                         "classes": f"edge-{edge.kind}"})
    return elements


def graph_stylesheet(theme: str = "light") -> list[dict[str, Any]]:
    """The cytoscape stylesheet: colours by role, collapsed boxes and frames, edge styles by kind, the
    statistic colour (``heat`` data), the selection's lineage classes (``focus``, ``up``, ``down``,
    ``faded``, set in the browser) and the diagnosis halos, which never fade."""
    c = GRAPH_THEMES.get(theme, GRAPH_THEMES["light"])
    sheet: list[dict[str, Any]] = [
        {"selector": "node", "style": {"label": "data(label)", "background-color": OTHER_ROLE_COLOR, "font-size": 11,
                                       "text-valign": "bottom", "text-margin-y": 4, "width": NODE_SIZE,
                                       "height": NODE_SIZE, "color": c["text"], "text-wrap": "wrap",
                                       "text-max-width": "160px"}},
        {"selector": "node.parameter", "style": {"shape": "round-rectangle", "width": 34, "height": 18}},
        {"selector": "node.box", "style": {"shape": "round-rectangle", "width": "data(w)", "height": "data(h)",
                                           "text-valign": "center", "text-margin-y": 0, "border-width": 1,
                                           "border-color": c["frame-border"], "font-size": 10}},
        {"selector": "node.frame", "style": {"background-color": c["frame"], "background-opacity": 1,
                                             "border-color": c["frame-border"], "border-width": 1,
                                             "shape": "round-rectangle", "padding": f"{FRAME_PADDING:g}px",
                                             "text-valign": "top", "text-halign": "center", "text-margin-y": -2,
                                             "font-size": 10, "color": c["text"]}},
        {"selector": "edge", "style": {"curve-style": "bezier", "target-arrow-shape": "triangle",
                                       "width": "mapData(count, 1, 40, 1.2, 4)", "line-color": c["edge"],
                                       "target-arrow-color": c["edge"], "arrow-scale": 0.8}},
        {"selector": "edge.edge-manual", "style": {"line-style": "dashed"}},
        {"selector": "edge.edge-across", "style": {"line-color": ITERATION_COLOR, "target-arrow-color": ITERATION_COLOR,
                                                   "line-style": "dashed"}},
        {"selector": "edge.edge-recurrent", "style": {"line-style": "dotted", "line-color": ITERATION_COLOR,
                                                      "target-arrow-color": ITERATION_COLOR,
                                                      "curve-style": "unbundled-bezier", "control-point-distances": 40,
                                                      "loop-direction": "0deg", "loop-sweep": "-60deg"}},
    ]
    sheet += [{"selector": f".role-{role}", "style": {"background-color": color}}
              for role, color in ROLE_COLORS.items() if role != "module"]
    sheet += [
        {"selector": "node.box", "style": {"background-color": ROLE_COLORS["module"]}},
        {"selector": "node[heat]", "style": {"background-color": "data(heat)"}},
        {"selector": ".faded", "style": {"opacity": 0.25}},
        {"selector": "node.up", "style": {"opacity": 1, "border-width": 3, "border-color": UPSTREAM_COLOR}},
        {"selector": "node.down", "style": {"opacity": 1, "border-width": 3, "border-color": DOWNSTREAM_COLOR}},
        {"selector": "edge.up, edge.down", "style": {"opacity": 1, "width": 2.5}},
        {"selector": "node.has-event", "style": {"opacity": 1, "underlay-color": EVENT_COLOR,
                                                 "underlay-opacity": 0.55, "underlay-padding": 7,
                                                 "underlay-shape": "ellipse"}},
        {"selector": "node.event-origin", "style": {"opacity": 1, "underlay-color": ORIGIN_COLOR,
                                                    "underlay-opacity": 0.6, "underlay-padding": 10,
                                                    "underlay-shape": "ellipse", "font-weight": "bold"}},
        {"selector": "node.focus", "style": {"opacity": 1, "border-width": 4, "border-color": c["selected"],
                                             "font-weight": "bold"}},
    ]
    return sheet


def item_values(view: VisibleGraph, node_values: Mapping[str, float], *, log: bool) -> dict[str, float]:
    """Drawn item -> the value it is coloured by: a node its own; a collapsed box the value of the member
    farthest from the median of all nodes (in decades when ``log``), so a box shows where inside it
    something stands out — a gradient that died or values that blew up.

    >>> from comgra_ndbg.graph.compound import visible_graph
    >>> from comgra_ndbg.graph.model import DependencyGraph, GraphNode
    >>> nodes = tuple(GraphNode(n, "intermediate", "", (n,), False, ("intermediate",)) for n in ("b.x", "b.y", "c"))
    >>> item_values(visible_graph(DependencyGraph(nodes, ()), ("b",)), {"b.x": 1.0, "b.y": 1e-6, "c": 2.0}, log=True)
    {'box:b': 1e-06, 'c': 2.0}
    """
    scale = (lambda v: np.log10(v) if v > 0 else -np.inf) if log else (lambda v: v)
    finite = [scale(v) for v in node_values.values() if np.isfinite(scale(v))]
    middle = float(np.median(finite)) if finite else 0.0
    values = {}
    for item in view.items:
        members = [(m, node_values[m]) for m in item.members if m in node_values]
        members = [(m, v) for m, v in members if np.isfinite(scale(v))]
        if members:
            values[item.id] = max(members, key=lambda mv: (abs(scale(mv[1]) - middle), mv[0]))[1]
    return values


def heat_colours(values: Mapping[str, float], items: Iterable[str], low: float, high: float, *, log: bool
                 ) -> dict[str, str]:
    """Item -> ``#rrggbb`` on the viridis scale from ``low`` to ``high`` (decades when ``log``); items without a
    finite value are grey.

    >>> heat_colours({"a": 10.0, "b": 1e-3}, ["a", "b", "c"], -3.0, 1.0, log=True)
    {'a': '#fde725', 'b': '#440154', 'c': '#9CA3AF'}
    """
    span = (high - low) if np.isfinite(high - low) and high > low else 1.0
    colours = {}
    for item in items:
        value = values.get(item, float("nan"))
        shown = (np.log10(value) if value > 0 else float("nan")) if log else value
        colours[item] = viridis((shown - low) / span) if np.isfinite(shown) else MISSING_COLOR
    return colours
