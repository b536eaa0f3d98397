"""The pure figure builders: exact elements, stylesheets and figure data for hand-made inputs."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from comgra_ndbg.graph import TensorEdge, build_graph
from comgra_ndbg.gui import figures
from comgra_ndbg.analysis.events import Event
from comgra_ndbg.gui.figures import (as_matrix, event_annotations, event_classes, event_shapes, event_text,
                                     graph_elements, graph_stylesheet, heatmap_figure, histogram_figure, lineage,
                                     statistics_rows, step_marker, timeline_figure, value_rows)


def small_graph():
    return build_graph(
        [TensorEdge("x", "h", 0, 0), TensorEdge("m.fc.weight", "h", 0, 0), TensorEdge("h", "out", 0, 0),
         TensorEdge("out", "loss", 0, 0), TensorEdge("h", "h", 0, 1)],
        {"x": ("x", "input", ""), "m.fc.weight": ("m.fc", "parameter", "m.fc"), "h": ("h", "intermediate", ""),
         "out": ("out", "output", ""), "loss": ("loss", "loss", "")},
    )


def test_figures_module_never_imports_dash() -> None:
    tree = ast.parse(Path(figures.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module}
    assert "dash" not in imported and "dash_cytoscape" not in imported


def test_graph_elements_place_nodes_at_their_preset_positions_and_colour_by_role() -> None:
    positions = {"x": (0.0, 0.0), "m.fc": (0.0, 50.0), "h": (100.0, 0.0), "out": (200.0, 0.0),
                 "loss": (300.0, 0.0)}
    elements = graph_elements(small_graph(), positions)
    nodes = [e for e in elements if "source" not in e["data"]]
    edges = [e for e in elements if "source" in e["data"]]
    assert [(n["data"]["id"], n["position"], n["classes"]) for n in nodes] == [
        ("h", {"x": 100.0, "y": 0.0}, "role-intermediate"),
        ("loss", {"x": 300.0, "y": 0.0}, "role-loss"),
        ("m.fc", {"x": 0.0, "y": 50.0}, "role-parameter parameter"),
        ("out", {"x": 200.0, "y": 0.0}, "role-output"),
        ("x", {"x": 0.0, "y": 0.0}, "role-input"),
    ]
    assert [e["data"]["id"] for e in edges] == ["h->h:iteration", "h->out:forward", "m.fc->h:forward",
                                                "out->loss:forward", "x->h:forward"]
    assert nodes[2]["data"] == {"id": "m.fc", "label": "m.fc", "role": "parameter", "tensors": 1}


def test_nodes_with_events_carry_classes_and_the_origin_is_emphasised() -> None:
    positions = {"x": (0.0, 0.0), "m.fc": (0.0, 50.0), "h": (100.0, 0.0), "out": (200.0, 0.0),
                 "loss": (300.0, 0.0)}
    marks = event_classes(["h", "loss", "h"], "h")
    assert marks == {"h": "has-event event-origin", "loss": "has-event"}
    assert event_classes(["h"], "x") == {"h": "has-event", "x": "event-origin"}
    assert event_classes([], None) == {}
    nodes = [e for e in graph_elements(small_graph(), positions, marks) if "source" not in e["data"]]
    assert [(n["data"]["id"], n["classes"]) for n in nodes] == [
        ("h", "role-intermediate has-event event-origin"), ("loss", "role-loss has-event"),
        ("m.fc", "role-parameter parameter"), ("out", "role-output"), ("x", "role-input")]


def test_event_marks_are_styled_with_or_without_a_selection_and_stay_opaque() -> None:
    halo = {"opacity": 1, "underlay-color": figures.EVENT_COLOR, "underlay-opacity": 0.55, "underlay-padding": 7,
            "underlay-shape": "ellipse"}
    origin = {"opacity": 1, "underlay-color": figures.ORIGIN_COLOR, "underlay-opacity": 0.6, "underlay-padding": 10,
              "underlay-shape": "ellipse", "font-weight": "bold"}
    for sheet in (graph_stylesheet(None), graph_stylesheet("out", ["h"], ["loss"], [("h", "out")])):
        selectors = [rule["selector"] for rule in sheet]
        by_selector = {rule["selector"]: rule["style"] for rule in sheet}
        assert by_selector["node.has-event"] == halo and by_selector["node.event-origin"] == origin
        if "node, edge" in selectors:  # after the fading rule, so marked nodes are not faded
            assert selectors.index("node.has-event") > selectors.index("node, edge")


def test_lineage_follows_dependencies_and_dependents_transitively() -> None:
    assert lineage(small_graph(), "h") == (["m.fc", "x"], ["loss", "out"])
    assert lineage(small_graph(), "loss") == (["h", "m.fc", "out", "x"], [])


def test_stylesheet_without_selection_only_colours_roles() -> None:
    sheet = graph_stylesheet(None)
    by_selector = {rule["selector"]: rule["style"] for rule in sheet}
    assert by_selector[".role-loss"] == {"background-color": figures.ROLE_COLORS["loss"]}
    assert not any("[id" in rule["selector"] for rule in sheet)


def test_stylesheet_highlights_the_selected_node_its_lineage_and_the_edges_between_them() -> None:
    graph = small_graph()
    dependencies, dependents = lineage(graph, "out")
    sheet = graph_stylesheet("out", dependencies, dependents, [(e.source, e.target) for e in graph.edges])
    by_selector = {rule["selector"]: rule["style"] for rule in sheet}
    assert by_selector['node[id = "h"]']["border-color"] == figures.UPSTREAM_COLOR
    assert by_selector['node[id = "loss"]']["border-color"] == figures.DOWNSTREAM_COLOR
    assert by_selector['node[id = "out"]']["border-color"] == figures.SELECTED_COLOR
    bold = sorted(rule["selector"] for rule in sheet if rule["selector"].startswith("edge[source"))
    assert bold == ['edge[source = "h"][target = "h"]', 'edge[source = "h"][target = "out"]',
                    'edge[source = "m.fc"][target = "h"]', 'edge[source = "out"][target = "loss"]',
                    'edge[source = "x"][target = "h"]']


def test_histogram_counts_finite_values_and_names_the_non_finite_ones() -> None:
    values = np.array([0.0, 1.0, 1.0, 2.0, np.nan, np.inf], dtype=np.float32)
    figure = histogram_figure(values, title="w", bins=2)
    bar = figure["data"][0]
    assert bar["x"] == [0.5, 1.5] and bar["y"] == [1, 3] and bar["width"] == 1.0
    assert figure["layout"]["title"]["text"] == "w · 4 values · 1 NaN, 1 ±Inf not shown"


def test_histogram_of_a_constant_or_empty_tensor() -> None:
    assert histogram_figure(np.array([3.0, 3.0]), title="c", bins=1)["data"][0]["y"] == [2]
    empty = histogram_figure(np.array([np.nan]), title="n")
    assert empty["data"] == [] and empty["layout"]["annotations"][0]["text"] == (
        "n: no finite value · 1 NaN, 0 ±Inf not shown")


def test_heatmap_blanks_positions_that_were_not_stored() -> None:
    figure = heatmap_figure(np.array([[1.0, np.nan], [-2.0, 0.5]]), title="t")
    assert figure["data"][0]["z"] == [[1.0, None], [-2.0, 0.5]]
    assert figure["layout"]["yaxis"]["autorange"] == "reversed"


def test_as_matrix_and_value_rows() -> None:
    assert as_matrix(np.arange(24).reshape(2, 3, 4))[5].tolist() == [20, 21, 22, 23]
    rows, pages = value_rows(np.array([5.0, 6.0, 7.0]), (2, 3), np.array([1, 4, 5]), page=1, page_size=2)
    assert (rows, pages) == ([("(1, 2)", "7")], 2)
    assert value_rows(np.array([1.0]), (), None, page=9) == ([("(0,)", "1")], 1)


def test_statistics_rows_format_exactly() -> None:
    assert statistics_rows({"count": 12.0, "mean": 0.1234567, "dead_fraction": float("nan")}) == [
        ("count", "12"), ("mean", "0.123457"), ("dead_fraction", "—")]


def test_timeline_has_one_trace_per_step_type_and_marks_the_step() -> None:
    curves = {"long": (np.array([0, 2]), np.array([1.0, np.nan])), "short": (np.array([1]), np.array([3.0]))}
    figure = timeline_figure(curves, title="mean", y_label="mean", step=2)
    assert [(t["name"], t["x"], t["y"], t["type"]) for t in figure["data"]] == [
        ("long", [0, 2], [1.0, None], "scatter"), ("short", [1], [3.0], "scatter")]
    assert figure["layout"]["shapes"] == step_marker(2)
    assert step_marker(2)[0]["x0"] == 2 and step_marker(None) == []


def test_long_timelines_are_drawn_with_webgl() -> None:
    steps = np.arange(5000)
    figure = timeline_figure({"t": (steps, steps * 0.5)}, title="", y_label="", step=None)
    assert figure["data"][0]["type"] == "scattergl" and figure["data"][0]["mode"] == "lines"


SATURATED = Event("activation_regime", "h", "value", "normal", "saturated", 10, 29, 0.9, 0.7)
VANISHING = Event("gradient_health", "h", "grad", "healthy", "vanishing", 10, 12, -2.5, 1.0)
DEAD = Event("activation_regime", "h", "value", "normal", "dead", 15, 29, 0.5, 0.25)


def test_event_text_describes_an_event_in_one_line() -> None:
    assert event_text(VANISHING) == ("gradient_health: healthy → vanishing · h (grad) · steps 10–12 · "
                                     "magnitude -2.5 · strength 1")


def test_timeline_marks_events_with_dashed_lines_and_hover_labels_at_their_onsets() -> None:
    events = [DEAD, SATURATED, VANISHING]
    line = {"type": "line", "xref": "x", "yref": "paper", "y0": 0, "y1": 1,
            "line": {"color": figures.EVENT_COLOR, "width": 1.5, "dash": "dash"}}
    assert event_shapes(events) == [{**line, "x0": 10, "x1": 10}, {**line, "x0": 15, "x1": 15}]
    labels = event_annotations(events)
    assert [(a["x"], a["text"], a["hovertext"]) for a in labels] == [
        (10, "⚑ saturated · ⚑ vanishing", f"{event_text(SATURATED)}<br>{event_text(VANISHING)}"),
        (15, "⚑ dead", event_text(DEAD))]
    assert (labels[0]["xref"], labels[0]["yref"], labels[0]["y"], labels[0]["showarrow"]) == ("x", "paper", 1, False)
    curves = {"t": (np.array([0, 10, 20]), np.array([1.0, 2.0, 3.0]))}
    figure = timeline_figure(curves, title="mean", y_label="mean", step=20, events=events)
    assert figure["layout"]["shapes"] == step_marker(20) + event_shapes(events)
    assert figure["layout"]["annotations"] == labels
    assert timeline_figure(curves, title="", y_label="", step=None)["layout"]["annotations"] == []
