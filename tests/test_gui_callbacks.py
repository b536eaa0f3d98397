"""The explorer's view callback and its views called as plain functions: exact options, values, tables and
figure data, and which outputs one action sends."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import plotly.io
import pytest
from dash import dcc, no_update
from test_gui_support import FAULT_NODE, FAULT_STEP, make_faulty, make_recording

import comgra_ndbg
from comgra_ndbg import open_recording
from comgra_ndbg.gui import callbacks, ids, panels, tabs
from comgra_ndbg.gui.app import create_app
from comgra_ndbg.gui.custom import CustomVisualizationError, load_visualization
from comgra_ndbg.gui.state import ReaderCache, Selection, ViewOptions
from comgra_ndbg.gui.zoom import zoom_timeline
from comgra_ndbg.store.results import results_path, write_results


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_recording(tmp_path_factory.mktemp("group"))


@pytest.fixture
def cache(group: Path) -> Iterator[ReaderCache]:
    cache = ReaderCache(group)
    yield cache
    cache.close()


def cells(component: Any) -> list[list[str]]:
    """The text of a table's body, row by row: an HTML table's cells, or a Markdown table's (unescaped)."""
    if isinstance(component, dcc.Markdown):
        rows = component.children.split("\n")[2:]  # after the header and its rule
        return [[re.sub(r"\\(.)", r"\1", cell.strip()) for cell in re.split(r"(?<!\\)\|", row)[1:-1]]
                for row in rows]
    body = component.children[1]
    return [[td.children for td in tr.children] for tr in body.children]


def act(cache: ReaderCache, trigger: str | None, value: Any, before: dict[str, Any] | None = None) -> dict[str, Any]:
    """One action through the view callback, starting from the page's first view or from ``before``: every
    output as the page then shows it (what was sent, else what it showed before); ``_sent`` names what
    this action sent."""
    if before is None:
        before = _shown({}, callbacks.update_view(cache, "url", "", None, None))
        if trigger is None:
            return before
    store, keys = json.loads(json.dumps(before["store"])), json.loads(json.dumps(before["keys"]))  # as the page has it
    out = callbacks.update_view(cache, trigger, value, store, keys)
    if trigger in callbacks.SETTABLE:
        before = {**before, trigger: value}  # the browser shows what the user set
    return _shown(before, out)


