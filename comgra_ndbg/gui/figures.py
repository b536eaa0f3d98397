"""Pure figure builders: numpy arrays and graph objects in, plain dicts out (plotly figures, cytoscape
elements and stylesheets). No dash import, no I/O, so every builder is tested by comparing dicts.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from comgra_ndbg.analysis.events import Event
from comgra_ndbg.graph import DependencyGraph

__all__ = [
    "ROLE_COLORS",
    "as_matrix",
    "event_annotations",
    "event_classes",
    "event_shapes",
    "event_text",
    "format_number",
    "graph_elements",
    "graph_stylesheet",
    "heatmap_figure",
    "histogram_figure",
    "kpi_figure",
    "lineage",
    "message_figure",
    "statistics_rows",
    "step_marker",
    "timeline_figure",
    "value_rows",
]

ROLE_COLORS: dict[str, str] = {
    "input": "#4C9BE8",
    "target": "#8E6CC9",
    "parameter": "#7F8C8D",
    "intermediate": "#F0A030",
    "output": "#3CB371",
    "loss": "#E0474C",
}
OTHER_ROLE_COLOR = "#B0B0B0"
UPSTREAM_COLOR = "#1F77B4"
DOWNSTREAM_COLOR = "#D62728"
SELECTED_COLOR = "#111111"
STEP_TYPE_COLORS = ("#1F77B4", "#FF7F0E", "#2CA02C", "#9467BD", "#8C564B", "#E377C2", "#17BECF")
MARKER_COLOR = "#D62728"
EVENT_COLOR = "#F28C28"  # nodes with events, event lines on timelines
ORIGIN_COLOR = "#D62728"  # the origin node of the top hypothesis
LARGE_SERIES = 2000  # points above which a line trace is drawn with WebGL
BASE_LAYOUT: dict[str, Any] = {"margin": {"l": 50, "r": 10, "t": 40, "b": 40}, "template": "plotly_white"}
TITLE_FONT: dict[str, Any] = {"size": 13}


def _title(text: str) -> dict[str, Any]:
    """A plot title at the top left, clear of the mode bar at the top right."""
    return {"text": text, "font": TITLE_FONT, "x": 0.0, "xanchor": "left", "xref": "paper", "y": 0.98,
            "yanchor": "top", "yref": "container"}


# ---- graph ------------------------------------------------------------------------------------------------
def graph_elements(graph: DependencyGraph, positions: Mapping[str, tuple[float, float]],
                   marks: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Cytoscape elements: one node per graph node at its preset position, one edge per node edge.

    Node data carries ``role`` (it drives the colour) and ``label`` (the name's last two dotted parts, so
    long module paths stay readable); edge ids are ``source->target:kind``. ``marks`` adds classes to
    nodes (:func:`event_classes`: ``has-event``, ``event-origin``).
    """
    marks = marks or {}
    elements: list[dict[str, Any]] = []
    for node in graph.nodes:
        x, y = positions.get(node.name, (0.0, 0.0))
        classes = f"role-{node.role}" + (" parameter" if node.is_parameter_group else "")
        elements.append({
            "data": {"id": node.name, "label": _short(node.name), "role": node.role,
                     "tensors": len(node.tensors)},
            "position": {"x": float(x), "y": float(y)},
            "classes": f"{classes} {marks[node.name]}" if marks.get(node.name) else classes,
        })
    for edge in graph.edges:
        elements.append({
            "data": {"id": f"{edge.source}->{edge.target}:{edge.kind}", "source": edge.source,
                     "target": edge.target, "kind": edge.kind},
            "classes": f"edge-{edge.kind}",
        })
    return elements


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


def lineage(graph: DependencyGraph, node: str) -> tuple[list[str], list[str]]:
    """``(dependencies, dependents)`` of ``node``: every node it was computed from, and every node computed
    from it, transitively, each sorted. Iteration edges count (state carried forward is a dependency)."""
    def walk(step: Any) -> list[str]:
        seen: set[str] = set()
        frontier = [node]
        while frontier:
            for other in step(frontier.pop()):
                if other not in seen and other != node:
                    seen.add(other)
                    frontier.append(other)
        return sorted(seen)
    return walk(graph.predecessors), walk(graph.successors)


