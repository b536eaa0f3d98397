"""Training loops run in lockstep, each in a process of its own: a token passed round a ring of pipes lets
one process run one step at a time, so every variant's steps meet the same load.

On a shared machine the speed of a step drifts by tens of per cent over fractions of a second; variants
measured in whole runs one after the other differ by that drift, which is larger than the few per cent
a recorder's bookkeeping is. Side by side step by step, each triple of steps meets the same load, and the
median of per-step ratios resolves a few thousandths of a step. In processes of their own, variants that
change process-wide state (``NeuralDbg`` replaces ``torch.autograd.backward`` and hooks every optimizer's
step) do not reach the others.

A variant is named by ``(module, function, args)``: ``function(*args)`` returns an iterator that runs one
training step per ``next()`` (set up lazily at the first) and cleans up when exhausted. Each process times
its own ``next()`` calls in wall-clock and in its CPU time; the token's passing is outside the timing.
"""
from __future__ import annotations

import importlib
import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

__all__ = ["Variant", "per_step", "run_ring"]

Variant = tuple[str, str, tuple]
"""``(module, function, args)`` of a loop: ``getattr(import_module(module), function)(*args)`` is its steps."""


def run_ring(variants: dict[str, Variant], steps: int, threads: int) -> dict[str, list[tuple[float, float]]]:
    """Run ``steps`` steps of every variant, one process each, one step at a time round the ring in the
    order given; returns each variant's ``(wall, CPU)`` seconds per step. ``threads``: torch's intra-op
    threads in every process."""
    context = multiprocessing.get_context("spawn")  # no state of this process (torch's threads) is inherited
    names = list(variants)
    pipes = [context.Pipe(duplex=False) for _ in names]  # pipe k: (receiving end, sending end) into process k
    results = [context.Pipe(duplex=False) for _ in names]
    processes = [context.Process(target=_worker, name=f"lockstep-{name}", daemon=True,
                                 args=(variants[name], steps, threads, pipes[k][0], pipes[(k + 1) % len(names)][1],
                                       results[k][1]))
                 for k, name in enumerate(names)]
    for process in processes:
        process.start()
    finished = False
    try:
        for k in range(len(names)):  # every process has imported its loop's module
            answer = _answer(results[k][0], processes[k])
            if answer != "ready":
                raise RuntimeError(f"lockstep variant {names[k]!r} failed to start: {answer}")
        pipes[0][1].send(None)
        times = {}
        for k, name in enumerate(names):
            answer = _answer(results[k][0], processes[k])
            if isinstance(answer, str):
                raise RuntimeError(f"lockstep variant {name!r} failed: {answer}")
            times[name] = answer
        finished = True
    finally:
        for process in processes:
            if finished:
                process.join(timeout=60)
            if process.is_alive():  # a failed start leaves the others waiting for the token
                process.kill()
                process.join()
    return times


def _answer(connection: Connection, process: multiprocessing.process.BaseProcess) -> object:
    """What ``process`` sends on ``connection``, or a failure when it died without a word (a crash, a kill)."""
    while not connection.poll(1.0):
        if not process.is_alive() and not connection.poll():
            return f"the process ended with exit code {process.exitcode} before it answered"
    return connection.recv()


def _worker(variant: Variant, steps: int, threads: int, inbox: Connection, outbox: Connection,
            result: Connection) -> None:
    import torch

    torch.set_num_threads(threads)
    try:
        module, function, args = variant
        loop = getattr(importlib.import_module(module), function)(*args)
    except BaseException as error:  # reported to the parent, which stops the ring
        result.send(f"{type(error).__name__}: {error}")
        return
    result.send("ready")
    times: list[tuple[float, float]] = []
    failure = None
    for _ in range(steps):
        inbox.recv()
        if failure is None:  # after a failure the token is only passed on, so the others run to their end
            try:
                t0, c0 = time.perf_counter(), time.process_time()
                next(loop)
                times.append((time.perf_counter() - t0, time.process_time() - c0))
            except BaseException as error:
                failure = f"{type(error).__name__}: {error}"
        outbox.send(None)
    if failure is None:
        try:
            for _ in loop:  # the loop's own cleanup (a recorder's close)
                pass
        except BaseException as error:
            failure = f"{type(error).__name__}: {error}"
    result.send(times if failure is None else failure)


def per_step(times: dict[str, list[tuple[float, float]]], skip: int = 10) -> Sequence[dict[str, tuple[float, float]]]:
    """The ring's times as one ``{variant: (wall, CPU)}`` per step, the first ``skip`` (warm-up) left out."""
    names = list(times)
    return [{name: times[name][i] for name in names} for i in range(skip, len(times[names[0]]))]
