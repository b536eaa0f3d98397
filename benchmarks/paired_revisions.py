"""The Recorder's bookkeeping of two revisions of the package, side by side in one process.

A change to the step's bookkeeping moves it by a few hundredths of a bare step, less than this machine's
speed drifts between two runs of ``benchmarks/bookkeeping_phases.py``. Here the revision asked for and this
checkout's working tree are each copied under a package name of their own (``comgra_ndbg_earlier``,
``comgra_ndbg_this``, imports rewritten), and four loops live side by side in lockstep as in
``benchmarks/overhead.py``: bare, the revision's ``Recorder``, this checkout's ``Recorder`` (summaries every
step, no snapshots) and the floor, one step each in turn, every order of the four in rotation. Both sides are
copies, built and imported alike: the package the process imported itself ran about 0.01× of a bare step
faster than a copy of the same code (an A/A run), a bias no difference between two copies carries. Each step
of the two recorded loops meets the same load, so their per-step difference is read paired: the median over a
round's steps of (this checkout − the revision), then over rounds, next to each one's bookkeeping
(recorded − floor) / bare. With ``--neuraldbg`` the two recorded
loops are the plain loop under each revision's ``NeuralDbg`` (summaries every step, no snapshots, every
statistic every step): their global hooks see the other loops' optimizers and backward passes too, alike for
both, so the paired difference holds while the bookkeeping figures read a little high.

Run: ``python -m benchmarks.paired_revisions REVISION [--steps 300] [--rounds 4] [--neuraldbg]``
(``OMP_NUM_THREADS=1`` for the figures of ``docs/recording.md``), e.g. ``python -m benchmarks.paired_revisions
HEAD~1``.
"""
from __future__ import annotations

import argparse
import importlib
import io
import itertools
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from benchmarks.neuraldbg_overhead import TanhMLP
from benchmarks.overhead import finish, floor_steps, make_data, training_steps
from comgra_ndbg.recorder import native
from comgra_ndbg.stats import parallel

__all__ = ["export_revision", "neuraldbg_steps", "paired_round", "renamed"]

PACKAGE = "comgra_ndbg"
ROOT = Path(__file__).resolve().parent.parent


def renamed(source: str, name: str) -> str:
    """``source`` with every reference to the package as a module turned into ``name``.

    >>> renamed("from comgra_ndbg.stats import x\\nimport comgra_ndbg\\nCOMGRA_NDBG_CACHE_DIR", "comgra_ndbg_old")
    'from comgra_ndbg_old.stats import x\\nimport comgra_ndbg_old\\nCOMGRA_NDBG_CACHE_DIR'
    """
    return re.sub(rf"\b{PACKAGE}\b", name, source)


def export_revision(revision: str | None, folder: Path, name: str) -> Path:
    """The package as it is at git ``revision`` (None: this checkout's working tree, tracked files as they are
    now), written under ``folder`` as package ``name``; returns the folder to put on ``sys.path``."""
    if revision is None:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", PACKAGE], capture_output=True,
                                check=True).stdout.decode().split("\0")
        files = [(path, (ROOT / path).read_bytes()) for path in listed if path and (ROOT / path).is_file()]
    else:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", revision, PACKAGE],
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            files = [(member.name, tar.extractfile(member).read()) for member in tar.getmembers() if member.isfile()]
    for path, data in files:
        target = folder / name / Path(path).relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(renamed(data.decode(), name).encode() if target.suffix == ".py" else data)
    return folder


def neuraldbg_steps(data: list, debugger: type, folder: str, trial: str) -> Iterator[None]:
    """The plain training loop of ``benchmarks/overhead.py``'s MLP under ``debugger`` (a ``NeuralDbg`` class),
    summaries every step, no snapshots, every statistic every step; one step per ``next()``."""
    torch.manual_seed(0)
    model = TanhMLP()
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    dbg = debugger(model, folder, trial=trial, loss=criterion, optimizer=optimizer, summaries=1, snapshots=None,
                   detail="full")
    for x, y in data:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
        yield
    dbg.close()


def paired_round(data: list, folder: str, earlier: type, this: type, tag: str) -> dict[str, list[float]]:
    """One round: the four loops over ``data`` in lockstep; per loop, the seconds of each of its steps.
    ``earlier`` and ``this`` are the two sides' ``Recorder`` classes, or their ``NeuralDbg`` classes."""
    if earlier.__name__ == "NeuralDbg":
        recorded = {"earlier": neuraldbg_steps(data, earlier, folder, f"earlier{tag}"),
                    "this": neuraldbg_steps(data, this, folder, f"this{tag}")}
    else:
        recorded = {"earlier": training_steps(data, earlier(folder, f"earlier{tag}", summaries=1, snapshots=None)),
                    "this": training_steps(data, this(folder, f"this{tag}", summaries=1, snapshots=None))}
    running: dict[str, Iterator[None]] = {"bare": training_steps(data, None), **recorded, "floor": floor_steps(data)}
    orders = list(itertools.permutations(running))
    times: dict[str, list[float]] = {name: [] for name in running}
    for i in range(len(data)):
        for name in orders[i % len(orders)]:
            started = time.perf_counter()
            next(running[name])
            times[name].append(time.perf_counter() - started)
    for loop in running.values():
        finish(loop)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="the git revision to compare this checkout with (e.g. HEAD~1)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--neuraldbg", action="store_true", help="NeuralDbg's loops instead of the Recorder's")
    args = parser.parse_args()
    sides = {f"{PACKAGE}_earlier": args.revision, f"{PACKAGE}_this": None}
    kind = "NeuralDbg" if args.neuraldbg else "Recorder"
    with tempfile.TemporaryDirectory() as copy, tempfile.TemporaryDirectory() as folder:
        for name, revision in sides.items():
            export_revision(revision, Path(copy), name)
        sys.path.insert(0, copy)
        earlier, this = (getattr(importlib.import_module(name), kind) for name in sides)
        for package in sides:  # one-time costs per machine (cached on disk), not per-step ones
            importlib.import_module(f"{package}.stats.parallel").warm_up()
            importlib.import_module(f"{package}.recorder.native").warm_up()
        parallel.warm_up()
        native.warm_up()
        data = make_data(args.steps)
        print(f"8-block 256-wide tanh MLP, Adam, {torch.get_num_threads()} torch thread(s), {args.steps} steps x "
              f"{args.rounds} rounds in lockstep; {kind} of this checkout against {args.revision}")
        paired = []
        for r in range(args.rounds):
            times = paired_round(data, folder, earlier, this, str(r))
            median = {loop: statistics.median(t[10:]) for loop, t in times.items()}
            bare = median["bare"]
            difference = statistics.median(a - b for a, b in zip(times["this"][10:], times["earlier"][10:]))
            paired.append(difference / bare)
            print(f"  round {r}: bare {bare * 1e6:7.0f} us; bookkeeping {args.revision} "
                  f"{(median['earlier'] - median['floor']) / bare:+.3f}x, this checkout "
                  f"{(median['this'] - median['floor']) / bare:+.3f}x; paired this - {args.revision} "
                  f"{difference * 1e6:+7.1f} us ({difference / bare:+.4f}x)")
        print(f"paired this - {args.revision}, median over rounds: {statistics.median(paired):+.4f}x of a bare step "
              f"(rounds {min(paired):+.4f}x to {max(paired):+.4f}x)")


if __name__ == "__main__":
    main()
