"""Loop-invariant checks' cost: NeuralDbg with ``invariants=True`` against ``invariants=False``, side by side.

Three workloads of ``benchmarks/neuraldbg_overhead.py``: the 8-block 256-wide tanh MLP (batch 64) trained
with plain SGD and with Adam, and the small transformer (2 pre-norm encoder layers of width 128) with Adam.
Each runs the plain training loop bare, under ``NeuralDbg`` with hooks only (every step skipped by the
policy, so nothing but the hooks, step detection and the checks run) with the invariants on, and the same
with ``invariants=False``; the three run interleaved in rounds on one torch thread, so machine noise hits
them alike. Printed per workload: the median step time of each against bare (wall clock and CPU time of
this process), the difference on − off as a share of the bare step, and — the steadier figure on a shared
machine, since that difference is a few microseconds against milliseconds of noise — the CPU time spent
inside the invariant methods themselves (each wrapped with a timer; the timers' own cost, measured on an
empty method, subtracted) as a share of the bare step, and the marginal cost measured in pairs: one
NeuralDbg run whose steps alternate with the checks on and off (``_inv`` toggled between steps, when no
step is open), the median CPU time of the steps with the checks minus that of the steps without, both
under the same cache and load conditions. The timed methods also pay for first touching the parameters
and gradients after the backward pass and the optimizer, which the code after them then finds in cache,
so the paired difference is the cost the training loop feels. The target is ≤ 1 % of a bare step.

Run: ``python benchmarks/invariant_overhead.py [--steps 200] [--rounds 5]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.neuraldbg_overhead import (  # noqa: E402
    LAYERS, OPTIMIZERS, WIDTH, TanhMLP, TinyTransformer, invariant_seconds, make_data, run, token_data)
from comgra_ndbg import NeuralDbg  # noqa: E402

HOOKS_ONLY = dict(summaries=None, snapshots=None)
VARIANTS = {"bare": None, "on": dict(HOOKS_ONLY), "off": dict(HOOKS_ONLY, invariants=False)}


def paired_seconds(make_model: Callable[[], nn.Module], data: list, folder: str, trial: str,
                   optimizer_name: str) -> tuple[float, float]:
    """Median CPU seconds (``time.thread_time``) of a step with the loop-invariant checks and of a step
    without them, the steps of one NeuralDbg run (hooks only) alternating between the two."""
    torch.manual_seed(0)
    model, criterion = make_model(), nn.CrossEntropyLoss()
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    dbg = NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, **HOOKS_ONLY)
    on: list[float] = []
    off: list[float] = []
    for k, (inputs, targets) in enumerate(data):
        dbg._inv = k % 2 == 0  # the step closed at the optimizer's post-hook: no step is open here
        t0 = time.thread_time()
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        (on if k % 2 == 0 else off).append(time.thread_time() - t0)
    dbg._inv = True
    dbg.close()
    return statistics.median(on[5:]), statistics.median(off[5:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    workloads = {
        "8-block 256-wide tanh MLP, batch 64, SGD": (TanhMLP, make_data(args.steps), "sgd"),
        "8-block 256-wide tanh MLP, batch 64, Adam": (TanhMLP, make_data(args.steps), "adam"),
        f"transformer {LAYERS}x{WIDTH}, Adam": (TinyTransformer, token_data(args.steps), "adam"),
    }
    times = {(w, v): [] for w in workloads for v in VARIANTS}
    inside = {w: [] for w in workloads}
    paired = {w: [] for w in workloads}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            for i, (w, (make_model, data, optimizer)) in enumerate(workloads.items()):
                for v, options in VARIANTS.items():
                    times[(w, v)].append(run(make_model, data, options, folder, f"{v}-{r}-{i}", optimizer))
                total, timers = invariant_seconds(make_model, data, folder, f"timed-{r}-{i}", optimizer)
                inside[w].append((total, timers))
                paired[w].append(paired_seconds(make_model, data, folder, f"paired-{r}-{i}", optimizer))
    print(f"Loop-invariant checks, CPU, 1 torch thread, {args.steps} steps x {args.rounds} rounds, median step time")
    for w in workloads:
        (bare_wall, bare_cpu), (on_wall, on_cpu), (off_wall, off_cpu) = (
            tuple(statistics.median(x) for x in zip(*times[(w, v)])) for v in VARIANTS)
        total = statistics.median(t for t, _ in inside[w])
        timers = statistics.median(c for _, c in inside[w])
        print(w)
        print(f"  bare step                      {bare_wall * 1e3:7.3f} ms wall   {bare_cpu * 1e3:7.3f} ms CPU")
        print(f"  hooks only, invariants on/off  ratio {on_wall / bare_wall:5.3f}x / {off_wall / bare_wall:5.3f}x wall"
              f"   {on_cpu / bare_cpu:5.3f}x / {off_cpu / bare_cpu:5.3f}x CPU")
        print(f"  on - off                       {(on_wall - off_wall) / bare_wall:+7.2%} of bare (wall)   "
              f"{(on_cpu - off_cpu) / bare_cpu:+7.2%} (CPU)")
        print(f"  inside the checks              {(total - timers) * 1e6:7.1f} us/step = "
              f"{(total - timers) / bare_cpu:.2%} of the bare step's CPU time (timers' own "
              f"{timers * 1e6:.1f} us/step subtracted)")
        on = statistics.median(a for a, _ in paired[w])
        off = statistics.median(b for _, b in paired[w])
        print(f"  paired steps, checks on - off  {(on - off) * 1e6:+7.1f} us/step = {(on - off) / off:+.2%} of a step "
              f"without them ({off * 1e3:.3f} ms CPU)")


if __name__ == "__main__":
    main()
