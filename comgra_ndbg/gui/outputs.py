"""Every output of the explorer's view callback: its name in :func:`~comgra_ndbg.gui.callbacks.update_view`'s
result, the component id and the property it sets.

One table, so the callback's decorator, the page's first view (:func:`comgra_ndbg.gui.app.fill`) and the
tests name the same outputs.
"""
from __future__ import annotations

from typing import Any

from comgra_ndbg.gui import ids

__all__ = ["OUTPUTS"]

# Output name -> (component id, property) of every output of the view callback.
OUTPUTS: dict[str, tuple[Any, str]] = {
    "store": (ids.SELECTION, "data"), "keys": (ids.KEYS, "data"), "url": (ids.ADDRESS, "data"),
    "step_data": (ids.STEP_DATA, "data"),
    "status": (ids.STATUS, "children"), "step_max": (ids.STEP, "max"), "step_marks": (ids.STEP, "marks"),
    "step": (ids.STEP, "value"), "step_label": (ids.STEP_LABEL, "children"), "step_box": (ids.STEP_BOX, "value"),
    "stat": (ids.STAT, "value"), "tab": (ids.TABS, "value"), "theme": (ids.THEME, "value"),
    "colour": (ids.COLOUR, "value"), "follow": (ids.FOLLOW, "value"), "graph_options": (ids.GRAPH_OPTIONS, "value"),
    "elements": (ids.GRAPH, "elements"), "stylesheet": (ids.GRAPH, "stylesheet"),
    "graph_view": (ids.GRAPH_VIEW, "data"), "colour_scale": (ids.COLOUR_SCALE, "children"),
    "graph_note": (ids.GRAPH_NOTE, "children"), "node_names": (ids.NODE_NAMES, "data"),
    "search": (ids.GRAPH_SEARCH, "value"),
    "header": (ids.TENSOR_HEADER, "children"), "stats": (ids.STATS_TABLE, "children"),
    "histogram": (ids.HISTOGRAM, "children"), "values": (ids.VALUES, "children"), "timeline": (ids.TIMELINE, "figure"),
    "distribution": (ids.DISTRIBUTION, "figure"),
    "overlay_trials_options": (ids.OVERLAY_TRIALS, "options"), "overlay_nodes": (ids.OVERLAY_NODES, "value"),
    "overlay_trials": (ids.OVERLAY_TRIALS, "value"), "timeline_options": (ids.TIMELINE_OPTIONS, "value"),
    "ema": (ids.EMA, "value"), "values_mode": (ids.VALUES_MODE, "value"), "values_page": (ids.VALUES_PAGE, "value"),
    "diagnosis": (ids.DIAGNOSIS, "children"), "evidence": (ids.EVIDENCE, "children"),
    "layers_note": (ids.LAYERS_NOTE, "children"), "gradient_flow": (ids.GRADIENT_FLOW, "figure"),
    "update_ratio": (ids.UPDATE_RATIO, "figure"), "kpis": (ids.KPIS, "children"), "notes": (ids.NOTES, "children"),
    "network": (ids.NETWORK, "children"), "compare": (ids.COMPARE, "children"),
    "compare_mode": (ids.COMPARE_MODE, "value"), "compare_trial": (ids.COMPARE_TRIAL, "value"),
    "compare_step": (ids.COMPARE_STEP, "value"), "custom": (ids.CUSTOM, "children"),
    "profile": (ids.PROFILE, "children"),
    **{f"{name}_options": (ids.SELECTORS[name], "options") for name in
       ("trial", "step_type", "iteration", "node", "tensor", "kind", "sample", "rank")},
    **{name: (ids.SELECTORS[name], "value") for name in ("trial", "step_type", "iteration", "node", "tensor", "kind",
                                                          "sample", "rank")},
}
