"""Parameter groups as boxes (``graph/groups.py``): which parameter nodes a prefix takes, how the groups join
the module boxes, and what the explorer then draws, on literal graphs."""
from __future__ import annotations

import pytest

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.graph.compound import default_collapsed, module_boxes, visible_graph
from comgra_ndbg.graph.groups import merge_boxes, parameter_groups
from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode
from comgra_ndbg.recorder.validation import check_parameter_groups

PARAMETERS = ("enc.attn_k", "enc.attn_q", "enc.ff", "dec.ff", "dec.head")


def graph() -> DependencyGraph:
    """An encoder and a decoder: parameter nodes, and the tensors ``input``, ``enc.attn_out``, ``loss``."""
    nodes = [GraphNode(name, "parameter", name, (f"{name}.weight",), True) for name in PARAMETERS]
    nodes += [GraphNode(name, role, "", (name,), False)
              for name, role in (("input", "input"), ("enc.attn_out", "intermediate"), ("loss", "loss"))]
    edges = [GraphEdge("input", "enc.attn_out", "forward"), GraphEdge("enc.attn_k", "enc.attn_out", "forward"),
             GraphEdge("enc.attn_q", "enc.attn_out", "forward"), GraphEdge("enc.attn_out", "loss", "forward"),
             GraphEdge("enc.ff", "loss", "forward"), GraphEdge("dec.ff", "loss", "forward"),
             GraphEdge("dec.head", "loss", "forward")]
    return DependencyGraph(tuple(sorted(nodes, key=lambda n: n.name)), tuple(sorted(edges)))


def test_each_parameter_goes_to_the_first_prefix_that_matches_it() -> None:
    found = parameter_groups(graph(), ["enc.attn_", "enc", "dec.head", ""])
    assert found == {"enc.attn_": ("enc.attn_k", "enc.attn_q")}  # 'enc' keeps one node, 'dec.head' one, '' none
    assert parameter_groups(graph(), ["enc", "dec"]) == {"enc": ("enc.attn_k", "enc.attn_q", "enc.ff"),
                                                        "dec": ("dec.ff", "dec.head")}
    assert "enc.attn_out" not in parameter_groups(graph(), ["enc"])["enc"]  # tensors are never grouped


def test_a_group_nests_in_its_module_box_and_cuts_none() -> None:
    g = graph()
    boxes = module_boxes(g.node_names, parameter_groups(g, ["enc.attn_"]))
    assert dict(boxes.members) == {"enc": ("enc.attn_k", "enc.attn_out", "enc.attn_q", "enc.ff"),
                                   "enc.attn_": ("enc.attn_k", "enc.attn_q"), "dec": ("dec.ff", "dec.head")}
    assert (boxes.parent["box:enc.attn_"], boxes.parent["enc.attn_q"], boxes.parent["enc.attn_out"]) == (
        "enc", "enc.attn_", "enc")
    assert boxes.depth == {"enc": 0, "dec": 0, "enc.attn_": 1}
    assert boxes.children("enc") == [("enc.attn_", True), ("enc.attn_out", False), ("enc.ff", False)]


def test_a_group_named_like_a_module_box_takes_its_place_and_a_crossing_box_goes() -> None:
    g = graph()
    boxes = module_boxes(g.node_names, parameter_groups(g, ["enc"]))
    assert dict(boxes.members) == {"enc": ("enc.attn_k", "enc.attn_q", "enc.ff"), "dec": ("dec.ff", "dec.head")}
    assert boxes.parent["enc.attn_out"] is None  # the tensor is not a parameter: outside the group
    members, box_parent, node_parent = merge_boxes(["a.x", "a.y", "b"], {"a": ("a.x", "a.y")}, {"g": ("a.x", "b")})
    assert members == {"g": ("a.x", "b")} and box_parent == {"g": None}  # 'a' would cut the group in two
    assert node_parent == {"a.x": "g", "a.y": None, "b": "g"}


def test_the_explorer_draws_the_groups_as_frames_and_collapses_them_like_boxes() -> None:
    g = graph()
    boxes = module_boxes(g.node_names, parameter_groups(g, ["enc.attn_", "dec"]))
    view = visible_graph(g, (), boxes=boxes)
    assert sorted((f.id, f.parent, f.label) for f in view.frames) == [
        ("box:dec", None, "dec"), ("box:enc", None, "enc"), ("box:enc.attn_", "box:enc", "attn_")]
    assert {i.name: i.parent for i in view.items if i.name.startswith("enc.attn_")} == {
        "enc.attn_k": "box:enc.attn_", "enc.attn_out": "box:enc", "enc.attn_q": "box:enc.attn_"}
    closed = visible_graph(g, ("enc.attn_",), boxes=boxes)
    assert closed.shown_as["enc.attn_q"] == "box:enc.attn_" and closed.shown_as["enc.ff"] == "enc.ff"
    assert ("box:enc.attn_", "enc.attn_out") in {(e.source, e.target) for e in closed.edges}
    assert default_collapsed(boxes, limit=4) == ("dec", "enc", "enc.attn_")  # 2 drawn: both top boxes shut


@pytest.mark.parametrize("prefixes", ["enc", ["enc", ""], ["enc", "enc.attn_"], [3]])
def test_bad_groups_are_rejected(prefixes: object) -> None:
    with pytest.raises(InvalidArgumentError, match="parameter_groups"):
        check_parameter_groups(prefixes)
