"""The explorer's callbacks called as plain functions: exact options, values, tables and figure data."""
from __future__ import annotations

import json
from pathlib import Path

import plotly.io
import pytest
from dash import html, no_update
from test_gui_support import FAULT_NODE, FAULT_STEP, make_faulty, make_recording

import comgra_ndbg
from comgra_ndbg import open_recording
from comgra_ndbg.gui import callbacks, ids, tabs
from comgra_ndbg.gui.app import create_app
from comgra_ndbg.gui.custom import CustomVisualizationError, load_visualization
from comgra_ndbg.gui.state import ReaderCache, Selection
from comgra_ndbg.store.results import results_path, write_results


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_recording(tmp_path_factory.mktemp("group"))


@pytest.fixture
def cache(group: Path) -> ReaderCache:
    cache = ReaderCache(group)
    yield cache
    cache.close()


def cells(component: html.Table) -> list[list[str]]:
    """The text of a rendered table's body, row by row."""
    body = component.children[1]
    return [[td.children for td in tr.children] for tr in body.children]


def test_first_load_fills_every_selector_with_valid_options(cache: ReaderCache) -> None:
    out = callbacks.update_selection(cache, None, None, None)
    assert out["trial_options"] == ["a", "b"] and out["trial"] == "a"
    assert out["step_type_options"] == ["long", "short"] and out["step_type"] == "short"
    assert (out["step_max"], out["step"], out["step_label"]) == (5, 5, "step 11 · 6 of 6 short steps")
    assert out["step_marks"] == {0: "1", 1: "3", 2: "5", 3: "7", 4: "9", 5: "11"}
    assert out["node"] == "output" and out["tensor_options"] == [{"label": "output", "value": "output"}]
    assert out["kind_options"] == [{"label": "value", "value": "value"}, {"label": "gradient", "value": "grad"}]
    assert out["sample_options"] == [{"label": "whole batch", "value": "batch"}] + [
        {"label": f"sample {i}", "value": i} for i in range(4)]
    assert (out["sample"], out["iteration_options"], out["collapse"]) == ("batch", [0], [])
    assert out["status"] == "a: 12 recorded steps, last 11 · complete"
    assert out["store"]["wanted"] == {"step_type": "short", "step": 11}
    json.dumps(out["store"])  # the store is plain JSON


def test_clicking_a_node_then_stepping_keeps_the_other_selectors(cache: ReaderCache) -> None:
    out = callbacks.update_selection(cache, None, None, None)
    out = callbacks.update_selection(cache, "graph", "model.2", out["store"])
    assert (out["node"], out["tensor"], out["kind"]) == ("model.2", "model.2.weight", "value")
    out = callbacks.update_selection(cache, "kind", "update", out["store"])
    out = callbacks.update_selection(cache, "stepper", ("step", -1), out["store"])
    assert (out["node"], out["tensor"], out["kind"], out["step_label"]) == (
        "model.2", "model.2.weight", "update", "step 9 · 5 of 6 short steps")
    out = callbacks.update_selection(cache, "trial", "b", out["store"])
    assert (out["trial"], out["node"], out["kind"], out["step"]) == ("b", "model.2", "update", 4)


def test_graph_elements_are_sent_only_when_the_graph_changes(cache: ReaderCache) -> None:
    out = callbacks.update_selection(cache, None, None, None)
    elements, key = callbacks.graph_view(cache, out["store"], None)
    assert sorted(e["data"]["id"] for e in elements if "source" not in e["data"]) == [
        "hidden", "input", "loss", "model.0", "model.2", "output", "target"]
    assert key == ["a", "short", [], 0, None]  # None: no analysis stored
    assert not any("has-event" in e.get("classes", "") for e in elements)
    moved = callbacks.update_selection(cache, "graph", "hidden", out["store"])
    assert callbacks.graph_view(cache, moved["store"], key) == (no_update, no_update)
    collapsed = callbacks.update_selection(cache, "collapsed", ["model"], moved["store"])
    elements, _ = callbacks.graph_view(cache, collapsed["store"], key)
    assert "model" in [e["data"]["id"] for e in elements] and "model.0" not in [e["data"]["id"] for e in elements]


