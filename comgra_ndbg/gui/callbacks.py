"""The explorer's one view callback: every action is answered by one request that updates all it changed.

A step change, a node tap, a selector, a diagnosis row, the page's address, the live refresh: each enters
:func:`update_view`, which applies the action to what the user *wants* (:mod:`comgra_ndbg.gui.selection`),
resolves the selection, and returns every output of the page — the selectors, the address, the graph's
elements and browser-side state, the tensor panel, the timeline, the open tab — as ``no_update`` where
nothing changed. What each view was last computed for is kept in a small store (``keys``), so a step
change sends a few table rows, two small figures and a patch of the timeline's marks, never the graph's
elements or 10,000 points again; with each view goes the window of nearby steps the page shows without
asking (:mod:`comgra_ndbg.gui.stepping`), and the slider, step box and address reach the callback only
through the page's script, when it cannot show the step itself. Only :func:`register_callbacks` knows
Dash's decorators and ``ctx``; it closes over the cache instead of using globals, and serializes the
callbacks on the cache's lock.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from dash import ALL, Dash, Input, Output, Patch, State, ctx, no_update
from dash.exceptions import PreventUpdate

from comgra_ndbg.gui import ids, tabs
from comgra_ndbg.gui.clientside import register_clientside
from comgra_ndbg.gui.custom import Visualization
from comgra_ndbg.gui.direct import register_direct, tap_item
from comgra_ndbg.gui.cyto import graph_stylesheet
from comgra_ndbg.gui.profile_tab import hot_layer_stylesheet, profile_tab
from comgra_ndbg.gui.evidence import focus_of
from comgra_ndbg.gui.outputs import OUTPUTS
from comgra_ndbg.gui.panels import (distribution_view, graph_state, graph_view, kind_label, tensor_panel,
                                    timeline_shapes, timeline_view)
from comgra_ndbg.gui.queries import evidence_statistic
from comgra_ndbg.gui.ranks import rank_options, split_rank_key
from comgra_ndbg.gui.selection import resolve, wanted_from_trigger
from comgra_ndbg.gui.stepping import step_window
from comgra_ndbg.gui.state import AGGREGATE, ReaderCache, Selection, ViewOptions
from comgra_ndbg.gui.timelines import step_marker
from comgra_ndbg.gui.urlstate import from_address, to_address
from comgra_ndbg.gui.zoom import register_zoom

__all__ = ["OUTPUTS", "refresh_generations", "register_callbacks", "update_selection", "update_view"]

SLIDER_MARKS = 8
TAB_BY_ID = dict(ids.TAB_NAMES)
TAB_ID = {name: tab for tab, name in ids.TAB_NAMES.items()}
# Component id -> the trigger name its value enters update_view as.
SELECTION_INPUTS = {ids.TRIAL: "trial", ids.RANK: "rank", ids.STEP_TYPE: "step_type", ids.ITERATION: "iteration", ids.NODE: "node",
                    ids.TENSOR: "tensor", ids.KIND: "kind", ids.SAMPLE: "sample", ids.STAT: "stat",
                    ids.GRAPH_SEARCH: "search"}
# What the page's script passes on in the ask store (a step it could not show itself, a typed step, an address
# it did not set: clientside.SCRIPT's ``ask``; a tap the tap route could not answer: tapscript), as
# [trigger, value, time].
ASKED = ("step", "step_box", "url", "window", "graph")
# Actions after which the next is likely a step: their answer carries the window of nearby steps. Others (a
# tap, a selector) answer without it, as fast as before; the first step after them asks the server, whose
# answer then brings the window.
STEPPING = ("step", "step_box", "stepper", "timeline", "jump", "generations", "url", "window")
OPTION_INPUTS = {ids.COLOUR: "colour", ids.GRAPH_OPTIONS: "graph_options", ids.OVERLAY_NODES: "overlay_nodes",
                 ids.OVERLAY_TRIALS: "overlay_trials", ids.TIMELINE_OPTIONS: "timeline_options", ids.EMA: "ema",
                 ids.FOLLOW: "follow", ids.THEME: "theme", ids.TABS: "tab", ids.VALUES_MODE: "values_mode",
                 ids.VALUES_PAGE: "values_page", ids.COMPARE_MODE: "compare_mode", ids.COMPARE_TRIAL: "compare_trial",
                 ids.COMPARE_STEP: "compare_step"}
CLICKABLE_PLOTS = (ids.TIMELINE, ids.GRADIENT_FLOW, ids.UPDATE_RATIO, ids.DISTRIBUTION)


# ---- selection -----------------------------------------------------------------------------------------
def update_selection(cache: ReaderCache, trigger: str | None, value: Any, store: dict[str, Any] | None
                     ) -> dict[str, Any]:
    """Apply one selection action (see :func:`~comgra_ndbg.gui.selection.wanted_from_trigger`) and return the
    store and every selector's options and value (the part of :func:`update_view` the selectors show)."""
    store = store or {}
    current, choices = None, None
    if store.get("selection"):
        current = Selection.from_dict(store["selection"])
        _, choices = resolve(cache, current.to_dict())
    wanted = wanted_from_trigger(store.get("wanted") or {}, trigger, value, current, choices, cache)
    return _selectors(cache, wanted, store.get("options"))


