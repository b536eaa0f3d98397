"""Statistic tiers side by side in one process: ``NeuralDbg`` with ``detail="tiered"`` (its default, sentinel
steps between the measured ones), with ``Tiers(sentinels=False)`` (module outputs at every step) and with
``detail="full"``, with and without snapshots, beside a bare copy of the same model.

Every variant trains its own copy of the workload (same seed, same batches); each step runs every variant
once, the order reversed every other step, so all of them share the machine's state (load, caches, clock)
step by step — on a shared machine that is steadier than separate processes, whose step times differ by ±5 %
run to run. Reported: the median and the mean CPU time per step after the first ``--skip`` steps, as a
ratio to the bare copy's median (the median step of the default is a sentinel step; the mean counts the
measured steps, every 10th and the one after it, and the snapshots), and the mean over the bare copy's mean
(a whole run's time against a bare run's). Running several models in one process evicts each other's data
from the caches, so absolute times are longer than alone; the ratios are what is compared.

``--kinds`` splits the default's mean by what its steps recorded (read back from its recording): sentinel
steps, steps measured in full, and those of them that took snapshots, each with what it adds to the run's
mean over the bare copy's mean (a whole run's time against a bare run's).

Workloads of ``benchmarks/neuraldbg_overhead.py``: the tanh MLP (``--width`` wide, 8 blocks, batch
``--batch``) with SGD or Adam, or the small transformer with Adam.

Run: ``python -m benchmarks.tiers_side_by_side [--workload mlp-sgd] [--width 256] [--batch 64] [--steps 600]
[--kinds] [--variants NAME ...]``.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import numpy as np
import torch
from torch import nn

import benchmarks.overhead as overhead
from benchmarks.neuraldbg_overhead import OPTIMIZERS, TanhMLP, TinyTransformer, token_data
from comgra_ndbg import NeuralDbg, open_recording
from comgra_ndbg.recorder import native
from comgra_ndbg.recorder.tiers import Tiers
from comgra_ndbg.stats import kernels
from comgra_ndbg.store import schema

VARIANTS = {
    "bare": None,
    "tiered (default), no snapshots": dict(snapshots=None),
    "full, no snapshots": dict(detail="full", snapshots=None),
    "tiered (default)": {},
    "tiered, no sentinel steps": dict(detail=Tiers(sentinels=False)),
    "full": dict(detail="full"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("mlp-sgd", "mlp-adam", "transformer"), default="mlp-sgd")
    parser.add_argument("--width", type=int, default=overhead.WIDTH)
    parser.add_argument("--batch", type=int, default=overhead.BATCH)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--skip", type=int, default=30, help="steps left out of the figures (warm-up)")
    parser.add_argument("--kinds", action="store_true", help="split the default's mean by the kind of step")
    parser.add_argument("--variants", nargs="+", choices=tuple(VARIANTS)[1:], default=tuple(VARIANTS)[1:],
                        help="the variants to run beside bare (fewer evict each other's data less)")
    args = parser.parse_args()
    if args.kinds and "tiered (default)" not in args.variants:
        parser.error("--kinds splits the default's steps: keep \"tiered (default)\" among --variants")
    torch.set_num_threads(1)
    kernels.warm_up()
    native.warm_up()
    overhead.WIDTH, overhead.BATCH = args.width, args.batch
    if args.workload == "transformer":
        make, data, optimizer_name = TinyTransformer, token_data(args.steps), "adam"
    else:
        make, data, optimizer_name = TanhMLP, overhead.make_data(args.steps), args.workload.split("-")[1]
    runs, folders = [], {}
    for name, options in VARIANTS.items():
        if options is not None and name not in args.variants:
            continue
        torch.manual_seed(0)
        model, criterion = make(), nn.CrossEntropyLoss()
        optimizer = OPTIMIZERS[optimizer_name](model.parameters())
        dbg = None
        if options is not None:
            folders[name] = tempfile.mkdtemp()
            dbg = NeuralDbg(model, folders[name], trial="run", loss=criterion, optimizer=optimizer, **options)
        runs.append((name, model, criterion, optimizer, dbg, []))
    for index, (inputs, targets) in enumerate(data):
        for name, model, criterion, optimizer, dbg, times in (runs if index % 2 == 0 else runs[::-1]):
            start = time.process_time()
            optimizer.zero_grad()
            criterion(model(inputs), targets).backward()
            optimizer.step()
            times.append(time.process_time() - start)
    for run in runs:
        if run[4] is not None:
            run[4].close()
    bare = float(np.median(runs[0][5][args.skip:]))
    bare_mean = float(np.mean(runs[0][5][args.skip:]))
    print(f"{args.workload}, width {args.width}, batch {args.batch}, {args.steps} steps (first {args.skip} left out), "
          f"1 torch thread, CPU time per step, every variant in one process, steps interleaved")
    for name, *_, times in runs:
        t = np.array(times[args.skip:])
        print(f"  {name:<32} median {np.median(t) * 1e3:7.3f} ms {np.median(t) / bare:6.3f}x   "
              f"mean {t.mean() * 1e3:7.3f} ms {t.mean() / bare:6.3f}x ({t.mean() / bare_mean:6.3f}x bare's mean)")
    if args.kinds:
        default = next(r for r in runs if r[0] == "tiered (default)")
        print_kinds(folders["tiered (default)"], np.array(default[5]), args.skip, bare, bare_mean)
    for folder in folders.values():
        shutil.rmtree(folder, ignore_errors=True)


def step_kind(reason: str | None, snapshot: bool) -> str:
    """What a step of the default recorded, from the reason its recording gives (None: the step is not in
    the recording) and whether it holds snapshots."""
    if reason is None:
        return "unrecorded"
    if reason.startswith(schema.SENTINEL_REASON.split(" (")[0]):
        return "sentinel"
    return "measured, snapshots" if snapshot else "measured"


def step_kinds(folder: str, steps: int, trial: str = "run") -> np.ndarray:
    """The kind (``step_kind``) of each of steps ``0 .. steps - 1`` of the recording of ``trial`` in ``folder``."""
    with open_recording(folder, trial=trial) as recording:
        reasons = recording.step_reasons()
        snapshots = set()
        for info in recording.tensors:
            if schema.KIND_VALUE in recording.kinds(info.name):
                snapshots.update(int(s) for s in recording.snapshot_steps(info.name))
    return np.array([step_kind(reasons.get(step), step in snapshots) for step in range(steps)])


def print_kinds(folder: str, times: np.ndarray, skip: int, bare: float, bare_mean: float) -> None:
    """The default's steps after ``skip`` by kind: how many, their median and mean over the bare median, and
    what each kind adds to the run's mean over bare's mean (the kinds' shares sum to that ratio minus 1)."""
    kinds = step_kinds(folder, len(times))[skip:]
    times = times[skip:]
    print("  the default's steps by kind:")
    for kind in ("sentinel", "measured", "measured, snapshots", "unrecorded"):
        t = times[kinds == kind]
        if len(t):
            print(f"    {kind:<22} {len(t):4d} steps  median {np.median(t) / bare:6.3f}x  mean {t.mean() / bare:6.3f}x"
                  f"   adds {(t - bare_mean).sum() / len(times) / bare_mean:+6.3f}x to the run's mean")


if __name__ == "__main__":
    main()
