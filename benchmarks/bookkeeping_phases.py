"""Where the Recorder's bookkeeping goes within a step: the lockstep of ``benchmarks/overhead.py`` split by
the step's phases.

The bookkeeping figure of ``benchmarks/overhead.py`` (recorded − floor, in lockstep) says how much a summary
step costs above the same statistics computed with no bookkeeping, not where. Here the same three loops —
bare, the explicit ``Recorder`` (summaries every step, no snapshots) and the floor — run one step each in
turn, every order of them in rotation, and each loop marks the end of each of its phases
(``overhead.PHASES``): the step's start (``start_step`` and the input's and target's summaries; the floor's
parameter-value pass), the forward pass with its outputs' summaries, the backward pass with what runs at its
end (the recorder's summary of the activations' gradients), the gradients' summaries (``record_gradients``;
the floor's activation- and parameter-gradient passes), the optimizer's step, and the step's end
(``finish_step``; the floor's update pass). The table gives each phase's median over a round's steps, then
over rounds, in microseconds, and recorded − floor per phase: a phase where the recorder does the same
kernel work as the floor shows its Python, a phase where the work moved (the activations' gradients are
summarised at the backward pass's end by the recorder, in the gradient phase by the floor) shows the move.
The marks cost the loops alike (a call per phase).

Run: ``python -m benchmarks.bookkeeping_phases [--steps 300] [--rounds 3]`` (``OMP_NUM_THREADS=1`` for the
figures of ``docs/recording.md``).
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from collections.abc import Iterator

import torch

from benchmarks.overhead import PHASES, finish, floor_steps, make_data, training_steps
from comgra_ndbg import Recorder
from comgra_ndbg.recorder import native
from comgra_ndbg.stats import parallel

__all__ = ["PhaseClock", "phase_lockstep", "phase_medians", "VARIANTS"]

VARIANTS = ("bare", "recorded", "floor")


class PhaseClock:
    """The seconds of each phase of one step: ``begin()`` right before the step, then the loop calls the
    clock with each phase's name as the phase ends; ``times`` holds the step's phases afterwards."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._last = 0.0

    def begin(self) -> None:
        self.times = {}
        self._last = time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.times[phase] = now - self._last
        self._last = now


def phase_lockstep(data: list, folder: str, trial: str) -> dict[str, list[dict[str, float]]]:
    """The three loops of ``VARIANTS`` over ``data`` in lockstep (every order in rotation); per variant, the
    phase seconds of each of its steps. The recorded loop writes trial ``trial`` under ``folder``."""
    clocks = {name: PhaseClock() for name in VARIANTS}
    running: dict[str, Iterator[None]] = {
        "bare": training_steps(data, None, clocks["bare"]),
        "recorded": training_steps(data, Recorder(folder, trial, summaries=1, snapshots=None), clocks["recorded"]),
        "floor": floor_steps(data, clocks["floor"])}
    orders = list(itertools.permutations(VARIANTS))
    steps: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    for i in range(len(data)):
        for name in orders[i % len(orders)]:
            clocks[name].begin()
            next(running[name])
            steps[name].append(clocks[name].times)
    for loop in running.values():
        finish(loop)
    return steps


def phase_medians(steps: dict[str, list[dict[str, float]]], skip: int = 10) -> dict[str, dict[str, float]]:
    """Per variant, each phase's median seconds over the steps after the first ``skip``, and ``"step"``: the
    median of the steps' totals (not the sum of the phases' medians)."""
    medians = {}
    for name, times in steps.items():
        kept = times[skip:]
        medians[name] = {phase: statistics.median(t[phase] for t in kept) for phase in PHASES}
        medians[name]["step"] = statistics.median(sum(t.values()) for t in kept)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    parallel.warm_up()  # one-time costs per machine (cached on disk), not per-step ones
    native.warm_up()
    data = make_data(args.steps)
    rounds = []
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            rounds.append(phase_medians(phase_lockstep(data, folder, f"phases{r}")))
    rows = (*PHASES, "step")
    table = {name: {row: statistics.median(m[name][row] for m in rounds) for row in rows} for name in VARIANTS}
    bare = table["bare"]["step"]
    print(f"8-block 256-wide tanh MLP, Adam, {torch.get_num_threads()} torch thread(s), {args.steps} steps x "
          f"{args.rounds} rounds in lockstep; medians over steps, then over rounds, in microseconds")
    print(f"  {'phase':<10} {'bare':>9} {'recorded':>9} {'floor':>9} {'rec-floor':>10} {'of a bare step':>15}")
    for row in rows:
        rec, low = table["recorded"][row], table["floor"][row]
        print(f"  {row:<10} {table['bare'][row] * 1e6:9.1f} {rec * 1e6:9.1f} {low * 1e6:9.1f} "
              f"{(rec - low) * 1e6:+10.1f} {(rec - low) / bare:+14.3f}x")


if __name__ == "__main__":
    main()
