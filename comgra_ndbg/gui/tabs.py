"""Callbacks of the tabs next to Tensors: Diagnosis, KPIs, Notes, Network, Compare and Custom.

Like :mod:`comgra_ndbg.gui.callbacks`, each is a plain function of (cache, selection, ...) that tests call
directly. A tab is computed only while it is the active one (otherwise ``no_update``), and again when it
is opened, so an open Tensors tab never pays for the KPI curves.

:func:`analysis_state` owns the stored analyses: it runs ``comgra_ndbg.analyze`` when Analyze now is
pressed, and on the live interval notices analyses stored from elsewhere (the CLI, a notebook). Either
way it writes the analyses' stamps, which the Diagnosis tab, the graph's event marks and the timeline's
event lines listen to.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from dash import Dash, Input, Output, State, html, no_update

from comgra_ndbg.analysis import analyze
from comgra_ndbg.errors import ComgraError, RecordingFormatError
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.custom import Visualization
from comgra_ndbg.gui.diagnosis import diagnosis_view, plural
from comgra_ndbg.gui.figures import format_number, histogram_figure, kpi_figure, message_figure
from comgra_ndbg.gui.selection import resolve
from comgra_ndbg.gui.state import ReaderCache, Selection, element_values, statistics_at
from comgra_ndbg.gui.views import graph_of, message, module_table, notes_table, problems_view, table

__all__ = ["analysis_state", "compare_tab", "custom_tab", "diagnosis_tab", "kpis_tab", "network_tab", "notes_tab",
           "register_tab_callbacks"]


def _selection(selection_data: dict[str, Any] | None) -> Selection | None:
    return Selection.from_dict(selection_data["selection"]) if selection_data else None


def diagnosis_tab(cache: ReaderCache, selection_data: dict[str, Any] | None, tab: str | None) -> Any:
    """Ranked hypotheses, events and coupled failures of the trial as the analysis stored them
    (``Recording.analysis()``), the selected node's rows highlighted."""
    selection = _selection(selection_data)
    if tab != ids.TAB_DIAGNOSIS or selection is None:
        return no_update
    try:
        stored = cache.diagnosis(selection.trial)
    except RecordingFormatError as error:
        return html.Div([message(str(error), error=True)])
    return diagnosis_view(stored, selected=selection.node,
                          shown=cache.shown_nodes(selection.trial, selection.step_type, selection.collapsed))


def analysis_state(cache: ReaderCache, analyze_now: bool, selection_data: dict[str, Any] | None,
                   previous: dict[str, Any] | None) -> tuple[Any, Any]:
    """``(stamps, status)``: with ``analyze_now``, run ``comgra_ndbg.analyze`` on the selected trial (it
    stores ``analysis.json``) and say what it found; otherwise only look whether a stored analysis changed.
    ``no_update`` for what did not change."""
    selection = _selection(selection_data)
    status: Any = no_update
    if analyze_now and selection is not None:
        try:
            diagnosis = analyze(cache.recording(selection.trial))
        except (ComgraError, OSError) as error:
            return no_update, message(f"Analysis of trial {selection.trial} failed: {error}", error=True)
        found = ("healthy run: no failure hypothesis" if diagnosis.healthy else
                 f"{plural(len(diagnosis.hypotheses), 'hypothesis', 'hypotheses')}, "
                 f"{plural(len(diagnosis.events), 'event')}")
        status = (f"Analysed {diagnosis.num_steps} steps of trial {selection.trial} in {diagnosis.seconds:.2f} s: "
                  f"{found}.")
    stamps = cache.analysis_stamps()
    return (no_update if stamps == (previous or {}) else stamps), status


def kpis_tab(cache: ReaderCache, selection_data: dict[str, Any] | None, tab: str | None) -> Any:
    """One plot per KPI with a curve per step type, the current step marked."""
    selection = _selection(selection_data)
    if tab != ids.TAB_KPIS or selection is None:
        return no_update
    recording = cache.recording(selection.trial)
    if not recording.kpi_names:
        return message("No KPIs in this recording — record some with Recorder.record_kpi(name, value).")
    graphs = []
    for name in recording.kpi_names:
        curves = {t: recording.kpi(name, t) for t in recording.step_types}
        curves = {t: c for t, c in curves.items() if len(c[0])}
        graphs.append(graph_of(kpi_figure(name, curves, selection.step), f"{ids.KPIS}-{name}", height=260))
    return graphs


def notes_tab(cache: ReaderCache, selection_data: dict[str, Any] | None, tab: str | None) -> Any:
    selection = _selection(selection_data)
    if tab != ids.TAB_NOTES or selection is None:
        return no_update
    recording = cache.recording(selection.trial)
    shown = problems_view(recording.damage, recording.problems())
    return html.Div([*shown, notes_table(recording.notes)]) if shown else notes_table(recording.notes)


def network_tab(cache: ReaderCache, selection_data: dict[str, Any] | None, tab: str | None) -> Any:
    """The module tree of the tracked modules with their own and total parameter counts."""
    selection = _selection(selection_data)
    if tab != ids.TAB_NETWORK or selection is None:
        return no_update
    recording = cache.recording(selection.trial)
    tree = recording.module_tree()
    if not tree:
        return message("No module was tracked — call Recorder.track_module(name, model) to see the network.")
    classes = {m.path: m.class_name for m in recording.modules}
    total = sum(m.total_parameters for m in tree if m.parent is None)
    return html.Div([html.Div(f"{total:,} parameters in {len(tree)} modules", className="tensor-header"),
                     module_table(tree, classes)])