def _shown(before: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    sent = {name for name, value in out.items() if value is not no_update}
    return {**{k: v for k, v in before.items() if k != "_sent"}, **{k: out[k] for k in sent}, "_sent": sent}


def selection_of(out: dict[str, Any]) -> Selection:
    return Selection.from_dict(out["store"]["selection"])


def options_of(out: dict[str, Any]) -> ViewOptions:
    return ViewOptions.from_dict(out["store"]["options"])


def sent(out: dict[str, Any]) -> set[str]:
    return out["_sent"]


def test_first_load_fills_every_selector_with_valid_options(cache: ReaderCache) -> None:
    out = callbacks.update_selection(cache, None, None, None)
    assert out["trial_options"] == ["a", "b"] and out["trial"] == "a"
    assert out["step_type_options"] == ["long", "short"] and out["step_type"] == "short"
    assert (out["step_max"], out["step"], out["step_label"]) == (5, 5, "step 11 · 6 of 6 short steps")
    assert out["step_marks"] == {0: "1", 1: "3", 2: "5", 3: "7", 4: "9", 5: "11"}
    assert out["node_options"] == ["output"]  # the chosen node: typing in the selector adds the matching ones
    assert out["node"] == "output" and out["tensor_options"] == [{"label": "output", "value": "output"}]
    assert out["kind_options"] == [{"label": "value", "value": "value"}, {"label": "gradient", "value": "grad"}]
    assert out["sample_options"] == [{"label": "whole batch", "value": "batch"}] + [
        {"label": f"sample {i}", "value": i} for i in range(4)]
    assert (out["sample"], out["iteration_options"]) == ("batch", [0])
    assert out["status"] == "a: 12 recorded steps, last 11 · complete"
    assert out["store"]["wanted"] == {"step_type": "short", "step": 11}
    json.dumps(out["store"])  # the store is plain JSON


def test_clicking_a_node_then_stepping_keeps_the_other_selectors(cache: ReaderCache) -> None:
    out = act(cache, "graph", ("model.2", "node"))
    assert (out["node"], out["tensor"], out["kind"]) == ("model.2", "model.2.weight", "value")
    out = act(cache, "kind", "update", out)
    out = act(cache, "stepper", ("step", -1), out)
    assert (out["node"], out["tensor"], out["kind"], out["step_label"]) == (
        "model.2", "model.2.weight", "update", "step 9 · 5 of 6 short steps")
    out = act(cache, "trial", "b", out)
    assert (out["trial"], out["node"], out["kind"], out["step"]) == ("b", "model.2", "update", 4)


def test_one_action_sends_only_what_it_changed(cache: ReaderCache) -> None:
    first = act(cache, None, None)
    assert {"elements", "stylesheet", "graph_view", "timeline", "header", "stats", "url"} <= sent(first)
    step = act(cache, "stepper", ("step", -1), first)
    assert "elements" not in sent(step) and "stylesheet" not in sent(step)  # the graph is not sent again
    assert {"graph_view", "colour_scale"}.isdisjoint(sent(step))  # nor its state: same selection, role colours
    assert step["timeline"].to_plotly_json()["operations"][0]["location"] == ["layout", "shapes"]  # a patch
    tap = act(cache, "graph", ("hidden", "node"), step)
    assert "elements" not in sent(tap) and selection_of(tap).node == "hidden"
    assert {"graph_view", "step_label"}.isdisjoint(sent(tap))  # the browser drew the tap's lineage; same step
    picked = act(cache, "node", "loss", tap)  # chosen in the selector: the graph is told
    assert picked["graph_view"]["selected"] == "loss"
    tap = act(cache, "graph", ("hidden", "node"), picked)
    assert tap["url"] == "?trial=a&type=short&step=9&node=hidden&tensor=hidden&kind=value"
    again = act(cache, "graph", ("hidden", "node"), tap)
    assert {"timeline", "header", "stats", "graph_view", "url"}.isdisjoint(sent(again))


def test_opening_or_closing_a_box_sends_the_graph_but_not_the_node_list_again(cache: ReaderCache) -> None:
    first = act(cache, None, None)
    frame = next(e["data"]["id"] for e in first["elements"] if e["data"].get("kind") == "frame")
    closed = act(cache, "graph", (frame, "frame"), first)
    assert "elements" in sent(closed) and "node_names" not in sent(closed)
    assert len(closed["elements"]) < len(first["elements"])  # the box's nodes stand as one
    assert first["node_names"] == ["input", "model.0", "target", "hidden", "model.2", "output", "loss"]  # what the
    assert first["node_options"] == [first["node"]]  # search filters, in reading order; the selector: the chosen
    fresh = callbacks.update_view(cache, "url", closed["url"], None, None)  # a new page sends it
    assert fresh["node_names"] == first["node_names"]


def test_graph_elements_are_module_frames_nodes_and_edges(cache: ReaderCache) -> None:
    selection = selection_of(act(cache, None, None))
    view = panels.graph_view(cache, selection, ViewOptions())
    nodes = [(e["data"]["id"], e["classes"], e["data"].get("parent"), e["data"]["label"])
             for e in view["elements"] if "source" not in e["data"]]
    assert nodes == [("box:model", "frame", None, "model"), ("hidden", "role-intermediate", None, "hidden"),
                     ("input", "role-input", None, "input"), ("loss", "role-loss", None, "loss"),
                     ("model.0", "role-parameter parameter", "box:model", "0"),
                     ("model.2", "role-parameter parameter", "box:model", "2"),
                     ("output", "role-output", None, "output"), ("target", "role-target", None, "target")]
    assert view["note"] == "7 drawn of 7 nodes, 0 module boxes collapsed"
    assert [o["value"] for o in view["search"]] == ["input", "model.0", "target", "hidden", "model.2", "output", "loss"]
    state, scale = panels.graph_state(cache, selection, ViewOptions(), centre=False)
    assert (state, scale) == ({"selected": "output", "colours": None, "centre": False, "fit": None}, "")


def test_colouring_by_a_statistic_colours_every_item_at_the_step(cache: ReaderCache) -> None:
    selection = selection_of(act(cache, None, None))
    state, scale = panels.graph_state(cache, selection, ViewOptions(colour="value:rms"), centre=False)
    assert sorted(state["colours"]) == ["hidden", "input", "loss", "model.0", "model.2", "output", "target"]
    assert all(c.startswith("#") and len(c) == 7 for c in state["colours"].values())
    assert scale[0] == "value RMS at step 11:"
    moved = panels.graph_state(cache, Selection.from_dict({**selection.to_dict(), "step": 1}),
                               ViewOptions(colour="value:rms"), centre=False)[0]
    assert moved["colours"] != state["colours"]


def test_a_step_change_sends_the_statistics_as_one_component(cache: ReaderCache) -> None:
    tap = act(cache, "graph", ("hidden", "node"))
    step = act(cache, "stepper", ("step", -1), tap)
    sent_table = step["stats"]
    assert isinstance(sent_table, dcc.Markdown) and isinstance(sent_table.children, str)  # no cell components
    fresh = callbacks.update_view(cache, "url", step["url"], None, None)["stats"]  # the view drawn anew
    assert cells(sent_table) == cells(fresh)
    before, after = dict(cells(tap["stats"])), dict(cells(sent_table))
    assert list(before) == list(after) and before["mean"] != after["mean"] and after["count"] == "48"


def test_tensor_panel_shows_the_recorded_statistics_values_and_histogram(cache: ReaderCache, group: Path) -> None:
    out = act(cache, "stepper", ("step", -1), act(cache, "graph", ("hidden", "node")))  # step 9
    selection = selection_of(out)
    panel = panels.tensor_panel(cache, selection, ViewOptions(values_mode="table"))
    assert panel["header"] == ("hidden / hidden · value · step 9 (short) · iteration 0 · whole batch · shape "
                               "(6, 8) float32")
    recording = open_recording(group, "a")
    steps, means = recording.summary("hidden", stat="mean")
    table = dict(cells(panel["stats"]))
    assert table["mean"] == f"{means[list(steps).index(9)]:.6g}" and table["count"] == "48"
    snapshot = recording.snapshot(9, "hidden")
    rows = cells(panel["values"][0])
    assert rows[0] == ["(0, 0)", f"{snapshot.values[0]:.6g}"] and len(rows) == 32
    canvas = panel["histogram"].children[1]  # drawn by the page from the bins it carries
    assert canvas.className == "histogram-canvas" and sum(json.loads(getattr(canvas, "data-counts"))) == 32
    assert panel["histogram"].children[0].children.endswith("· 32 values")
    image = _find(panels.tensor_panel(cache, selection, ViewOptions())["values"], ids.VALUES_IMAGE)
    assert json.loads(getattr(image, "data-rows")) == ["0", "1", "2", "3"]  # one row per sample
    assert json.loads(getattr(image, "data-cells")) == snapshot.dense().reshape(4, -1).tolist()
    one = panels.tensor_panel(cache, selection_of(act(cache, "sample", 2, out)), ViewOptions(values_mode="table"))
    assert [r[0] for r in cells(one["values"][0])] == [f"({i},)" for i in range(8)]
    assert cells(one["values"][0])[0][1] == f"{snapshot.dense()[2, 0]:.6g}"


def _find(component: object, component_id: str) -> object | None:
    """The component with ``component_id`` in a Dash layout tree."""
    if getattr(component, "id", None) == component_id:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        found = _find(child, component_id) if child is not None and not isinstance(child, str) else None
        if found is not None:
            return found
    return None


def test_the_sample_spread_is_listed_tabulated_and_plotted(cache: ReaderCache, group: Path) -> None:
    """A batch statistic: the whole batch's table and timeline show it, one sample's table shows it unknown."""
    page = create_app(group).layout()
    assert {"sample_spread", "sample_spread_rms"} <= set(_find(page, ids.STAT).options)
    out = act(cache, "graph", ("hidden", "node"))
    panel = panels.tensor_panel(cache, selection_of(out), ViewOptions(values_mode="table"))
    recording = open_recording(group, "a")
    steps, spread = recording.summary("hidden", stat="sample_spread")
    table = dict(cells(panel["stats"]))
    assert 0 < spread[-1] < 1 and table["sample_spread"] == f"{spread[-1]:.6g}"
    sample = panels.tensor_panel(cache, selection_of(act(cache, "sample", 2, out)), ViewOptions(values_mode="table"))
    assert dict(cells(sample["stats"]))["sample_spread"] == "—"
    restat = act(cache, "stat", "sample_spread", out)
    figure = restat["timeline"]
    assert figure["layout"]["yaxis"]["title"]["text"] == "sample_spread"
    plotted = {x: y for trace in figure["data"] for x, y in zip(trace["x"], trace["y"])}
    assert plotted == pytest.approx(dict(zip(steps.tolist(), spread.tolist())), rel=1e-12)


def test_timeline_is_patched_when_only_the_step_moves(cache: ReaderCache) -> None:
    out = act(cache, "graph", ("loss", "node"))
    figure = out["timeline"]
    assert [trace["name"] for trace in figure["data"]] == ["long", "short"]
    assert figure["layout"]["shapes"][0]["x0"] == 11
    plotly.io.to_json(figure)  # serializable as Dash sends it
    clicked = act(cache, "timeline", 4, out)
    assert (clicked["step_type"], clicked["step_label"]) == ("long", "step 4 · 3 of 6 long steps")
    assert clicked["timeline"].to_plotly_json()["operations"] == [
        {"operation": "Assign", "location": ["layout", "shapes"],
         "params": {"value": [{"type": "line", "xref": "x", "yref": "paper", "x0": 4, "x1": 4, "y0": 0, "y1": 1,
                               "line": {"color": "#D62728", "width": 2}}]}}]
    restat = act(cache, "stat", "abs_max", clicked)
    assert restat["timeline"]["layout"]["yaxis"]["title"]["text"] == "abs_max"


def test_a_zoom_sends_the_zoomed_range_and_a_reset_the_whole_run(cache: ReaderCache) -> None:
    out = act(cache, "graph", ("loss", "node"))
    whole = out["timeline"]
    zoomed = zoom_timeline(cache, [3.5, 8.2], out["store"])
    assert zoomed["layout"]["xaxis"]["range"] == [3.5, 8.2]
    assert [trace["x"] for trace in zoomed["data"]] == [[2, 4, 6, 8, 10], [3, 5, 7, 9]]  # each edge's neighbour too
    assert [trace["x"] for trace in whole["data"]] == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]]
    for reset in ("all", [5, 5], ["a", 1], [float("nan"), 3]):  # a reset, or no range to show: the whole run
        assert zoom_timeline(cache, reset, out["store"]) == whole
    assert zoom_timeline(cache, [3, 8], None) is no_update
    assert zoom_timeline(cache, None, out["store"]) is no_update  # the page's empty store, reported


