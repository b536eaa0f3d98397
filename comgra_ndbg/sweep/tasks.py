"""What a sweep runs: the list of trials a glob names (on the client), and one trial's row (on a worker).

:func:`analyze_one` is the unit of work a Dask worker runs: a plain function of a path and a trial name that
returns a plain dict, so it pickles to any worker of any cluster. A recording that cannot be read or
analysed becomes a row with its ``error`` filled in, never an exception that stops the sweep.
"""
from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.errors import ComgraError, InvalidArgumentError
from comgra_ndbg.sweep.table import last_value, sweep_row

__all__ = ["expand", "analyze_one", "final_loss"]

PathsOrGlob = str | Path | Sequence[str | Path]


def _matches(pattern: str | Path) -> list[str]:
    text = str(pattern)
    return sorted(glob.glob(text, recursive=True)) if glob.has_magic(text) else [text]


def expand(paths_or_glob: PathsOrGlob) -> list[tuple[str, str]]:
    """``(path, trial)`` of every trial the paths or glob patterns name, each trial once, in path order.

    A path given literally must hold a recording (``RecordingNotFoundError`` otherwise); what a pattern
    matches that holds none (a stray file, a folder of plots) is passed over. Raises
    ``InvalidArgumentError`` when nothing is found at all.
    """
    from comgra_ndbg.store.reader import list_trials

    patterns = [paths_or_glob] if isinstance(paths_or_glob, (str, Path)) else list(paths_or_glob)
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for pattern in patterns:
        literal = not glob.has_magic(str(pattern))
        for path in _matches(pattern):
            try:
                trials = list_trials(path)
            except ComgraError:
                if literal:
                    raise
                continue
            for trial in trials:
                inside = Path(path) / trial
                where = os.path.realpath(inside if inside.is_dir() else path) + "::" + trial
                if where not in seen:
                    seen.add(where)
                    found.append((str(path), trial))
    if not found:
        raise InvalidArgumentError(f"no recording found at {paths_or_glob!r}; give group folders, trial folders or "
                                   f".h5 files, or a glob such as 'runs/*' (quote it so the shell leaves it alone)")
    return found


def final_loss(recording: Any) -> float:
    """The last recorded loss of a recording: its KPI ``loss``, else the mean value of its loss-role node;
    NaN when it has neither (or the run ended non-finite)."""
    if "loss" in recording.kpi_names:
        return last_value(recording.kpi("loss")[1])
    for node, role in recording.roles.items():
        if role == "loss":
            return last_value(recording.summary(node, "value", "mean")[1])
    return float("nan")


def analyze_one(path: str, trial: str, *, store: bool = True, thresholds: Thresholds | None = None
                ) -> dict[str, Any]:
    """The sweep row of one trial. Uses the stored analysis when it is up to date; otherwise analyses now and
    (``store=True``) stores it beside the recording. With ``thresholds`` it always analyses again and stores
    nothing, as ``comgra-ndbg explain`` does with overrides."""
    from comgra_ndbg.analysis.api import analyze
    from comgra_ndbg.export import current_diagnosis
    from comgra_ndbg.store.reader import open_recording

    try:
        with open_recording(path, trial) as recording:
            if thresholds is not None:
                diagnosis = analyze(recording, store=False, thresholds=thresholds)
            elif store:
                diagnosis, _ = current_diagnosis(recording)
            else:
                diagnosis = analyze(recording, store=False)
            return sweep_row(path, trial, diagnosis, final_loss=final_loss(recording), steps=len(recording.steps),
                             hyperparameters=recording.hyperparameters)
    except (ComgraError, OSError) as error:
        return sweep_row(path, trial, None, final_loss=float("nan"), steps=0, hyperparameters={},
                         error=f"{type(error).__name__}: {error}")