def test_graph_style_highlights_the_selection(cache: ReaderCache) -> None:
    out = callbacks.update_selection(cache, "graph", "hidden", None)
    selectors = [rule["selector"] for rule in callbacks.graph_style(cache, out["store"])]
    assert 'node[id = "hidden"]' in selectors and 'node[id = "loss"]' in selectors
    assert 'edge[source = "model.0"][target = "hidden"]' in selectors


def test_tensor_panel_shows_the_recorded_statistics_values_and_histogram(cache: ReaderCache, group: Path) -> None:
    out = callbacks.update_selection(cache, "graph", "hidden", None)
    out = callbacks.update_selection(cache, "stepper", ("step", -1), out["store"])  # step 9
    panel = callbacks.tensor_panel(cache, out["store"], "table", 1)
    assert panel["header"] == ("hidden / hidden · value · step 9 (short) · iteration 0 · whole batch · shape "
                               "(6, 8) float32")
    recording = open_recording(group, "a")
    steps, means = recording.summary("hidden", stat="mean")
    table = dict(cells(panel["stats"]))
    assert table["mean"] == f"{means[list(steps).index(9)]:.6g}" and table["count"] == "48"
    snapshot = recording.snapshot(9, "hidden")
    rows = cells(panel["values"][0])
    assert rows[0] == ["(0, 0)", f"{snapshot.values[0]:.6g}"] and len(rows) == 32
    assert sum(panel["histogram"]["data"][0]["y"]) == 32
    heat = callbacks.tensor_panel(cache, out["store"], "heatmap", 1)["values"].figure
    assert heat["data"][0]["y"] == [0, 1, 2, 3] and len(heat["data"][0]["z"]) == 4
    sample = callbacks.update_selection(cache, "sample", 2, out["store"])
    one = callbacks.tensor_panel(cache, sample["store"], "table", 1)
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
    out = callbacks.update_selection(cache, "graph", "hidden", None)
    panel = callbacks.tensor_panel(cache, out["store"], "table", 1)
    recording = open_recording(group, "a")
    steps, spread = recording.summary("hidden", stat="sample_spread")
    table = dict(cells(panel["stats"]))
    assert 0 < spread[-1] < 1 and table["sample_spread"] == f"{spread[-1]:.6g}"
    sample = callbacks.tensor_panel(cache, callbacks.update_selection(cache, "sample", 2, out["store"])["store"],
                                    "table", 1)
    assert dict(cells(sample["stats"]))["sample_spread"] == "—"
    restat = callbacks.update_selection(cache, "stat", "sample_spread", out["store"])
    figure, _ = callbacks.timeline_view(cache, restat["store"], None)
    plotted = {x: y for trace in figure["data"] for x, y in zip(trace["x"], trace["y"])}
    assert plotted == pytest.approx(dict(zip(steps.tolist(), spread.tolist())), rel=1e-12)


def test_timeline_is_patched_when_only_the_step_moves(cache: ReaderCache) -> None:
    out = callbacks.update_selection(cache, "graph", "loss", None)
    figure, key = callbacks.timeline_view(cache, out["store"], None)
    assert [trace["name"] for trace in figure["data"]] == ["long", "short"]
    assert figure["layout"]["shapes"][0]["x0"] == 11
    plotly.io.to_json(figure)  # serializable as Dash sends it
    clicked = callbacks.update_selection(cache, "timeline", 4, out["store"])
    assert (clicked["step_type"], clicked["step_label"]) == ("long", "step 4 · 3 of 6 long steps")
    patch, same = callbacks.timeline_view(cache, clicked["store"], key)
    assert same is no_update
    assert patch.to_plotly_json()["operations"] == [
        {"operation": "Assign", "location": ["layout", "shapes"],
         "params": {"value": [{"type": "line", "xref": "x", "yref": "paper", "x0": 4, "x1": 4, "y0": 0, "y1": 1,
                               "line": {"color": "#D62728", "width": 2}}]}}]
    restat = callbacks.update_selection(cache, "stat", "abs_max", clicked["store"])
    figure, new_key = callbacks.timeline_view(cache, restat["store"], key)
    assert new_key[-2:] == ["abs_max", None] and figure["layout"]["yaxis"]["title"]["text"] == "abs_max"


