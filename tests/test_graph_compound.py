"""Module boxes, what is drawn of a graph with some boxes collapsed, and the nested layout of frames."""
from __future__ import annotations

import pytest

from comgra_ndbg.graph import DependencyGraph, GraphEdge, GraphNode
from comgra_ndbg.graph.compound import (box_id, default_collapsed, edge_kinds, module_boxes, reveal, toggle,
                                        visible_graph)
from comgra_ndbg.graph.nested_layout import FRAME_PADDING, FRAME_TITLE, item_size, nested_layout


def node(name: str, role: str = "intermediate") -> GraphNode:
    return GraphNode(name, role, "", (name,), role == "parameter", (role,))


def make_graph(roles: dict[str, str], edges: list[tuple[str, str, str]]) -> DependencyGraph:
    return DependencyGraph(tuple(node(n, r) for n, r in sorted(roles.items())),
                           tuple(sorted(GraphEdge(*e) for e in edges)))


def residual_network(blocks: int, *, container: str = "blocks") -> DependencyGraph:
    """Names and edges as NeuralDbg records a pre-norm residual MLP: every block reads the residual stream,
    which autograd links to every earlier block (the adds are no modules)."""
    roles = {"input": "input", "model.embed": "intermediate", "model.embed.parameters": "parameter",
             "model.head": "intermediate", "model.head.parameters": "parameter", "model": "output", "loss": "loss"}
    edges = [("input", "model.embed", "forward"), ("model.embed.parameters", "model.embed", "forward"),
             ("model.head.parameters", "model.head", "forward"), ("model.head", "model", "forward"),
             ("model", "loss", "forward")]
    stream = ["model.embed"]
    for i in range(blocks):
        b = f"model.{container}.{i}"
        for part in ("norm", "mlp.0", "mlp.2"):
            roles[f"{b}.{part}.parameters"] = "parameter"
            edges.append((f"{b}.{part}.parameters", f"{b}.{part}", "forward"))
        roles.update({f"{b}.norm": "intermediate", f"{b}.mlp.0": "intermediate", f"{b}.mlp.1": "intermediate",
                      f"{b}.mlp.2": "intermediate"})
        edges += [(s, f"{b}.norm", "forward") for s in stream]
        edges += [(f"{b}.norm", f"{b}.mlp.0", "forward"), (f"{b}.mlp.0", f"{b}.mlp.1", "forward"),
                  (f"{b}.mlp.1", f"{b}.mlp.2", "forward")]
        stream.append(f"{b}.mlp.2")
    edges += [(s, "model.head", "forward") for s in stream]
    return make_graph(roles, edges)


def test_boxes_come_from_dotted_names_and_a_box_holding_one_inner_box_is_that_box() -> None:
    boxes = module_boxes(residual_network(2).node_names)
    assert boxes.paths[:4] == ("model", "model.blocks", "model.embed", "model.head")
    assert "model.blocks.0.mlp.1" not in boxes.paths  # one node: no box
    assert boxes.members["model.blocks.0.mlp.0"] == ("model.blocks.0.mlp.0", "model.blocks.0.mlp.0.parameters")
    assert boxes.ancestors("model.blocks.1.mlp.0.parameters") == [
        "model", "model.blocks", "model.blocks.1", "model.blocks.1.mlp", "model.blocks.1.mlp.0"]
    assert boxes.depth["model.blocks.1.mlp.0"] == 4 and boxes.parent["input"] is None
    chain = module_boxes(["m.enc.layers.0.a", "m.enc.layers.0.b", "m.enc.layers.1.a", "m.enc.layers.1.b"])
    assert chain.paths == ("m.enc.layers", "m.enc.layers.0", "m.enc.layers.1")  # m, m.enc hold the same


def test_a_500_node_network_opens_at_most_40_things_and_a_small_one_whole() -> None:
    graph = residual_network(70)
    assert len(graph.nodes) == 7 + 70 * 7 and len(graph.edges) > 2500
    view = visible_graph(graph, default_collapsed(module_boxes(graph.node_names)))
    assert len(view.items) <= 40
    assert [i.id for i in view.items if i.kind == "box"] == [box_id("model.blocks")]  # 70 blocks do not fit
    assert view.frames[0].id == box_id("model")
    opened = visible_graph(graph, toggle(default_collapsed(module_boxes(graph.node_names)), "model.blocks"))
    assert [i.id for i in opened.items if i.kind == "box"][:3] == [
        box_id("model.blocks.0"), box_id("model.blocks.1"), box_id("model.blocks.10")]
    small = residual_network(1)
    assert default_collapsed(module_boxes(small.node_names)) == ()


def test_collapsed_boxes_stand_for_their_nodes_and_edges_between_them_are_counted() -> None:
    graph = residual_network(3)
    view = visible_graph(graph, ("model.blocks",))
    assert view.shown_as["model.blocks.2.mlp.0.parameters"] == box_id("model.blocks")
    assert view.shown_as["model.embed"] == "model.embed"
    counted = {(e.source, e.target): e.count for e in view.edges}
    assert counted[("model.embed", box_id("model.blocks"))] == 3  # the stream into each block's norm
    assert counted[(box_id("model.blocks"), "model.head")] == 3
    assert ("model.embed", "model.head") not in counted  # implied by the path through the blocks
    assert view.implied == 1
    assert visible_graph(graph, ("model.blocks",), show_implied=True).implied == 0


