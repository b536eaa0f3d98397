"""NeuralDbg overhead: an unchanged training loop, bare and instrumented, measured side by side.

Two CPU models: the 8-block 256-wide tanh MLP of ``benchmarks/overhead.py`` (batch 64, Adam; given a
``forward`` here) and a small transformer (2 pre-norm ``nn.TransformerEncoderLayer`` of width 128, 4
heads, feed-forward 256, over sequences of 32 tokens, batch 16, next-token loss). Each variant trains the
same data with ``NeuralDbg(model, loss=criterion, optimizer=...)`` around the loop: every leaf module's
output and gradient, every parameter's value, gradient and update, the input, target and loss. The
variants run interleaved in rounds, so machine noise hits all of them alike; the printed ratios are the
median step time over bare, in wall-clock time and in CPU time of this process (the second is steadier on
a machine shared with other work).

The "summaries" variants pass ``detail="full"``: every step records everything, which is what the floor
and the bookkeeping compare. "defaults" is ``NeuralDbg``'s own default (``detail="tiered"``): between the
steps it measures in full (the first 32, every 10th and the one after it, and where something moved),
sentinel steps record only the parameters' values and gradients, the input and the KPIs
(``recorder/sentinel_steps.py``), so its median step is a sentinel step.

"hooks only" is NeuralDbg with a policy that skips every step: the hooks, step detection and the loss KPI
run, no statistic is computed, so it isolates the instrumentation from the Recorder's reductions.

"invariants off" variants pass ``invariants=False`` (no loop-invariant checks, no ``lr/<group>`` KPIs): the
difference to the same variant with invariants on is their cost. It is a few microseconds per step, below
the noise of wall-clock medians on a shared machine, so ``invariant_seconds`` also times the invariant
methods themselves inside a NeuralDbg run (each wrapped with a CPU-time timer, the timers' own cost
subtracted) and the report states their CPU time per step against the bare step's
(``benchmarks/invariant_overhead.py`` measures the checks alone, on three workloads).

"statistics alone" is a floor for any instrumentation of these loops on this machine: the statistics that
NeuralDbg's summaries hold (every leaf module's output and its gradient, every parameter's value,
gradient and update, the input, target and loss) from the same compiled kernels, called directly from
bare forward hooks, and nothing else: no bookkeeping, no storage. The outputs' gradients are taken as
NeuralDbg takes them: kept by a bare gradient hook to the pass's end, then their moments per sample in one
kernel call. (Until 2026-12-02 the floor took them with ``retain_grad``, which copies every gradient, and
summarised each in full, a heavier statistic than NeuralDbg's: it read above NeuralDbg itself on the
transformer.)

"bookkeeping" is what NeuralDbg adds above that floor: the median over rounds of (summaries every step −
floor) / bare, each round's three runs side by side; "invariants" is the median over rounds of (summaries
with invariants − summaries with ``invariants=False``) / bare. ``--bookkeeping`` runs only the variants these
two figures need (bare, summaries with and without invariants, the floor), for a quicker measurement.

``--calls`` prints, instead of times, the function calls NeuralDbg's code makes per recorded step (Python
functions and builtins called from ``comgra_ndbg``, counted with ``sys.setprofile`` over 20 steps after 20
warm-up steps): a measure of the bookkeeping that does not depend on the machine's load, where timings of a
few per cent are lost in the noise of a shared machine.

Run: ``python benchmarks/neuraldbg_overhead.py [--steps 200] [--rounds 5] [--threads N] [--bookkeeping]
[--calls]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.overhead import BATCH, MLP, ParameterPasses, make_data, median_step  # noqa: E402
from comgra_ndbg import NeuralDbg  # noqa: E402
from comgra_ndbg.recorder import native  # noqa: E402
from comgra_ndbg.stats import kernels, parallel  # noqa: E402
from comgra_ndbg.store.schema import NUM_FIELDS  # noqa: E402

FLOAT32 = np.dtype(np.float32)
VOCAB, SEQUENCE, WIDTH, HEADS, FEED_FORWARD, LAYERS, TOKENS_BATCH = 256, 32, 128, 4, 256, 2, 16


class TanhMLP(MLP):
    """``benchmarks/overhead.py``'s MLP with the forward its explicit loop spells out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.randn(SEQUENCE, WIDTH) * 0.02)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(WIDTH, HEADS, FEED_FORWARD, dropout=0.0,
                                                               batch_first=True, norm_first=True)
                                    for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQUENCE), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.position
        for layer in self.layers:
            h = layer(h, src_mask=self.mask, is_causal=True)
        return self.head(self.norm(h)).flatten(0, 1)


