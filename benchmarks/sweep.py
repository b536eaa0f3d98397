"""Throughput of ``comgra_ndbg.sweep.analyze_many`` over many small recordings, with 1 and 2 local workers.

A learning-rate sweep is recorded first: ``--runs`` tiny regressions (4 → 16 → 1, ReLU, SGD, 32 samples a
step, ``--steps`` steps), learning rates spread log-uniformly over 0.003–3, so that the larger ones diverge
(about a fifth of the runs) and the table has failures to show. Each run stores its learning rate and seed
as hyperparameters. Then the same sweep is analysed (``store=False``: every trial analysed afresh, nothing
cached between the measurements) in this process without Dask, then on a ``LocalCluster`` of 1 and of 2
single-threaded worker processes, started before the clock runs; the throughputs (trials per second,
cluster start-up excluded) and the ratio 2-worker / 1-worker are printed side by side, with the start-up
times. The three variants run in ``--rounds`` interleaved rounds (alternating their order), each line with the
load average, then the medians.

Run: ``python -m benchmarks.sweep [--runs 200] [--steps 40] [--rounds 3] [--folder DIR]`` (a given folder is
reused when it already holds the runs).
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from comgra_ndbg import Recorder
from comgra_ndbg.store.reader import list_trials

__all__ = ["record_tiny_run", "record_sweep", "main"]


def record_tiny_run(folder: str | Path, trial: str, *, lr: float, steps: int = 40, seed: int = 0) -> float:
    """Train and record one tiny regression into ``folder/trial``; returns the last loss (NaN once diverged)."""
    torch.manual_seed(seed)
    teacher = torch.randn(4, 1)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    loss = torch.zeros(())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a diverging run's overflow warnings are the point, not news
        with Recorder(folder, trial, hyperparameters={"lr": lr, "seed": seed}, snapshots=False) as rec:
            for step in range(steps):
                x = torch.randn(32, 4)
                with rec.step(step):
                    x = rec.register_tensor("input", x, role="input")
                    hidden = rec.register_tensor("hidden", torch.relu(net[0](x)))
                    out = rec.register_tensor("output", net[2](hidden), role="output")
                    loss = rec.register_tensor("loss", ((out - x @ teacher) ** 2).mean(), role="loss")
                    rec.record_kpi("loss", loss.detach())
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
    return float(loss.detach())


def record_sweep(folder: Path, runs: int, steps: int) -> float:
    """Record ``runs`` trials ``run000``… with log-uniform learning rates; returns the seconds it took."""
    started = time.perf_counter()
    rates = np.logspace(np.log10(0.003), np.log10(3.0), runs)
    for i, lr in enumerate(rates):
        record_tiny_run(folder, f"run{i:03d}", lr=float(lr), steps=steps, seed=i)
    return time.perf_counter() - started


def _measure(folder: Path, workers: int) -> tuple[float, float, object]:
    from distributed import Client, LocalCluster

    from comgra_ndbg.sweep import analyze_many

    started = time.perf_counter()
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        client.run(lambda: __import__("comgra_ndbg.analysis"))  # imports on every worker, before the clock
        startup = time.perf_counter() - started
        started = time.perf_counter()
        frame = analyze_many(str(folder), client=client, store=False)
        return startup, time.perf_counter() - started, frame


def _serial(folder: Path) -> float:
    """Seconds to analyse every trial in this process, one after another: the cost without Dask."""
    from comgra_ndbg.sweep import analyze_one, expand

    tasks = expand(str(folder))
    started = time.perf_counter()
    for path, trial in tasks:
        analyze_one(path, trial, store=False)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three variants")
    parser.add_argument("--folder", type=Path, help="where the runs are (recorded there when missing)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or Path(scratch) / "sweep"
        if folder.exists() and len(list_trials(folder)) >= args.runs:
            print(f"reusing {len(list_trials(folder))} runs in {folder}")
        else:
            torch.set_num_threads(1)
            print(f"recorded {args.runs} runs of {args.steps} steps in {record_sweep(folder, args.runs, args.steps):.1f} s")
        trials = len(list_trials(folder))
        print(f"cpus: {os.cpu_count()}, trials: {trials}, load average before: {os.getloadavg()[0]:.1f}")
        print(f"{'round':>5} {'variant':>9} {'start-up s':>11} {'analysis s':>11} {'trials/s':>9} {'load':>5}")
        seconds: dict[str, list[float]] = {"no Dask": [], "1 worker": [], "2 workers": []}
        frames = {}
        for round_ in range(args.rounds):
            order = ("no Dask", "1 worker", "2 workers") if round_ % 2 == 0 else ("2 workers", "1 worker", "no Dask")
            for variant in order:  # side by side: each round runs every variant, in alternating order
                if variant == "no Dask":
                    startup, took = 0.0, _serial(folder)
                else:
                    startup, took, frames[variant] = _measure(folder, int(variant[0]))
                seconds[variant].append(took)
                print(f"{round_ + 1:>5} {variant:>9} {startup:>11.2f} {took:>11.2f} {trials / took:>9.1f} "
                      f"{os.getloadavg()[0]:>5.1f}")
        medians = {variant: statistics.median(values) for variant, values in seconds.items()}
        print("medians: " + ", ".join(f"{variant} {trials / m:.1f} trials/s" for variant, m in medians.items()))
        ratios = [one / two for one, two in zip(seconds["1 worker"], seconds["2 workers"])]
        print(f"scaling 2 workers / 1 worker: median {statistics.median(ratios):.2f}x (rounds: "
              f"{', '.join(f'{r:.2f}' for r in ratios)}); load average after: {os.getloadavg()[0]:.1f}")
        frame = frames["2 workers"]
        counts = frame["type"].value_counts().to_dict()
        print(f"types: {counts}; errors: {int((frame['error'] != '').sum())}")
        print(f"1-worker and 2-worker tables equal: {frames['1 worker'].equals(frame)}")


if __name__ == "__main__":
    main()
