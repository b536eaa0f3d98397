"""Layered layout: every node placed once, forward edges left to right, fewer crossings, deterministic."""
from __future__ import annotations

import random
import time

from comgra_ndbg.graph import DependencyGraph, GraphEdge, GraphNode, assign_layers, count_crossings, layered_layout
from comgra_ndbg.graph.layout import implied_edges


def node(name: str, role: str = "intermediate") -> GraphNode:
    return GraphNode(name, role, "", (name,), role == "parameter", (role,))


def make_graph(nodes: dict[str, str], edges: list[tuple[str, str, str]]) -> DependencyGraph:
    return DependencyGraph(
        tuple(node(name, role) for name, role in sorted(nodes.items())),
        tuple(sorted(GraphEdge(*e) for e in edges)),
    )


def random_dag(num_nodes: int, seed: int) -> DependencyGraph:
    rng = random.Random(seed)
    names = [f"n{i:04d}" for i in range(num_nodes)]
    rng.shuffle(names)  # name order is not topological order
    edges = []
    for i in range(1, num_nodes):
        for j in rng.sample(range(max(0, i - 30), i), k=min(i, rng.randint(1, 3))):
            edges.append((names[j], names[i], "forward"))
    return make_graph({name: "intermediate" for name in names}, edges)


def assert_valid(graph: DependencyGraph, positions: dict[str, tuple[float, float]]) -> None:
    assert sorted(positions) == sorted(graph.node_names)
    assert len(set(positions.values())) == len(positions)
    for e in graph.edges:
        if e.kind == "forward":
            assert positions[e.source][0] < positions[e.target][0], e


def test_small_model_exact_positions() -> None:
    graph = make_graph(
        {"input": "input", "model.fc1": "parameter", "hidden": "intermediate", "model.fc2": "parameter",
         "output": "output", "target": "target", "loss": "loss"},
        [("input", "hidden", "forward"), ("model.fc1", "hidden", "forward"), ("hidden", "output", "forward"),
         ("model.fc2", "output", "forward"), ("output", "loss", "forward"), ("target", "loss", "manual"),
         ("hidden", "hidden", "iteration")],
    )
    assert layered_layout(graph) == {
        "hidden": (180.0, -40.0),
        "input": (0.0, -40.0),
        "loss": (540.0, 0.0),
        "model.fc1": (0.0, 40.0),
        "model.fc2": (180.0, 40.0),
        "output": (360.0, -40.0),
        "target": (360.0, 40.0),
    }
    positions = layered_layout(graph, column_spacing=100.0, row_spacing=10.0)
    assert positions["loss"] == (300.0, 0.0) and positions["target"] == (200.0, 5.0)


def test_parameters_sit_in_the_column_just_before_their_first_consumer() -> None:
    graph = make_graph(
        {"x": "input", "a": "intermediate", "b": "intermediate", "c": "intermediate", "p": "parameter"},
        [("x", "a", "forward"), ("a", "b", "forward"), ("b", "c", "forward"), ("p", "c", "forward"),
         ("p", "b", "forward")],
    )
    layers = assign_layers(graph)
    assert layers == {"x": 0, "a": 1, "b": 2, "c": 3, "p": 1}
    assert_valid(graph, layered_layout(graph))


def test_random_dag_every_node_placed_once_and_edges_go_right() -> None:
    graph = random_dag(300, seed=1)
    positions = layered_layout(graph)
    assert_valid(graph, positions)
    assert positions == layered_layout(graph)
    columns = sorted({x for x, _ in positions.values()})
    assert columns == [180.0 * i for i in range(len(columns))]
    for column in columns:
        ys = sorted(y for x, y in positions.values() if x == column)
        assert abs(ys[0] + ys[-1]) < 1e-9  # centred on y = 0
        assert all(abs(b - a - 80.0) < 1e-9 for a, b in zip(ys, ys[1:]))


def test_barycenter_sweeps_remove_crossings_of_a_crafted_graph() -> None:
    # Name order puts a1 above a2 but their consumers the other way round, in every column.
    graph = make_graph(
        {name: "intermediate" for name in ["s1", "s2", "s3", "a1", "a2", "a3", "b1", "b2", "b3"]},
        [("s1", "a3", "forward"), ("s2", "a2", "forward"), ("s3", "a1", "forward"),
         ("a1", "b3", "forward"), ("a2", "b1", "forward"), ("a3", "b2", "forward"),
         ("s1", "a2", "forward")],
    )
    before = count_crossings(graph, layered_layout(graph, sweeps=0))
    after = count_crossings(graph, layered_layout(graph))
    assert before == 6
    assert after == 0


def test_crossings_never_increase_on_random_graphs() -> None:
    for seed in range(5):
        graph = random_dag(60, seed)
        before = count_crossings(graph, layered_layout(graph, sweeps=0))
        assert count_crossings(graph, layered_layout(graph)) <= before


def test_cycles_from_manual_edges_and_iteration_edges_are_laid_out() -> None:
    graph = make_graph(
        {"a": "input", "b": "intermediate", "c": "intermediate"},
        [("a", "b", "forward"), ("b", "c", "forward"), ("c", "b", "manual"), ("c", "a", "iteration"),
         ("c", "c", "iteration")],
    )
    positions = layered_layout(graph)
    assert sorted(positions) == ["a", "b", "c"] and len(set(positions.values())) == 3
    assert positions == layered_layout(graph)
    assert positions["a"][0] < positions["b"][0] < positions["c"][0]


def test_empty_and_edgeless_graphs() -> None:
    assert layered_layout(make_graph({}, [])) == {}
    assert layered_layout(make_graph({"a": "input", "b": "loss"}, [])) == {"a": (0.0, -40.0), "b": (0.0, 40.0)}


def test_skip_edges_implied_by_longer_paths_do_not_move_or_slow_the_layout() -> None:
    """A residual stream shows an edge from every block to every later block; only the chain orders columns."""
    blocks = [f"b{i:03d}" for i in range(120)]
    chain = [(a, b, "forward") for a, b in zip(blocks, blocks[1:])]
    skips = [(a, b, "forward") for i, a in enumerate(blocks) for b in blocks[i + 2:]]
    nodes = {name: "intermediate" for name in blocks}
    dense, sparse = make_graph(nodes, chain + skips), make_graph(nodes, chain)
    assert len(dense.edges) == 7140
    start = time.perf_counter()
    positions = layered_layout(dense)
    assert time.perf_counter() - start < 2.0  # 7021 skip edges would need 280,840 dummy points
    assert positions == layered_layout(sparse)
    assert implied_edges(3, [(0, 1), (1, 2), (0, 2)]) == {(0, 2)}
