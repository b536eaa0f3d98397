"""Callbacks of the tabs next to Tensors: Diagnosis, KPIs, Notes, Network, Compare and Custom.

Like :mod:`comgra_ndbg.gui.callbacks`, each is a plain function of (cache, selection, ...) that tests call
directly. A tab is computed only while it is the active one (otherwise ``no_update``), and again when it
is opened, so an open Tensors tab never pays for the KPI curves.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from dash import Dash, Input, Output, html, no_update

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.custom import Visualization
from comgra_ndbg.gui.figures import format_number, histogram_figure, kpi_figure, message_figure
from comgra_ndbg.gui.selection import resolve
from comgra_ndbg.gui.state import ReaderCache, Selection, element_values, statistics_at
from comgra_ndbg.gui.views import diagnosis_view, graph_of, message, module_table, notes_table, table

__all__ = ["compare_tab", "custom_tab", "diagnosis_tab", "kpis_tab", "network_tab", "notes_tab",
           "register_tab_callbacks"]


def _selection(selection_data: dict[str, Any] | None) -> Selection | None:
    return Selection.from_dict(selection_data["selection"]) if selection_data else None


def diagnosis_tab(cache: ReaderCache, selection_data: dict[str, Any] | None, tab: str | None) -> Any:
    """Ranked hypotheses and events of the trial, as the analysis stored them (``Recording.analysis()``)."""
    selection = _selection(selection_data)
    if tab != ids.TAB_DIAGNOSIS or selection is None:
        return no_update
    analysis = getattr(cache.recording(selection.trial), "analysis", None)
    return diagnosis_view(analysis() if callable(analysis) else None)


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
    return notes_table(cache.recording(selection.trial).notes)


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
    for output, function in ((ids.DIAGNOSIS, diagnosis_tab), (ids.KPIS, kpis_tab), (ids.NOTES, notes_tab),
                             (ids.NETWORK, network_tab)):
        app.callback(Output(output, "children"), selection, tab)(locked(functools.partial(function, cache)))
    app.callback(Output(ids.COMPARE, "children"), selection, tab, Input(ids.COMPARE_MODE, "value"),
                 Input(ids.COMPARE_TRIAL, "value"), Input(ids.COMPARE_STEP, "value"))(
        locked(functools.partial(compare_tab, cache)))
    app.callback(Output(ids.CUSTOM, "children"), selection, tab)(
        locked(functools.partial(custom_tab, cache, visualization)))