def test_a_value_the_user_just_set_is_not_sent_back(cache: ReaderCache) -> None:
    first = act(cache, None, None)
    moved = act(cache, "step", 2, first)
    assert "step" not in sent(moved) and selection_of(moved).step == 5 and moved["step_label"].startswith("step 5 ")
    typed = act(cache, "step_box", 40, moved)  # no step 40: the nearest one is shown, in the box too
    assert typed["step_box"] == selection_of(typed).step == 11 and "step_box" in sent(typed)


def test_timeline_overlays_nodes_and_trials_with_log_scale_and_smoothing(cache: ReaderCache) -> None:
    out = act(cache, "graph", ("hidden", "node"))
    out = act(cache, "overlay_nodes", ["output", "loss"], out)
    out = act(cache, "overlay_trials", ["b"], out)
    names = [t["name"] for t in out["timeline"]["data"]]
    assert names == ["a · hidden", "a · output", "a · loss", "b · hidden"]
    out = act(cache, "timeline_options", ["log"], out)
    assert out["timeline"]["layout"]["yaxis"]["type"] == "log"
    out = act(cache, "ema", 0.5, out)
    smoothed = out["timeline"]["data"]
    assert [t["name"] for t in smoothed if t.get("showlegend", True)] == [f"{n} (EMA 0.5)" for n in names]
    assert out["url"].endswith("&overlay=output%2Closs&trials=b&logy=1&ema=0.5")


