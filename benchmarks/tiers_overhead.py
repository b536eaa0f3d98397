"""Statistic tiers: the cost of NeuralDbg's default ``detail="tiered"`` beside ``detail="full"``, and
diagnosis scores, in one report.

Workloads (``benchmarks/neuraldbg_overhead.py``): the 8-block 256-wide tanh MLP with plain SGD (the
cheapest bare step, where recording shows most) and with Adam, and the small transformer with Adam.
Variants, run interleaved in rounds with the order rotated each round, one torch thread:

- bare: the training loop alone;
- tiered (the default): ``detail="tiered"`` — every value and gradient summarised at every step, parameter
  updates measured at the first 20 steps, every 40th step and where something changed (``recorder/tiers.py``),
  snapshots every 40th step;
- full: ``detail="full"`` — every parameter's update summarised at every step too;
- tiered / full without snapshots (``snapshots=None``): the summaries' share;
- nothing recorded: a policy that skips every step (the hooks return at once);
- hook entries alone (``hook_floor.run_hook_floor``): NeuralDbg's hook entry points with empty bodies, the
  floor of a skipped step for any recorder that sees the step through hooks;
- two floors (``neuraldbg_overhead.run_floor``: the same statistics from the compiled kernels called
  directly in bare hooks, no bookkeeping, no storage): every statistic of the full default, and the
  activations' and all gradients' statistics alone. The second is what any tiering that keeps activations
  and gradients complete at every step costs at the least, however rarely it measures updates.

Each figure is the median over rounds of each round's median step time, as a ratio to bare (wall clock
and CPU time of this process; the second is steadier on a shared machine), with the load average.
``--diagbench result.json`` (from ``python -m benchmarks.diagbench --out result.json``) adds the pooled
diagnosis scores of that run beside their targets.

Run: ``python -m benchmarks.tiers_overhead [--steps 150] [--rounds 5] [--diagbench result.json]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.hook_floor import run_hook_floor
from benchmarks.neuraldbg_overhead import TanhMLP, TinyTransformer, run, run_floor, token_data
from benchmarks.overhead import make_data
from comgra_ndbg.stats import kernels

VARIANTS = {
    "bare": None,
    "tiered (default)": {},
    "full": dict(detail="full"),
    "tiered, no snapshots": dict(snapshots=None),
    "full, no snapshots": dict(detail="full", snapshots=None),
    "nothing recorded": dict(summaries=None, snapshots=None),
    "hook entries alone": "hooks",
    "floor: everything": "floor",
    "floor: act. + gradients": "floor without parameters",
}
TARGETS = [("tpr", "detection TPR", ">= 0.95"), ("fpr", "FPR over healthy runs", "<= 0.02"),
           ("type_accuracy", "fault-type accuracy", ">= 0.90"), ("origin_top1", "origin top-1", ">= 0.90"),
           ("onset_within_2", "onset within +-2 steps", ">= 0.90"), ("ece", "ECE (LOFO)", "<= 0.10")]


def measure(steps: int, rounds: int) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Per workload and variant, the (wall, CPU) median step seconds of each round."""
    workloads = {"MLP 8x256 tanh, SGD": (TanhMLP, make_data(steps), "sgd"),
                 "MLP 8x256 tanh, Adam": (TanhMLP, make_data(steps), "adam"),
                 "transformer 2x128, Adam": (TinyTransformer, token_data(steps), "adam")}
    names = [v for v in VARIANTS if kernels.AVAILABLE or not str(VARIANTS[v]).startswith("floor")]
    results = {w: {v: [] for v in names} for w in workloads}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for w, (workload, (make_model, data, optimizer)) in enumerate(workloads.items()):
                for v in order:
                    trial = f"w{w}-v{names.index(v)}-r{r}"
                    options = VARIANTS[v]
                    if options == "hooks":
                        results[workload][v].append(run_hook_floor(make_model, data, optimizer))
                    elif isinstance(options, str):
                        results[workload][v].append(run_floor(make_model, data, optimizer,
                                                              parameters=options == "floor"))
                    else:
                        results[workload][v].append(run(make_model, data, options, folder, trial, optimizer))
    return results


def report(results: dict, diagbench: dict | None, *, steps: int, rounds: int, load: tuple[str, str]) -> str:
    lines = [f"Statistic tiers: {steps} steps x {rounds} interleaved rounds, 1 torch thread, median of the rounds' "
             f"median step times (load average {load[0]} before, {load[1]} after)"]
    for workload, variants in results.items():
        lines.append(workload)
        bare = [statistics.median(x[i] for x in variants["bare"]) for i in (0, 1)]
        for v, samples in variants.items():
            wall = [x[0] / b[0] for x, b in zip(samples, variants["bare"])]
            cpu = [x[1] / b[1] for x, b in zip(samples, variants["bare"])]
            ms = statistics.median(x[0] for x in samples) * 1e3
            lines.append(f"  {v:<24} {ms:8.3f} ms/step   wall {statistics.median(wall):5.3f}x "
                         f"({min(wall):.2f}-{max(wall):.2f})   CPU {statistics.median(cpu):5.3f}x "
                         f"({min(cpu):.2f}-{max(cpu):.2f})   bare {bare[0] * 1e3:.3f} ms")
    if diagbench is not None:
        pooled = diagbench["scores"]["analysis"]["pooled"]
        runs = f"{pooled['faulty_runs']} faulty ({pooled['valid_faulty_runs']} valid), {pooled['healthy_runs']} healthy"
        lines.append(f"diagnosis (diagbench{' smoke' if diagbench.get('smoke') else ''}, {runs}):")
        for key, label, target in TARGETS:
            lines.append(f"  {label:<24} {pooled[key]:.3f}   target {target}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--diagbench", type=Path, default=None, help="a diagbench --out JSON to report beside")
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = f"{os.getloadavg()[0]:.1f}"
    results = measure(args.steps, args.rounds)
    after = f"{os.getloadavg()[0]:.1f}"
    diagbench = json.loads(args.diagbench.read_text()) if args.diagbench else None
    print(report(results, diagbench, steps=args.steps, rounds=args.rounds, load=(before, after)))


if __name__ == "__main__":
    main()