def graph_stylesheet(selected: str | None, dependencies: Sequence[str] = (), dependents: Sequence[str] = (),
                     edges: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """The cytoscape stylesheet: colours by role, edge styles by kind, and the selected node's lineage when a
    node is selected: dependencies ringed blue, dependents red, the ``(source, target)`` edges among them
    drawn bold, everything else faded. Nodes marked by :func:`event_classes` always carry a halo (orange: it
    has events; red: origin of the top hypothesis)."""
    sheet: list[dict[str, Any]] = [
        {"selector": "node", "style": {"label": "data(label)", "background-color": OTHER_ROLE_COLOR,
                                       "font-size": 11, "text-valign": "bottom", "text-margin-y": 4,
                                       "width": 26, "height": 26, "color": "#222"}},
        {"selector": "node.parameter", "style": {"shape": "round-rectangle", "width": 34, "height": 18}},
        {"selector": "edge", "style": {"curve-style": "bezier", "target-arrow-shape": "triangle",
                                       "width": 1.5, "line-color": "#9AA5B1", "target-arrow-color": "#9AA5B1"}},
        {"selector": "edge.edge-manual", "style": {"line-style": "dashed"}},
        {"selector": "edge.edge-iteration", "style": {"line-style": "dotted", "line-color": "#8E6CC9",
                                                      "target-arrow-color": "#8E6CC9"}},
    ]
    sheet += [{"selector": f".role-{role}", "style": {"background-color": color}}
              for role, color in ROLE_COLORS.items()]
    if selected is None:
        return sheet + _event_styles()
    sheet.append({"selector": "node, edge", "style": {"opacity": 0.25}})
    for name, color in [(n, UPSTREAM_COLOR) for n in dependencies] + [(n, DOWNSTREAM_COLOR) for n in dependents]:
        sheet.append({"selector": f'node[id = "{name}"]', "style": {"opacity": 1, "border-width": 3,
                                                                    "border-color": color}})
    upstream, downstream = {selected, *dependencies}, {selected, *dependents}
    for source, target in sorted(set(edges)):
        if {source, target} <= upstream or {source, target} <= downstream:
            sheet.append({"selector": f'edge[source = "{source}"][target = "{target}"]',
                          "style": {"opacity": 1, "width": 2.5}})
    sheet += _event_styles()
    sheet.append({"selector": f'node[id = "{selected}"]', "style": {
        "opacity": 1, "border-width": 4, "border-color": SELECTED_COLOR, "width": 34, "height": 34,
        "font-weight": "bold"}})
    return sheet


def _event_styles() -> list[dict[str, Any]]:
    """Marked nodes get a halo (cytoscape's underlay), so the mark never competes with the lineage rings,
    and stay opaque when a selection fades the rest: the diagnosis is never faded out."""
    return [
        {"selector": "node.has-event", "style": {"opacity": 1, "underlay-color": EVENT_COLOR,
                                                 "underlay-opacity": 0.55, "underlay-padding": 7,
                                                 "underlay-shape": "ellipse"}},
        {"selector": "node.event-origin", "style": {"opacity": 1, "underlay-color": ORIGIN_COLOR,
                                                    "underlay-opacity": 0.6, "underlay-padding": 10,
                                                    "underlay-shape": "ellipse", "font-weight": "bold"}},
    ]


def _short(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 2 else name


# ---- tensor views -----------------------------------------------------------------------------------------
def format_number(value: float) -> str:
    """A statistic as text: integers exactly, other numbers with 6 significant digits, NaN as ``—``.

    >>> format_number(3.0), format_number(0.000123456789), format_number(float("nan")), format_number(float("inf"))
    ('3', '0.000123457', '—', 'inf')
    """
    if np.isnan(value):
        return "—"
    if np.isinf(value):
        return "inf" if value > 0 else "-inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def statistics_rows(stats: Mapping[str, float]) -> list[tuple[str, str]]:
    """``(name, formatted value)`` rows of a statistics table, in the order of ``stats``."""
    return [(name, format_number(float(value))) for name, value in stats.items()]


def histogram_figure(values: np.ndarray, *, title: str, bins: int = 40) -> dict[str, Any]:
    """A bar chart of the finite element values; non-finite values are counted in the title, not binned.

    The bins are computed here (not by plotly), so the figure holds exactly the counts a test can check.
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
    suffix = f" · {nan} NaN, {inf} ±Inf not shown" if nan or inf else ""
    if not len(finite):
        return message_figure(f"{title}: no finite value{suffix}")
    low, high = float(finite.min()), float(finite.max())
    if low == high:
        low, high = low - 0.5, high + 0.5
    counts, edges = np.histogram(finite, bins=bins, range=(low, high))
    centres = (edges[:-1] + edges[1:]) / 2
    return {
        "data": [{"type": "bar", "x": centres.tolist(), "y": counts.tolist(), "width": float(edges[1] - edges[0]),
                  "marker": {"color": "#4C72B0"}, "hovertemplate": "%{x:.4g}: %{y}<extra></extra>"}],
        "layout": {**BASE_LAYOUT, "title": _title(f"{title} · {len(finite)} values{suffix}"),
                   "bargap": 0.02, "xaxis": {"title": {"text": "value"}}, "yaxis": {"title": {"text": "count"}}},
    }


def as_matrix(values: np.ndarray) -> np.ndarray:
    """A 2-D view of an array: a scalar is 1×1, a vector one row, higher ranks keep the last axis as columns.

    >>> as_matrix(np.zeros((2, 3, 4))).shape, as_matrix(np.float32(1.0)).shape, as_matrix(np.zeros(5)).shape
    ((6, 4), (1, 1), (1, 5))
    """
    values = np.asarray(values)
    if values.ndim == 0:
        return values.reshape(1, 1)
    if values.ndim == 1:
        return values.reshape(1, -1)
    return values.reshape(-1, values.shape[-1])


def heatmap_figure(matrix: np.ndarray, *, title: str, row_label: str = "row",
                   column_label: str = "column") -> dict[str, Any]:
    """A heatmap of a 2-D array (row 0 at the top); NaN cells (positions not stored) stay blank."""
    matrix = np.asarray(matrix, dtype=np.float64)
    z = [[None if not np.isfinite(v) else float(v) for v in row] for row in matrix]
    return {
        "data": [{"type": "heatmap", "z": z, "colorscale": "RdBu", "reversescale": True, "zmid": 0.0,
                  "hovertemplate": f"{row_label} %{{y}}, {column_label} %{{x}}: %{{z:.5g}}<extra></extra>"}],
        "layout": {**BASE_LAYOUT, "title": _title(title),
                   "yaxis": {"autorange": "reversed", "title": {"text": row_label}},
                   "xaxis": {"title": {"text": column_label}}},
    }


def value_rows(values: np.ndarray, shape: tuple[int, ...], positions: np.ndarray | None, *, page: int,
               page_size: int = 50, first_axis: np.ndarray | None = None) -> tuple[list[tuple[str, str]], int]:
    """One page of ``(position, value)`` rows of stored element values, and the number of pages.

    ``positions`` are the flat indices of ``values`` in an array of ``shape`` (``None``: every element, in C
    order); a position is shown as the element's index tuple, its first index replaced by
    ``first_axis[index]`` when given (the batch position of a stored sample).

    >>> value_rows(np.array([1.5, 2.0, 3.0]), (3,), None, page=0, page_size=2)
    ([('(0,)', '1.5'), ('(1,)', '2')], 2)
    >>> value_rows(np.array([7.0]), (2, 2), np.array([3]), page=0, first_axis=np.array([4, 9]))
    ([('(9, 1)', '7')], 1)
    """
    values = np.asarray(values).ravel()
    pages = max(1, -(-len(values) // page_size))
    page = int(np.clip(page, 0, pages - 1))
    chosen = slice(page * page_size, (page + 1) * page_size)
    flat = np.arange(len(values))[chosen] if positions is None else np.asarray(positions)[chosen]
    shape = shape if shape else (1,)
    rows = []
    for p, v in zip(flat, values[chosen]):
        index = [int(i) for i in np.unravel_index(int(p), shape)]
        if first_axis is not None:
            index[0] = int(first_axis[index[0]])
        rows.append((str(tuple(index)), format_number(float(v))))
    return rows, pages


def step_marker(step: int | None) -> list[dict[str, Any]]:
    """The vertical line that marks the current step on a timeline (none when no step is selected)."""
    if step is None:
        return []
    return [{"type": "line", "xref": "x", "yref": "paper", "x0": step, "x1": step, "y0": 0, "y1": 1,
             "line": {"color": MARKER_COLOR, "width": 2}}]


def event_text(event: Event) -> str:
    """One line describing an event, as hover text and table titles.

    >>> event_text(Event("activation_regime", "h", "value", "normal", "saturated", 10, 29, 0.9, 0.7))
    'activation_regime: normal → saturated · h (value) · steps 10–29 · magnitude 0.9 · strength 0.7'
    """
    return (f"{event.family}: {event.from_state} → {event.to_state} · {event.node} ({event.kind}) · steps "
            f"{event.onset}–{event.end} · magnitude {format_number(event.magnitude)} · strength "
            f"{format_number(event.strength)}")


def _by_onset(events: Sequence[Event]) -> dict[int, list[Event]]:
    grouped: dict[int, list[Event]] = {}
    for event in sorted(events, key=lambda e: (e.onset, e.node, e.family, e.kind)):
        grouped.setdefault(int(event.onset), []).append(event)
    return grouped


def event_shapes(events: Sequence[Event]) -> list[dict[str, Any]]:
    """A dashed vertical line at each distinct onset step of ``events`` (a timeline's event marks)."""
    return [{"type": "line", "xref": "x", "yref": "paper", "x0": onset, "x1": onset, "y0": 0, "y1": 1,
             "line": {"color": EVENT_COLOR, "width": 1.5, "dash": "dash"}} for onset in _by_onset(events)]


def event_annotations(events: Sequence[Event]) -> list[dict[str, Any]]:
    """A label at the top of each event line: the new states, with every event of that onset as hover text."""
    return [{"x": onset, "xref": "x", "y": 1, "yref": "paper", "yanchor": "top", "xanchor": "left",
             "showarrow": False, "text": " · ".join(dict.fromkeys(f"⚑ {e.to_state}" for e in group)),
             "hovertext": "<br>".join(event_text(e) for e in group), "font": {"size": 10, "color": EVENT_COLOR},
             "bgcolor": "rgba(255,255,255,0.85)"} for onset, group in _by_onset(events).items()]


def timeline_figure(curves: Mapping[str, tuple[np.ndarray, np.ndarray]], *, title: str, y_label: str,
                    step: int | None, events: Sequence[Event] = ()) -> dict[str, Any]:
    """One line per step type (its steps against a statistic), the current step marked, and ``events`` (of
    the tensor's node) marked by dashed lines at their onsets, described on hover.

    Clicking a point selects its step (``clickData.points[0].x``); long series are drawn with WebGL.
    """
    data = []
    for index, (step_type, (steps, values)) in enumerate(curves.items()):
        data.append({
            "type": "scattergl" if len(steps) > LARGE_SERIES else "scatter",
            "mode": "lines+markers" if len(steps) <= 200 else "lines",
            "name": step_type, "x": np.asarray(steps).tolist(),
            "y": [None if not np.isfinite(v) else float(v) for v in np.asarray(values, dtype=np.float64)],
            "marker": {"size": 6, "color": STEP_TYPE_COLORS[index % len(STEP_TYPE_COLORS)]},
            "line": {"width": 1.5, "color": STEP_TYPE_COLORS[index % len(STEP_TYPE_COLORS)]},
        })
    return {"data": data, "layout": {
        **BASE_LAYOUT, "title": _title(title), "shapes": step_marker(step) + event_shapes(events),
        "annotations": event_annotations(events),
        "hovermode": "closest", "clickmode": "event", "showlegend": len(data) > 1,
        "xaxis": {"title": {"text": "step"}}, "yaxis": {"title": {"text": y_label}},
        "legend": {"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"},
    }}


def kpi_figure(name: str, curves: Mapping[str, tuple[np.ndarray, np.ndarray]], step: int | None) -> dict[str, Any]:
    """A KPI's curve per step type, the current step marked."""
    return timeline_figure(curves, title=name, y_label=name, step=step)


def message_figure(text: str) -> dict[str, Any]:
    """An empty figure that says why there is nothing to plot."""
    return {"data": [], "layout": {
        **BASE_LAYOUT, "xaxis": {"visible": False}, "yaxis": {"visible": False},
        "annotations": [{"text": text, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                         "font": {"size": 13, "color": "#666"}}]}}
