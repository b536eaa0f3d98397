"""Cost of distributed recording and of the checks across ranks.

Measured, side by side in one process:

- step time of a ``Recorder`` tracking a small MLP's parameters as rank 1 of 2 (``RANK``/``WORLD_SIZE`` set, so
  it writes ``<trial>/rank1/``) against the same recorder as a single process: the ratio should be 1, since
  per-rank recording only changes where the files go and adds nothing to the step;
- ``check_ranks`` on synthetic fingerprints (ranks × parameters × steps), the pure part of the cross-rank
  analysis;
- ``load_rank_runs`` + ``check_ranks`` on real rank recordings (what ``analyze`` adds for a multi-rank trial).

Run: ``python benchmarks/ranks.py [--steps 200] [--ranks 4]``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from comgra_ndbg import Recorder, open_recording
from comgra_ndbg.analysis.rank_loading import load_rank_runs
from comgra_ndbg.analysis.ranks import RankRun, check_ranks
from comgra_ndbg.store import schema


def record(folder: Path, trial: str, steps: int, rank: int | None, world: int) -> float:
    """Seconds per step of a recorded training loop, as rank ``rank`` of ``world`` (None: one process)."""
    if rank is None:
        os.environ.pop("RANK", None)
        os.environ.pop("WORLD_SIZE", None)
    else:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(steps, 16, 32)
    try:
        with Recorder(folder, trial, snapshots=False) as rec:
            rec.track_module("model", model)
            start = time.perf_counter()
            for step in range(steps):
                with rec.step(step):
                    optimizer.zero_grad()
                    loss = model(data[step]).square().mean()
                    loss.backward()
                    optimizer.step()
                    rec.record_kpi("loss", float(loss.detach()))
            return (time.perf_counter() - start) / steps
    finally:
        os.environ.pop("RANK", None)
        os.environ.pop("WORLD_SIZE", None)


def synthetic(ranks: int, parameters: int, steps: int) -> list[RankRun]:
    rows = np.random.default_rng(0).normal(size=(steps, schema.NUM_FIELDS))
    rows[:, :3] = [1024, 0, 0]
    prints = {f"p{i}": (np.arange(steps), rows) for i in range(parameters)}
    series = (np.arange(steps), np.linspace(2.0, 1.0, steps))
    return [RankRun(r, np.arange(steps), prints, True, series, series) for r in range(ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        single, ranked = [], []
        for repeat in range(3):  # alternating, so load on the machine hits both alike
            single.append(record(Path(folder), f"single{repeat}", args.steps, None, 1))
            ranked.append(record(Path(folder), f"ranked{repeat}", args.steps, 1, 2))
        s, r = statistics.median(single), statistics.median(ranked)
        print(f"step time, recorder as one process: {s * 1e3:.3f} ms; as rank 1 of 2: {r * 1e3:.3f} ms; "
              f"ratio {r / s:.3f}")
        for rank in range(args.ranks):
            record(Path(folder), "multi", args.steps, rank, args.ranks)
        with open_recording(folder, "multi") as recording:
            times = []
            for _ in range(3):
                start = time.perf_counter()
                findings = check_ranks(load_rank_runs(recording))
                times.append(time.perf_counter() - start)
        print(f"load_rank_runs + check_ranks, {args.ranks} ranks x 6 parameters x {args.steps} steps: "
              f"{statistics.median(times) * 1e3:.1f} ms, {len(findings)} findings")
    for ranks, parameters, steps in ((2, 200, 2000), (8, 200, 2000)):
        runs = synthetic(ranks, parameters, steps)
        start = time.perf_counter()
        findings = check_ranks(runs)
        print(f"check_ranks, {ranks} ranks x {parameters} parameters x {steps} steps: "
              f"{(time.perf_counter() - start) * 1e3:.0f} ms, {len(findings)} findings")


if __name__ == "__main__":
    main()
