"""Bookkeeping in two parts, per step and per layer, measured where the kernels cost nothing.

The bookkeeping of ``benchmarks/neuraldbg_overhead.py --bookkeeping`` is a difference of two ~1.2x ratios
on a 5 ms step, and runs of one code spread by +-0.1x of a bare step between rounds: a change of 0.01x
cannot be seen there. Here the model is a chain of ``depth`` ``nn.Linear(4, 4)`` layers on a batch of 2,
so a summary's kernel reads 8 numbers and every microsecond above bare is Python: the hooks, the
registration, the gradient hooks, collecting the rows, the step record. Each variant runs at two depths;
the step time is then a line, ``fixed + depth * per_layer``, and

- **fixed** is what a step costs whatever the model (step detection, the loss KPI, collecting and writing
  the step's rows, the loop invariants),
- **per layer** what each module output and its two parameters add (the output's value and gradient, the
  parameters' values, gradients and updates),

for NeuralDbg everything every step (``detail="full"``), the explicit ``Recorder`` of ``benchmarks/overhead.py``
(every layer's output, the input, target and loss registered by hand, every parameter tracked, summaries
every step, no snapshots), and the floor of ``neuraldbg_overhead`` (the same statistics from the same
kernels called from bare hooks). The bookkeeping is a recorder's line minus the floor's. Runs of one code
agree on the fixed part within a few microseconds; the 33-layer runs spread by about 5 % (some 4 us per
layer).

The same split for a step that records nothing: NeuralDbg with nothing to record (after its first 32 steps
every step is a light step, ``instrument/light_steps.py``) and NeuralDbg's hook entry points installed and
empty (``benchmarks/hook_floor.py``), each above bare: the target for such a step is 1.02x. (NeuralDbg's
defaults are not measured here: a deep chain of tiny layers has vanishing gradients, so the tiers measure
every step in full.) The chains keep the recorder's code in the caches, which a large model's passes evict:
the projections are lower bounds for the MLP itself, and this benchmark is for seeing a change in the cost
of the Python, which it resolves to a few microseconds.

The 8x256 MLP of the bookkeeping figure is 10 such layers (every ``nn.Linear`` output and its weight and
bias; its ``tanh`` is functional), so the last line projects the two parts onto it, ``fixed + 10 *
per_layer``, as a share of that MLP's bare step measured in the same run: the bookkeeping target is
0.05x of it.

Run: ``python -m benchmarks.bookkeeping_parts [--depths 1 33] [--steps 500] [--rounds 3] [--width 4] [--batch 2]``.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.hook_floor import run_hook_floor
from benchmarks.neuraldbg_overhead import TanhMLP, make_data, run, run_floor
from comgra_ndbg import Recorder
from comgra_ndbg.recorder import native

__all__ = ["Chain", "chain_data", "parts", "recorder_seconds", "RECORDERS", "SKIPPED", "VARIANTS"]

WIDTH, BATCH, MLP_LAYERS = 4, 2, 10
VARIANTS: dict[str, dict | None] = {
    "bare": None,
    "floor": None,
    "NeuralDbg, everything every step": dict(summaries=1, snapshots=None, detail="full"),
    "Recorder, summaries every step": None,
    "NeuralDbg, nothing recorded": dict(summaries=None, snapshots=None),
    "hook entries alone": None,
}
RECORDERS = ("NeuralDbg, everything every step", "Recorder, summaries every step")
SKIPPED = ("NeuralDbg, nothing recorded", "hook entries alone")


class Chain(nn.Module):
    """``depth`` ``nn.Linear(WIDTH, WIDTH)`` layers one after the other: one output and two parameters each."""

    def __init__(self, depth: int, width: int = WIDTH) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def chain_data(steps: int, width: int = WIDTH, batch: int = BATCH) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, width, generator=g), torch.randint(0, width, (batch,), generator=g))
            for _ in range(steps)]


def _seconds(variant: str, make_model: Callable[[], nn.Module], data: list, folder: str, trial: str) -> float:
    """Median CPU seconds per step of ``variant`` (SGD, so that the optimizer adds little to the line)."""
    if variant == "floor":
        return run_floor(make_model, data, "sgd")[1]
    if variant.startswith("Recorder"):
        return recorder_seconds(make_model, data, folder, trial)
    if variant == "hook entries alone":
        return run_hook_floor(make_model, data, "sgd", warmup=50)[1]
    return run(make_model, data, VARIANTS[variant], folder, trial, "sgd", warmup=50)[1]


def recorder_seconds(make_model: Callable[[], Chain], data: list, folder: str, trial: str, warmup: int = 50) -> float:
    """Median CPU seconds per step after ``warmup`` steps of the chain's loop with the explicit ``Recorder``."""
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    rec = Recorder(folder, trial, summaries=1, snapshots=None)
    rec.track_module("model", model)
    names = [f"layer{i}" for i in range(len(model.layers))]
    times = []
    for step, (x, y) in enumerate(data):
        c0 = time.process_time()
        rec.start_step(step)
        rec.register_tensor("input", x, role="input")
        rec.register_tensor("target", y, role="target")
        h = x
        for name, layer in zip(names, model.layers):
            h = layer(h)
            rec.register_tensor(name, h, role="output" if layer is model.layers[-1] else "intermediate")
        loss = nn.functional.cross_entropy(h, y)
        rec.register_tensor("loss", loss, role="loss")
        optimizer.zero_grad()
        loss.backward()
        rec.record_gradients()
        optimizer.step()
        rec.record_kpi("loss", loss)
        rec.finish_step()
        times.append(time.process_time() - c0)
    rec.close()
    return statistics.median(times[warmup:])


