"""The analysis shell: load a recording, run the pure pipeline, store the results with the recording.

>>> import tempfile, torch
>>> from comgra_ndbg import Recorder
>>> with tempfile.TemporaryDirectory() as folder:
...     with Recorder(folder, trial="t") as rec:
...         for step in range(30):
...             with rec.step(step):
...                 _ = rec.register_tensor("x", torch.ones(4, 2), role="input")
...                 rec.record_kpi("loss", 1.0)
...     analyze(folder).healthy
True
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path


from comgra_ndbg import __version__
from comgra_ndbg.analysis.abrupt import abrupt_events
from comgra_ndbg.analysis.activation_regime import activation_events
from comgra_ndbg.analysis.balance import balance_events
from comgra_ndbg.analysis.collapse import collapse_events
from comgra_ndbg.analysis.causal import coupled_failures, link_events
from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Diagnosis, Event, diagnosis_from_dict, to_dict
from comgra_ndbg.analysis.gradient_health import gradient_events, scaled_after_backward
from comgra_ndbg.analysis.hypotheses import rank_hypotheses
from comgra_ndbg.analysis.invariants import loop_diagnosis, merge_hypotheses
from comgra_ndbg.analysis.loading import load_run_facts, load_series
from comgra_ndbg.analysis.nonfinite import first_nonfinite_index, nonfinite_events, phase_key
from comgra_ndbg.analysis.optimizer_stability import optimizer_events
from comgra_ndbg.analysis.output_range import output_range_events
from comgra_ndbg.analysis.parameter_edits import edit_events
from comgra_ndbg.analysis.profile import profile_report, with_profile
from comgra_ndbg.analysis.query import Query
from comgra_ndbg.analysis.rank_loading import with_rank_checks
from comgra_ndbg.analysis.reference import RunFacts, compare_runs, with_reference
from comgra_ndbg.analysis.series import RunSeries
from comgra_ndbg.analysis.stagnation import stagnation_events
from comgra_ndbg.errors import ReferenceMismatchError
from comgra_ndbg.store import schema
from comgra_ndbg.store.reader import Recording, list_trials, open_recording
from comgra_ndbg.store.results import read_results, write_results

__all__ = ["analyze", "diagnose", "detect_events", "query", "stored_diagnosis"]


def detect_events(series: RunSeries, thresholds: Thresholds = Thresholds()) -> list[Event]:
    """Every event of every family, in step order. Relative rules skip the first ``settle_steps`` steps
    and every family but ``nonfinite`` stops at the first non-finite step; the steps just before it are
    searched for abrupt single-step jumps (:mod:`~comgra_ndbg.analysis.abrupt`)."""
    stop = first_nonfinite_index(series)
    settle = min(thresholds.settle_steps, len(series.steps))
    events = nonfinite_events(series)
    events += edit_events(series, thresholds, stop=stop)
    events += activation_events(series, thresholds, stop=stop, settle=settle)
    events += collapse_events(series, thresholds, stop=stop, settle=settle)
    events += gradient_events(series, thresholds, stop=stop, settle=settle)
    events += optimizer_events(series, thresholds, stop=stop, settle=settle)
    events += stagnation_events(series, thresholds, stop=stop)
    events += balance_events(series, thresholds, stop=stop, settle=settle)
    events += output_range_events(series, thresholds, stop=stop)
    events = scaled_after_backward(series, events, thresholds)
    events += abrupt_events(series, events, thresholds, stop=stop)
    return sorted(events, key=lambda e: phase_key(e, series))


def diagnose(series: RunSeries, thresholds: Thresholds = Thresholds()) -> Diagnosis:
    """The pure pipeline: events, causal links, coupled failures and ranked hypotheses of one run; the
    training loop's own mistakes (:mod:`~comgra_ndbg.analysis.invariants`) rank ahead of their effects."""
    started = time.perf_counter()
    events = detect_events(series, thresholds)
    links = link_events(events, series, thresholds)
    hypotheses = rank_hypotheses(events, links, series, thresholds)
    loop = loop_diagnosis(series)
    events = _insert_by_onset(events, loop.events)
    return Diagnosis(trial=series.trial, num_steps=int(len(series.steps)),
                     last_step=int(series.steps[-1]) if len(series.steps) else -1, events=tuple(events),
                     coupled=tuple(coupled_failures(links)),
                     hypotheses=tuple(merge_hypotheses(hypotheses, loop.hypotheses)),
                     seconds=time.perf_counter() - started, library_version=__version__,
                     thresholds=thresholds.as_dict(), notes=loop.notes)