def compare_tab(cache: ReaderCache, selection_data: dict[str, Any] | None, tab: str | None, mode: str | None,
                other_trial: str | None, other_step: int | None) -> Any:
    """The selected tensor in another trial or at another step, side by side with the current one: one
    table of every statistic (A, B, B − A) and the two histograms."""
    current = _selection(selection_data)
    if tab != ids.TAB_COMPARE or current is None:
        return no_update
    wanted = current.to_dict()
    if mode == "trial":
        wanted["trial"] = other_trial
    else:
        wanted["step"] = other_step
    other, _ = resolve(cache, wanted)
    if other.tensor != current.tensor:
        return message(f"{current.tensor} was not recorded in trial {other.trial}.")
    sides = [(current, "A"), (other, "B")]
    stats = [statistics_at(cache, s) for s, _ in sides]
    names = list((stats[0] or stats[1] or {}).keys())
    rows = []
    for name in names:
        a, b = (s.get(name, np.nan) if s else np.nan for s in stats)
        rows.append((name, format_number(a), format_number(b), format_number(b - a)))
    titles = [f"{tag}: {s.trial} · step {s.step} · {s.kind}" for s, tag in sides]
    histograms = []
    for (side, tag), title in zip(sides, titles):
        snapshot = (cache.snapshot(side.trial, side.tensor, side.kind, side.step, side.iteration)
                    if side.tensor and side.kind and side.step is not None else None)
        values = element_values(snapshot, side.sample) if snapshot is not None else None
        figure = (histogram_figure(values.values, title=title) if values is not None
                  else message_figure(f"{title}: no snapshot"))
        histograms.append(html.Div(graph_of(figure, f"{ids.COMPARE}-histogram-{tag}", height=280), className="half"))
    return html.Div([
        html.Div(f"{current.node} / {current.tensor} — " + " vs ".join(titles), className="tensor-header"),
        html.Div([html.Div(table(("statistic", "A", "B", "B − A"), rows, table_id=f"{ids.COMPARE}-table"),
                           style={"flex": "0 0 360px"}), *histograms], className="row"),
    ])


def custom_tab(cache: ReaderCache, visualization: Visualization | None, selection_data: dict[str, Any] | None,
               tab: str | None) -> Any:
    """The user's visualization for the current selection."""
    selection = _selection(selection_data)
    if tab != ids.TAB_CUSTOM or selection is None:
        return no_update
    if visualization is None:
        return message("No visualization file — start the explorer with --visualization-file FILE.py.")
    return html.Div([html.H4(visualization.title),
                     visualization.render(cache.recording(selection.trial), selection)])


def register_tab_callbacks(app: Dash, cache: ReaderCache, visualization: Visualization | None,
                           locked: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Wire the tab callbacks; ``locked`` serializes them on the cache's lock."""
    selection, tab = Input(ids.SELECTION, "data"), Input(ids.TABS, "value")
    # The stamps of analysis_state only trigger the tab: the cache notices a new analysis by itself.
    app.callback(Output(ids.DIAGNOSIS, "children"), selection, tab, Input(ids.ANALYSES, "data"))(
        locked(lambda selection_data, active, _analyses: diagnosis_tab(cache, selection_data, active)))

    # One callback per trigger: the live interval only looks, the button analyses. (In one callback, a
    # click arriving with an interval tick could be read as the tick.)
    def _watch(_n_intervals: int, selection_data: dict[str, Any] | None, previous: dict[str, Any] | None) -> Any:
        return analysis_state(cache, False, selection_data, previous)[0]

    def _analyze(_n_clicks: int, selection_data: dict[str, Any] | None, previous: dict[str, Any] | None
                 ) -> tuple[Any, Any]:
        return analysis_state(cache, True, selection_data, previous)
    app.callback(Output(ids.ANALYSES, "data"), Input(ids.INTERVAL, "n_intervals"), State(ids.SELECTION, "data"),
                 State(ids.ANALYSES, "data"), prevent_initial_call=True)(locked(_watch))
    app.callback(Output(ids.ANALYSES, "data", allow_duplicate=True), Output(ids.ANALYZE_STATUS, "children"),
                 Input(ids.ANALYZE, "n_clicks"), State(ids.SELECTION, "data"), State(ids.ANALYSES, "data"),
                 prevent_initial_call=True)(locked(_analyze))
    for output, function in ((ids.KPIS, kpis_tab), (ids.NOTES, notes_tab), (ids.NETWORK, network_tab)):
        app.callback(Output(output, "children"), selection, tab)(locked(functools.partial(function, cache)))
    app.callback(Output(ids.COMPARE, "children"), selection, tab, Input(ids.COMPARE_MODE, "value"),
                 Input(ids.COMPARE_TRIAL, "value"), Input(ids.COMPARE_STEP, "value"))(
        locked(functools.partial(compare_tab, cache)))
    app.callback(Output(ids.CUSTOM, "children"), selection, tab)(
        locked(functools.partial(custom_tab, cache, visualization)))