def token_data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (TOKENS_BATCH, SEQUENCE + 1), generator=g)
        out.append((tokens[:, :-1], tokens[:, 1:].flatten()))
    return out


WORKLOADS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], list]]] = {
    "mlp": (TanhMLP, make_data), "transformer": (TinyTransformer, token_data)}
"""The two workloads by a short name: the model's constructor and the maker of its batches."""

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adam": lambda parameters: torch.optim.Adam(parameters, lr=1e-3),
    "sgd": lambda parameters: torch.optim.SGD(parameters, lr=1e-2),
}


def run(make_model: Callable[[], nn.Module], data: list, options: dict | None, folder: str,
        trial: str, optimizer_name: str = "adam", warmup: int = 10) -> tuple[float, float]:
    """Train over ``data`` with the plain training loop (``optimizer_name``: a key of ``OPTIMIZERS``); returns
    the median wall-clock and CPU seconds per step after ``warmup`` steps."""
    torch.manual_seed(0)
    model, criterion = make_model(), nn.CrossEntropyLoss()
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    dbg = None if options is None else NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer,
                                                 **options)
    times = timed_loop(model, criterion, optimizer, data, warmup)
    if dbg is not None:
        dbg.close()
    return times


def timed_loop(model: nn.Module, criterion: nn.Module, optimizer: torch.optim.Optimizer, data: list,
               warmup: int = 10) -> tuple[float, float]:
    """The plain training loop over ``data``; the median wall-clock and CPU seconds per step after ``warmup``
    steps (the loop every workload here is timed with)."""
    wall, cpu = [], []
    for inputs, targets in data:
        t0, c0 = time.perf_counter(), time.process_time()
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall[warmup:]), statistics.median(cpu[warmup:])


def run_floor(make_model: Callable[[], nn.Module], data: list, optimizer_name: str = "adam", *,
              parameters: bool = True) -> tuple[float, float]:
    """``run`` computing NeuralDbg's per-step statistics with direct kernel calls (see the module doc);
    returns the median wall-clock and CPU seconds per step after 10 warm-up steps. ``parameters=False``
    leaves out the parameters' values and updates (their start-of-step copy included): the statistics of
    activations and of every gradient alone, what a tiering that keeps those complete at every step pays."""
    return median_step(floor_loop(make_model, data, optimizer_name, parameters=parameters), len(data))