def test_trigger_mapping_from_dash_ids() -> None:
    assert callbacks._trigger(ids.GRAPH, None, {"graph": {"id": "hidden", "label": "x"}}) == ("graph", "hidden")
    assert callbacks._trigger(ids.TIMELINE, {"points": [{"x": 7, "y": 1.0}]}, {}) == ("timeline", 7)
    assert callbacks._trigger(ids.stepper("kind", 1), 3, {}) == ("stepper", ("kind", 1))
    assert callbacks._trigger(ids.stepper("kind", 1), 0, {}) == (None, None)
    assert callbacks._trigger(ids.diagnosis_jump("e0", "hidden", 5, "grad"), 1, {}) == ("jump", ("hidden", 5, "grad"))
    assert callbacks._trigger(ids.diagnosis_jump("e0", "hidden", 5, "grad"), 0, {}) == (None, None)
    assert callbacks._trigger(ids.STEP, None, {"step": 3}) == ("step", 3)
    assert callbacks._trigger(None, None, {}) == (None, None)
    assert [callbacks._kind_label(k) for k in ("value", "grad", "grad:aux", "update")] == [
        "value", "gradient", "gradient (aux)", "update"]


def test_tensors_body_is_inserted_once() -> None:
    assert callbacks.tensors_body(None, None) is no_update
    body = callbacks.tensors_body({"selection": {}}, None)
    assert body.children[0].id == ids.TENSOR_HEADER
    assert callbacks.tensors_body({"selection": {}}, body) is no_update


def test_refresh_returns_no_update_when_nothing_changed(cache: ReaderCache) -> None:
    assert callbacks.refresh_generations(cache, None) == {"a": 0, "b": 0}
    assert callbacks.refresh_generations(cache, {"a": 0, "b": 0}) is no_update


def test_tabs_compute_only_when_active(cache: ReaderCache) -> None:
    store = callbacks.update_selection(cache, None, None, None)["store"]
    assert tabs.kpis_tab(cache, store, ids.TAB_TENSORS) is no_update
    graphs = tabs.kpis_tab(cache, store, ids.TAB_KPIS)
    assert [trace["name"] for trace in graphs[0].figure["data"]] == ["long", "short"]
    assert graphs[0].figure["data"][0]["x"] == [0, 2, 4, 6, 8, 10]
    assert cells(tabs.notes_tab(cache, store, ids.TAB_NOTES))[0][::2] == ["3", "learning rate kept"]
    network = tabs.network_tab(cache, store, ids.TAB_NETWORK)
    assert network.children[0].children == "58 parameters in 3 modules"
    assert [row[1:] for row in cells(network.children[1])] == [
        ["Sequential", "0", "58"], ["Linear", "40", "40"], ["Linear", "18", "18"]]


def test_a_healthy_run_says_so_and_marks_nothing(tmp_path: Path) -> None:
    group = make_recording(tmp_path, trials=("a",), steps=6)
    comgra_ndbg.analyze(group, trial="a")
    cache = ReaderCache(group)
    store = callbacks.update_selection(cache, None, None, None)["store"]
    view = tabs.diagnosis_tab(cache, store, ids.TAB_DIAGNOSIS)
    assert [getattr(c, "children", None) for c in view.children[1:3]] == [
        "Hypotheses (0)", "Healthy run: no failure hypothesis."]
    assert callbacks.graph_marks(cache, Selection.from_dict(store["selection"])) == {}
    cache.close()


