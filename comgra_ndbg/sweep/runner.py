"""``analyze_many``: one analysis per trial, spread over a Dask cluster, gathered into a pandas DataFrame.

The client lists the trials (:func:`~comgra_ndbg.sweep.tasks.expand`) and submits one
:func:`~comgra_ndbg.sweep.tasks.analyze_one` per trial; workers open the recordings themselves, so on a real
cluster the paths must name the same files on every worker (a shared file system). Without ``client`` or
``scheduler`` a ``LocalCluster`` of ``workers`` single-threaded processes is started and closed again; a
``scheduler`` address (``tcp://host:8786``, from ``dask scheduler``, dask-jobqueue or dask-kubernetes)
runs the same code on that cluster.
"""
from __future__ import annotations

import logging
import os
import sys
from contextlib import ExitStack
from typing import Any, TextIO

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.errors import InvalidArgumentError, MissingDependencyError
from comgra_ndbg.sweep.table import columns_of, sweep_row
from comgra_ndbg.sweep.tasks import PathsOrGlob, analyze_one, expand

__all__ = ["analyze_many", "require"]

_INSTALL = "pip install 'comgra-ndbg[sweep]'"


def require(module: str, purpose: str) -> Any:
    """Import ``module`` or raise :class:`MissingDependencyError` saying how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f"{purpose} needs the package {module.split('.')[0]!r}, which is not "
                                     f"installed; install the sweep extra: {_INSTALL}") from None


def _start_client(stack: ExitStack, client: Any, scheduler: str | None, workers: int | None, processes: bool,
                  tasks: int) -> Any:
    if client is not None:
        if scheduler is not None:
            raise InvalidArgumentError("pass either client or scheduler, not both")
        return client
    distributed = require("distributed", "analysing many recordings")
    if scheduler is not None:
        return stack.enter_context(distributed.Client(scheduler))
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise InvalidArgumentError(f"workers must be a positive number of worker processes, got {workers!r}")
    count = workers if workers is not None else max(1, min(os.cpu_count() or 1, tasks))
    cluster = stack.enter_context(distributed.LocalCluster(n_workers=count, threads_per_worker=1,
                                                           processes=processes, dashboard_address=":0",
                                                           silence_logs=logging.CRITICAL))
    return stack.enter_context(distributed.Client(cluster))


def analyze_many(paths_or_glob: PathsOrGlob, client: Any = None, scheduler: str | None = None, *,
                 workers: int | None = None, processes: bool = True, store: bool = True,
                 thresholds: Thresholds | None = None, progress: bool = False, stream: TextIO | None = None) -> Any:
    """Analyse every trial that ``paths_or_glob`` names and return a ``pandas.DataFrame``, one row per trial
    (columns :data:`~comgra_ndbg.sweep.table.SWEEP_COLUMNS`, then the runs' hyperparameters), sorted by
    path and trial.

    ``client``: a ``distributed.Client`` to use as is; ``scheduler``: the address of a running scheduler;
    neither: a ``LocalCluster`` of ``workers`` processes (default: one per CPU, at most one per trial;
    ``processes=False`` runs them as threads), whose log is silenced below CRITICAL: a worker still sending
    its heartbeat while the cluster closes logs a traceback that means nothing, and a failed task already
    shows as its row's ``error``. ``store`` keeps the stored-analysis behaviour of
    ``comgra-ndbg explain`` (analyse what is missing or stale and store it); ``thresholds`` re-analyses
    every trial with them and stores nothing. ``progress`` draws a tqdm bar on ``stream`` (stderr).
    A trial that cannot be read or analysed gets its ``error`` column filled in; the others are unaffected.

    Raises :class:`~comgra_ndbg.errors.MissingDependencyError` when dask.distributed or pandas (or, with
    ``progress``, tqdm) is not installed.
    """
    pandas = require("pandas", "the sweep table")
    tasks = expand(paths_or_glob)
    bar_module = require("tqdm", "the sweep's progress bar") if progress else None
    with ExitStack() as stack:
        active = _start_client(stack, client, scheduler, workers, processes, len(tasks))
        distributed = require("distributed", "analysing many recordings")
        futures = active.map(analyze_one, [p for p, _ in tasks], [t for _, t in tasks], store=store,
                             thresholds=thresholds, pure=False)
        bar = None
        if bar_module is not None:
            bar = stack.enter_context(bar_module.tqdm(total=len(futures), desc="analysing", unit="trial",
                                                      file=stream if stream is not None else sys.stderr))
        task_of = {future.key: task for future, task in zip(futures, tasks)}
        rows = []
        for future in distributed.as_completed(futures):
            rows.append(_result(future, *task_of[future.key]))
            if bar is not None:
                bar.update(1)
    rows.sort(key=lambda row: (row["path"], row["trial"]))
    frame = pandas.DataFrame(rows, columns=columns_of(rows))
    return frame.astype({"onset": "Int64", "steps": "int64"})


def _result(future: Any, path: str, trial: str) -> dict[str, Any]:
    """The row a worker returned, or an error row when the task itself failed (a worker lost, a bug): one
    trial's failure never ends the sweep."""
    try:
        return future.result()
    except Exception as error:  # anything a remote task raises; its row carries it
        return sweep_row(path, trial, None, final_loss=float("nan"), steps=0, hyperparameters={},
                         error=f"{type(error).__name__}: {error}")
