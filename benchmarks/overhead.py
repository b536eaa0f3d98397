"""Recording overhead: bare training vs the same loop with the Recorder, measured side by side.

Model: 8 blocks of Linear(256, 256) + tanh, batch 64, Adam, CPU. The recorded loop registers the input,
the target, every block's output, the logits and the loss, tracks every parameter (value, gradient and
update), takes summaries every step and snapshots every 10th step. The variants run interleaved in rounds
so that machine noise hits all of them alike; the printed ratio is the median step time over bare. The
last line is the mean over the same steps of everything, the periodic flushes to HDF5 and the final
``close()`` included, against the bare mean.

The "statistics alone" line is a floor for any recorder on this machine: the same statistics from the same
compiled kernels, called directly with no bookkeeping, no storage and no guard against tensors changed
after their registration, in five kernel calls and twelve activation summaries per step; the activations'
gradients are kept by bare gradient hooks to the pass's end (until 2026-12-02 by ``retain_grad``, which
copies each).

"bookkeeping" is the Recorder's time above that floor, (recorded − floor) / bare, measured two ways. First,
per round of whole runs, the median over rounds, in wall-clock time and in this process's CPU time, with the
quartiles of the rounds' figures. On a shared machine that reading swings by ±0.1× between rounds: the
machine's speed drifts by tens of per cent over fractions of a second, within one run as between runs. So,
second, in *lockstep*: bare, recorded and floor loops live side by side and run one step each in turn, every
order of the three in rotation, so the steps of a turn meet the same load and each follows each other as
often; the figure is the median over a round's steps of the per-step ratio, then over rounds.
Snapshot steps (every 10th) do work the floor does not: the lockstep figure counts summary steps and prints
a snapshot step's cost apart. The second table gives the same whole-run figures for ``NeuralDbg`` (summaries
every step) on this MLP and on the small transformer of ``benchmarks/neuraldbg_overhead.py``, and the cost
of the loop-invariant checks (invariants on − off) as a share of a bare step, then the same in lockstep with
each variant in a process of its own (``benchmarks/lockstep.py``); ``--no-neuraldbg`` leaves it out.

Run: ``python benchmarks/overhead.py [--steps 300] [--rounds 5] [--lockstep-rounds 3] [--no-neuraldbg]``.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from comgra_ndbg import Recorder
from comgra_ndbg.recorder import native
from comgra_ndbg.stats import kernels, parallel
from comgra_ndbg.store.schema import NUM_FIELDS

WIDTH, DEPTH, BATCH, IN, OUT = 256, 8, 64, 32, 10
SNAPSHOTS = 10  # the recorded loop's snapshot steps: every 10th


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(IN, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = torch.nn.Linear(WIDTH, OUT)


def make_data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(BATCH, IN, generator=g), torch.randint(0, OUT, (BATCH,), generator=g)) for _ in range(steps)]


PHASES = ("start", "forward", "backward", "gradients", "optimizer", "end")
"""The parts of a step that ``mark`` separates: the step's start (the recorder's ``start_step`` and the
input's and target's summaries), the forward pass with its outputs' summaries, the backward pass (with what
runs at its end), the gradients' summaries, the optimizer's step, and the step's end (the updates)."""


