"""Evaluation-run overhead: the cost of ``NeuralDbg(record_eval=True)`` against ``record_eval=False``.

The 8-block 256-wide tanh MLP of ``benchmarks/neuraldbg_overhead.py`` (batch 64, Adam). One cycle is one
training step followed by an evaluation run of ``--passes`` forward passes under ``model.eval()`` and
``torch.no_grad()`` (a validation loop). With ``record_eval=True`` each pass reduces every leaf module's
output and the model's into four sums on the device, and the next training step files the run as KPIs (one
host copy); with ``record_eval=False`` an evaluation pass costs the forward pre-hook's checks only.

Variants run interleaved in rounds so machine noise hits all alike; printed are the median seconds of one
evaluation pass and of one whole cycle (wall-clock and CPU time of this process), and their ratios to the
bare loop and to ``record_eval=False``.

Run: ``python benchmarks/eval_overhead.py [--cycles 30] [--passes 20] [--rounds 3] [--threads N]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.neuraldbg_overhead import TanhMLP  # noqa: E402
from benchmarks.overhead import make_data  # noqa: E402
from comgra_ndbg import NeuralDbg  # noqa: E402

VARIANTS = [("bare loop", None), ("NeuralDbg, record_eval=False", False), ("NeuralDbg, record_eval=True", True)]


def run(record_eval: bool | None, data: list, held_out: list, folder: str, trial: str
        ) -> tuple[float, float, float, float]:
    """Median wall and CPU seconds of one evaluation pass and of one cycle (after 3 warm-up cycles)."""
    torch.manual_seed(0)
    model, criterion = TanhMLP(), nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    dbg = None if record_eval is None else NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer,
                                                     record_eval=record_eval)
    passes_wall, passes_cpu, cycles_wall, cycles_cpu = [], [], [], []
    try:
        for cycle, (x, y) in enumerate(data):
            wall, cpu = time.perf_counter(), time.process_time()
            model.train()
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            model.eval()
            eval_wall, eval_cpu = time.perf_counter(), time.process_time()
            with torch.no_grad():
                for batch in held_out:
                    model(batch)
            if cycle >= 3:
                passes_wall.append((time.perf_counter() - eval_wall) / len(held_out))
                passes_cpu.append((time.process_time() - eval_cpu) / len(held_out))
                cycles_wall.append(time.perf_counter() - wall)
                cycles_cpu.append(time.process_time() - cpu)
    finally:
        if dbg is not None:
            dbg.close()
    return tuple(statistics.median(v) for v in (passes_wall, passes_cpu, cycles_wall, cycles_cpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data = make_data(args.cycles)
    held_out = [x for x, _ in make_data(args.passes)]
    results: dict[str, list[tuple[float, ...]]] = {name: [] for name, _ in VARIANTS}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for name, record_eval in VARIANTS:
                results[name].append(run(record_eval, data, held_out, folder, f"r{round_}-{record_eval}"))
    medians = {name: [statistics.median(r[i] for r in rows) for i in range(4)] for name, rows in results.items()}
    bare, off = medians["bare loop"], medians["NeuralDbg, record_eval=False"]
    print(f"{'variant':32} {'pass ms':>8} {'pass cpu':>8} {'cycle ms':>9} {'cycle cpu':>9}   pass ×bare  pass ×off  "
          f"cycle ×off")
    for name, (pw, pc, cw, cc) in medians.items():
        print(f"{name:32} {pw * 1e3:8.3f} {pc * 1e3:8.3f} {cw * 1e3:9.2f} {cc * 1e3:9.2f}   {pw / bare[0]:9.2f}  "
              f"{pw / off[0]:9.2f}  {cw / off[2]:10.2f}")


if __name__ == "__main__":
    main()