def test_trigger_mapping_from_dash_ids() -> None:
    # a tap reaches the view callback only through the ask store, when the tap route could not answer it
    assert callbacks._trigger(ids.GRAPH, {"id": "hidden", "kind": "node"}, {}) == (None, None)
    assert callbacks._trigger(ids.STEP_ASK, ["graph", ["hidden", "node"], 1], {}) == ("graph", ("hidden", "node"))
    assert callbacks._trigger(ids.TIMELINE, {"points": [{"x": 7, "y": 1.0}]}, {}) == ("timeline", 7)
    assert callbacks._trigger(ids.GRADIENT_FLOW, {"points": [{"x": 3}]}, {}) == ("timeline", 3)
    assert callbacks._trigger(ids.stepper("kind", 1), 3, {}) == ("stepper", ("kind", 1))
    assert callbacks._trigger(ids.stepper("kind", 1), 0, {}) == (None, None)
    assert callbacks._trigger(ids.diagnosis_jump("e0", "hidden", 5, "grad"), 1, {}) == (
        "jump", ("hidden", 5, "grad", "e0"))
    assert callbacks._trigger(ids.diagnosis_jump("e0", "hidden", 5, "grad"), 0, {}) == (None, None)
    # the slider, the step box and the address reach the view through the page's script (clientside ask)
    assert callbacks._trigger(ids.STEP_ASK, ["step", 3, 1.0], {}) == ("step", 3)
    assert callbacks._trigger(ids.STEP_ASK, ["step_box", 40, 1.0], {}) == ("step_box", 40)
    assert callbacks._trigger(ids.STEP_ASK, ["url", "?step=3", 1.0], {}) == ("url", "?step=3")
    assert callbacks._trigger(ids.STEP_ASK, ["url", None, 1.0], {}) == ("url", "")
    assert callbacks._trigger(ids.STEP_ASK, ["tab", "x", 1.0], {}) == (None, None)
    assert callbacks._trigger(ids.STEP_ASK, None, {}) == (None, None)
    assert callbacks._trigger(ids.STEP, 3, {}) == (None, None)
    assert callbacks._trigger(ids.THEME, "dark", {}) == ("theme", "dark")
    assert callbacks._trigger(ids.GRAPH_EXPAND, 1, {}) == ("boxes", "expand")
    assert callbacks._trigger(None, None, {}) == (None, None)