def _selectors(cache: ReaderCache, wanted: dict[str, Any], options: dict[str, Any] | None) -> dict[str, Any]:
    selection, choices = resolve(cache, wanted)
    wanted = dict(wanted)
    for key in ("step_type", "step"):  # pin the defaults shown first, so other changes do not move them
        if wanted.get(key) is None and getattr(selection, key) is not None:
            wanted[key] = getattr(selection, key)
    steps = choices.steps
    position = int(np.searchsorted(steps, selection.step)) if selection.step is not None else 0
    marks_at = np.unique(np.linspace(0, max(len(steps) - 1, 0), min(SLIDER_MARKS, max(len(steps), 1))).astype(int))
    recording = cache.recording(selection.trial)
    last = int(recording.steps.max()) if len(recording.steps) else None
    return {
        "store": {"wanted": wanted, "selection": selection.to_dict(), "options": options or {}},
        "trial_options": choices.trials, "trial": split_rank_key(selection.trial)[0],
        "rank_options": rank_options(choices.ranks), "rank": selection.rank,
        "step_type_options": choices.step_types, "step_type": selection.step_type,
        "step_max": max(len(steps) - 1, 0), "step": position,
        "step_marks": {int(i): str(int(steps[i])) for i in marks_at} if len(steps) else {},
        "step_label": (f"step {selection.step} · {position + 1} of {len(steps)} {selection.step_type} steps"
                       if selection.step is not None else "no recorded step"),
        "iteration_options": choices.iterations, "iteration": selection.iteration,
        # the node selector lists the chosen node (what is typed adds the matching ones, in the browser): a
        # dropdown indexes every substring of its options' names when they arrive, some 280 ms for 497 nodes
        "node_options": [selection.node] if selection.node is not None else [], "node": selection.node,
        "tensor_options": [{"label": label, "value": name} for name, label in choices.tensors],
        "tensor": selection.tensor,
        "kind_options": [{"label": kind_label(k), "value": k} for k in choices.kinds], "kind": selection.kind,
        "sample_options": [{"label": "whole batch", "value": AGGREGATE}]
        + [{"label": f"sample {i}", "value": i} for i in choices.samples],
        "sample": AGGREGATE if selection.sample is None else selection.sample,
        "stat": selection.stat,
        "status": (f"{selection.trial}: {len(recording.steps)} recorded steps, last {last} · "
                   f"{'complete' if recording.is_complete else 'live'}"),
    }


