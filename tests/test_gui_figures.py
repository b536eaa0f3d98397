"""The pure builders: exact cytoscape elements and stylesheets, and figure data for hand-made inputs."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from comgra_ndbg.analysis.events import Event
from comgra_ndbg.graph import DependencyGraph, GraphEdge, GraphNode
from comgra_ndbg.graph.compound import visible_graph
from comgra_ndbg.gui import cyto, figures, timelines
from comgra_ndbg.gui.cyto import event_classes, graph_elements, graph_stylesheet, heat_colours, item_marks
from comgra_ndbg.gui.figures import as_matrix, histogram_figure, statistics_rows, value_rows
from comgra_ndbg.gui.timelines import (decimate, ema, event_annotations, event_shapes, event_text, layers_figure,
                                       step_marker, timeline_figure, visible)


def small_graph() -> DependencyGraph:
    roles = {"x": "input", "m.w": "parameter", "m.fc": "intermediate", "m.act": "intermediate",
             "out": "output", "loss": "loss"}
    nodes = tuple(GraphNode(n, r, "", (n,), r == "parameter", (r,)) for n, r in sorted(roles.items()))
    edges = (GraphEdge("x", "m.fc", "forward"), GraphEdge("m.w", "m.fc", "forward"),
             GraphEdge("m.fc", "m.act", "forward"), GraphEdge("m.act", "out", "forward"),
             GraphEdge("out", "loss", "forward"))
    return DependencyGraph(nodes, tuple(sorted(edges)))


@pytest.mark.parametrize("module", [figures, timelines, cyto])
def test_builders_never_import_dash(module: object) -> None:
    tree = ast.parse(Path(module.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module}
    assert "dash" not in imported and "dash_cytoscape" not in imported


def test_elements_of_an_open_module_are_a_frame_holding_its_nodes_at_their_positions() -> None:
    view = visible_graph(small_graph())
    positions = {"x": (0.0, 0.0), "m.w": (50.0, 60.0), "m.fc": (100.0, 0.0), "m.act": (150.0, 0.0),
                 "out": (200.0, 0.0), "loss": (300.0, 0.0)}
    elements = graph_elements(view, positions)
    frames = [e for e in elements if e.get("classes") == "frame"]
    assert [f["data"] for f in frames] == [{"id": "box:m", "label": "m", "full": "m", "kind": "frame",
                                            "role": "module", "members": 3}]
    nodes = {e["data"]["id"]: e for e in elements if "source" not in e["data"] and e.get("classes") != "frame"}
    assert nodes["m.fc"]["data"] == {"id": "m.fc", "label": "fc", "full": "m.fc", "kind": "node",
                                     "role": "intermediate", "members": 1, "parent": "box:m"}
    assert nodes["m.fc"]["position"] == {"x": 100.0, "y": 0.0}
    assert nodes["x"]["classes"] == "role-input" and "parent" not in nodes["x"]["data"]
    edges = sorted(e["data"]["id"] for e in elements if "source" in e["data"])
    assert edges == ["m.act->out:forward", "m.fc->m.act:forward", "m.w->m.fc:forward", "out->loss:forward",
                     "x->m.fc:forward"]


def test_a_collapsed_box_is_one_item_sized_for_its_label_and_counts_its_events() -> None:
    view = visible_graph(small_graph(), ("m",))
    saturated = Event("activation_regime", "m.act", "value", "normal", "saturated", 10, 29, 0.9, 0.7)
    dead = Event("activation_regime", "m.fc", "value", "normal", "dead", 12, 29, 0.5, 0.3)
    marks = item_marks(view, [saturated, dead], "m.act")
    assert marks == {"box:m": cyto.Mark("has-event event-origin", "⚑ 2 events")}
    box = next(e for e in graph_elements(view, {}, marks) if e["data"]["id"] == "box:m")
    assert box["data"]["label"] == "m (3)\n⚑ 2 events" and box["data"]["kind"] == "box"
    assert box["classes"] == "role-module box has-event event-origin"
    opened = item_marks(visible_graph(small_graph()), [saturated], None)
    assert opened == {"m.act": cyto.Mark("has-event", "⚑ saturated")}


def test_nodes_with_events_carry_classes_and_the_origin_is_emphasised() -> None:
    assert event_classes(["h", "loss", "h"], "h") == {"h": "has-event event-origin", "loss": "has-event"}
    assert event_classes(["h"], "x") == {"h": "has-event", "x": "event-origin"}
    assert event_classes([], None) == {}


def test_stylesheets_per_theme_keep_event_halos_above_the_fading_of_the_lineage() -> None:
    for theme in ("light", "dark"):
        sheet = graph_stylesheet(theme)
        selectors = [rule["selector"] for rule in sheet]
        by_selector = {rule["selector"]: rule["style"] for rule in sheet}
        assert by_selector["node.has-event"]["opacity"] == 1 and by_selector["node.event-origin"]["opacity"] == 1
        assert selectors.index("node.has-event") > selectors.index(".faded")
        assert by_selector["node[heat]"] == {"background-color": "data(heat)"}
        assert by_selector["node"]["color"] == cyto.GRAPH_THEMES[theme]["text"]
        assert by_selector[".role-loss"] == {"background-color": cyto.ROLE_COLORS["loss"]}
    assert graph_stylesheet("light") != graph_stylesheet("dark")


def test_heat_colours_map_values_by_decade_onto_viridis_and_grey_the_unrecorded() -> None:
    assert heat_colours({"a": 10.0, "b": 1e-3, "c": 0.0}, ["a", "b", "c", "d"], -3.0, 1.0, log=True) == {
        "a": "#fde725", "b": "#440154", "c": cyto.MISSING_COLOR, "d": cyto.MISSING_COLOR}
    assert heat_colours({"a": 0.5}, ["a"], 0.0, 1.0, log=False) == {"a": "#21918c"}


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


def test_dark_theme_figures_use_the_dark_template_and_colours() -> None:
    figure = histogram_figure(np.array([1.0, 2.0]), title="", theme="dark")
    assert figure["layout"]["template"] == "plotly_dark"
    assert figure["layout"]["paper_bgcolor"] == figures.THEMES["dark"]["paper"]


def test_as_matrix_and_value_rows() -> None:
    assert as_matrix(np.arange(24).reshape(2, 3, 4))[5].tolist() == [20, 21, 22, 23]
    rows, pages = value_rows(np.array([5.0, 6.0, 7.0]), (2, 3), np.array([1, 4, 5]), page=1, page_size=2)
    assert (rows, pages) == ([("(1, 2)", "7")], 2)
    assert value_rows(np.array([1.0]), (), None, page=9) == ([("(0,)", "1")], 1)


def test_statistics_rows_format_exactly() -> None:
    assert statistics_rows({"count": 12.0, "mean": 0.1234567, "dead_fraction": float("nan")}) == [
        ("count", "12"), ("mean", "0.123457"), ("dead_fraction", "—")]


def test_timeline_has_one_trace_per_curve_and_marks_the_step() -> None:
    curves = {"long": (np.array([0, 2]), np.array([1.0, np.nan])), "short": (np.array([1]), np.array([3.0]))}
    figure = timeline_figure(curves, title="mean", y_label="mean", step=2)
    assert [(t["name"], t["x"], t["y"], t["type"]) for t in figure["data"]] == [
        ("long", [0, 2], [1.0, None], "scatter"), ("short", [1], [3.0], "scatter")]
    assert figure["layout"]["shapes"] == step_marker(2)
    assert step_marker(2)[0]["x0"] == 2 and step_marker(None) == []


def test_long_timelines_are_svg_reduced_to_bucket_extremes_never_webgl() -> None:
    steps = np.arange(100_000)
    values = np.sin(steps / 1000.0)
    values[54_321] = 50.0  # a spike survives the reduction
    figure = timeline_figure({"t": (steps, values)}, title="", y_label="", step=None, log_y=True)
    trace = figure["data"][0]
    assert trace["type"] == "scatter" and trace["mode"] == "lines" and len(trace["x"]) <= timelines.MAX_POINTS
    assert 54_321 in trace["x"] and max(trace["y"]) == 50.0
    assert figure["layout"]["yaxis"]["type"] == "log"
    assert decimate(np.arange(8), np.array([0, 5, 1, 1, 2, -3, 2, 2.0]), limit=4)[1].tolist() == [0, 5, 2, -3]


def test_a_zoomed_timeline_shows_the_range_in_full_detail_with_the_lines_running_to_its_edges() -> None:
    steps = np.arange(0, 50_000, 2)
    values = np.cos(steps / 700.0)
    whole = timeline_figure({"t": (steps, values)}, title="", y_label="", step=20_000)
    assert len(whole["data"][0]["x"]) <= timelines.MAX_POINTS and "range" not in whole["layout"]["xaxis"]
    zoomed = timeline_figure({"t": (steps, values)}, title="", y_label="", step=20_000, x_range=(20_001, 22_001))
    trace = zoomed["data"][0]
    assert trace["x"] == list(range(20_000, 22_004, 2))  # every step inside, and one beyond each edge
    assert trace["y"] == pytest.approx(np.cos(np.arange(20_000, 22_004, 2) / 700.0).tolist())
    assert zoomed["layout"]["xaxis"]["range"] == [20_001, 22_001] and zoomed["layout"]["xaxis"]["autorange"] is False
    assert zoomed["layout"]["shapes"] == step_marker(20_000)
    smooth = timeline_figure({"t": (steps, values)}, title="", y_label="", step=None, smoothing=0.9,
                             x_range=(20_001, 22_001))
    full = ema(values, 0.9)[10_000:11_002]  # smoothed over the whole run, then cut: the same line as unzoomed
    assert smooth["data"][1]["y"] == pytest.approx(full.tolist())
    assert visible(steps, values, -10, -5)[0].tolist() == [0]  # before the run: its first point only


def _decimated_bucket_by_bucket(steps: np.ndarray, values: np.ndarray, limit: int) -> tuple[list[int], list[float]]:
    """The reduction as defined: per bucket of ``np.array_split``, the first minimum and the first maximum of
    its finite values, in step order; buckets without a finite value dropped."""
    keep: list[int] = []
    for bucket in np.array_split(np.arange(len(steps)), limit // 2):
        finite = bucket[np.isfinite(values[bucket])]
        if len(finite):
            keep += sorted({int(finite[np.argmin(values[finite])]), int(finite[np.argmax(values[finite])])})
    return steps[keep].tolist(), values[keep].tolist()


@pytest.mark.parametrize("seed", range(40))
def test_decimate_keeps_the_first_extremes_of_every_bucket_with_ties_and_non_finite_values(seed: int) -> None:
    rng = np.random.default_rng(seed)
    count, limit = int(rng.integers(5, 3000)), int(rng.integers(2, 300))
    values = np.round(rng.standard_normal(count), 1 if seed % 2 else 6)  # rounded: many ties within a bucket
    values[rng.random(count) < rng.random() * 0.6] = rng.choice([np.nan, np.inf, -np.inf])
    if seed % 9 == 0:
        values[: count // 2] = np.nan  # whole buckets without a finite value
    steps = np.arange(count) * 5 + 3
    found = decimate(steps, values, limit)
    expected = (steps, values) if count <= limit else _decimated_bucket_by_bucket(steps, values, limit)
    assert np.asarray(found[0]).tolist() == np.asarray(expected[0]).tolist()
    np.testing.assert_array_equal(found[1], expected[1])


def test_ema_smooths_like_tensorboard_and_skips_non_finite_values() -> None:
    assert ema(np.array([1.0, 3.0, np.nan, 3.0]), 0.5).round(4).tolist() == [1.0, 2.3333, 2.3333, 2.7143]
    assert ema(np.array([1.0, 2.0]), 0.0).tolist() == [1.0, 2.0]
    figure = timeline_figure({"t": (np.arange(3), np.array([1.0, 2.0, 3.0]))}, title="", y_label="", step=None,
                             smoothing=0.5)
    assert [(t["name"], t["opacity"]) for t in figure["data"]] == [("t", 0.3), ("t (EMA 0.5)", 1.0)]


def test_layers_figure_draws_one_line_per_layer_from_first_to_last() -> None:
    matrix = np.array([[1.0, 2.0], [0.1, 0.2], [1e-3, 1e-3]])
    figure = layers_figure(["a", "b", "c"], np.array([0, 1]), matrix, title="gradient flow", y_label="L2", step=1)
    assert [t["name"] for t in figure["data"]] == ["a", "b", "c"]
    assert [t["line"]["color"] for t in figure["data"]] == ["#440154", "#21918c", "#fde725"]
    assert figure["layout"]["yaxis"]["type"] == "log" and figure["layout"]["shapes"] == step_marker(1)


SATURATED = Event("activation_regime", "h", "value", "normal", "saturated", 10, 29, 0.9, 0.7)
VANISHING = Event("gradient_health", "h", "grad", "healthy", "vanishing", 10, 12, -2.5, 1.0)
DEAD = Event("activation_regime", "h", "value", "normal", "dead", 15, 29, 0.5, 0.25)


def test_event_text_describes_an_event_in_one_line() -> None:
    assert event_text(VANISHING) == ("gradient_health: healthy → vanishing · h (grad) · steps 10–12 · "
                                     "magnitude -2.5 · strength 1")


def test_timeline_marks_events_with_dashed_lines_and_hover_labels_at_their_onsets() -> None:
    events = [DEAD, SATURATED, VANISHING]
    line = {"type": "line", "xref": "x", "yref": "paper", "y0": 0, "y1": 1,
            "line": {"color": timelines.EVENT_COLOR, "width": 1.5, "dash": "dash"}}
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