def test_refresh_returns_no_update_when_nothing_changed(cache: ReaderCache) -> None:
    assert callbacks.refresh_generations(cache, None) == {"a": 0, "b": 0}
    assert callbacks.refresh_generations(cache, {"a": 0, "b": 0}) is no_update


def test_tabs_compute_only_when_open(cache: ReaderCache) -> None:
    first = act(cache, None, None)
    assert {"kpis", "notes", "network", "compare", "diagnosis", "gradient_flow"}.isdisjoint(sent(first))
    graphs = act(cache, "tab", ids.TAB_KPIS, first)["kpis"]
    figure = graphs[0].children[1].figure
    assert [trace["name"] for trace in figure["data"]] == ["long", "short"]
    assert figure["data"][0]["x"] == [0, 2, 4, 6, 8, 10]
    selection, options = selection_of(first), options_of(first)
    assert cells(tabs.notes_tab(cache, selection, options))[0][::2] == ["3", "learning rate kept"]
    network = tabs.network_tab(cache, selection, options)
    assert network.children[0].children == "58 parameters in 3 modules"
    assert [row[1:] for row in cells(network.children[1].children)] == [
        ["Sequential", "0", "58"], ["Linear", "40", "40"], ["Linear", "18", "18"]]


def test_layers_tab_draws_gradient_flow_and_update_ratio_per_layer(cache: ReaderCache, group: Path) -> None:
    out = act(cache, "tab", ids.TAB_LAYERS, act(cache, None, None))
    assert out["layers_note"].startswith("2 layers (parameter nodes) in forward order")
    flow = out["gradient_flow"]
    assert [t["name"] for t in flow["data"]] == ["model.0", "model.2"]
    recording = open_recording(group, "a")
    steps, weight = recording.summary("model.0.weight", "grad", stat="l2")
    _, bias = recording.summary("model.0.bias", "grad", stat="l2")
    assert flow["data"][0]["x"] == steps.tolist()
    assert flow["data"][0]["y"][0] == pytest.approx(float((weight[0] ** 2 + bias[0] ** 2) ** 0.5), rel=1e-5)
    ratio = out["update_ratio"]
    assert [t["name"] for t in ratio["data"]] == ["model.0", "model.2"] and ratio["layout"]["yaxis"]["type"] == "log"
    moved = act(cache, "stepper", ("step", -1), out)
    assert moved["gradient_flow"].to_plotly_json()["operations"][0]["location"] == ["layout", "shapes", 0]


