"""Recording size and memory: what the defaults write per step and per snapshot, projected to a long run.

Size: a 12-block pre-norm Transformer encoder of width 64 (4 heads, feed-forward 256, sequences of 32
tokens, batch 16, next-token loss, Adam) is recorded by ``NeuralDbg`` with its defaults (summaries every
step, snapshots every 40th step, the default byte budget) for ``--steps`` steps, and once with
``byte_budget=None`` for comparison. The file's datasets are split into summaries, snapshots and the rest
(catalog, graph, KPIs); the bytes per recorded step and per snapshot step are measured, and a run of
``--project`` steps is projected linearly for the summaries and, for the snapshots, by running the byte
budget's own account (``SnapshotBudget``) over that many steps with the measured snapshot size: the
budget's arithmetic, checked against what the short run wrote.

Memory: the peak resident set (``VmHWM``) of a fresh process that trains the 8-block 256-wide MLP of
``benchmarks/overhead.py`` bare, of one that only imports comgra_ndbg first, and of one that records it
with ``NeuralDbg`` defaults, each in its own subprocess; the ratios are recorded over bare.

Run: ``python benchmarks/recording_size.py [--steps 30] [--project 100000] [--mlp-steps 300]``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VOCAB, SEQUENCE, WIDTH, HEADS, FEED_FORWARD, LAYERS, BATCH = 256, 32, 64, 4, 256, 12, 16


def snapshot_every() -> int:
    """``NeuralDbg``'s default snapshot interval (its ``snapshots=`` default), which the projection follows."""
    import inspect

    from comgra_ndbg import NeuralDbg

    return int(inspect.signature(NeuralDbg).parameters["snapshots"].default)