def floor_loop(make_model: Callable[[], nn.Module], data: list, optimizer_name: str = "adam", *,
               parameters: bool = True) -> Iterator[None]:
    """The floor's training loop of :func:`run_floor`, one step per ``next()``."""
    torch.manual_seed(0)
    model, criterion = make_model(), nn.CrossEntropyLoss()
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    passes = ParameterPasses(model)
    row = np.zeros(NUM_FIELDS)
    grads: list[torch.Tensor] = []  # the outputs' gradients of the step

    def summarize(t: torch.Tensor) -> None:
        host = t.detach().to(torch.float32).contiguous().numpy()
        kernels.summarize(host.reshape(host.shape[0] if host.ndim else 1, -1), row, None, host.ndim > 0)

    def gradients(taken: list[torch.Tensor]) -> None:
        """The moments of the outputs' gradients, per sample, in one kernel call, as NeuralDbg takes them."""
        host = [g.detach().to(torch.float32).contiguous() for g in taken]
        if host:
            parallel.moments_many(FLOAT32, np.array([g.data_ptr() for g in host], dtype=np.int64),
                                  np.array([g.numel() for g in host], dtype=np.int64),
                                  np.zeros((len(host), NUM_FIELDS)),
                                  batches=np.array([g.shape[0] if g.dim() else 1 for g in host], dtype=np.int64))

    def hook(module: nn.Module, args: tuple, output: object) -> None:
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(grads.append)  # the gradient itself, kept to the pass's end: no copy
            summarize(output)

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    for inputs, targets in data:
        grads.clear()
        if parameters:
            passes.values()
        summarize(inputs)
        summarize(targets)
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        summarize(loss)
        loss.backward()
        gradients(grads)
        passes.gradients()
        optimizer.step()
        if parameters:
            passes.updates()
        yield
    for handle in handles:
        handle.remove()


def lockstep_steps(workload: str, steps: int, variant: str, folder: str = "", trial: str = "") -> Iterator[None]:
    """The steps of one variant of a workload (``"mlp"`` or ``"transformer"``) for ``lockstep.run_processes``:
    ``"floor"``, or a key of ``VARIANTS`` (``"bare"``: the plain loop; the others under ``NeuralDbg``
    writing trial ``trial`` into ``folder``); Adam, the data of ``steps`` batches made here."""
    make_model, make = WORKLOADS[workload]
    data = make(steps)
    if variant == "floor":
        yield from floor_loop(make_model, data)
        return
    torch.manual_seed(0)
    model, criterion = make_model(), nn.CrossEntropyLoss()
    optimizer = OPTIMIZERS["adam"](model.parameters())
    options = VARIANTS[variant]
    dbg = None if options is None else NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer,
                                                 **options)
    for inputs, targets in data:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        yield
    if dbg is not None:
        dbg.close()


VARIANTS = {
    "bare": None,
    "disabled": dict(enabled=False),
    "hooks only": dict(summaries=None, snapshots=None),
    "hooks only, invariants off": dict(summaries=None, snapshots=None, invariants=False),
    "summaries": dict(summaries=1, snapshots=None, detail="full"),
    "summaries, invariants off": dict(summaries=1, snapshots=None, invariants=False, detail="full"),
    "summaries+snapshots": dict(summaries=1, snapshots=10, detail="full"),
    "defaults": {},
}
LABELS = {
    "bare": "bare training loop",
    "disabled": "NeuralDbg(enabled=False)",
    "hooks only": "NeuralDbg, hooks only (every step skipped)",
    "hooks only, invariants off": "NeuralDbg, hooks only, invariants=False",
    "summaries": "NeuralDbg, summaries every step",
    "summaries, invariants off": "NeuralDbg, summaries every step, invariants=False",
    "summaries+snapshots": "NeuralDbg, summaries every step, snapshots every 10th",
    "defaults": "NeuralDbg defaults (tiered: sentinel steps between)",
    "floor": "statistics alone, no bookkeeping (a floor)",
}


INVARIANT_METHODS = ("_inv_forward", "_inv_backward_call", "_inv_before_step", "_inv_end_step", "_inv_reset_step")