def test_a_healthy_run_says_so_and_marks_nothing(tmp_path: Path) -> None:
    group = make_recording(tmp_path, trials=("a",), steps=6)
    comgra_ndbg.analyze(group, trial="a")
    cache = ReaderCache(group)
    out = act(cache, None, None)
    view = tabs.diagnosis_tab(cache, selection_of(out), options_of(out))
    assert [getattr(c, "children", None) for c in view.children[1:3]] == [
        "Hypotheses (0)", "Healthy run: no failure hypothesis."]
    assert not any("event" in e.get("classes", "") for e in out["elements"])
    cache.close()


def test_an_unreadable_analysis_is_reported_in_the_tab_and_marks_nothing(tmp_path: Path) -> None:
    group = make_recording(tmp_path, trials=("a",), steps=4)
    cache = ReaderCache(group)
    out = act(cache, None, None)
    selection, options = selection_of(out), options_of(out)
    location = cache.recording("a").location
    write_results(location, {"trial": "a"}, num_steps=4, last_step=3)  # no events, no hypotheses: unreadable
    error = tabs.diagnosis_tab(cache, selection, options).children[0]
    assert error.className == "message error"
    assert error.children.startswith(f"{results_path(location)} holds an analysis this version cannot read")
    elements = panels.graph_view(cache, selection, options)["elements"]
    assert not any("event" in e.get("classes", "") for e in elements)
    results_path(location).write_text("{")
    unparsable = tabs.diagnosis_tab(cache, selection, options).children[0]
    assert "holds no readable analysis results" in unparsable.children
    cache.close()


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_faulty(tmp_path_factory.mktemp("faulty"))


