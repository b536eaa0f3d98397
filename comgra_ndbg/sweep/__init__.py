"""Sweeps: the diagnosis of many recordings at once, as one table of trials.

:func:`analyze_many` runs the analysis of every trial a glob matches on a Dask cluster (a ``LocalCluster``
by default; any scheduler address with the same code) and returns a pandas ``DataFrame`` of trials ×
(path, trial, top hypothesis, type, origin, node, onset, confidence, final loss, steps, error, and the
hyperparameters each run stored). :mod:`~comgra_ndbg.sweep.table` builds, sorts and filters the rows
without pandas or Dask, so the GUI's trial selector uses it too. See ``docs/sweeps.md``.
"""
from comgra_ndbg.sweep.runner import analyze_many
from comgra_ndbg.sweep.table import SWEEP_COLUMNS, filter_rows, parse_filter, sort_rows, sweep_row
from comgra_ndbg.sweep.tasks import analyze_one, expand

__all__ = ["analyze_many", "analyze_one", "expand", "SWEEP_COLUMNS", "sweep_row", "sort_rows", "filter_rows",
           "parse_filter"]