def _insert_by_onset(events: list[Event], extra: tuple[Event, ...]) -> list[Event]:
    """``events`` in their order, each of ``extra`` put before the first event with a later onset."""
    out = list(events)
    for event in extra:
        at = next((i for i, e in enumerate(out) if e.onset > event.onset), len(out))
        out.insert(at, event)
    return out


def _open(path_or_recording: str | Path | Recording, trial: str | None) -> tuple[Recording, bool]:
    if isinstance(path_or_recording, Recording):
        return path_or_recording, False
    return open_recording(path_or_recording, trial), True


def analyze(path_or_recording: str | Path | Recording, *, trial: str | None = None, store: bool = True,
            thresholds: Thresholds = Thresholds(), reference: str | Path | Recording | None = None,
            reference_trial: str | None = None) -> Diagnosis:
    """Diagnose a recording (a group folder with ``trial``, a trial folder, a ``.h5`` file or an open
    ``Recording``); with ``store=True`` the results are written next to it (``analysis.json``) for the GUI.

    ``reference`` (with ``reference_trial`` for a group folder) is a recording of a healthy run of the same
    model: what held there is checked in this run too (:mod:`~comgra_ndbg.analysis.reference`), and each
    invariant broken becomes a hypothesis. Such a diagnosis depends on the reference, so it is not stored.
    ``ReferenceMismatchError`` says when the reference is another model.

    ``Diagnosis.hypotheses`` is empty for a healthy run; ``Diagnosis.explain()`` prints them as sentences.
    """
    started = time.perf_counter()
    recording, owned = _open(path_or_recording, trial)
    try:
        series = load_series(recording)
        diagnosis = with_rank_checks(diagnose(series, thresholds), recording)
        if reference is not None:
            diagnosis = _against_reference(diagnosis, load_run_facts(recording, series), reference, reference_trial)
            store = False
        diagnosis = _add_profile(diagnosis, recording)
        diagnosis = replace(diagnosis, seconds=time.perf_counter() - started)
        if store:
            write_results(recording.location, to_dict(diagnosis), num_steps=diagnosis.num_steps,
                          last_step=diagnosis.last_step)
    finally:
        if owned:
            recording.close()
    return diagnosis


def _against_reference(diagnosis: Diagnosis, run: RunFacts, reference: str | Path | Recording,
                       reference_trial: str | None) -> Diagnosis:
    if reference_trial is None and not isinstance(reference, Recording):
        trials = list_trials(reference)
        if len(trials) > 1:
            raise ReferenceMismatchError(
                f"the reference {str(reference)!r} holds {len(trials)} trials ({', '.join(trials[:8])}): say which one "
                f"ran healthy with reference_trial= (--reference-trial)")
    recording, owned = _open(reference, reference_trial)
    try:
        facts = load_run_facts(recording)
    finally:
        if owned:
            recording.close()
    return with_reference(diagnosis, compare_runs(facts, run))


def _add_profile(diagnosis: Diagnosis, recording: Recording) -> Diagnosis:
    """The profile's findings (hot layers, a memory leak) added to ``diagnosis`` when the run was profiled."""
    profile = recording.profile()
    if profile.is_empty:
        return diagnosis
    rss = profile.process_field("rss")
    report = profile_report(profile.modules, profile.data, schema.PROFILE_FIELDS, profile.process_steps, rss,
                            profile.process_field("step_time"))
    return with_profile(diagnosis, report, profile.process_steps, rss)


def stored_diagnosis(path_or_recording: str | Path | Recording, *, trial: str | None = None) -> Diagnosis | None:
    """The diagnosis stored by :func:`analyze`, or None; it is returned even when stale — compare its
    ``num_steps`` with the recording's, or use ``Recording.analysis().stale``."""
    recording, owned = _open(path_or_recording, trial)
    try:
        stored = read_results(recording.location, num_steps=len(recording.steps))
    finally:
        if owned:
            recording.close()
    return None if stored is None else diagnosis_from_dict(stored.diagnosis)


def query(path_or_recording: str | Path | Recording, *, trial: str | None = None,
          thresholds: Thresholds = Thresholds()) -> Query:
    """A :class:`~comgra_ndbg.analysis.query.Query` over a recording's series and its diagnosis."""
    recording, owned = _open(path_or_recording, trial)
    try:
        series = load_series(recording)
    finally:
        if owned:
            recording.close()
    return Query(series, diagnose(series, thresholds))