def test_skip_edges_of_the_residual_stream_are_left_out_but_no_ancestor_is_lost() -> None:
    graph = residual_network(4)
    view = visible_graph(graph)
    drawn = {(e.source, e.target) for e in view.edges}
    assert ("model.embed", "model.blocks.3.norm") not in drawn
    assert ("model.blocks.2.mlp.2", "model.blocks.3.norm") in drawn

    def ancestors(edges: set[tuple[str, str]], name: str) -> set[str]:
        found, frontier = set(), [name]
        while frontier:
            current = frontier.pop()
            for s, t in edges:
                if t == current and s not in found:
                    found.add(s)
                    frontier.append(s)
        return found
    every = {(e.source, e.target) for e in graph.edges}
    assert all(ancestors(drawn, n) == ancestors(every, n) for n in graph.node_names)


def test_iteration_edges_are_recurrent_when_fed_back_and_across_when_going_on() -> None:
    """A loss summed over the outputs of three iterations: its edges from earlier iterations go on forward and
    order columns, so the loss lands after the outputs, not in the input column."""
    graph = make_graph({"x": "input", "cell": "parameter", "h": "intermediate", "out": "output", "loss": "loss"},
                       [("x", "h", "forward"), ("cell", "h", "forward"), ("h", "h", "iteration"),
                        ("h", "out", "forward"), ("out", "h", "iteration"), ("out", "loss", "iteration")])
    assert edge_kinds(graph) == {("cell", "h", "forward"): "forward", ("h", "h", "iteration"): "recurrent",
                                 ("h", "out", "forward"): "forward", ("out", "h", "iteration"): "recurrent",
                                 ("out", "loss", "iteration"): "across", ("x", "h", "forward"): "forward"}
    positions = nested_layout(visible_graph(graph))
    assert positions["loss"][0] > positions["out"][0] > positions["h"][0] > positions["x"][0]
    assert ("h", "h", "recurrent") in {(e.source, e.target, e.kind) for e in visible_graph(graph).edges}


def test_unused_parameters_are_left_out_unless_asked_for() -> None:
    graph = make_graph({"x": "input", "fc": "parameter", "spare": "parameter", "y": "output"},
                       [("x", "y", "forward"), ("fc", "y", "forward")])
    view = visible_graph(graph)
    assert view.unused == ("spare",) and "spare" not in view.shown_as
    assert "spare" in [i.id for i in visible_graph(graph, show_unused=True).items]


def test_labels_are_relative_to_their_frame_distinct_within_it_and_spell_the_full_name() -> None:
    blocks, layers = residual_network(2, container="blocks"), residual_network(2, container="layers")
    graph = DependencyGraph(tuple(sorted(set(blocks.nodes) | set(layers.nodes), key=lambda n: n.name)),
                            tuple(sorted(set(blocks.edges) | set(layers.edges))))
    view = visible_graph(graph)
    frames = {f.id: f for f in view.frames}
    seen: dict[tuple[str | None, str], str] = {}
    for item in view.items + view.frames:
        assert (item.parent, item.label) not in seen, (item.id, seen.get((item.parent, item.label)))
        seen[(item.parent, item.label)] = item.id
        parts, parent = [item.label], item.parent
        while parent is not None:
            parts.append(frames[parent].label)
            parent = frames[parent].parent
        spelled = ".".join(reversed(parts))
        assert spelled == item.name or spelled.endswith("." + item.label) and item.name.endswith(item.label)
    labels = {i.id: i.label for i in view.items}
    assert labels["model.blocks.1.mlp.0.parameters"] == labels["model.layers.1.mlp.0.parameters"] == "parameters"
    assert frames[box_id("model.blocks.1")].label == "1" and frames[box_id("model.blocks")].label == "blocks"


def test_reveal_opens_the_boxes_around_a_node_and_toggle_flips_one() -> None:
    boxes = module_boxes(residual_network(3).node_names)
    collapsed = default_collapsed(boxes, limit=5)
    opened = reveal(boxes, collapsed, "model.blocks.1.mlp.2")
    assert not set(boxes.ancestors("model.blocks.1.mlp.2")) & set(opened)
    assert set(collapsed) - set(opened) == set(boxes.ancestors("model.blocks.1.mlp.2")) & set(collapsed)
    assert set(toggle(toggle(opened, "model.blocks.2"), "model.blocks.2")) == set(opened)
    assert "model.blocks.2" in toggle((), "model.blocks.2")


@pytest.mark.parametrize("collapsed", [(), ("model.blocks.1",), None])
def test_frames_never_overlap_and_forward_edges_go_right(collapsed: tuple[str, ...] | None) -> None:
    graph = residual_network(12)
    if collapsed is None:
        collapsed = default_collapsed(module_boxes(graph.node_names), limit=30)
    view = visible_graph(graph, collapsed)
    positions = nested_layout(view)
    assert sorted(positions) == sorted(i.id for i in view.items)
    bounds: dict[str, list[float]] = {}
    for item in view.items:
        (x, y), (w, h) = positions[item.id], item_size(item)
        box = [x - w / 2, y - h / 2, x + w / 2, y + h / 2]
        parent = item.parent
        while parent is not None:
            b = bounds.setdefault(parent, list(box))
            bounds[parent] = [min(b[0], box[0]), min(b[1], box[1]), max(b[2], box[2]), max(b[3], box[3])]
            parent = view.item(parent).parent
    frames = {f.id: f for f in view.frames}
    for a in frames:
        for b in frames:
            if a < b and frames[a].parent == frames[b].parent:
                (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = bounds[a], bounds[b]
                pad = FRAME_PADDING
                apart = ax1 + pad <= bx0 - pad or bx1 + pad <= ax0 - pad or ay1 + pad <= by0 - pad - FRAME_TITLE \
                    or by1 + pad <= ay0 - pad - FRAME_TITLE
                assert apart, (a, b)
    for edge in view.edges:
        if edge.kind == "forward":
            assert positions[edge.source][0] < positions[edge.target][0], edge