def test_analyze_now_stores_the_diagnosis_and_the_tab_marks_graph_and_timeline(faulty: Path) -> None:
    cache = ReaderCache(faulty)
    out = act(cache, None, None)
    selection, options = selection_of(out), options_of(out)
    assert tabs.diagnosis_tab(cache, selection, options).children[0].children.startswith(
        "No analysis stored for this trial yet")
    store = out["store"]
    assert tabs.analysis_state(cache, False, store, {"fault": None}) == (no_update, no_update)
    stamps, status = tabs.analysis_state(cache, True, store, {"fault": None})
    assert stamps == {"fault": cache.analysis_stamp("fault")} and stamps["fault"] is not None
    assert status.startswith("Analysed 24 steps of trial fault in ") and status.endswith(": 1 hypothesis, 1 event.")
    assert tabs.analysis_state(cache, False, store, stamps) == (no_update, no_update)

    view = tabs.diagnosis_tab(cache, selection, options)
    assert view.children[0].children == ("trial fault: 24 steps analysed (up to step 23) · 1 hypothesis · 1 event · "
                                         "0 coupled failures")
    card = view.children[2].children[0]
    assert card.id == ids.diagnosis_jump("h0", FAULT_NODE, FAULT_STEP, "value")
    assert card.children[0].children[3].children.startswith(f"Saturation originated in '{FAULT_NODE}' at step 10")

    marked = act(cache, "analyses", stamps, out)
    classes = {e["data"]["id"]: e["classes"] for e in marked["elements"] if "source" not in e["data"]}
    assert classes[FAULT_NODE] == "role-intermediate has-event event-origin"
    assert [n for n, c in classes.items() if "event" in c] == [FAULT_NODE]
    badge = next(e["data"]["label"] for e in marked["elements"] if e["data"]["id"] == FAULT_NODE)
    assert badge == f"{FAULT_NODE}\n⚑ saturated"

    figure = act(cache, "graph", (FAULT_NODE, "node"), marked)["timeline"]
    assert [s["x0"] for s in figure["layout"]["shapes"]] == [22, FAULT_STEP]  # the step marker, the event line
    assert figure["layout"]["annotations"][0]["text"] == "⚑ saturated"
    assert "activation_regime: normal → saturated · hidden1 (value) · steps 10–23" in (
        figure["layout"]["annotations"][0]["hovertext"])
    other = act(cache, "graph", ("hidden0", "node"), marked)["timeline"]
    assert other["layout"]["annotations"] == []
    cache.close()


def test_choosing_a_hypothesis_selects_node_step_and_statistic_and_draws_the_evidence(faulty: Path) -> None:
    cache = ReaderCache(faulty)
    comgra_ndbg.analyze(faulty, trial="fault")
    out = act(cache, "tab", ids.TAB_DIAGNOSIS, act(cache, "stat", "abs_max"))
    assert (out["node"], out["step_label"]) == ("output", "step 22 · 23 of 24 default steps")
    card = out["diagnosis"].children[2].children[0]
    trigger, value = callbacks._trigger(card.id, 1, {})
    assert (trigger, value) == ("jump", (FAULT_NODE, FAULT_STEP, "value", "h0"))
    jumped = act(cache, trigger, value, out)
    assert (jumped["node"], jumped["tensor"], jumped["kind"]) == (FAULT_NODE, FAULT_NODE, "value")
    assert (jumped["step"], jumped["step_label"]) == (10, "step 10 · 11 of 24 default steps")
    assert (jumped["stat"], jumped["trial"]) == ("saturated_fraction", "fault")  # the statistic the rule fired on
    assert jumped["diagnosis"].children[2].children[0].className == "hypothesis current"
    evidence = jumped["evidence"]
    facts = dict(cells(evidence.children[2]))
    assert facts["series"] == f"{FAULT_NODE}/value/saturated_fraction"
    assert facts["threshold"] == "saturated_enter = 0.5" and facts["onset – end"] == "step 10 – step 23"
    assert evidence.children[1].children.startswith("Remedy: ")
    plot = evidence.children[3].children[1].figure
    lines = [(s["type"], s.get("y0")) for s in plot["layout"]["shapes"]]
    assert ("line", 0.5) in lines  # the threshold across the plot
    assert {"rect", "line"} <= {kind for kind, _ in lines}  # the span from onset to end, the onset
    timeline = act(cache, "tab", ids.TAB_TENSORS, jumped)["timeline"]
    assert timeline["layout"]["yaxis"]["title"]["text"] == "saturated_fraction"
    assert "saturated_enter 0.5" in [a["text"] for a in timeline["layout"]["annotations"]]
    cache.close()


