"""What ``NeuralDbg``'s defaults cost over a whole run: snapshot steps and ``close()`` included.

Medians of per-step times (``benchmarks/tiers_overhead.py``, ``benchmarks/neuraldbg_overhead.py``) leave
out the snapshot steps (one in ten) and the write at ``close()``; what a user pays is the mean. Each run
here is a fresh process that trains 300 steps of a workload of ``benchmarks/neuraldbg_overhead.py`` (the
8×256 tanh MLP with SGD and with Adam, the small transformer with Adam) bare or under
``NeuralDbg(model, folder, loss=..., optimizer=...)`` and reports the CPU time per step from step 10 to
the end of ``close()``, 1 torch thread. ``--against DIR`` adds the same recorder from another checkout
(e.g. ``git worktree add /tmp/before <commit>``), its order against this one reversed every other round;
ratios are taken to the bare run of the same round (median and range over the rounds).

Run: ``python -m benchmarks.whole_run [--rounds 5] [--steps 300] [--against DIR]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("mlp-sgd", "mlp-adam", "transformer")


def child(tree: str, workload: str, recorded: bool, steps: int) -> None:
    """Train ``workload`` with the package of ``tree`` (bare unless ``recorded``); print ms per step."""
    sys.path.insert(0, tree)
    import comgra_ndbg  # the package of ``tree``; the workloads below come from this checkout's benchmarks

    if not Path(comgra_ndbg.__file__).resolve().is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"comgra_ndbg came from {comgra_ndbg.__file__}, not from {tree}")
    sys.path.insert(0, str(ROOT))
    import torch
    from torch import nn

    from benchmarks.neuraldbg_overhead import OPTIMIZERS, TanhMLP, TinyTransformer, token_data
    from benchmarks.overhead import make_data

    torch.set_num_threads(1)
    if workload == "transformer":
        make, data, optimizer_name = TinyTransformer, token_data(steps), "adam"
    else:
        make, data, optimizer_name = TanhMLP, make_data(steps), workload.split("-")[1]
    torch.manual_seed(0)
    model, criterion = make(), nn.CrossEntropyLoss()
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    dbg = None
    if recorded:
        dbg = comgra_ndbg.NeuralDbg(model, tempfile.mkdtemp(), trial="run", loss=criterion, optimizer=optimizer)
    start = None
    for index, (inputs, targets) in enumerate(data):
        if index == 10:
            start = time.process_time()
        optimizer.zero_grad()
        criterion(model(inputs), targets).backward()
        optimizer.step()
    if dbg is not None:
        dbg.close()
    print(json.dumps({"ms": (time.process_time() - start) / (steps - 10) * 1e3}))


def one_run(tree: str, workload: str, recorded: bool, steps: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", tree, workload, str(int(recorded)), str(steps)],
                         check=True, capture_output=True, text=True, cwd=tree).stdout
    return float(json.loads(out.strip().splitlines()[-1])["ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--against", type=Path, help="another checkout whose NeuralDbg runs beside this one's")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        tree, workload, recorded, steps = args.child
        child(tree, workload, recorded == "1", int(steps))
        return
    codes = {"this checkout": str(ROOT)}
    if args.against is not None:
        codes[f"{args.against}"] = str(args.against.resolve())
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for workload in WORKLOADS:
            order = list(codes.items())[::(-1 if r % 2 else 1)]
            times.setdefault((workload, "bare"), []).append(one_run(str(ROOT), workload, False, args.steps))
            for name, tree in order:
                times.setdefault((workload, name), []).append(one_run(tree, workload, True, args.steps))
            print(f"round {r}, {workload}: " + ", ".join(f"{name} {values[-1]:.2f} ms" for (w, name), values
                                                         in times.items() if w == workload)
                  + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"\nNeuralDbg defaults, {args.steps} steps, CPU time per step from step 10 to the end of close(), "
          f"1 torch thread, {args.rounds} rounds")
    for workload in WORKLOADS:
        bare = times[(workload, "bare")]
        parts = [f"bare {statistics.median(bare):.2f} ms"]
        for name in codes:
            ratios = [t / b for t, b in zip(times[(workload, name)], bare)]
            parts.append(f"{name} {statistics.median(times[(workload, name)]):.2f} ms, "
                         f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})")
        print(f"  {workload:<12} " + "; ".join(parts))


if __name__ == "__main__":
    main()