def test_an_unreadable_analysis_is_reported_in_the_tab_and_marks_nothing(tmp_path: Path) -> None:
    group = make_recording(tmp_path, trials=("a",), steps=4)
    cache = ReaderCache(group)
    store = callbacks.update_selection(cache, None, None, None)["store"]
    location = cache.recording("a").location
    write_results(location, {"trial": "a"}, num_steps=4, last_step=3)  # no events, no hypotheses: unreadable
    error = tabs.diagnosis_tab(cache, store, ids.TAB_DIAGNOSIS).children[0]
    assert error.className == "message error"
    assert error.children.startswith(f"{results_path(location)} holds an analysis this version cannot read")
    elements, _ = callbacks.graph_view(cache, store, None)
    assert not any("event" in e.get("classes", "") for e in elements)
    results_path(location).write_text("{")
    unparsable = tabs.diagnosis_tab(cache, store, ids.TAB_DIAGNOSIS).children[0]
    assert "holds no readable analysis results" in unparsable.children
    cache.close()


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_faulty(tmp_path_factory.mktemp("faulty"))


def test_analyze_now_stores_the_diagnosis_and_the_tab_marks_graph_and_timeline(faulty: Path) -> None:
    cache = ReaderCache(faulty)
    store = callbacks.update_selection(cache, None, None, None)["store"]
    assert tabs.diagnosis_tab(cache, store, ids.TAB_DIAGNOSIS).children[0].children.startswith(
        "No analysis stored for this trial yet")
    assert tabs.analysis_state(cache, False, store, {"fault": None}) == (no_update, no_update)
    stamps, status = tabs.analysis_state(cache, True, store, {"fault": None})
    assert stamps == {"fault": cache.analysis_stamp("fault")} and stamps["fault"] is not None
    assert status.startswith("Analysed 24 steps of trial fault in ") and status.endswith(": 1 hypothesis, 1 event.")
    assert tabs.analysis_state(cache, False, store, stamps) == (no_update, no_update)

    view = tabs.diagnosis_tab(cache, store, ids.TAB_DIAGNOSIS)
    assert view.children[0].children == ("trial fault: 24 steps analysed (up to step 23) · 1 hypothesis · 1 event · "
                                         "0 coupled failures")
    card = view.children[2].children[0]
    assert card.id == ids.diagnosis_jump("h0", FAULT_NODE, FAULT_STEP, "value")
    assert card.children[0].children[3].children.startswith(f"Saturation originated in '{FAULT_NODE}' at step 10")

    elements, key = callbacks.graph_view(cache, store, None)
    classes = {e["data"]["id"]: e["classes"] for e in elements if "source" not in e["data"]}
    assert classes[FAULT_NODE] == "role-intermediate has-event event-origin"
    assert [n for n, c in classes.items() if "event" in c] == [FAULT_NODE]
    assert key[-1] == stamps["fault"]

    at_node = callbacks.update_selection(cache, "graph", FAULT_NODE, store)["store"]
    figure, _ = callbacks.timeline_view(cache, at_node, None)
    assert [s["x0"] for s in figure["layout"]["shapes"]] == [22, FAULT_STEP]  # the step marker, the event line
    assert figure["layout"]["annotations"][0]["text"] == "⚑ saturated"
    assert "activation_regime: normal → saturated · hidden1 (value) · steps 10–23" in (
        figure["layout"]["annotations"][0]["hovertext"])
    other = callbacks.update_selection(cache, "graph", "hidden0", store)["store"]
    assert callbacks.timeline_view(cache, other, None)[0]["layout"]["annotations"] == []
    cache.close()


