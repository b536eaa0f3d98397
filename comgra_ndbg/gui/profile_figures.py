"""Pure figure builders of the Profile tab: per-layer time and memory bars at a step, process memory over
steps, and the stylesheet rules that mark hot layers on the graph. No dash import: dicts in, dicts out.

>>> hot_layer_rules(["model.2"])[0]["selector"]
'node[id = "model.2"]'
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from comgra_ndbg.graph.compound import VisibleGraph, box_id
from comgra_ndbg.gui.figures import format_number, plot_title, step_line, themed

__all__ = ["HOT_COLOR", "hot_items", "hot_layer_rules", "layer_bars", "memory_bars", "process_figure"]

HOT_COLOR = "#FF7F0E"
FORWARD_COLOR = "#1F77B4"
BACKWARD_COLOR = "#9467BD"
MIB = 2.0**20


def hot_items(view: VisibleGraph, hot: Sequence[str]) -> list[str]:
    """The drawn items that show the hot layers: the layer's node, or the collapsed box that holds it (a real
    network opens with most of its blocks collapsed), or the module's own box when the hot module is a
    container with no node of its own; each item once, in the order of ``hot``. A hot module drawn nowhere
    (a container that is an open frame, a module the graph lacks) marks nothing.

    >>> from comgra_ndbg.graph.compound import visible_graph
    >>> from comgra_ndbg.graph.model import DependencyGraph, GraphNode
    >>> nodes = tuple(GraphNode(n, "intermediate", "", (n,), False, ("intermediate",)) for n in ("m.a.x", "m.a.y",
    ...                                                                                           "m.b"))
    >>> hot_items(visible_graph(DependencyGraph(nodes, ()), ("m.a",)), ["m.a.y", "m.a.x", "m.b", "m.c"])
    ['box:m.a', 'm.b']
    >>> hot_items(visible_graph(DependencyGraph(nodes, ())), ["m.a.y", "m.a"])  # m.a open: a frame, not marked
    ['m.a.y']
    """
    drawn = {item.id: item.kind for item in view.items + view.frames}
    found: list[str] = []
    for name in hot:
        item = view.shown_as.get(name)
        if item is None and drawn.get(box_id(name)) == "box":
            item = box_id(name)
        if item is not None and item not in found:
            found.append(item)
    return found


def hot_layer_rules(hot: Sequence[str]) -> list[dict[str, Any]]:
    """Cytoscape rules that ring each hot layer's node (added after the graph's own stylesheet)."""
    return [{"selector": f'node[id = "{name}"]', "style": {"border-width": 4, "border-color": HOT_COLOR,
                                                             "border-style": "double"}} for name in hot]


def _label(name: str, hot: set[str]) -> str:
    return f"🔥 {name}" if name in hot else name


def layer_bars(modules: Sequence[str], forward: np.ndarray, backward: np.ndarray, step: int, hot: set[str], *,
               theme: str = "light") -> dict[str, Any]:
    """Horizontal stacked bars: each module's exclusive forward and backward time (ms) at ``step``, the
    slowest on top; hot layers are labelled 🔥."""
    total = np.nan_to_num(forward) + np.nan_to_num(backward)
    order = np.argsort(total, kind="stable")
    labels = [_label(modules[i], hot) for i in order]
    data = [{"type": "bar", "orientation": "h", "name": name, "y": labels, "marker": {"color": colour},
             "x": [float(np.nan_to_num(values[i]) * 1e3) for i in order],
             "hovertemplate": "%{y}: %{x:.4g} ms<extra>" + name + "</extra>"}
            for name, values, colour in (("forward", forward, FORWARD_COLOR), ("backward", backward, BACKWARD_COLOR))]
    return {"data": data, "layout": themed({"title": plot_title(f"time per layer at step {step} (exclusive, ms)"),
                                            "barmode": "stack", "xaxis": {"title": "ms"},
                                            "yaxis": {"automargin": True}, "legend": {"orientation": "h"}}, theme)}


def memory_bars(modules: Sequence[str], saved: np.ndarray, peak: np.ndarray, step: int, hot: set[str], *,
                theme: str = "light") -> dict[str, Any]:
    """Horizontal bars of each module's saved activation memory (MiB) at ``step``, and its allocator peak
    above the call's start where the device measured one (CUDA)."""
    order = np.argsort(np.nan_to_num(saved), kind="stable")
    labels = [_label(modules[i], hot) for i in order]
    data = [{"type": "bar", "orientation": "h", "name": "kept for backward", "y": labels,
             "x": [float(np.nan_to_num(saved[i]) / MIB) for i in order], "marker": {"color": HOT_COLOR},
             "hovertemplate": "%{y}: %{x:.4g} MiB<extra>saved</extra>"}]
    if np.isfinite(peak).any():
        data.append({"type": "bar", "orientation": "h", "name": "allocator peak", "y": labels,
                     "x": [float(np.nan_to_num(peak[i]) / MIB) for i in order], "marker": {"color": BACKWARD_COLOR}})
    return {"data": data, "layout": themed({"title": plot_title(f"memory per layer at step {step} (MiB)"),
                                            "barmode": "group", "xaxis": {"title": "MiB"},
                                            "yaxis": {"automargin": True}, "legend": {"orientation": "h"}}, theme)}


def process_figure(steps: np.ndarray, rss: np.ndarray, device: np.ndarray, step: int | None, *, leaking: bool,
                   theme: str = "light") -> dict[str, Any]:
    """Process memory over the steps (RSS, and the device allocator where there is one), the current step
    marked; the title says whether the analysis sees a leak."""
    data = [{"type": "scatter", "mode": "lines", "name": "RSS", "x": steps.tolist(),
             "y": (rss / MIB).tolist(), "line": {"color": HOT_COLOR if leaking else FORWARD_COLOR}}]
    if np.isfinite(device).any():
        data.append({"type": "scatter", "mode": "lines", "name": "device allocated", "x": steps.tolist(),
                     "y": (device / MIB).tolist(), "line": {"color": BACKWARD_COLOR}})
    last = format_number(float(rss[-1] / MIB)) if len(rss) else "—"
    title = f"process memory over steps (MiB; last {last})" + (" — growing linearly: leak" if leaking else "")
    return {"data": data, "layout": themed({"title": plot_title(title), "xaxis": {"title": "step"},
                                            "yaxis": {"title": "MiB"}, "shapes": step_line(step, theme),
                                            "legend": {"orientation": "h"}}, theme)}
