"""Time ``layered_layout`` on random layered DAGs; the target is at most 1 s for 500 nodes.

Each graph has ``--layers`` columns of equal size; every node takes one to three inputs from the two
previous columns, and one node in ten is a parameter group feeding one node. Prints the median of
``--repeats`` runs per size, the crossings before and after ordering, and whether 500 nodes met the target.

Run from the repository root: ``python benchmarks/graph_layout.py`` (after ``make setup``, or with
``PYTHONPATH=.``).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from comgra_ndbg.graph import DependencyGraph, GraphEdge, GraphNode, count_crossings, layered_layout

TARGET_NODES, TARGET_SECONDS = 500, 1.0


def random_layered_dag(num_nodes: int, num_layers: int, seed: int) -> DependencyGraph:
    rng = random.Random(seed)
    per_layer = max(1, num_nodes // num_layers)
    columns = [[f"L{layer:02d}.n{i:03d}" for i in range(per_layer)] for layer in range(num_layers)]
    nodes = [
        GraphNode(name, "intermediate", "", (name,), False, ("intermediate",)) for column in columns for name in column
    ]
    edges = set()
    for layer in range(1, num_layers):
        for target in columns[layer]:
            candidates = columns[layer - 1] + (columns[layer - 2] if layer >= 2 else [])
            for source in rng.sample(candidates, k=rng.randint(1, 3)):
                edges.add(GraphEdge(source, target, "forward"))
    for i, name in enumerate(rng.sample([n for column in columns[1:] for n in column], k=num_nodes // 10)):
        parameter = f"param{i:03d}"
        nodes.append(GraphNode(parameter, "parameter", parameter, (f"{parameter}.weight",), True, ("weight",)))
        edges.add(GraphEdge(parameter, name, "forward"))
    return DependencyGraph(tuple(sorted(nodes, key=lambda n: n.name)), tuple(sorted(edges)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 250, 500, 1000])
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for size in args.sizes:
        graph = random_layered_dag(size, args.layers, seed=size)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            positions = layered_layout(graph)
            times.append(time.perf_counter() - start)
        before = count_crossings(graph, layered_layout(graph, sweeps=0))
        after = count_crossings(graph, positions)
        median = statistics.median(times)
        print(
            f"{len(graph.nodes):5d} nodes {len(graph.edges):5d} edges: {median * 1000:8.1f} ms "
            f"(median of {args.repeats}); crossings between neighbouring columns {before} -> {after}"
        )
        if size == TARGET_NODES:
            verdict = "meets" if median <= TARGET_SECONDS else "MISSES"
            print(f"      {verdict} the target of {TARGET_SECONDS:.1f} s for {TARGET_NODES} nodes")


if __name__ == "__main__":
    main()