def _options_after(options: ViewOptions, trigger: str, value: Any, trials: list[str]) -> ViewOptions:
    """``options`` after an option input changed."""
    if trigger == "graph_options":
        return dataclasses.replace(options, show_implied="implied" in (value or []),
                                   show_unused="unused" in (value or []))
    if trigger == "timeline_options":
        return dataclasses.replace(options, log_y="log" in (value or []))
    if trigger == "follow":
        return dataclasses.replace(options, follow="follow" in (value or []))
    if trigger == "tab":
        return dataclasses.replace(options, tab=TAB_BY_ID.get(value, "tensors"))
    if trigger == "ema":
        return dataclasses.replace(options, ema=float(np.clip(float(value or 0), 0.0, 0.999)))
    if trigger in ("overlay_nodes", "overlay_trials"):
        return dataclasses.replace(options, **{trigger: tuple(value or ())})
    if trigger == "values_page":
        return dataclasses.replace(options, values_page=int(value or 1))
    if trigger == "compare_step":
        return dataclasses.replace(options, compare_step=None if value is None else int(value))
    if trigger == "compare_trial" and value not in trials:
        return options
    return dataclasses.replace(options, **{trigger: value})


# ---- the view ------------------------------------------------------------------------------------------
# Selector outputs the user cannot change in the browser: sent only when they differ from what was sent.
UNCHANGING = ("trial_options", "rank_options", "step_type_options", "iteration_options", "tensor_options", "kind_options",
              "sample_options", "step_max", "step_marks", "step_label", "status")
# Values the user sets in the browser: sent when they differ from what was sent, or when the user just set
# that one (the view may have resolved the choice to another value).
SETTABLE = ("trial", "rank", "step_type", "iteration", "node", "tensor", "kind", "sample", "stat", "step", "step_box", "tab",
            "theme", "colour", "follow", "graph_options", "overlay_nodes", "overlay_trials", "timeline_options", "ema",
            "values_mode", "values_page", "compare_mode", "compare_trial", "compare_step")


def _digest(value: Any) -> int:
    """A short fingerprint of a JSON value, to remember in the keys store what was sent."""
    return zlib.crc32(json.dumps(value, sort_keys=True, default=str).encode())


def _fresh(keys: dict[str, Any], name: str, key: Any) -> bool:
    """Whether the view ``name`` must be computed for ``key`` (and remember it).

    The keys store keeps the key's digest: the browser hands the store back through JSON, which turns every
    tuple into a list, so a key kept as it is would never compare equal again (and the store stays small)."""
    digest = _digest(key)
    if keys.get(name) == digest:
        return False
    keys[name] = digest
    return True


