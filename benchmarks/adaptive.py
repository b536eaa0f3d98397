"""Adaptive recording costs: skipped steps, retroactive step types, and the flight recorder's steady cost.

Same model and loop as ``benchmarks/overhead.py`` (``overhead.run``: 8 blocks of Linear(256, 256) + tanh,
batch 64, Adam, CPU; 12 registered tensors, every parameter tracked, gradients and the loss KPI recorded).
The variants run interleaved in rounds, so machine noise hits them alike; each prints the median step
time and its ratio to bare training:

- ``skipped``: every step skipped by both policies (target: a skipped step costs <= 1 % of a bare step).
  Also timed apart, which resolves far less than 1 %: the recorder calls of a skipped step without
  training, and the post-accumulate-grad hooks ``track_module`` puts on every parameter (paired backward
  passes with and without them).
- ``known`` / ``late``: summaries and snapshots on every step, the step type given at ``start_step`` vs
  decided at the end with ``decide_step(type, sample_categories=labels)`` (a category-balanced snapshot);
  also the recorder calls alone, without training, for both.
- ``known, type refused`` / ``late, type refused``: the policy records only a type that never comes. A known
  type is skipped outright; an unknown one is recorded tentatively (the step *could* be recorded) and
  dropped at ``decide_step`` — the extra cost of a retroactive decision.
- ``late, step not recordable``: ``EveryK(1000)``, so no type can be recorded: the tentative step costs about
  what a skipped one does — the extra cost is paid only on steps that can still be recorded (also timed as
  recorder calls alone, against a skipped known-type step).
- ``flight recorder``: nothing recorded by policy, a ring of the last 20 steps, default triggers (no trigger
  fires on this healthy run); its peak bytes are printed.

Step times are the training thread's CPU time (``time.thread_time``, put in place of ``overhead.run``'s
clock), with one intra-op thread, so that other processes on a shared machine do not inflate them; on a
busy 2-core machine two threads made wall-clock step times jump up to 100x between rounds. ``--wall`` and
``--threads 0`` restore wall-clock time and torch's default thread count.

Run from the repository root: ``python -m benchmarks.adaptive [--steps 100] [--rounds 5]`` (about a minute).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import overhead  # noqa: E402
from benchmarks.overhead import BATCH, DEPTH, IN, MLP, make_data, run  # noqa: E402
from comgra_ndbg import Recorder, open_recording  # noqa: E402
from comgra_ndbg.recorder.flight import FlightRecorder  # noqa: E402
from comgra_ndbg.recorder.policy import Always, EveryK, Policy, Predicate  # noqa: E402

RING_STEPS = 20
SKIPPED = "every step skipped by policy"
KNOWN, LATE = "known type, recorded (summaries + snapshots)", "late type, recorded (summaries + snapshots)"
KNOWN_REFUSED, LATE_REFUSED = "known type, type refused by policy", "late type, type refused by policy"
NOT_RECORDABLE = "late type, step not recordable (EveryK(1000))"
FLIGHT = f"flight recorder, ring of {RING_STEPS} steps"


def step_type_of(step: int) -> str:
    return "long" if step % 2 else "short"


class StepTypes:
    """Drives ``overhead.run``'s loop with step types: given at ``start_step`` (``late=False``) or left open
    and decided in ``finish_step`` with the batch's class labels as sample categories (``late=True``).
    Both variants forward every other call the same way, so they pay the same wrapper cost."""

    def __init__(self, rec: Recorder, *, late: bool) -> None:
        self.rec, self.late = rec, late
        self.labels: torch.Tensor | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rec, name)

    def start_step(self, step: int) -> None:
        self.rec.start_step(step, None if self.late else step_type_of(step))

    def register_tensor(self, name: str, tensor: torch.Tensor, **options: Any) -> torch.Tensor:
        if name == "target":
            self.labels = tensor
        return self.rec.register_tensor(name, tensor, **options)

    def finish_step(self) -> None:
        if self.late:
            self.rec.decide_step(step_type_of(self.rec.current_step), sample_categories=self.labels)
        self.rec.finish_step()


def never_this_type() -> Policy:
    return Predicate(lambda step, step_type: step_type == "rare", "rare steps only")


def calls_alone(clock: Callable[[], float], steps: int, make: Callable[[str], Any]) -> float:
    """Seconds per step of the recorder calls ``overhead.run`` makes, without any training (no backward, so
    no gradient work); ``make(folder)`` builds the recorder (or a ``StepTypes`` around one)."""
    torch.manual_seed(0)
    x, y = make_data(1)[0]
    hidden = [torch.randn(BATCH, 256) for _ in range(DEPTH)]
    logits, loss = torch.randn(BATCH, 10), torch.tensor(1.0)
    with tempfile.TemporaryDirectory() as folder:
        rec = make(folder)
        rec.track_module("model", MLP())
        t0 = clock()
        for step in range(steps):
            rec.start_step(step)
            rec.register_tensor("input", x, role="input")
            rec.register_tensor("target", y, role="target")
            for i, h in enumerate(hidden):
                rec.register_tensor(f"block{i}", h)
            rec.register_tensor("logits", logits, role="output")
            rec.register_tensor("loss", loss, role="loss")
            rec.record_gradients()
            rec.record_kpi("loss", loss)
            rec.finish_step()
        elapsed = clock() - t0
        rec.close()
    return elapsed / steps


def recorded_calls(folder: str, *, late: bool) -> StepTypes:
    return StepTypes(Recorder(folder, "calls", summaries=Always(), snapshots=Always()), late=late)


def hook_cost(clock: Callable[[], float], steps: int) -> float:
    """Seconds per backward pass that the parameter hooks of ``track_module`` add (paired, median)."""
    torch.manual_seed(0)
    plain, tracked = MLP(), MLP()
    differences = []
    with tempfile.TemporaryDirectory() as folder:
        rec = Recorder(folder, "hooks", summaries=None, snapshots=None)
        rec.track_module("model", tracked)

        def backward(model: MLP, x: torch.Tensor, y: torch.Tensor) -> float:
            h = model.stem(x)
            for block in model.blocks:
                h = block(h)
            loss = torch.nn.functional.cross_entropy(model.head(h), y)
            t0 = clock()
            loss.backward()
            return clock() - t0

        for i, (x, y) in enumerate(make_data(steps)):
            if i % 2:
                without = backward(plain, x, y)
                with_hooks = backward(tracked, x, y)
            else:
                with_hooks = backward(tracked, x, y)
                without = backward(plain, x, y)
            differences.append(with_hooks - without)
        rec.close()
    return statistics.median(differences)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps per run (a third for recording variants)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads; 0 keeps the default")
    parser.add_argument("--wall", action="store_true", help="wall-clock step times instead of thread CPU time")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.wall else time.thread_time
    overhead.time = types.SimpleNamespace(perf_counter=clock)  # the clock overhead.run reads
    long_data = make_data(args.steps)
    short_data = long_data[: max(args.steps // 3, 20)]
    rings: list[FlightRecorder] = []

    def flight(folder: str, trial: str) -> Recorder:
        rings.append(FlightRecorder(steps=RING_STEPS))
        return Recorder(folder, trial, summaries=None, snapshots=None, flight_recorder=rings[-1])

    variants: dict[str, tuple[list, Callable[[str, str], Any]]] = {
        "bare training": (long_data, lambda folder, trial: None),
        SKIPPED: (long_data, lambda folder, trial: Recorder(folder, trial, summaries=None, snapshots=None)),
        KNOWN: (short_data, lambda folder, trial: StepTypes(
            Recorder(folder, trial, summaries=Always(), snapshots=Always()), late=False)),
        LATE: (short_data, lambda folder, trial: StepTypes(
            Recorder(folder, trial, summaries=Always(), snapshots=Always()), late=True)),
        KNOWN_REFUSED: (long_data, lambda folder, trial: StepTypes(
            Recorder(folder, trial, summaries=never_this_type(), snapshots=never_this_type()), late=False)),
        LATE_REFUSED: (short_data, lambda folder, trial: StepTypes(
            Recorder(folder, trial, summaries=never_this_type(), snapshots=never_this_type()), late=True)),
        NOT_RECORDABLE: (long_data, lambda folder, trial: StepTypes(
            Recorder(folder, trial, summaries=EveryK(1000), snapshots=EveryK(1000)), late=True)),
        FLIGHT: (short_data, flight),
    }
    results: dict[str, list[float]] = {name: [] for name in variants}
    triggers = 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            for i, (name, (data, make)) in enumerate(variants.items()):
                results[name].append(run(data, make(folder, f"v{i}-r{r}")))
            with open_recording(folder, f"v{len(variants) - 1}-r{r}") as recording:
                triggers += len(recording.triggers)
    calls = calls_alone(clock, 2000, lambda folder: Recorder(folder, "calls", summaries=None, snapshots=None))
    hooks = hook_cost(clock, 300)
    known_calls, late_calls, skipped_calls, unrecordable_calls = [], [], [], []
    for _ in range(5):
        known_calls.append(calls_alone(clock, 30, partial(recorded_calls, late=False)))
        late_calls.append(calls_alone(clock, 30, partial(recorded_calls, late=True)))
        skipped_calls.append(calls_alone(clock, 1000, lambda folder: StepTypes(
            Recorder(folder, "calls", summaries=None, snapshots=None), late=False)))
        unrecordable_calls.append(calls_alone(clock, 1000, lambda folder: StepTypes(
            Recorder(folder, "calls", summaries=EveryK(1000), snapshots=EveryK(1000)), late=True)))
    elapsed = time.perf_counter() - started

    median = {name: statistics.median(values) for name, values in results.items()}
    bare = median["bare training"]
    print(f"8-block 256-wide tanh MLP, batch {BATCH}, input {IN}, Adam, CPU, {torch.get_num_threads()} thread(s), "
          f"{'wall-clock' if args.wall else 'thread CPU'} time; {args.rounds} interleaved rounds of "
          f"{len(long_data)} steps ({len(short_data)} for recording variants); median step time; {elapsed:.0f} s")
    print(f"  {'variant':<48} {'ms/step':>8}   {'ratio':>7}   {'vs bare':>10}   spread of the round medians")
    for name, value in median.items():
        low, high = min(results[name]), max(results[name])
        print(f"  {name:<48} {value * 1e3:8.3f}   {value / bare:6.3f}x   {(value - bare) * 1e6:+8.0f} µs   "
              f"{(low / value - 1) * 100:+5.1f} % .. {(high / value - 1) * 100:+5.1f} %")
    skipped = median[SKIPPED]
    print(f"skipped step, side by side: {(skipped - bare) * 1e6:+.1f} µs/step = {(skipped / bare - 1) * 100:+.2f} % "
          f"of a bare step (target <= 1 %)")
    print(f"skipped step, parts: recorder calls {calls * 1e6:.1f} µs + parameter hooks in backward "
          f"{hooks * 1e6:.1f} µs = {(calls + hooks) * 1e6:.1f} µs = {(calls + hooks) / bare * 100:.2f} % of a bare "
          f"step")
    print(f"retroactive decision on a recorded step, side by side: {(median[LATE] - median[KNOWN]) * 1e6:+.1f} "
          f"µs/step over a known type ({(median[LATE] / median[KNOWN] - 1) * 100:+.1f} %)")
    known_step, late_step = statistics.median(known_calls), statistics.median(late_calls)
    print(f"retroactive decision on a recorded step, recorder calls alone (no backward): known type "
          f"{known_step * 1e3:.2f} ms, late type {late_step * 1e3:.2f} ms: {(late_step - known_step) * 1e6:+.1f} "
          f"µs/step ({(late_step / known_step - 1) * 100:+.1f} %)")
    print(f"tentative step dropped at decide_step: {(median[LATE_REFUSED] - median[KNOWN_REFUSED]) * 1e6:+.1f} "
          f"µs/step over a known type the policy skips")
    skipped_step, unrecordable_step = statistics.median(skipped_calls), statistics.median(unrecordable_calls)
    print(f"late type at a step no type can be recorded at, recorder calls alone: {unrecordable_step * 1e6:.1f} µs vs "
          f"{skipped_step * 1e6:.1f} µs for a skipped known type ({(unrecordable_step - skipped_step) * 1e6:+.1f} µs = "
          f"{(unrecordable_step - skipped_step) / bare * 100:+.2f} % of a bare step)")
    peak = max(ring.peak_bytes for ring in rings)
    print(f"flight recorder steady cost: ratio {median[FLIGHT] / bare:.3f}x to bare; peak ring {peak / 2**20:.1f} MiB "
          f"({peak / RING_STEPS / 2**10:.0f} KiB/step); triggers fired: {triggers}")


if __name__ == "__main__":
    main()
