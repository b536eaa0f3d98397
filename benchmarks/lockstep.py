"""Training loops run in lockstep, each in a process of its own: this process tells one at a time to run
one step, so every variant's steps meet the same load.

On a shared machine the speed of a step drifts by tens of per cent over fractions of a second; variants
measured in whole runs one after the other differ by that drift, which is larger than the few per cent
a recorder's bookkeeping is. Side by side step by step, each set of steps meets the same load, and the
median of per-step ratios resolves about a hundredth of a step. In processes of their own, variants that
change process-wide state (``NeuralDbg`` replaces ``torch.autograd.backward`` and hooks every optimizer's
step) do not reach the others. A step starts with the caches the step before it left, so the steps take
every order of the variants in rotation, and each variant follows each other as often (two identical
variants read 0.015× apart in one process when each always followed the same partner).

A variant is named by ``(module, function, args)``: ``function(*args)`` returns an iterator that runs one
training step per ``next()`` (set up lazily at the first) and cleans up when exhausted. Each process times
its own ``next()`` calls in wall-clock and in its CPU time; the messages are outside the timing.
"""
from __future__ import annotations

import importlib
import itertools
import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

__all__ = ["Variant", "per_step", "run_processes"]

Variant = tuple[str, str, tuple]
"""``(module, function, args)`` of a loop: ``getattr(import_module(module), function)(*args)`` is its steps."""


def run_processes(variants: dict[str, Variant], steps: int, threads: int) -> dict[str, list[tuple[float, float]]]:
    """Run ``steps`` steps of every variant, one process each, one step at a time, the order of the variants
    rotating through all their orders; returns each variant's ``(wall, CPU)`` seconds per step. ``threads``:
    torch's intra-op threads in every process."""
    context = multiprocessing.get_context("spawn")  # no state of this process (torch's threads) is inherited
    names = list(variants)
    links = {name: context.Pipe() for name in names}  # (this end, the process's end)
    processes = {name: context.Process(target=_worker, name=f"lockstep-{name}", daemon=True,
                                       args=(variants[name], threads, links[name][1]))
                 for name in names}
    for process in processes.values():
        process.start()
    finished = False
    try:
        for name in names:  # every process has imported its loop's module
            answer = _answer(links[name][0], processes[name])
            if answer != "ready":
                raise RuntimeError(f"lockstep variant {name!r} failed to start: {answer}")
        orders = list(itertools.permutations(names))
        for i in range(steps):
            for name in orders[i % len(orders)]:
                links[name][0].send(True)
                answer = _answer(links[name][0], processes[name])
                if answer is not None:
                    raise RuntimeError(f"lockstep variant {name!r} failed: {answer}")
        times = {}
        for name in names:
            links[name][0].send(False)  # no more steps: clean up and send the times
            answer = _answer(links[name][0], processes[name])
            if isinstance(answer, str):
                raise RuntimeError(f"lockstep variant {name!r} failed: {answer}")
            times[name] = answer
        finished = True
    finally:
        for process in processes.values():
            if finished:
                process.join(timeout=60)
            if process.is_alive():  # a failure leaves the others waiting for their next step
                process.kill()
                process.join()
    return times


def _answer(connection: Connection, process: multiprocessing.process.BaseProcess) -> object:
    """What ``process`` sends on ``connection``, or a failure (a str) when it ended without a word (a crash,
    a kill)."""
    while not connection.poll(1.0):
        if not process.is_alive() and not connection.poll():
            return f"the process ended with exit code {process.exitcode} before it answered"
    return connection.recv()


def _worker(variant: Variant, threads: int, link: Connection) -> None:
    import torch

    from benchmarks.overhead import finish

    torch.set_num_threads(threads)
    try:
        module, function, args = variant
        loop = getattr(importlib.import_module(module), function)(*args)
    except BaseException as error:  # reported to the parent, which stops the others
        link.send(f"{type(error).__name__}: {error}")
        return
    link.send("ready")
    times: list[tuple[float, float]] = []
    try:
        while link.recv():
            t0, c0 = time.perf_counter(), time.process_time()
            next(loop)
            times.append((time.perf_counter() - t0, time.process_time() - c0))
            link.send(None)
        finish(loop)  # the loop's own cleanup (a recorder's close)
    except BaseException as error:  # reported to the parent, which stops the others
        link.send(f"{type(error).__name__}: {error}")
        return
    link.send(times)


def per_step(times: dict[str, list[tuple[float, float]]], skip: int = 10) -> Sequence[dict[str, tuple[float, float]]]:
    """The variants' times as one ``{variant: (wall, CPU)}`` per step, the first ``skip`` (warm-up) left out."""
    names = list(times)
    return [{name: times[name][i] for name in names} for i in range(skip, len(times[names[0]]))]
