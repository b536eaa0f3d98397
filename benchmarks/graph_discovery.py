"""Time dependency-graph discovery, and what a step with an unchanged structure costs instead.

Three shapes of autograd graph: a chain of ``depth`` registered Linear+tanh layers (parameters tracked),
the same chain with nothing registered in between (the walk crosses every unregistered op), and a
"diamond" chain where every op doubles the number of paths (2**depth paths; memoisation keeps it
linear). For the chain, it also times ``structure_signature`` plus a ``GraphCache`` hit, the cost of
every later step with the same structure. Discovery time should grow linearly with depth.

Run from the repository root: ``python benchmarks/graph_discovery.py`` (after ``make setup``, or with
``PYTHONPATH=.``).
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from comgra_ndbg.graph import GraphCache, build_graph, discover_edges, structure_signature


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def chain(depth: int, register_every: int) -> tuple[list[tuple[str, int, torch.Tensor]], dict[str, torch.Tensor]]:
    layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(depth))
    x = torch.randn(4, 8, requires_grad=True)
    tensors = [("input", 0, x)]
    h = x
    for i, layer in enumerate(layers):
        h = torch.tanh(layer(h))
        if (i + 1) % register_every == 0 or i == depth - 1:
            tensors.append((f"layer{i:04d}", 0, h))
    return tensors, {f"model.{name}": p for name, p in layers.named_parameters()}


def diamond(depth: int) -> tuple[list[tuple[str, int, torch.Tensor]], dict[str, torch.Tensor]]:
    x = torch.randn(8, requires_grad=True)
    h = x
    for _ in range(depth):
        h = h * torch.sigmoid(h)
    return [("input", 0, x), ("output", 0, h)], {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[100, 200, 400, 800])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    for depth in args.depths:
        registered, parameters = chain(depth, register_every=1)
        every, _ = chain(depth, register_every=depth)
        wide, _ = diamond(depth)
        rows = {
            "chain, every layer registered": median_seconds(
                lambda: discover_edges(registered, parameters), args.repeats
            ),
            "chain, ends registered only": median_seconds(lambda: discover_edges(every, parameters), args.repeats),
            f"diamond, 2**{depth} paths": median_seconds(lambda: discover_edges(wide, {}), args.repeats),
        }
        metadata = {name: (name, "intermediate", "") for name, _, _ in registered}
        metadata |= {name: (name.rpartition(".")[0], "parameter", name.rpartition(".")[0]) for name in parameters}
        cache = GraphCache()
        build = lambda: build_graph(discover_edges(registered, parameters), metadata)  # noqa: E731
        cache.get_or_build(structure_signature(registered, parameters), "train", build)
        rows["unchanged structure: signature + cache hit"] = median_seconds(
            lambda: cache.get_or_build(structure_signature(registered, parameters), "train", build), args.repeats
        )
        for label, seconds in rows.items():
            print(f"depth {depth:4d}  {label:44s} {seconds * 1000:8.2f} ms")


if __name__ == "__main__":
    main()