def test_compare_two_trials_side_by_side(cache: ReaderCache, group: Path) -> None:
    selection = selection_of(act(cache, "graph", ("hidden", "node")))
    view = tabs.compare_tab(cache, selection, ViewOptions(compare_mode="trial", compare_trial="b"))
    table = {row[0]: row[1:] for row in cells(view.children[1].children[0].children.children)}
    a = open_recording(group, "a").summary("hidden", stat="max")[1][-1]
    b = open_recording(group, "b").summary("hidden", stat="max")[1][-1]
    assert table["max"] == [f"{a:.6g}", f"{b:.6g}", f"{b - a:.6g}"]
    histogram = view.children[1].children[1].children.children[1].figure
    assert [t["name"] for t in histogram["data"]] == ["A: a · step 11 · value", "B: b · step 11 · value"]
    assert histogram["layout"]["barmode"] == "overlay"
    steps = tabs.compare_tab(cache, selection, ViewOptions(compare_mode="step", compare_step=1))
    assert "A: a · step 11 · value vs B: a · step 1 · value" in steps.children[0].children


def test_custom_visualization_contract(cache: ReaderCache, tmp_path: Path) -> None:
    good = tmp_path / "viz.py"
    good.write_text("from dash import html\nTITLE = 'Mine'\n"
                    "def visualize(recording, selection):\n"
                    "    return html.Div(f'{recording.trial} {selection.node} {selection.step}', id='mine')\n")
    selection = selection_of(act(cache, None, None))
    view = tabs.custom_tab(cache, load_visualization(good), selection)
    assert view.children[0].children == "Mine" and view.children[1].children == "a output 11"
    broken = tmp_path / "broken.py"
    broken.write_text("def visualize(recording, selection):\n    return 1 / 0\n")
    error = tabs.custom_tab(cache, load_visualization(broken), selection).children[1]
    assert "ZeroDivisionError" in error.children and error.className == "message error"
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def visualize(recording, selection):\n    return object()\n")
    assert "returned a object" in tabs.custom_tab(cache, load_visualization(wrong), selection).children[1].children


@pytest.mark.parametrize("text, expected", [
    ("x = (", "importing .* failed at line 1: SyntaxError"),
    ("def other(): pass\n", "defines no function visualize"),
    ("def visualize(recording): pass\n", r"cannot be called with \(recording, selection\)"),
    ("raise RuntimeError('boom')\n", "failed at line 1: RuntimeError: boom"),
])
def test_unusable_visualization_files_fail_at_start_with_a_clear_error(tmp_path: Path, text: str,
                                                                       expected: str) -> None:
    path = tmp_path / "viz.py"
    path.write_text(text)
    with pytest.raises(CustomVisualizationError, match=expected):
        load_visualization(path)
    with pytest.raises(CustomVisualizationError, match="does not exist"):
        load_visualization(tmp_path / "missing.py")


def test_create_app_serves_the_first_view_with_the_page(group: Path) -> None:
    app = create_app(group)
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    layout = json.dumps(client.get("/_dash-layout", headers={"Referer": "http://x/?node=hidden&step=3"}).get_json())
    assert '"type": "Cytoscape"' in layout and f'"id": "{ids.GRAPH}"' in layout
    assert '"children": "step 3 \\u00b7 2 of 6 short steps"' in layout  # the address' view, without a callback
    assert '"value": "hidden"' in layout
    assert client.get("/_dash-dependencies").status_code == 200
    # the view, the live refresh (new steps and stored analyses, one request per tick), Analyze now, the trial
    # selector's sort and filter, the zoomed timeline, and eight browser-side ones (the graph's state, fit and
    # centre, the search's, the node selector's and the overlay's node options, the zoom range, the theme, the
    # exports) plus the one that shows a step in the browser or asks the view for it; a tap's highlight, the
    # hover line and the step buttons need none: cytoscape's tap and mouseover events and the slider's thumb
    assert len(app.callback_map) == 14