def parts(depths: tuple[int, int], steps: int, rounds: int, width: int = WIDTH, batch: int = BATCH
          ) -> dict[str, tuple[float, float]]:
    """Per variant, ``(fixed, per_layer)`` seconds: the line through its median step times at the two
    depths, each the median over ``rounds`` rounds that run every variant and depth one after the other."""
    times: dict[tuple[str, int], list[float]] = {(v, d): [] for v in VARIANTS for d in depths}
    data = chain_data(steps, width, batch)
    with tempfile.TemporaryDirectory() as folder:
        for r in range(rounds):
            for d in depths:
                for i, v in enumerate(VARIANTS):
                    times[(v, d)].append(_seconds(v, lambda d=d: Chain(d, width), data, folder, f"parts-{r}-{d}-{i}"))
    low, high = depths
    lines = {}
    for v in VARIANTS:
        a, b = statistics.median(times[(v, low)]), statistics.median(times[(v, high)])
        per_layer = (b - a) / (high - low)
        lines[v] = (a - low * per_layer, per_layer)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs=2, default=(1, 33))
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=WIDTH, help="the layers' width (256: the MLP's own layers)")
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args()
    torch.set_num_threads(1)
    native.warm_up()  # the C++ gradient taps: built once per machine, not in a measured run
    lines = parts(tuple(args.depths), args.steps, args.rounds, args.width, args.batch)
    with tempfile.TemporaryDirectory() as folder:
        mlp_bare = statistics.median(run(TanhMLP, make_data(args.steps // 2), None, folder, "mlp", "sgd")[1]
                                     for _ in range(args.rounds))
    print(f"CPU time per step, 1 thread, chains of {args.depths[0]} and {args.depths[1]} Linear({args.width}, "
          f"{args.width}) layers, batch {args.batch}, SGD, {args.steps} steps x {args.rounds} rounds")
    print(f"  {'':<36} {'fixed':>10} {'per layer':>12}")
    for v, (fixed, per_layer) in lines.items():
        print(f"  {v:<36} {fixed * 1e6:7.1f} us {per_layer * 1e6:9.2f} us")
    print(f"bookkeeping (recorder - floor); projected onto the 8x256 MLP ({MLP_LAYERS} layers, bare step "
          f"{mlp_bare * 1e3:.2f} ms with SGD): fixed + {MLP_LAYERS} x per layer")
    _print_above(lines, RECORDERS, "floor", mlp_bare)
    print("a step that records nothing (after the first 32 steps: light steps), above bare; projected the same way")
    _print_above(lines, SKIPPED, "bare", mlp_bare)


def _print_above(lines: dict[str, tuple[float, float]], variants: tuple[str, ...], base: str, mlp_bare: float) -> None:
    """Each of ``variants``' two parts above ``base``'s, and their projection onto the MLP."""
    base_fixed, base_layer = lines[base]
    for v in variants:
        fixed, per_layer = lines[v][0] - base_fixed, lines[v][1] - base_layer
        total = fixed + MLP_LAYERS * per_layer
        print(f"  {v:<36} {fixed * 1e6:7.1f} us {per_layer * 1e6:9.2f} us   {total * 1e6:7.1f} us = "
              f"{total / mlp_bare:.3f}x of the MLP's bare step")


if __name__ == "__main__":
    main()