class Transformer(nn.Module):
    """12 pre-norm encoder blocks of width 64 between an embedding and a language-model head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(WIDTH, HEADS, FEED_FORWARD, dropout=0.0,
                                                               batch_first=True, norm_first=True)
                                    for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h)).flatten(0, 1)


def record_transformer(folder: Path, trial: str, steps: int, **options) -> Path:
    """Train the Transformer for ``steps`` steps under ``NeuralDbg``; returns the consolidated file."""
    from comgra_ndbg import NeuralDbg

    torch.manual_seed(0)
    model, criterion = Transformer(), nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with NeuralDbg(model, folder, trial=trial, optimizer=optimizer, loss=criterion, **options):
        for _ in range(steps):
            tokens = torch.randint(0, VOCAB, (BATCH, SEQUENCE), generator=g)
            optimizer.zero_grad()
            loss = criterion(model(tokens), torch.roll(tokens, -1, 1).reshape(-1))
            loss.backward()
            optimizer.step()
    return folder / trial / "recording.h5"


def split_sizes(path: Path) -> dict[str, int]:
    """Bytes on disk of the summary datasets, the snapshot datasets and everything else in ``path``."""
    import h5py

    sizes = {"summary": 0, "snapshot": 0, "other": 0}
    with h5py.File(path, "r") as f:
        def visit(name: str, obj: object) -> None:
            if isinstance(obj, h5py.Dataset):
                part = name.split("/")[0]
                sizes[part if part in sizes else "other"] += obj.id.get_storage_size()
        f.visititems(visit)
    sizes["file"] = path.stat().st_size
    return sizes


def project_snapshots(per_snapshot: int, steps: int) -> tuple[int, int]:
    """(bytes, snapshot steps) the default budget lets a ``steps``-step run write when each snapshot step
    is ``per_snapshot`` bytes after sub-sampling: the recorder's own account, run without a model."""
    import numpy as np

    from comgra_ndbg.recorder.budget import DEFAULT_BYTE_BUDGET, SnapshotBudget
    from comgra_ndbg.recorder.step_record import StepRecord
    from comgra_ndbg.store.segment import SnapshotData

    budget = SnapshotBudget(DEFAULT_BYTE_BUDGET)
    data = SnapshotData((per_snapshot // 4 - 16,), np.zeros(0, np.int64), np.zeros((0, 17)),
                        np.zeros(per_snapshot // 4 - 16, np.float32), None)
    taken = 0
    for step in range(0, steps, snapshot_every()):
        if budget.admit():
            fitted, _ = budget.fit(StepRecord(step, 0, 1, "", 0.0, snapshots=[(0, 0, data)]), preferred=False)
            taken += bool(fitted.snapshots)
    return budget.spent, taken


def peak_rss(variant: str, steps: int) -> dict:
    """Peak resident set in bytes of a fresh process training the MLP as ``variant`` (``maxrss``), the
    kernels' backend it ran (``kernels``) and whether numba was imported (``numba``)."""
    out = subprocess.run([sys.executable, __file__, "--child", variant, "--mlp-steps", str(steps)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


class MLP(nn.Module):
    """The 8-block 256-wide tanh MLP of ``benchmarks/overhead.py``, defined here so that the bare process
    does not import comgra_ndbg."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(32, 256)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(8))
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def child(variant: str, steps: int) -> None:
    """Train the MLP ``steps`` steps bare, after importing comgra_ndbg, or recorded; print the peak RSS."""
    if variant != "bare":
        importlib.import_module("comgra_ndbg")  # the import alone (h5py, numba) is part of the cost
    if variant == "kernels":  # the compiled statistics kernels loaded from numba's cache: a fixed cost
        importlib.import_module("comgra_ndbg.stats.kernels").warm_up()
    torch.manual_seed(0)
    model, criterion = MLP(), nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(steps)]

    def train() -> None:
        for x, y in data:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()

    if variant == "recorded":
        from comgra_ndbg import NeuralDbg

        with tempfile.TemporaryDirectory() as folder:
            with NeuralDbg(model, folder, trial="rss", optimizer=optimizer, loss=criterion):
                train()
    else:
        train()
    kind = None
    if variant != "bare":
        from comgra_ndbg.stats import backend

        kind = backend.kind()
    print(json.dumps({"maxrss": high_water_mark(), "kernels": kind, "numba": "numba" in sys.modules}))


def high_water_mark() -> int:
    """Peak resident bytes of this process: ``VmHWM`` where ``/proc`` has it (``ru_maxrss`` is inherited
    across fork and exec on Linux, so a child forked from a large parent would report the parent's peak)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="steps of the Transformer run")
    parser.add_argument("--project", type=int, default=100_000, help="steps of the projected run")
    parser.add_argument("--mlp-steps", type=int, default=300, help="steps of the MLP memory runs")
    parser.add_argument("--child", choices=("bare", "imported", "kernels", "recorded"), help=argparse.SUPPRESS)
    parser.add_argument("--skip-size", action="store_true", help="only the memory measurement")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.mlp_steps)
        return
    if not args.skip_size:
        from comgra_ndbg import open_recording
        from comgra_ndbg.recorder.budget import DEFAULT_BYTE_BUDGET

        with tempfile.TemporaryDirectory() as folder:
            started = time.perf_counter()
            path = record_transformer(Path(folder), "defaults", args.steps)
            seconds = time.perf_counter() - started
            unbounded = split_sizes(record_transformer(Path(folder), "unbounded", args.steps, byte_budget=None))
            sizes = split_sizes(path)
            with open_recording(folder, trial="defaults") as rec:
                nodes, recorded = len(rec.nodes), len(rec.steps)
                snap_steps = len(rec.snapshot_steps(rec.nodes[0])) if rec.nodes else 0
        per_step = sizes["summary"] / recorded
        per_snapshot = sizes["snapshot"] / max(snap_steps, 1)
        print(f"Transformer {LAYERS} blocks, width {WIDTH}: {nodes} nodes, {recorded} steps recorded in "
              f"{seconds:.0f} s, {snap_steps} snapshot steps")
        print(f"  file {sizes['file'] / 1e6:.2f} MB: summaries {sizes['summary'] / 1e6:.2f} MB, snapshots "
              f"{sizes['snapshot'] / 1e6:.2f} MB, catalog and the rest {sizes['other'] / 1e6:.2f} MB")
        print(f"  summaries per recorded step: {per_step / 1e3:.1f} kB")
        print(f"  snapshots per snapshot step: {per_snapshot / 1e6:.3f} MB with the budget "
              f"(bound {DEFAULT_BYTE_BUDGET.step_bytes / 1e6:.3f} MB), "
              f"{unbounded['snapshot'] / max(snap_steps, 1) / 1e6:.3f} MB without")
        snap_bytes, snap_count = project_snapshots(int(per_snapshot), args.project)
        projected = per_step * args.project + snap_bytes + sizes["other"]
        naive = per_step * args.project + unbounded["snapshot"] / max(snap_steps, 1) * args.project / snapshot_every()
        print(f"  projected {args.project} steps: {projected / 1e9:.2f} GB = summaries "
              f"{per_step * args.project / 1e9:.2f} GB + snapshots {snap_bytes / 1e9:.3f} GB in {snap_count} "
              f"snapshot steps (budget {DEFAULT_BYTE_BUDGET.run_bytes / 1e9:.3f} GB) + rest "
              f"{sizes['other'] / 1e9:.3f} GB; without the budget {naive / 1e9:.1f} GB")
        print(f"  checks: snapshot step within its bound {per_snapshot <= DEFAULT_BYTE_BUDGET.step_bytes}, "
              f"run within the budget {snap_bytes <= DEFAULT_BYTE_BUDGET.run_bytes}, projected <= 2 GB "
              f"{projected <= 2e9}")
    from comgra_ndbg.stats import kernels

    kernels.warm_up()  # a first build of the kernels happens here, not in a measured process
    children = {variant: peak_rss(variant, args.mlp_steps) for variant in ("bare", "imported", "kernels", "recorded")}
    rss = {variant: child["maxrss"] for variant, child in children.items()}
    mib = {variant: value / 2**20 for variant, value in rss.items()}
    print(f"MLP 8x256, {args.mlp_steps} steps, peak RSS of a fresh process: bare {mib['bare']:.0f} MiB, "
          f"comgra_ndbg imported {mib['imported']:.0f} MiB ({rss['imported'] / rss['bare']:.3f}x), its compiled "
          f"kernels loaded too {mib['kernels']:.0f} MiB ({rss['kernels'] / rss['bare']:.3f}x), recorded with "
          f"NeuralDbg defaults {mib['recorded']:.0f} MiB ({rss['recorded'] / rss['bare']:.3f}x bare)")
    print(f"  of the {mib['recorded'] - mib['bare']:.0f} MiB above bare: fixed, whatever the model's size: the "
          f"import {mib['imported'] - mib['bare']:.0f} MiB and the kernels {mib['kernels'] - mib['imported']:.0f} "
          f"MiB; the recording itself (buffers, flight ring, the merge at close) "
          f"{mib['recorded'] - mib['kernels']:.0f} MiB ({(rss['recorded'] - rss['kernels']) / rss['bare']:.1%} of "
          f"bare)")
    recorded = children["recorded"]
    print(f"  the kernels ran {recorded['kernels'] or 'in numpy'}; numba imported while recording: {recorded['numba']}")

if __name__ == "__main__":
    main()
