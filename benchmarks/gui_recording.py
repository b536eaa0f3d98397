"""A recording of real size for the explorer's benchmarks: 500 graph nodes, 10,000 steps.

The structure is recorded by ``NeuralDbg`` from a real model: a 70-block pre-norm residual MLP whose first
35 blocks sit in ``model.encoder.layers`` and the rest in ``model.decoder.blocks`` (so the same module
names occur under two parents), 497 graph nodes and 2,981 edges (the residual adds are no modules, so
autograd links every block to every later one), 709 tensors, 1,841 series (values, gradients, updates).
Its catalog — tensors, modules, the graph — is then given 10,000 steps of summaries of every series and
a snapshot of every series every 100th step, written with the store writer as the recorder writes them
(segments flushed every 200 steps, merged, consolidated on close). Recording 10,000 steps of this model
with ``NeuralDbg`` itself takes long on a 2-core machine; the explorer reads the same file layout either
way. The statistics drift smoothly and carry one fault: from step 7,000 the values of
``model.decoder.blocks.20.mlp.1`` grow tenfold and its gradient and the gradients of every block before it
fall a hundredfold, so the graph colouring and the diagnosis have something to show.

Run: ``python -m benchmarks.gui_recording PATH [--steps N]`` (about 3 minutes and 1.4 GiB for 10,000 steps).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog
from comgra_ndbg.store.reader import open_recording
from comgra_ndbg.store.segment import SnapshotData
from comgra_ndbg.store.writer import RecordingWriter

STEPS, BLOCKS, WIDTH, BATCH = 10_000, 70, 8, 4
SNAPSHOT_EVERY, FLUSH_EVERY = 100, 200
TRIAL = "bench"
FAULT_STEP, FAULT_NODE = 7_000, "model.decoder.blocks.20.mlp.1"


class Block(nn.Module):
    """A pre-norm residual block; the add is no module, as in most real models."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Network(nn.Module):
    def __init__(self, blocks: int = BLOCKS) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(Block() for _ in range(blocks // 2))
        self.decoder = nn.Module()
        self.decoder.blocks = nn.ModuleList(Block() for _ in range(blocks - blocks // 2))
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in [*self.encoder.layers, *self.decoder.blocks]:
            h = block(h)
        return self.head(h)


def record_structure(folder: Path, blocks: int = BLOCKS) -> Catalog:
    """Three steps of the model under NeuralDbg; returns the catalog it wrote (tensors, modules, graph)."""
    torch.manual_seed(0)
    model = Network(blocks)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model, path=folder, trial="structure", optimizer=optimizer, snapshots=1):
        for _ in range(3):
            x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 2)
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
    with open_recording(folder, "structure") as recording:
        return recording.catalog.copy()


def _rows(scales: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sufficient statistics of tensors with these RMS scales and element counts."""
    f, n = schema.FIELD, len(scales)
    mean = rng.normal(0.0, 0.2, n) * scales
    std = scales * rng.uniform(0.8, 1.2, n)
    rows = np.zeros((n, schema.NUM_FIELDS))
    rows[:, f["count"]] = counts
    rows[:, f["zeros"]] = rng.integers(0, 2, n)
    rows[:, f["sum"]] = mean * counts
    rows[:, f["sum_sq"]] = (std ** 2 + mean ** 2) * counts
    rows[:, f["sum_abs"]] = 0.8 * std * counts
    rows[:, f["min"]] = mean - 3 * std
    rows[:, f["max"]] = mean + 3 * std
    rows[:, f["units"]] = WIDTH
    return rows


def write_steps(folder: Path, catalog: Catalog, steps: int, fault_step: int = FAULT_STEP) -> Path:
    """``steps`` steps of summaries (every step) and snapshots (every 100th) of every series of ``catalog``,
    the fault from ``fault_step`` on."""
    rng = np.random.default_rng(0)
    writer = RecordingWriter(folder / TRIAL, TRIAL)
    series = np.arange(len(catalog.series))
    infos = [catalog.tensors[t] for t, _ in catalog.series]
    kinds = [k for _, k in catalog.series]
    counts = np.array([float(np.prod(i.shape)) for i in infos])
    depth = np.array([_depth(i.node) for i in infos])
    base = np.where(np.array(kinds) == "value", 1.0, np.where(np.array(kinds) == "grad", 1e-2, 1e-4))
    base = base * (1.0 + 0.05 * depth)
    fault_value = np.array([i.node == FAULT_NODE and k == "value" for i, k in zip(infos, kinds)])
    fault_grad = np.array([k != "value" and (i.node == FAULT_NODE or 0 <= d <= _depth(FAULT_NODE))
                           for i, k, d in zip(infos, kinds, depth)])
    loss_kpi = catalog.kpi_id("loss")
    for step in range(steps):
        drift = 1.0 + 0.3 * np.sin(step / 900.0 + depth / 7.0)
        scales = base * drift
        if step >= fault_step:
            scales = np.where(fault_value, scales * 10.0, scales)
            scales = np.where(fault_grad, scales * 1e-2, scales)
        writer.add_step(step, 0, 1, schema.FLAG_SUMMARY | (schema.FLAG_SNAPSHOT if step % SNAPSHOT_EVERY == 0 else 0),
                        "every step")
        writer.add_summaries(step, 0, series, _rows(scales, counts, rng))
        writer.add_kpi(step, loss_kpi, float(1.0 / (1 + step / 2000) + (0.5 if step >= fault_step else 0.0)), 0)
        if step % SNAPSHOT_EVERY == 0:
            for sid, info, scale in zip(series.tolist(), infos, scales):
                writer.add_snapshot(step, 0, sid, _snapshot(info.shape, info.batched, float(scale), rng))
        if (step + 1) % FLUSH_EVERY == 0:
            writer.flush(catalog)
    final = writer.close(catalog)
    assert final is not None
    return final


def _depth(node: str) -> int:
    """The block number of a node in forward order (encoder 0-34, decoder 35-69), -1 outside the blocks."""
    parts = node.split(".")
    if len(parts) > 3 and parts[1] in ("encoder", "decoder") and parts[3].isdigit():
        return int(parts[3]) + (BLOCKS // 2 if parts[1] == "decoder" else 0)
    return -1


def _snapshot(shape: tuple[int, ...], batched: bool, scale: float, rng: np.random.Generator) -> SnapshotData:
    values = (rng.standard_normal(int(np.prod(shape))) * scale).astype(np.float32)
    samples = shape[0] if batched and shape else 0
    stats = np.zeros((samples, schema.NUM_FIELDS))
    per = len(values) // max(samples, 1)
    for row in range(samples):
        part = values[row * per:(row + 1) * per].astype(np.float64)
        f = schema.FIELD
        stats[row, f["count"]], stats[row, f["sum"]] = len(part), part.sum()
        stats[row, f["sum_sq"]], stats[row, f["sum_abs"]] = (part ** 2).sum(), np.abs(part).sum()
        stats[row, f["min"]], stats[row, f["max"]] = part.min(), part.max()
    return SnapshotData(tuple(shape), np.arange(samples, dtype=np.int64), stats, values, None)


def make_recording(path: Path, steps: int = STEPS, fault_step: int = FAULT_STEP) -> None:
    """The recording at ``path`` (a group folder holding trial ``bench``); the fault from ``fault_step`` on
    (the tests make short recordings with an early fault)."""
    torch.set_num_threads(1)  # tiny tensors: more threads only wait for each other
    with tempfile.TemporaryDirectory() as structure:
        catalog = record_structure(Path(structure))
    write_steps(path, catalog, steps, fault_step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    if args.path.exists():
        shutil.rmtree(args.path)
    start = time.perf_counter()
    make_recording(args.path, args.steps)
    with open_recording(args.path, TRIAL) as recording:
        graph = recording.graph()
        assert graph is not None
        print(f"{args.path}: {len(recording.steps)} steps, {len(graph.graph.nodes)} graph nodes, "
              f"{len(graph.graph.edges)} edges, {len(recording.catalog.series)} series, written in "
              f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