def invariant_seconds(make_model: Callable[[], nn.Module], data: list, folder: str, trial: str,
                      optimizer_name: str = "adam") -> tuple[float, float]:
    """CPU seconds per step spent inside the loop-invariant methods of a NeuralDbg run (hooks only), each
    method wrapped with a timer (``time.thread_time``: a shared machine's preemption is not counted), and the
    timers' own share of it (their cost per call, measured on an empty method, times the calls per step)."""
    from comgra_ndbg.instrument.invariants import LoopInvariants

    spent, calls = [0.0], [0]
    originals = {name: getattr(LoopInvariants, name) for name in INVARIANT_METHODS}

    def timed(method: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            calls[0] += 1
            t0 = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.thread_time() - t0
        return wrapper

    empty = timed(lambda: None)
    for _ in range(20000):
        empty()
    per_call = spent[0] / calls[0]
    for name, method in originals.items():
        setattr(LoopInvariants, name, timed(method))
    try:
        run(make_model, data[:20], dict(summaries=None, snapshots=None), folder, trial + "-warm", optimizer_name)
        spent[0], calls[0] = 0.0, 0
        run(make_model, data, dict(summaries=None, snapshots=None), folder, trial, optimizer_name)
    finally:
        for name, method in originals.items():
            setattr(LoopInvariants, name, method)
    return spent[0] / len(data), per_call * calls[0] / len(data)


def calls_per_step(make_model: Callable[[], nn.Module], data: list, folder: str, trial: str) -> tuple[float, float]:
    """Python functions and builtins called from ``comgra_ndbg`` per step of a NeuralDbg run with summaries
    every step (the last 20 of ``data``'s batches, after the ones before them as warm-up)."""
    torch.manual_seed(0)
    model, criterion = make_model(), nn.CrossEntropyLoss()
    optimizer = OPTIMIZERS["adam"](model.parameters())
    counts = {"call": 0, "c_call": 0}

    def count(frame: object, event: str, arg: object) -> None:
        if event in counts and "comgra_ndbg" in frame.f_code.co_filename:
            counts[event] += 1

    def steps(batches: list) -> None:
        for inputs, targets in batches:
            optimizer.zero_grad()
            criterion(model(inputs), targets).backward()
            optimizer.step()

    with NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, summaries=1, snapshots=None):
        steps(data[:-20])
        sys.setprofile(count)
        try:
            steps(data[-20:])
        finally:
            sys.setprofile(None)
    return counts["call"] / 20, counts["c_call"] / 20


BOOKKEEPING_VARIANTS = ("bare", "summaries", "summaries, invariants off")


def models_under_test(steps: int) -> dict[str, tuple[Callable[[], nn.Module], list]]:
    """The two workloads, by their printed name: the model's constructor and ``steps`` batches."""
    return {
        "8-block 256-wide tanh MLP, batch 64": (TanhMLP, make_data(steps)),
        f"transformer {LAYERS}x{WIDTH}, seq {SEQUENCE}, batch {TOKENS_BATCH}": (TinyTransformer, token_data(steps)),
    }