def training_steps(data: list, rec: Recorder | None, mark: Callable[[str], None] | None = None
                   ) -> Iterator[None]:
    """The training loop over ``data``, recorded by ``rec`` (None: bare), one step per ``next()``; the
    recorder is closed once the steps are exhausted. ``mark`` is called with each of ``PHASES`` as it ends."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if rec is not None:
        rec.track_module("model", model)
    for step, (x, y) in enumerate(data):
        if rec is not None:
            rec.start_step(step)
            rec.register_tensor("input", x, role="input")
            rec.register_tensor("target", y, role="target")
        if mark is not None:
            mark("start")
        h = model.stem(x)
        for i, block in enumerate(model.blocks):
            h = block(h)
            if rec is not None:
                rec.register_tensor(f"block{i}", h)
        out = model.head(h)
        loss = torch.nn.functional.cross_entropy(out, y)
        if rec is not None:
            rec.register_tensor("logits", out, role="output")
            rec.register_tensor("loss", loss, role="loss")
        if mark is not None:
            mark("forward")
        opt.zero_grad()
        loss.backward()
        if mark is not None:
            mark("backward")
        if rec is not None:
            rec.record_gradients()
        if mark is not None:
            mark("gradients")
        opt.step()
        if mark is not None:
            mark("optimizer")
        if rec is not None:
            rec.record_kpi("loss", loss)
            rec.finish_step()
        if mark is not None:
            mark("end")
        yield
    if rec is not None:
        rec.close()


def run(data: list, rec: Recorder | None, *, with_close: bool = False, cpu: bool = False
        ) -> float | tuple[float, float]:
    """Train over ``data``; returns the median seconds per step (after 10 warm-up steps), or with
    ``with_close`` the mean over those steps of everything, periodic flushes and the final ``close()``
    (which writes the consolidated file) included. With ``cpu``, the median wall-clock and process CPU
    seconds per step (CPU time does not count the time a shared machine gives to others)."""
    steps = training_steps(data, rec)
    times, cpu_times = [], []
    started = c0 = 0.0
    for step in range(len(data)):
        if step == 10:
            started = time.perf_counter()
        t0 = time.perf_counter()
        if cpu:
            c0 = time.process_time()
        next(steps)
        times.append(time.perf_counter() - t0)
        if cpu:
            cpu_times.append(time.process_time() - c0)
    finish(steps)
    if with_close:
        return (time.perf_counter() - started) / (len(data) - 10)
    if cpu:
        return statistics.median(times[10:]), statistics.median(cpu_times[10:])
    return statistics.median(times[10:])


def lockstep(data: list, variants: dict[str, Callable[[], Iterator[None]]]) -> dict[str, list[tuple[float, float]]]:
    """Wall-clock and process CPU seconds of every step of each variant (a maker of its steps), the variants
    run one step each in turn: the load of a shared machine swings over fractions of a second, far slower
    than one step, so each step of a variant meets the load its partners' steps met. A step starts with the
    caches the step before it left, and that shows: two identical variants read 0.015× apart when each
    always followed the same partner. So the turns take every order of the variants in rotation, and each
    variant follows each other as often."""
    running = {name: make() for name, make in variants.items()}
    names = list(running)
    orders = list(itertools.permutations(names))
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for i in range(len(data)):
        for name in orders[i % len(orders)]:
            t0, c0 = time.perf_counter(), time.process_time()
            next(running[name])
            times[name].append((time.perf_counter() - t0, time.process_time() - c0))
    for steps in running.values():
        finish(steps)
    return times


def finish(steps: Iterator[None]) -> None:
    """Run a step iterator past its last step, where it cleans up (a recorder's ``close()``, hooks removed)."""
    collections.deque(steps, maxlen=0)


def median_step(steps: Iterator[None], count: int) -> tuple[float, float]:
    """Run ``count`` steps of ``steps``, then :func:`finish` it; the median wall-clock and process CPU seconds
    per step after 10 warm-up steps."""
    times = []
    for _ in range(count):
        t0, c0 = time.perf_counter(), time.process_time()
        next(steps)
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    finish(steps)
    return statistics.median(t[0] for t in times[10:]), statistics.median(t[1] for t in times[10:])


class ParameterPasses:
    """The floor's three kernel passes over a float32 model's parameters, each one call for all of them:
    values with the start-of-step copy, gradients, and updates against that copy."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = list(model.parameters())
        self.dtype = np.dtype(np.float32)
        self._copies = [torch.empty_like(p) for p in self.params]
        self._addresses = np.array([p.data_ptr() for p in self.params], dtype=np.int64)
        self._sizes = np.array([p.numel() for p in self.params], dtype=np.int64)
        self._copy_addresses = np.array([c.data_ptr() for c in self._copies], dtype=np.int64)
        self._rows = np.zeros((len(self.params), NUM_FIELDS))

    def values(self) -> None:
        parallel.moments_many(self.dtype, self._addresses, self._sizes, self._rows, copies=self._copy_addresses)

    def gradients(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        parallel.moments_many(self.dtype, np.array([g.data_ptr() for g in grads], dtype=np.int64),
                              np.array([g.numel() for g in grads], dtype=np.int64), self._rows[:len(grads)])

    def updates(self) -> None:
        parallel.moments_many(self.dtype, self._addresses, self._sizes, self._rows, starts=self._copy_addresses)


def floor_steps(data: list, mark: Callable[[str], None] | None = None) -> Iterator[None]:
    """Train over ``data`` computing what the recorder summarizes every step (parameter values with the
    start-of-step copy, their gradients and updates; every registered tensor's value and gradient, dead
    units and tanh saturation) by calling the kernels directly, one step per ``next()``; ``mark`` as in
    :func:`training_steps`."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    passes = ParameterPasses(model)
    dtype = np.dtype(np.float32)
    thresholds = np.array([-0.99, 0.99], dtype=dtype)
    row = np.zeros(NUM_FIELDS)
    for x, y in data:
        passes.values()
        kernels.summarize(x.numpy(), row, None, True)
        kernels.summarize(y.numpy().astype(np.float64)[None], row, None, False)
        if mark is not None:
            mark("start")
        grads: list[torch.Tensor] = []  # kept by a bare gradient hook to the pass's end, as the recorder's taps do
        h = model.stem(x)
        for block in model.blocks:
            h = block(h)
            h.register_hook(grads.append)
            kernels.summarize(h.detach().numpy(), row, thresholds, True)
        out = model.head(h)
        loss = torch.nn.functional.cross_entropy(out, y)
        out.register_hook(grads.append)
        kernels.summarize(out.detach().numpy(), row, None, True)
        kernels.summarize(loss.detach().numpy().reshape(1, 1), row, None, False)
        if mark is not None:
            mark("forward")
        opt.zero_grad()
        loss.backward()
        if mark is not None:
            mark("backward")
        parallel.moments_many(dtype, np.array([g.data_ptr() for g in grads], dtype=np.int64),
                              np.array([g.numel() for g in grads], dtype=np.int64), np.zeros((len(grads), NUM_FIELDS)),
                              batches=np.full(len(grads), BATCH, dtype=np.int64))
        passes.gradients()
        if mark is not None:
            mark("gradients")
        opt.step()
        if mark is not None:
            mark("optimizer")
        passes.updates()
        if mark is not None:
            mark("end")
        yield


def run_floor(data: list) -> tuple[float, float]:
    """:func:`floor_steps` over ``data``; returns the median wall-clock and process CPU seconds per step."""
    return median_step(floor_steps(data), len(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-neuraldbg", action="store_true", help="only the Recorder on the MLP")
    parser.add_argument("--lockstep-rounds", type=int, default=3,
                        help="rounds of the bookkeeping measured in lockstep, Recorder and NeuralDbg (0: none)")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    data = make_data(args.steps)
    parallel.warm_up()  # a one-time cost per machine (cached on disk), not a per-step one
    native.warm_up()  # the C++ gradient taps, likewise
    results: dict[str, list] = {"bare": [], "disabled": [], "recorded": [], "skipped": [], "floor": [],
                                "bare_total": [], "recorded_total": []}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            results["bare"].append(run(data, None, cpu=True))
            results["disabled"].append(run(data, Recorder(folder, f"off{r}", enabled=False), cpu=True))
            recorder = Recorder(folder, f"on{r}", summaries=1, snapshots=SNAPSHOTS)
            results["recorded"].append(run(data, recorder, cpu=True))
            results["skipped"].append(run(data, Recorder(folder, f"skip{r}", summaries=None, snapshots=None),
                                          cpu=True))
            if kernels.AVAILABLE:
                results["floor"].append(run_floor(data))
            results["bare_total"].append(run(data, None, with_close=True))
            results["recorded_total"].append(run(data, Recorder(folder, f"all{r}", summaries=1, snapshots=SNAPSHOTS),
                                                 with_close=True))
    bare = statistics.median(wall for wall, _ in results["bare"])
    print(f"8-block 256-wide tanh MLP, batch {BATCH}, CPU ({torch.get_num_threads()} threads), "
          f"{args.steps} steps x {args.rounds} rounds, median step time")
    labels = {"bare": "bare training", "disabled": "Recorder(enabled=False)",
              "recorded": "summaries every step, snapshots every 10th", "skipped": "every step skipped by policy",
              "floor": "statistics alone, no bookkeeping (a floor)"}
    for key, label in labels.items():
        if not results[key]:
            continue
        value = statistics.median(wall for wall, _ in results[key])
        print(f"  {label:<45} {value * 1e3:8.3f} ms/step   ratio {value / bare:5.3f}x")
    total_bare, total = statistics.median(results["bare_total"]), statistics.median(results["recorded_total"])
    print(f"  {'recorded, mean incl. flushes and close()':<45} {total * 1e3:8.3f} ms/step   ratio "
          f"{total / total_bare:5.3f}x  (bare mean {total_bare * 1e3:.3f} ms/step)")
    if results["floor"]:
        for k, clock in enumerate(("wall", "CPU")):
            rounds = [(rec[k], low[k], bare[k]) for rec, low, bare in
                      zip(results["recorded"], results["floor"], results["bare"])]
            recorded = statistics.median(rec / bare for rec, _, bare in rounds)
            floor = statistics.median(low / bare for _, low, bare in rounds)
            book = sorted((rec - low) / bare for rec, low, bare in rounds)
            quartiles = statistics.quantiles(book, n=4) if len(book) > 1 else book * 3
            print(f"  medians over rounds ({clock:>4}): recorded {recorded:5.3f}x, floor {floor:5.3f}x, bookkeeping "
                  f"(recorded - floor) {statistics.median(book):+6.3f}x of a bare step "
                  f"(rounds' quartiles {quartiles[0]:+.3f}x to {quartiles[2]:+.3f}x)")
    if results["floor"] and args.lockstep_rounds:
        lockstep_bookkeeping(data, args.lockstep_rounds)
    if not args.no_neuraldbg:
        neuraldbg_bookkeeping(args.steps, args.rounds, args.lockstep_rounds)


def lockstep_bookkeeping(data: list, rounds: int) -> None:
    """The Recorder's bookkeeping with bare training, the recorded loop and the floor in :func:`lockstep`:
    per step, (recorded − floor) / bare from the three steps run side by side; the median over a round's
    summary steps, then over rounds. Snapshot steps (every ``SNAPSHOTS``-th) do work the floor does not and
    are left out of it (a tenth of the steps at several times the cost would shift a median of all steps by
    a fraction of the steps' spread, not by their cost); their own figure is printed apart."""
    figures: dict[str, list[list[float]]] = {"recorded": [], "floor": [], "bookkeeping": [], "snapshot steps": []}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(rounds):
            times = lockstep(data, {
                "bare": lambda: training_steps(data, None),
                "recorded": lambda: training_steps(data, Recorder(folder, f"lock{r}", summaries=1,
                                                                  snapshots=SNAPSHOTS)),
                "floor": lambda: floor_steps(data)})
            steps = list(zip(range(len(data)), times["bare"], times["recorded"], times["floor"]))[10:]
            summary = [step for step in steps if step[0] % SNAPSHOTS]
            snapshot = [step for step in steps if not step[0] % SNAPSHOTS]
            figures["recorded"].append([[rec[k] / bare[k] for _, bare, rec, _ in summary] for k in (0, 1)])
            figures["floor"].append([[low[k] / bare[k] for _, bare, _, low in summary] for k in (0, 1)])
            for key, chosen in (("bookkeeping", summary), ("snapshot steps", snapshot)):
                figures[key].append([[(rec[k] - low[k]) / bare[k] for _, bare, rec, low in chosen] for k in (0, 1)])
    print(f"Recorder in lockstep (bare, recorded and floor one step each in turn, every order in rotation), "
          f"{len(data)} steps x {rounds} "
          f"rounds; summary steps (snapshot steps apart): medians over steps of per-step ratios, then over rounds")
    for k, clock in enumerate(("wall", "CPU")):
        medians = {key: [statistics.median(r[k]) for r in values] for key, values in figures.items()}
        book, snap = medians["bookkeeping"], medians["snapshot steps"]
        print(f"  {clock:>4}: recorded {statistics.median(medians['recorded']):5.3f}x, floor "
              f"{statistics.median(medians['floor']):5.3f}x, bookkeeping {statistics.median(book):+6.3f}x of a bare "
              f"step (rounds {min(book):+.3f}x to {max(book):+.3f}x); a snapshot step {statistics.median(snap):+.3f}x "
              f"above the floor")


def neuraldbg_bookkeeping(steps: int, rounds: int, lockstep_rounds: int) -> None:
    """NeuralDbg's recorded step, its floor, their difference and the invariants' cost on both models."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.neuraldbg_overhead import bookkeeping_lines, bookkeeping_rounds, models_under_test

    models = models_under_test(steps)
    with tempfile.TemporaryDirectory() as folder:
        results = bookkeeping_rounds(models, rounds, folder)
    print(f"NeuralDbg, summaries every step, {steps} steps x {rounds} rounds, medians over rounds of ratios to bare")
    for m in models:
        print(m)
        print("\n".join(bookkeeping_lines(m, results)))
    neuraldbg_lockstep(steps, lockstep_rounds)


def neuraldbg_lockstep(steps: int, rounds: int) -> None:
    """NeuralDbg's bookkeeping and invariants' cost in lockstep: bare, summaries every step, the same with
    ``invariants=False``, and the floor, each in a process of its own (NeuralDbg's process-wide hooks stay in
    its own), one step each in turn (``benchmarks/lockstep.py``); medians over steps, then over rounds."""
    from benchmarks.lockstep import per_step, run_processes

    if not rounds:
        return
    print(f"NeuralDbg in lockstep (bare, summaries every step, invariants off, floor: a process each, one step "
          f"each in turn, every order in rotation), {steps} steps x {rounds} rounds, medians over steps of per-step "
          f"ratios, then over rounds")
    source = "benchmarks.neuraldbg_overhead"
    for workload, label in (("mlp", "8-block 256-wide tanh MLP"), ("transformer", "small transformer")):
        figures: dict[str, list[list[float]]] = {"recorded": [], "floor": [], "bookkeeping": [], "invariants": []}
        with tempfile.TemporaryDirectory() as folder:
            for r in range(rounds):
                off = "summaries, invariants off"
                times = run_processes({
                    "bare": (source, "lockstep_steps", (workload, steps, "bare")),
                    "on": (source, "lockstep_steps", (workload, steps, "summaries", folder, f"on{r}")),
                    "off": (source, "lockstep_steps", (workload, steps, off, folder, f"off{r}")),
                    "floor": (source, "lockstep_steps", (workload, steps, "floor"))}, steps, torch.get_num_threads())
                rows = per_step(times)
                for key, of in (("recorded", lambda t, k: t["on"][k]), ("floor", lambda t, k: t["floor"][k]),
                                ("bookkeeping", lambda t, k: t["on"][k] - t["floor"][k]),
                                ("invariants", lambda t, k: t["on"][k] - t["off"][k])):
                    figures[key].append([statistics.median(of(t, k) / t["bare"][k] for t in rows) for k in (0, 1)])
        print(label)
        for k, clock in enumerate(("wall", "CPU")):
            book = [f[k] for f in figures["bookkeeping"]]
            recorded, floor = (statistics.median(f[k] for f in figures[key]) for key in ("recorded", "floor"))
            print(f"  {clock:>4}: recorded {recorded:5.3f}x, floor {floor:5.3f}x, bookkeeping "
                  f"{statistics.median(book):+6.3f}x (rounds {min(book):+.3f}x to {max(book):+.3f}x), invariants "
                  f"{statistics.median(f[k] for f in figures['invariants']):+6.2%} of a bare step")


if __name__ == "__main__":
    main()
