"""Breakpoint overhead: NeuralDbg without breakpoints and with breakpoints whose condition never fires.

The 8-block 256-wide tanh MLP of ``benchmarks/neuraldbg_overhead.py`` (batch 64, Adam), trained by the
unchanged loop under ``NeuralDbg(model, loss=criterion, optimizer=...)`` with summaries every step. The
variants add breakpoints that never fire on this healthy run, so what they cost is the check alone:

- one module, forward, ``"abs_max > 1e30"``: one summary pass over that module's output per step;
- one module, backward, the same condition on its gradient: a gradient hook and one summary pass;
- every leaf module (``"*"``), forward, ``"nonfinite"``: one summary pass per module output;
- one module, forward, a function of the tensor (``lambda t: bool(t.abs().max() > 1e30)``);
- an ``after_step`` hook that reads one statistic of the step's summaries.

Variants run interleaved in rounds so machine noise hits all alike; printed are the median step times and
their ratios to NeuralDbg without breakpoints (and to the bare loop), in wall-clock and in CPU time of this
process (steadier on a shared machine). On a busy machine a few percent are below the noise of step
medians, so the check itself is also timed alone: CPU microseconds per call of each condition on a tensor
of the watched output's shape (64 × 256), and that as a share of the NeuralDbg step.

Run: ``python benchmarks/breakpoint_overhead.py [--steps 200] [--rounds 5] [--threads N]``.
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

from benchmarks.neuraldbg_overhead import TanhMLP, timed_loop  # noqa: E402
from benchmarks.overhead import make_data  # noqa: E402
from comgra_ndbg import NeuralDbg  # noqa: E402
from comgra_ndbg.instrument.conditions import parse_condition  # noqa: E402

NEVER = "abs_max > 1e30"
Setup = Callable[[NeuralDbg], object] | None
VARIANTS: list[tuple[str, Setup | str]] = [
    ("bare loop", "bare"),
    ("NeuralDbg, no breakpoint", None),
    ("+ break_at one module, forward", lambda dbg: dbg.break_at("blocks.3.linear", when=NEVER)),
    ("+ break_at one module, backward", lambda dbg: dbg.break_at("blocks.3.linear", when=NEVER, at="backward")),
    ("+ break_at every leaf module, nonfinite", lambda dbg: dbg.break_at("*", when="nonfinite")),
    ("+ break_at one module, a function", lambda dbg: dbg.break_at(
        "blocks.3.linear", when=lambda t: bool(t.abs().max() > 1e30))),
    ("+ after_step hook reading a statistic", lambda dbg: dbg.on(
        "after_step", lambda info: info.stat("model.head", "abs_max"))),
]


def run(setup: Setup | str, data: list, folder: str, trial: str) -> tuple[float, float]:
    """Train over ``data``; the median wall-clock and CPU seconds per step after 10 warm-up steps."""
    torch.manual_seed(0)
    model, criterion = TanhMLP(), nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    dbg = None
    if setup != "bare":
        dbg = NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, snapshots=None)
        if setup is not None:
            setup(dbg)
    times = timed_loop(model, criterion, optimizer, data)
    if dbg is not None:
        hits = sum(point.hits for point in dbg.breakpoints)
        dbg.close()
        assert hits == 0, f"a breakpoint that should never fire fired {hits} times"
    return times


def check_seconds(when: object, calls: int = 2000) -> float:
    """CPU seconds per ``check`` of condition ``when`` on a 64 x 256 tensor (the watched layer's output)."""
    condition = parse_condition(when)
    tensor = torch.randn(64, 256)
    for _ in range(50):
        condition.check(tensor)
    c0 = time.process_time()
    for _ in range(calls):
        condition.check(tensor)
    return (time.process_time() - c0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = make_data(args.steps)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in VARIANTS}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            for i, (name, setup) in enumerate(VARIANTS):
                times[name].append(run(setup, data, folder, f"r{r}v{i}"))
    wall = {name: statistics.median(t[0] for t in runs) for name, runs in times.items()}
    cpu = {name: statistics.median(t[1] for t in runs) for name, runs in times.items()}
    base, bare = "NeuralDbg, no breakpoint", "bare loop"
    print(f"Breakpoint overhead, CPU ({torch.get_num_threads()} threads), 8x256 tanh MLP, batch 64, {args.steps} "
          f"steps x {args.rounds} rounds, median per step")
    print(f"{'variant':42s} {'ms/step':>8s} {'vs no bp (wall)':>16s} {'vs no bp (CPU)':>15s} {'vs bare (wall)':>15s}")
    for name, _ in VARIANTS:
        print(f"{name:42s} {wall[name] * 1e3:8.2f} {wall[name] / wall[base]:16.2f} {cpu[name] / cpu[base]:15.2f} "
              f"{wall[name] / wall[bare]:15.2f}")
    print(f"\none check on a 64x256 tensor, alone (CPU µs per call; share of the {cpu[base] * 1e3:.2f} ms CPU "
          f"NeuralDbg step)")
    for when in (NEVER, "nonfinite", "always"):
        seconds = check_seconds(when)
        print(f"  {when!r:42s} {seconds * 1e6:8.1f} µs  {seconds / cpu[base]:7.2%}")
    seconds = check_seconds(lambda t: bool(t.abs().max() > 1e30))
    print(f"  {'a function (abs().max() > 1e30)':42s} {seconds * 1e6:8.1f} µs  {seconds / cpu[base]:7.2%}")


if __name__ == "__main__":
    main()