def update_view(cache: ReaderCache, trigger: str | None, value: Any, store: dict[str, Any] | None,
                keys: dict[str, Any] | None, *, visualization: Visualization | None = None, nearby: bool = True
                ) -> dict[str, Any]:
    """Apply one action and return every output of the page (``no_update`` for what did not change).

    ``nearby=False`` leaves the window of nearby steps out even after a step (the page's first view: the
    page asks for it once it is drawn, trigger ``"window"``).

    ``trigger`` is a selection trigger (see :func:`update_selection`), an option name (a key of
    :data:`OPTION_INPUTS`' values), ``"url"`` (the address, on load and on back / forward), ``"boxes"``,
    ``"generations"`` or ``"analyses"`` (the live refresh and a stored analysis), or None.
    """
    store, keys = dict(store or {}), dict(keys or {})
    acted = trigger  # what the user set (options and the address are applied below and become None)
    if trigger == "window":  # the page asks for the window of its first view
        keys = {k: v for k, v in keys.items() if k != "step_data"}
        trigger = None
    options = ViewOptions.from_dict(store.get("options"))
    wanted = dict(store.get("wanted") or {})
    current = Selection.from_dict(store["selection"]) if store.get("selection") else None
    centre = False
    if trigger == "url":
        if _digest(value) != keys.get("address") or current is None:
            wanted, named = from_address(value)
            options = ViewOptions.from_dict(named)
            current, centre = None, bool(wanted.get("node"))  # a link to a node shows it; else the whole graph
        trigger = None
    elif trigger in OPTION_INPUTS.values():
        options = _options_after(options, trigger, value, list(cache.trials))
        trigger = None
    elif trigger == "jump":
        item = value[3] if len(value) > 3 else ""
        options = dataclasses.replace(options, focus=item, tab=options.tab)
        stored = cache.readable_diagnosis(current.trial if current else cache.trials[0])
        chosen = focus_of(stored.diagnosis if stored else None, item)
        named = evidence_statistic(chosen.evidence.series) if chosen and chosen.evidence else None
        if named is not None and named[0] in cache.recording(current.trial if current else cache.trials[0]).nodes:
            value = (named[0], value[1], named[1], item)
            wanted["stat"] = named[2]
        centre = True
    elif trigger in ("search",):
        centre = True
    fit = tapped = None
    if trigger == "graph" and isinstance(value, (tuple, list)) and value[1] == "box":
        fit = str(value[0])  # a box opened: its frame fills the view
    elif trigger == "graph" and isinstance(value, (tuple, list)) and value[1] == "node":
        tapped = str(value[0])
    if trigger == "trial" and current is not None and value != current.trial:
        options = dataclasses.replace(options, focus="")
    store["options"] = options.to_dict()
    store["wanted"] = wanted
    if current is not None:
        store["selection"] = current.to_dict()
    else:
        store.pop("selection", None)
    selection_trigger = None if trigger in ("generations", "analyses") else trigger
    selectors = update_selection(cache, selection_trigger, value, store)
    selection = Selection.from_dict(selectors["store"]["selection"])
    if trigger in ("trial", "generations"):  # another run, or this one grew: the step shown is the one wanted now,
        # so a step wanted in another trial does not pull the view along as this one grows towards it
        selectors["store"]["wanted"].update(step=selection.step, step_type=selection.step_type)
    if trigger == "generations" and options.follow and current is not None and selection.trial == current.trial \
            and selection.generation != current.generation:
        steps = cache.steps_of_type(selection.trial, selection.step_type)
        if len(steps) and selection.step != int(steps[-1]):
            selectors = _selectors(cache, {**selectors["store"]["wanted"], "step": int(steps[-1])}, options.to_dict())
            selection = Selection.from_dict(selectors["store"]["selection"])
    selectors["store"]["options"] = options.to_dict()
    out = _outputs(cache, selection, options, selectors, keys, centre=centre, fit=fit, visualization=visualization,
                   tapped=tapped, stepping=nearby and acted in STEPPING)
    for name in SETTABLE:
        if out[name] is not no_update and not _fresh(keys, "sent:" + name, out[name]) and \
                name != acted and not (name == "node" and acted == "search"):
            out[name] = no_update
    if acted in SETTABLE and out[acted] is not no_update and out[acted] == value:
        out[acted] = no_update  # the browser shows what the user just set: sending it back re-renders it
    out["keys"] = keys
    if trigger == "search":
        out["search"] = None  # ready for the next search, even of the same node
    return out


