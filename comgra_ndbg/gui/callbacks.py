"""The explorer's callbacks, written as plain functions of (cache, inputs) and registered by one function.

Each function unpacks its inputs, asks the cached reader (:mod:`comgra_ndbg.gui.state`) one query, calls a
pure builder (:mod:`comgra_ndbg.gui.figures`) and returns; the tests call them directly. Only
:func:`register_callbacks` knows about Dash's decorators and ``ctx``; it closes over the cache instead of
using globals, and serializes every callback on the cache's lock.

One callback owns the selection: every selector, prev/next button, graph click, timeline click and
diagnosis row feeds it, and it writes back the options and values of all selectors, so each shows only
valid choices and a change of one keeps the others (see :mod:`comgra_ndbg.gui.selection`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from dash import ALL, Dash, Input, Output, Patch, State, ctx, no_update

from comgra_ndbg.gui import ids, tabs
from comgra_ndbg.gui.custom import Visualization
from comgra_ndbg.gui.figures import (as_matrix, event_classes, event_shapes, graph_elements, graph_stylesheet,
                                     heatmap_figure, histogram_figure, lineage, message_figure, statistics_rows,
                                     step_marker, timeline_figure, value_rows)
from comgra_ndbg.gui.selection import resolve, tensor_label, wanted_from_trigger
from comgra_ndbg.gui.state import (AGGREGATE, ReaderCache, Selection, element_values, node_events, statistics_at,
                                   timeline_curves)
from comgra_ndbg.gui.layout import tensors_tab
from comgra_ndbg.gui.views import graph_of, message, table

__all__ = ["graph_marks", "graph_view", "graph_style", "refresh_generations", "register_callbacks", "tensor_panel",
           "tensors_body", "timeline_view", "update_selection"]

HEATMAP_LIMIT = 65_536  # cells above which element values are shown as a table
SLIDER_MARKS = 8
# Selector component id -> the wanted-key it sets.
TRIGGERS = {**{component: name for name, component in ids.SELECTORS.items()},
            ids.STAT: "stat", ids.COLLAPSE: "collapsed", ids.GRAPH: "graph"}


# ---- selection -----------------------------------------------------------------------------------------
def update_selection(cache: ReaderCache, trigger: str | None, value: Any, store: dict[str, Any] | None
                     ) -> dict[str, Any]:
    """Apply one user action to the selection and return every selector's options and value.

    ``trigger`` is a key of :data:`TRIGGERS`' values, ``"stepper"`` (value ``(selector, delta)``),
    ``"jump"`` (value ``(node, step, kind)``) or None (first load, or the live recording grew).
    """
    store = store or {}
    current, choices = None, None
    if store.get("selection"):
        current = Selection.from_dict(store["selection"])
        _, choices = resolve(cache, current.to_dict())
    wanted = wanted_from_trigger(store.get("wanted") or {}, trigger, value, current, choices, cache)
    selection, choices = resolve(cache, wanted)
    for key in ("step_type", "step"):  # pin the defaults shown first, so other changes do not move them
        if wanted.get(key) is None and getattr(selection, key) is not None:
            wanted[key] = getattr(selection, key)
    steps = choices.steps
    position = int(np.searchsorted(steps, selection.step)) if selection.step is not None else 0
    marks_at = np.unique(np.linspace(0, max(len(steps) - 1, 0), min(SLIDER_MARKS, max(len(steps), 1))).astype(int))
    recording = cache.recording(selection.trial)
    last = int(recording.steps.max()) if len(recording.steps) else None
    return {
        "store": {"wanted": wanted, "selection": selection.to_dict()},
        "trial_options": choices.trials, "trial": selection.trial,
        "step_type_options": choices.step_types, "step_type": selection.step_type,
        "step_max": max(len(steps) - 1, 0), "step": position,
        "step_marks": {int(i): str(int(steps[i])) for i in marks_at} if len(steps) else {},
        "step_label": (f"step {selection.step} · {position + 1} of {len(steps)} {selection.step_type} steps"
                       if selection.step is not None else "no recorded step"),
        "iteration_options": choices.iterations, "iteration": selection.iteration,
        "node_options": choices.nodes, "node": selection.node,
        "tensor_options": [{"label": label, "value": name} for name, label in choices.tensors],
        "tensor": selection.tensor,
        "kind_options": [{"label": _kind_label(k), "value": k} for k in choices.kinds], "kind": selection.kind,
        "sample_options": [{"label": "whole batch", "value": AGGREGATE}]
        + [{"label": f"sample {i}", "value": i} for i in choices.samples],
        "sample": AGGREGATE if selection.sample is None else selection.sample,
        "stat": selection.stat,
        "collapse_options": choices.modules, "collapse": list(selection.collapsed),
        "status": (f"{selection.trial}: {len(recording.steps)} recorded steps, last {last} · "
                   f"{'complete' if recording.is_complete else 'live'}"),
    }


def _kind_label(kind: str) -> str:
    if kind == "grad":
        return "gradient"
    if kind.startswith("grad:"):
        return f"gradient ({kind[5:]})"
    return kind


# ---- graph ---------------------------------------------------------------------------------------------
def graph_view(cache: ReaderCache, selection_data: dict[str, Any] | None, previous_key: Any) -> tuple[Any, Any]:
    """``(elements, key)`` of the graph, nodes with events marked (``has-event``; ``event-origin`` for the
    top hypothesis' node); ``no_update`` for both while trial, step type, grouping, generation and stored
    analysis are unchanged, so picking a node or a step never resends the graph."""
    if not selection_data:
        return no_update, no_update
    selection = Selection.from_dict(selection_data["selection"])
    key = [selection.trial, selection.step_type, list(selection.collapsed), selection.generation,
           cache.analysis_stamp(selection.trial)]
    if key == previous_key:
        return no_update, no_update
    view = cache.view_graph(selection.trial, selection.step_type, selection.collapsed)
    if view is None:
        return [], key
    return graph_elements(view.graph, view.positions, graph_marks(cache, selection)), key


def graph_marks(cache: ReaderCache, selection: Selection) -> dict[str, str]:
    """Displayed node -> its event classes, from the trial's stored diagnosis (none without one)."""
    stored = cache.readable_diagnosis(selection.trial)
    if stored is None:
        return {}
    shown = cache.shown_nodes(selection.trial, selection.step_type, selection.collapsed)
    top = stored.diagnosis.top
    return event_classes([shown[e.node] for e in stored.diagnosis.events if e.node in shown],
                         shown.get(top.node) if top is not None else None)


def graph_style(cache: ReaderCache, selection_data: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The stylesheet that highlights the selected node with its dependencies and dependents."""
    if not selection_data:
        return graph_stylesheet(None)
    selection = Selection.from_dict(selection_data["selection"])
    view = cache.view_graph(selection.trial, selection.step_type, selection.collapsed)
    if view is None or selection.node not in view.graph.node_names:
        return graph_stylesheet(None)
    dependencies, dependents = lineage(view.graph, selection.node)
    return graph_stylesheet(selection.node, dependencies, dependents,
                            [(e.source, e.target) for e in view.graph.edges])


# ---- tensor outputs ------------------------------------------------------------------------------------
def tensor_panel(cache: ReaderCache, selection_data: dict[str, Any] | None, mode: str | None,
                 page: int | None) -> dict[str, Any]:
    """The Tensors tab for the selection: header, statistics table, histogram and element values."""
    if not selection_data:
        return {"header": "", "stats": message("Loading…"), "histogram": message_figure(""), "values": ""}
    selection = Selection.from_dict(selection_data["selection"])
    if selection.tensor is None or selection.kind is None or selection.step is None:
        text = "Nothing recorded to show: no tensor or no recorded step in this trial."
        return {"header": text, "stats": message(text), "histogram": message_figure(text), "values": ""}
    info = next(t for t in cache.recording(selection.trial).tensors if t.name == selection.tensor)
    where = "whole batch" if selection.sample is None else f"sample {selection.sample}"
    label = tensor_label(selection.tensor, selection.node or info.node)
    header = (f"{selection.node} / {label} · {_kind_label(selection.kind)} · step {selection.step} "
              f"({selection.step_type}) · iteration {selection.iteration} · {where} · shape {info.shape} "
              f"{info.dtype}")
    stats = statistics_at(cache, selection)
    stats_view = (table(("statistic", "value"), statistics_rows(stats), table_id=ids.STATS_TABLE + "-table")
                  if stats is not None else message(f"No statistics of {selection.tensor} ({selection.kind}) "
                                                    f"at step {selection.step}, {where}."))
    snapshot = cache.snapshot(selection.trial, selection.tensor, selection.kind, selection.step,
                              selection.iteration)
    values = element_values(snapshot, selection.sample) if snapshot is not None else None
    if values is None:
        text = _no_snapshot_text(cache, selection)
        return {"header": header, "stats": stats_view, "histogram": message_figure(text), "values": message(text)}
    title = f"{label} {_kind_label(selection.kind)} · step {selection.step} · {where}"
    histogram = histogram_figure(values.values, title=title)
    if mode != "table" and values.dense.size <= HEATMAP_LIMIT:
        row_label = "sample" if values.first_axis is not None and values.dense.ndim == 2 else "row"
        matrix = as_matrix(values.dense)
        figure = heatmap_figure(matrix, title=f"element values · {values.dense.shape}", row_label=row_label,
                                column_label="index")
        if row_label == "sample":
            figure["data"][0]["y"] = [int(i) for i in values.first_axis]
            figure["layout"]["yaxis"]["type"] = "category"
        values_view: Any = graph_of(figure, ids.VALUES + "-heatmap", height=min(120 + 18 * len(matrix), 420))
    else:
        rows, pages = value_rows(values.values, values.shape, values.positions, page=max(int(page or 1), 1) - 1,
                                 first_axis=values.first_axis)
        values_view = [table(("position", "value"), rows, table_id=ids.VALUES + "-table"),
                       message(f"page {min(max(int(page or 1), 1), pages)} of {pages} · {len(values.values)} "
                               f"stored values")]
    return {"header": header, "stats": stats_view, "histogram": histogram, "values": values_view}


def _no_snapshot_text(cache: ReaderCache, selection: Selection) -> str:
    assert selection.tensor is not None and selection.kind is not None and selection.step is not None
    steps = cache.snapshot_steps(selection.trial, selection.tensor, selection.kind)
    if not len(steps):
        return f"No snapshot of {selection.tensor} ({selection.kind}) was recorded in this trial."
    position = int(np.searchsorted(steps, selection.step))
    near = sorted({int(steps[i]) for i in (position - 1, position) if 0 <= i < len(steps)})
    if selection.step in steps and selection.sample is not None:
        return f"Sample {selection.sample} was not stored in the snapshot of step {selection.step}."
    return (f"No snapshot at step {selection.step} (iteration {selection.iteration}); nearest snapshots at "
            f"step {' and '.join(map(str, near))}.")


def timeline_view(cache: ReaderCache, selection_data: dict[str, Any] | None, previous_key: Any
                  ) -> tuple[Any, Any]:
    """``(figure, key)`` of the timeline with the events of the selected node marked; while the series and
    the stored analysis are unchanged only the step marker is patched (the event lines with it), so
    stepping through 10k steps never resends 10k points."""
    if not selection_data:
        return no_update, no_update
    selection = Selection.from_dict(selection_data["selection"])
    key = [selection.trial, selection.generation, selection.node, selection.tensor, selection.kind,
           selection.iteration, selection.stat, cache.analysis_stamp(selection.trial)]
    events = node_events(cache, selection)
    if key == previous_key:
        patch = Patch()
        patch["layout"]["shapes"] = step_marker(selection.step) + event_shapes(events)
        return patch, no_update
    if selection.tensor is None or selection.kind is None:
        return message_figure("no tensor selected"), key
    curves = timeline_curves(cache, selection)
    if not any(len(steps) for steps, _ in curves.values()):
        return message_figure(f"{selection.tensor} ({selection.kind}) has no summaries"), key
    title = f"{selection.stat} of {selection.tensor} ({_kind_label(selection.kind)}) over steps · click to select"
    return timeline_figure(curves, title=title, y_label=selection.stat, step=selection.step, events=events), key


def _present_timelines(view: tuple[Any, Any]) -> tuple[Any, Any]:
    """``timeline_view``'s answer for the timelines on the page: the Tensors tab inserts the timeline after
    the first selection, and a callback must not name an output that is not there yet (Dash reports it as an
    error in the browser); with none there, nothing changes, the remembered key included."""
    figure, key = view
    present = len(ctx.outputs_list[0])
    if not present:
        return [], no_update
    return [figure] * present, key


def tensors_body(selection_data: dict[str, Any] | None, children: Any) -> Any:
    """The Tensors tab's body, inserted once the first selection is known (after the graph is drawn)."""
    return no_update if children or not selection_data else tensors_tab()


def refresh_generations(cache: ReaderCache, previous: dict[str, int] | None) -> Any:
    """Refresh the readers; the new generations, or ``no_update`` when nothing was written since."""
    generations = cache.refresh()
    return no_update if generations == (previous or {}) else generations


# ---- registration --------------------------------------------------------------------------------------
def _trigger(triggered_id: Any, triggered_value: Any, inputs: dict[str, Any]) -> tuple[str | None, Any]:
    """Map Dash's ``ctx.triggered_id`` (and the triggering value) to :func:`update_selection`'s trigger."""
    if isinstance(triggered_id, dict):
        if triggered_id.get("type") == ids.STEPPER_TYPE and triggered_value:
            return "stepper", (triggered_id["selector"], int(triggered_id["delta"]))
        if triggered_id.get("type") == ids.DIAGNOSIS_JUMP_TYPE and triggered_value:
            return "jump", (triggered_id["node"], int(triggered_id["step"]), triggered_id["kind"])
        if triggered_id.get("type") == ids.TIMELINE_TYPE:
            points = (triggered_value or {}).get("points") or []
            return ("timeline", points[0].get("x")) if points else (None, None)
        return None, None
    name = TRIGGERS.get(triggered_id)
    if name is None:
        return None, None
    value = inputs.get(name)
    if name == "graph":
        value = (value or {}).get("id")
    return name, value


def register_callbacks(app: Dash, cache: ReaderCache, visualization: Visualization | None) -> None:
    """Wire every callback of the explorer to ``app``, closing over ``cache`` (no module state)."""
    def locked(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with cache.lock:
                return fn(*args, **kwargs)
        return run

    selector_outputs = {
        "store": Output(ids.SELECTION, "data"), "status": Output(ids.STATUS, "children"),
        "step_max": Output(ids.STEP, "max"), "step_marks": Output(ids.STEP, "marks"),
        "step": Output(ids.STEP, "value"), "step_label": Output(ids.STEP_LABEL, "children"),
        "stat": Output(ids.STAT, "value"), "collapse_options": Output(ids.COLLAPSE, "options"),
        "collapse": Output(ids.COLLAPSE, "value"),
    }
    for name in ("trial", "step_type", "iteration", "node", "tensor", "kind", "sample"):
        selector_outputs[f"{name}_options"] = Output(ids.SELECTORS[name], "options")
        selector_outputs[name] = Output(ids.SELECTORS[name], "value")
    selector_inputs = {name: Input(component, "value") for component, name in TRIGGERS.items()
                       if component != ids.GRAPH}
    selector_inputs.update(graph=Input(ids.GRAPH, "tapNodeData"),
                           timeline=Input({"type": ids.TIMELINE_TYPE, "index": ALL}, "clickData"),
                           steppers=Input({"type": ids.STEPPER_TYPE, "selector": ALL, "delta": ALL}, "n_clicks"),
                           jumps=Input({"type": ids.DIAGNOSIS_JUMP_TYPE, "item": ALL, "node": ALL, "step": ALL,
                                        "kind": ALL}, "n_clicks"),
                           generations=Input(ids.GENERATION, "data"))

    @app.callback(output=selector_outputs, inputs=selector_inputs, state={"store": State(ids.SELECTION, "data")})
    @locked
    def _selection(store: dict[str, Any] | None, **inputs: Any) -> dict[str, Any]:
        triggered_value = ctx.triggered[0]["value"] if ctx.triggered else None
        trigger, value = _trigger(ctx.triggered_id, triggered_value, inputs)
        return update_selection(cache, trigger, value, store)

    app.callback(Output(ids.TENSORS_BODY, "children"), Input(ids.SELECTION, "data"),
                 State(ids.TENSORS_BODY, "children"))(tensors_body)
    # The stored analyses' stamps only trigger the graph and the timeline: their keys read the stamp from the
    # cache, so the plain functions do not take it.
    app.callback(Output(ids.GRAPH, "elements"), Output(ids.GRAPH_KEY, "data"), Input(ids.SELECTION, "data"),
                 Input(ids.ANALYSES, "data"), State(ids.GRAPH_KEY, "data"))(
        locked(lambda selection_data, _analyses, key: graph_view(cache, selection_data, key)))
    app.callback(Output(ids.GRAPH, "stylesheet"), Input(ids.SELECTION, "data"))(
        locked(functools.partial(graph_style, cache)))
    app.callback(output={"header": Output(ids.TENSOR_HEADER, "children"), "stats": Output(ids.STATS_TABLE, "children"),
                         "histogram": Output(ids.HISTOGRAM, "figure"), "values": Output(ids.VALUES, "children")},
                 inputs=[Input(ids.SELECTION, "data"), Input(ids.VALUES_MODE, "value"),
                         Input(ids.VALUES_PAGE, "value")])(locked(functools.partial(tensor_panel, cache)))
    app.callback(Output({"type": ids.TIMELINE_TYPE, "index": ALL}, "figure"), Output(ids.TIMELINE_KEY, "data"),
                 Input(ids.SELECTION, "data"), Input(ids.ANALYSES, "data"), State(ids.TIMELINE_KEY, "data"))(
        locked(lambda selection_data, _analyses, key: _present_timelines(timeline_view(cache, selection_data, key))))
    app.callback(Output(ids.GENERATION, "data"), Input(ids.INTERVAL, "n_intervals"), State(ids.GENERATION, "data"),
                 prevent_initial_call=True)(locked(lambda _n, previous: refresh_generations(cache, previous)))
    tabs.register_tab_callbacks(app, cache, visualization, locked)
