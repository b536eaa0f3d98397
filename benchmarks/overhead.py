"""Recording overhead: bare training vs the same loop with the Recorder, measured side by side.

Model: 8 blocks of Linear(256, 256) + tanh, batch 64, Adam, CPU. The recorded loop registers the input,
the target, every block's output, the logits and the loss, tracks every parameter (value, gradient and
update), takes summaries every step and snapshots every 10th step. The variants run interleaved in rounds
so that machine noise hits all of them alike; the printed ratio is the median step time over bare. The
last line is the mean over the same steps of everything, the periodic flushes to HDF5 and the final
``close()`` included, against the bare mean.

The "statistics alone" line is a floor for any recorder on this machine: the same statistics from the same
compiled kernels, called directly with no bookkeeping, no hooks (``retain_grad``), no storage and no
guard against tensors changed after their registration, in five kernel calls and twelve activation
summaries per step.

"bookkeeping" is the Recorder's time above that floor, the median over rounds of (recorded − floor) / bare,
each round's runs side by side. The second table gives the same figures for ``NeuralDbg`` (summaries every
step) on this MLP and on the small transformer of ``benchmarks/neuraldbg_overhead.py``, and the cost of the
loop-invariant checks (invariants on − off) as a share of a bare step; ``--no-neuraldbg`` leaves it out.

Run: ``python benchmarks/overhead.py [--steps 300] [--rounds 5] [--no-neuraldbg]``.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch

from comgra_ndbg import Recorder
from comgra_ndbg.recorder import native
from comgra_ndbg.stats import kernels, parallel
from comgra_ndbg.store.schema import NUM_FIELDS

WIDTH, DEPTH, BATCH, IN, OUT = 256, 8, 64, 32, 10


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


def run(data: list, rec: Recorder | None, *, with_close: bool = False) -> float:
    """Train over ``data``; returns the median seconds per step (after 10 warm-up steps), or with
    ``with_close`` the mean over those steps of everything, periodic flushes and the final ``close()``
    (which writes the consolidated file) included."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if rec is not None:
        rec.track_module("model", model)
    times = []
    started = 0.0
    for step, (x, y) in enumerate(data):
        if step == 10:
            started = time.perf_counter()
        t0 = time.perf_counter()
        if rec is not None:
            rec.start_step(step)
            rec.register_tensor("input", x, role="input")
            rec.register_tensor("target", y, role="target")
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
        opt.zero_grad()
        loss.backward()
        if rec is not None:
            rec.record_gradients()
        opt.step()
        if rec is not None:
            rec.record_kpi("loss", loss)
            rec.finish_step()
        times.append(time.perf_counter() - t0)
    if rec is not None:
        rec.close()
    if with_close:
        return (time.perf_counter() - started) / (len(data) - 10)
    return statistics.median(times[10:])


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


def run_floor(data: list) -> float:
    """Train over ``data`` computing what the recorder summarizes every step (parameter values with the
    start-of-step copy, their gradients and updates; every registered tensor's value and gradient, dead
    units and tanh saturation) by calling the kernels directly; returns the median seconds per step."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    passes = ParameterPasses(model)
    dtype = np.dtype(np.float32)
    thresholds = np.array([-0.99, 0.99], dtype=dtype)
    row = np.zeros(NUM_FIELDS)
    times = []
    for x, y in data:
        t0 = time.perf_counter()
        passes.values()
        kernels.summarize(x.numpy(), row, None, True)
        kernels.summarize(y.numpy().astype(np.float64)[None], row, None, False)
        hidden = []
        h = model.stem(x)
        for block in model.blocks:
            h = block(h)
            h.retain_grad()
            hidden.append(h)
            kernels.summarize(h.detach().numpy(), row, thresholds, True)
        out = model.head(h)
        loss = torch.nn.functional.cross_entropy(out, y)
        out.retain_grad()
        hidden.append(out)
        kernels.summarize(out.detach().numpy(), row, None, True)
        kernels.summarize(loss.detach().numpy().reshape(1, 1), row, None, False)
        opt.zero_grad()
        loss.backward()
        grads = [t.grad for t in hidden]
        parallel.moments_many(dtype, np.array([g.data_ptr() for g in grads], dtype=np.int64),
                              np.array([g.numel() for g in grads], dtype=np.int64), np.zeros((len(grads), NUM_FIELDS)),
                              batches=np.full(len(grads), BATCH, dtype=np.int64))
        passes.gradients()
        opt.step()
        passes.updates()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[10:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-neuraldbg", action="store_true", help="only the Recorder on the MLP")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    data = make_data(args.steps)
    parallel.warm_up()  # a one-time cost per machine (cached on disk), not a per-step one
    native.warm_up()  # the C++ gradient taps, likewise
    results: dict[str, list[float]] = {"bare": [], "disabled": [], "recorded": [], "skipped": [], "floor": [],
                                       "bare_total": [], "recorded_total": []}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            results["bare"].append(run(data, None))
            results["disabled"].append(run(data, Recorder(folder, f"off{r}", enabled=False)))
            results["recorded"].append(run(data, Recorder(folder, f"on{r}", summaries=1, snapshots=10)))
            results["skipped"].append(run(data, Recorder(folder, f"skip{r}", summaries=None, snapshots=None)))
            if kernels.AVAILABLE:
                results["floor"].append(run_floor(data))
            results["bare_total"].append(run(data, None, with_close=True))
            results["recorded_total"].append(run(data, Recorder(folder, f"all{r}", summaries=1, snapshots=10),
                                                 with_close=True))
    bare = statistics.median(results["bare"])
    print(f"8-block 256-wide tanh MLP, batch {BATCH}, CPU ({torch.get_num_threads()} threads), "
          f"{args.steps} steps x {args.rounds} rounds, median step time")
    labels = {"bare": "bare training", "disabled": "Recorder(enabled=False)",
              "recorded": "summaries every step, snapshots every 10th", "skipped": "every step skipped by policy",
              "floor": "statistics alone, no bookkeeping (a floor)"}
    for key, label in labels.items():
        if not results[key]:
            continue
        value = statistics.median(results[key])
        print(f"  {label:<45} {value * 1e3:8.3f} ms/step   ratio {value / bare:5.3f}x")
    total_bare, total = statistics.median(results["bare_total"]), statistics.median(results["recorded_total"])
    print(f"  {'recorded, mean incl. flushes and close()':<45} {total * 1e3:8.3f} ms/step   ratio "
          f"{total / total_bare:5.3f}x  (bare mean {total_bare * 1e3:.3f} ms/step)")
    if results["floor"]:
        rounds = list(zip(results["recorded"], results["floor"], results["bare"]))
        recorded = statistics.median(rec / bare for rec, _, bare in rounds)
        floor = statistics.median(low / bare for _, low, bare in rounds)
        book = statistics.median((rec - low) / bare for rec, low, bare in rounds)
        print(f"  medians over rounds: recorded {recorded:5.3f}x, floor {floor:5.3f}x, "
              f"bookkeeping (recorded - floor) {book:+6.3f}x of a bare step")
    if not args.no_neuraldbg:
        neuraldbg_bookkeeping(args.steps, args.rounds)


def neuraldbg_bookkeeping(steps: int, rounds: int) -> None:
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


if __name__ == "__main__":
    main()