def _outputs(cache: ReaderCache, selection: Selection, options: ViewOptions, selectors: dict[str, Any],
             keys: dict[str, Any], *, centre: bool, fit: str | None, visualization: Visualization | None,
             tapped: str | None = None, stepping: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {name: no_update for name in OUTPUTS}
    out.update({k: v for k, v in selectors.items() if k in OUTPUTS})
    for name in UNCHANGING:  # option lists the browser already shows are not sent (nor re-rendered) again
        if name in selectors and not _fresh(keys, name, selectors[name]):
            out[name] = no_update
    out["store"] = selectors["store"]
    stamp = cache.analysis_stamp(selection.trial)
    drawn_key = (selection.trial, selection.step_type, selection.generation, list(selection.boxes),
                 options.show_implied, options.show_unused, stamp)
    if not _fresh(keys, "node_options", (selection.trial, selection.step_type, selection.generation, selection.node)):
        out["node_options"] = no_update
    address = to_address(selection, options)
    if _fresh(keys, "address", address):
        out["url"] = address
    out["tab"], out["theme"], out["colour"], out["follow"] = (TAB_ID.get(options.tab, ids.TAB_TENSORS), options.theme,
                                                              options.colour, ["follow"] if options.follow else [])
    out["graph_options"] = [name for name, on in (("implied", options.show_implied),
                                                  ("unused", options.show_unused)) if on]
    out["step_box"] = selection.step
    if _fresh(keys, "graph", drawn_key):
        view = graph_view(cache, selection, options)
        out["elements"], out["graph_note"], out["search"] = view["elements"], view["note"], None
        names = [option["value"] for option in view["search"]]
        if _fresh(keys, "node_names", names):  # every node: unchanged by opening a box
            out["node_names"] = names
    if _fresh(keys, "stylesheet", (options.theme, drawn_key)):  # a hot layer's ring moves with the boxes
        out["stylesheet"] = graph_stylesheet(options.theme) + hot_layer_stylesheet(cache, selection, options)
    state, scale = graph_state(cache, selection, options, centre=centre, fit=fit)
    painted = _fresh(keys, "graph_paint", (repr({**state, "selected": None}), drawn_key))
    if _fresh(keys, "graph_state", (repr(state), drawn_key)) or centre:
        # A tapped node was highlighted by the browser at the tap: when only the selection moved, and to
        # the tapped node, the browser already shows this state.
        if painted or centre or state["selected"] != tapped:
            out["graph_view"] = state
    if _fresh(keys, "colour_scale", scale):
        out["colour_scale"] = scale
    # The address names the whole view. An answer to another action sends nothing: the page drops its window
    # when the address changes other than in the step (one output fewer for Dash to apply on every tap).
    if (stepping or "step_data" not in keys) and _fresh(keys, "step_data", (address, selection.generation)):
        out["step_data"] = step_window(cache, selection, options, nearby=stepping)
    _tensors_outputs(cache, selection, options, keys, out)
    _tab_outputs(cache, selection, options, keys, out, stamp, visualization)
    out["keys"] = keys
    return out


def _tensors_outputs(cache: ReaderCache, selection: Selection, options: ViewOptions, keys: dict[str, Any],
                     out: dict[str, Any]) -> None:
    if options.tab != "tensors":
        return
    theme, stamp = options.theme, cache.analysis_stamp(selection.trial)
    if _fresh(keys, "overlay_options", (selection.trial, selection.step_type, selection.generation)):
        # (the overlay's node names are offered by the browser as the user types, from the graph's names)
        out["overlay_trials_options"] = [key for key in cache.trial_keys() if key != selection.trial]
    out["overlay_nodes"], out["overlay_trials"] = list(options.overlay_nodes), list(options.overlay_trials)
    out["timeline_options"], out["ema"] = (["log"] if options.log_y else []), options.ema
    out["values_mode"], out["values_page"] = options.values_mode, options.values_page
    panel_key = (selection.trial, selection.generation, selection.tensor, selection.kind, selection.step,
                 selection.iteration, selection.sample, options.values_mode, options.values_page, theme)
    if _fresh(keys, "panel", panel_key):
        panel = tensor_panel(cache, selection, options)
        out.update(header=panel["header"], stats=panel["stats"], histogram=panel["histogram"], values=panel["values"])
    timeline_key = (selection.trial, selection.generation, selection.node, selection.tensor, selection.kind,
                    selection.iteration, selection.stat, list(options.overlay_nodes), list(options.overlay_trials),
                    options.log_y, options.ema, options.focus, theme, stamp)
    if _fresh(keys, "timeline", timeline_key):
        out["timeline"] = timeline_view(cache, selection, options)
        keys["timeline_step"] = selection.step
    elif keys.get("timeline_step") != selection.step:
        patch = Patch()
        patch["layout"]["shapes"] = timeline_shapes(cache, selection, options)
        out["timeline"], keys["timeline_step"] = patch, selection.step


def _tab_outputs(cache: ReaderCache, selection: Selection, options: ViewOptions, keys: dict[str, Any],
                 out: dict[str, Any], stamp: str | None, visualization: Visualization | None) -> None:
    tab, theme = options.tab, options.theme
    if tab == "distribution":
        distribution_key = (selection.trial, selection.generation, selection.tensor, selection.kind,
                            selection.iteration, selection.sample, theme)
        if _fresh(keys, "distribution", distribution_key):
            out["distribution"] = distribution_view(cache, selection, options)
            keys["distribution_step"] = selection.step
        elif keys.get("distribution_step") != selection.step:
            patch = Patch()
            patch["layout"]["shapes"] = step_marker(selection.step, theme)
            out["distribution"], keys["distribution_step"] = patch, selection.step
    elif tab == "diagnosis":
        if _fresh(keys, "diagnosis", (selection.trial, selection.generation, stamp, selection.node, selection.step,
                                      options.focus, theme)):
            out["diagnosis"] = tabs.diagnosis_tab(cache, selection, options)
            out["evidence"] = tabs.evidence_panel(cache, selection, options)
    elif tab == "layers":
        if _fresh(keys, "layers", (selection.trial, selection.generation, selection.step_type, theme)):
            out["layers_note"], out["gradient_flow"], out["update_ratio"] = tabs.layers_tab(cache, selection, options)
            keys["layers_step"] = selection.step
        elif keys.get("layers_step") != selection.step:
            for name in ("gradient_flow", "update_ratio"):
                patch = Patch()
                patch["layout"]["shapes"][0] = step_marker(selection.step, theme)[0]
                out[name] = patch
            keys["layers_step"] = selection.step
    elif tab in ("kpis", "notes", "network"):
        function = {"kpis": tabs.kpis_tab, "notes": tabs.notes_tab, "network": tabs.network_tab}[tab]
        key = (selection.trial, selection.generation, theme) + ((selection.step,) if tab == "kpis" else ())
        if _fresh(keys, tab, key):
            out[tab] = function(cache, selection, options)
    elif tab == "compare":
        out["compare"] = tabs.compare_tab(cache, selection, options)
        out["compare_mode"], out["compare_trial"], out["compare_step"] = tabs.compare_choice(cache, selection, options)
    elif tab == "custom":
        out["custom"] = tabs.custom_tab(cache, visualization, selection)
    elif tab == "profile":
        if _fresh(keys, "profile", (selection.trial, selection.generation, selection.step, theme)):
            out["profile"] = profile_tab(cache, selection, options)
    if tab != "layers":
        keys.pop("layers", None)


def refresh_generations(cache: ReaderCache, previous: dict[str, int] | None) -> Any:
    """Refresh the readers; the new generations, or ``no_update`` when nothing was written since."""
    generations = cache.refresh()
    return no_update if generations == (previous or {}) else generations


def _trigger(triggered_id: Any, value: Any, inputs: dict[str, Any]) -> tuple[str | None, Any]:
    """Map Dash's ``ctx.triggered_id`` (and the triggering value) to :func:`update_view`'s trigger."""
    if isinstance(triggered_id, dict):
        kind = triggered_id.get("type")
        if kind == ids.STEPPER_TYPE and value:
            return "stepper", (triggered_id["selector"], int(triggered_id["delta"]))
        if kind == ids.DIAGNOSIS_JUMP_TYPE and value:
            return "jump", (triggered_id["node"], int(triggered_id["step"]), triggered_id["kind"],
                            triggered_id["item"])
        return None, None
    if triggered_id in CLICKABLE_PLOTS:
        points = (value or {}).get("points") or []
        return ("timeline", points[0].get("x")) if points else (None, None)
    if triggered_id == ids.STEP_ASK:
        if isinstance(value, (list, tuple)) and len(value) >= 2 and value[0] in ASKED:
            if value[0] == "graph":
                item = tap_item(value[1])
                return ("graph", item) if item is not None else (None, None)
            return str(value[0]), (value[1] or "") if value[0] == "url" else value[1]
        return None, None
    if triggered_id in (ids.GRAPH_EXPAND, ids.GRAPH_DEFAULT):
        return ("boxes", "expand" if triggered_id == ids.GRAPH_EXPAND else "default") if value else (None, None)
    if triggered_id == ids.GENERATION:
        return "generations", value
    if triggered_id == ids.ANALYSES:
        return "analyses", value
    if triggered_id == ids.GRAPH_SEARCH and not value:
        return None, None
    name = SELECTION_INPUTS.get(triggered_id) or OPTION_INPUTS.get(triggered_id)
    return (name, value) if name is not None else (None, None)


def register_callbacks(app: Dash, cache: ReaderCache, visualization: Visualization | None) -> None:
    """Wire every callback of the explorer to ``app``, closing over ``cache`` (no module state)."""
    def locked(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with cache.lock:
                return fn(*args, **kwargs)
        return run

    plain = {**SELECTION_INPUTS, **OPTION_INPUTS}
    inputs: dict[str, Any] = {f"i{n}": Input(component, "value") for n, component in enumerate(plain)}
    inputs.update(
        ask=Input(ids.STEP_ASK, "data"),
        plots={f"p{n}": Input(plot, "clickData") for n, plot in enumerate(CLICKABLE_PLOTS)},
        steppers=Input({"type": ids.STEPPER_TYPE, "selector": ALL, "delta": ALL}, "n_clicks"),
        jumps=Input({"type": ids.DIAGNOSIS_JUMP_TYPE, "item": ALL, "node": ALL, "step": ALL, "kind": ALL}, "n_clicks"),
        expand=Input(ids.GRAPH_EXPAND, "n_clicks"), default=Input(ids.GRAPH_DEFAULT, "n_clicks"),
        generations=Input(ids.GENERATION, "data"), analyses=Input(ids.ANALYSES, "data"))

    # The page arrives with its first view (app._page), so the callback runs only on actions.
    @app.callback(output={name: Output(*target) for name, target in OUTPUTS.items()}, inputs=inputs,
                  state={"store": State(ids.SELECTION, "data"), "keys": State(ids.KEYS, "data")},
                  prevent_initial_call=True)
    @locked
    def _view(store: dict[str, Any] | None, keys: dict[str, Any] | None, **given: Any) -> dict[str, Any]:
        triggered_value = ctx.triggered[0]["value"] if ctx.triggered else None
        trigger, value = _trigger(ctx.triggered_id, triggered_value, given)
        if trigger is None and ctx.triggered_id == ids.STEP_ASK:
            raise PreventUpdate  # the ask store reporting an empty value: nothing asked
        return update_view(cache, trigger, value, store, keys, visualization=visualization)

    register_zoom(app, cache, locked)
    # A tap on the graph is sent by the page's script to a route of its own (not an input of this callback).
    register_direct(app, cache, visualization, locked, set(plain))

    # The live refresh: one request per tick looks for new steps and for analyses stored from elsewhere (two
    # callbacks on the tick cost the page two rounds of Dash's work every interval, in the way of actions).
    def _refresh(_n: int, generations: dict[str, int] | None, store: dict[str, Any] | None,
                 analyses: dict[str, Any] | None) -> tuple[Any, Any]:
        return refresh_generations(cache, generations), tabs.analysis_state(cache, False, store, analyses)[0]
    app.callback(Output(ids.GENERATION, "data"), Output(ids.ANALYSES, "data"), Input(ids.INTERVAL, "n_intervals"),
                 State(ids.GENERATION, "data"), State(ids.SELECTION, "data"), State(ids.ANALYSES, "data"),
                 prevent_initial_call=True)(locked(_refresh))
    tabs.register_analysis_callbacks(app, cache, locked)
    register_clientside(app)