def bookkeeping_rounds(models: dict[str, tuple[Callable[[], nn.Module], list]], rounds: int, folder: str
                       ) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Per model and variant (``BOOKKEEPING_VARIANTS`` and the floor), the ``(wall, CPU)`` median step
    seconds of each round, the variants of a round run one after the other, so they meet the same load."""
    variants = BOOKKEEPING_VARIANTS + (("floor",) if kernels.AVAILABLE else ())
    results = {(m, v): [] for m in models for v in variants}
    for r in range(rounds):
        for i, (m, (make_model, data)) in enumerate(models.items()):
            for v in BOOKKEEPING_VARIANTS:
                results[(m, v)].append(run(make_model, data, VARIANTS[v], folder, f"book-{v}-{r}-{i}"))
            if kernels.AVAILABLE:
                results[(m, "floor")].append(run_floor(make_model, data))
    return results


def bookkeeping_lines(model: str, results: dict[tuple[str, str], list[tuple[float, float]]]) -> list[str]:
    """The bookkeeping and invariant figures of ``model``: medians over rounds of per-round ratios and
    differences to that round's bare step, wall clock and CPU time."""
    lines = []
    bare = results[(model, "bare")]

    def per_round(variant: str, minus: str | None = None) -> tuple[float, float]:
        values = results[(model, variant)]
        others = results[(model, minus)] if minus is not None else [(0.0, 0.0)] * len(values)
        return tuple(statistics.median((v[k] - o[k]) / b[k] for v, o, b in zip(values, others, bare))
                     for k in (0, 1))

    recorded = per_round("summaries")
    lines.append(f"  recorded (summaries every step) / bare        {recorded[0]:6.3f}x wall   {recorded[1]:6.3f}x CPU")
    if results.get((model, "floor")):
        floor = per_round("floor")
        book = per_round("summaries", "floor")
        lines.append(f"  floor (statistics alone) / bare               {floor[0]:6.3f}x wall   {floor[1]:6.3f}x CPU")
        lines.append(f"  bookkeeping = (recorded - floor) / bare       {book[0]:+6.3f}x wall   {book[1]:+6.3f}x CPU")
    invariants = per_round("summaries", "summaries, invariants off")
    lines.append(f"  invariants = (on - off) / bare                {invariants[0]:+6.2%} wall  {invariants[1]:+6.2%} CPU")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--bookkeeping", action="store_true",
                        help="only the variants of the bookkeeping and invariant figures")
    parser.add_argument("--calls", action="store_true", help="function calls per recorded step instead of times")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    native.warm_up()  # the C++ gradient taps: built once per machine, not in a measured run
    if args.calls:
        print("NeuralDbg, summaries every step: calls per step made from comgra_ndbg's code")
        with tempfile.TemporaryDirectory() as folder:
            for i, (m, (make_model, data)) in enumerate(models_under_test(40).items()):
                python, builtin = calls_per_step(make_model, data, folder, f"calls-{i}")
                print(f"{m}\n  {python:7.1f} Python functions + {builtin:7.1f} builtins = {python + builtin:7.1f}")
        return
    models = models_under_test(args.steps)
    if args.bookkeeping:
        with tempfile.TemporaryDirectory() as folder:
            results = bookkeeping_rounds(models, args.rounds, folder)
        print(f"NeuralDbg bookkeeping, CPU ({torch.get_num_threads()} threads), {args.steps} steps x {args.rounds} "
              f"rounds, medians over rounds")
        for m in models:
            print(m)
            print("\n".join(bookkeeping_lines(m, results)))
        return
    variants = list(VARIANTS) + (["floor"] if kernels.AVAILABLE else [])
    results = {(m, v): [] for m in models for v in variants}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            for i, (m, (make_model, data)) in enumerate(models.items()):
                for v, options in VARIANTS.items():
                    results[(m, v)].append(run(make_model, data, options, folder, f"{v}-{r}-{i}"))
                if kernels.AVAILABLE:
                    results[(m, "floor")].append(run_floor(make_model, data))
        inside = {m: statistics.median(total - timers for total, timers in (
                      invariant_seconds(make_model, data, folder, f"inv-{r}-{i}") for r in range(args.rounds)))
                  for i, (m, (make_model, data)) in enumerate(models.items())}
    print(f"NeuralDbg overhead, CPU ({torch.get_num_threads()} threads), {args.steps} steps x {args.rounds} rounds, "
          f"median step time (batch {BATCH} for the MLP)")
    for m in models:
        bare_wall, bare_cpu = (statistics.median(x) for x in zip(*results[(m, "bare")]))
        print(f"{m}")
        for v in variants:
            wall, cpu = (statistics.median(x) for x in zip(*results[(m, v)]))
            print(f"  {LABELS[v]:<55} {wall * 1e3:8.3f} ms/step  ratio {wall / bare_wall:5.3f}x   "
                  f"CPU {cpu * 1e3:8.3f} ms/step  ratio {cpu / bare_cpu:5.3f}x")
        print(f"  {'CPU time inside the loop-invariant checks (timers excluded)':<55} {inside[m] * 1e6:8.1f} us/step  "
              f"= {inside[m] / bare_cpu:.2%} of the bare step's CPU time")
        print("\n".join(bookkeeping_lines(m, results)))


if __name__ == "__main__":
    main()