def test_choosing_a_hypothesis_selects_its_node_and_onset_step_and_keeps_the_rest(faulty: Path) -> None:
    cache = ReaderCache(faulty)
    comgra_ndbg.analyze(faulty, trial="fault")
    out = callbacks.update_selection(cache, None, None, None)
    out = callbacks.update_selection(cache, "stat", "abs_max", out["store"])
    out = callbacks.update_selection(cache, "collapsed", ["model"], out["store"])
    assert (out["node"], out["step_label"]) == ("output", "step 22 · 23 of 24 default steps")
    view = tabs.diagnosis_tab(cache, out["store"], ids.TAB_DIAGNOSIS)
    card = view.children[2].children[0]
    trigger, value = callbacks._trigger(card.id, 1, {})
    assert (trigger, value) == ("jump", (FAULT_NODE, FAULT_STEP, "value"))
    jumped = callbacks.update_selection(cache, trigger, value, out["store"])
    assert (jumped["node"], jumped["tensor"], jumped["kind"]) == (FAULT_NODE, FAULT_NODE, "value")
    assert (jumped["step"], jumped["step_label"]) == (10, "step 10 · 11 of 24 default steps")
    assert (jumped["stat"], jumped["collapse"], jumped["trial"]) == ("abs_max", ["model"], "fault")
    highlighted = tabs.diagnosis_tab(cache, jumped["store"], ids.TAB_DIAGNOSIS)
    assert highlighted.children[2].children[0].className == "hypothesis current"
    cache.close()


def test_compare_two_trials_side_by_side(cache: ReaderCache, group: Path) -> None:
    store = callbacks.update_selection(cache, "graph", "hidden", None)["store"]
    view = tabs.compare_tab(cache, store, ids.TAB_COMPARE, "trial", "b", None)
    table = {row[0]: row[1:] for row in cells(view.children[1].children[0].children)}
    a = open_recording(group, "a").summary("hidden", stat="max")[1][-1]
    b = open_recording(group, "b").summary("hidden", stat="max")[1][-1]
    assert table["max"] == [f"{a:.6g}", f"{b:.6g}", f"{b - a:.6g}"]
    steps = tabs.compare_tab(cache, store, ids.TAB_COMPARE, "step", None, 2)
    assert "A: a · step 11 · value vs B: a · step 1 · value" in steps.children[0].children


def test_custom_visualization_contract(cache: ReaderCache, tmp_path: Path) -> None:
    good = tmp_path / "viz.py"
    good.write_text("from dash import html\nTITLE = 'Mine'\n"
                    "def visualize(recording, selection):\n"
                    "    return html.Div(f'{recording.trial} {selection.node} {selection.step}', id='mine')\n")
    store = callbacks.update_selection(cache, None, None, None)["store"]
    visualization = load_visualization(good)
    view = tabs.custom_tab(cache, visualization, store, ids.TAB_CUSTOM)
    assert view.children[0].children == "Mine" and view.children[1].children == "a output 11"
    broken = tmp_path / "broken.py"
    broken.write_text("def visualize(recording, selection):\n    return 1 / 0\n")
    error = tabs.custom_tab(cache, load_visualization(broken), store, ids.TAB_CUSTOM).children[1]
    assert "ZeroDivisionError" in error.children and error.className == "message error"
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def visualize(recording, selection):\n    return object()\n")
    assert "returned a object" in tabs.custom_tab(cache, load_visualization(wrong), store,
                                                  ids.TAB_CUSTOM).children[1].children


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


def test_create_app_registers_callbacks_and_serves_the_layout(group: Path) -> None:
    app = create_app(group)
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    layout = json.dumps(client.get("/_dash-layout").get_json())
    assert '"type": "Cytoscape"' in layout and f'"id": "{ids.GRAPH}"' in layout
    assert client.get("/_dash-dependencies").status_code == 200
    assert len(app.callback_map) == 15  # selection, graph ×2, tensors body and panel, timeline, refresh, 6 tabs,
    # and the stored analyses: watched on the interval, made by Analyze now
