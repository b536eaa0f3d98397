"""The tabs next to Tensors: Diagnosis (with the chosen item's evidence), Layers, KPIs, Notes, Network,
Compare and Custom.

Each is a plain function of (cache, selection, options) that tests call directly; the view callback
(:mod:`comgra_ndbg.gui.callbacks`) computes only the open tab. :func:`analysis_state` owns the stored
analyses: it runs ``comgra_ndbg.analyze`` when Analyze now is pressed, and on the live interval notices
analyses stored from elsewhere (the CLI, a notebook); either way it writes the analyses' stamps, which the
view callback listens to.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from dash import Dash, Input, Output, State, html, no_update

from comgra_ndbg.analysis import Thresholds, analyze
from comgra_ndbg.analysis.loading import load_series
from comgra_ndbg.analysis.signature import failure_signature
from comgra_ndbg.errors import ComgraError, RecordingFormatError
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.custom import Visualization
from comgra_ndbg.gui.diagnosis import diagnosis_view, evidence_view, plural
from comgra_ndbg.gui.evidence import Focus, evidence_marks, focus_of
from comgra_ndbg.gui.figures import format_number, histogram_figure, message_figure, themed
from comgra_ndbg.gui.overview import layer_matrix
from comgra_ndbg.gui.queries import element_values, evidence_series, statistics_at
from comgra_ndbg.gui.selection import resolve
from comgra_ndbg.gui.state import ReaderCache, Selection, StoredDiagnosis, ViewOptions
from comgra_ndbg.signature import data_uri
from comgra_ndbg.store.reader import Recording
from comgra_ndbg.gui.timelines import kpi_figure, layers_figure, timeline_figure
from comgra_ndbg.gui.views import graph_of, message, module_table, notes_table, problems_view, table

__all__ = ["analysis_state", "compare_tab", "custom_tab", "diagnosis_tab", "evidence_panel", "kpis_tab",
           "layers_tab", "network_tab", "notes_tab", "register_analysis_callbacks", "signature_uri"]


def diagnosis_tab(cache: ReaderCache, selection: Selection, options: ViewOptions) -> Any:
    """Ranked hypotheses, events and coupled failures of the trial as the analysis stored them
    (``Recording.analysis()``), the selected node's rows and the chosen item highlighted."""
    try:
        stored = cache.diagnosis(selection.trial)
    except RecordingFormatError as error:
        return html.Div([message(str(error), error=True)])
    uri, problem = signature_uri(cache, selection.trial, stored)
    view = diagnosis_view(stored, selected=selection.node, focus=options.focus,
                          shown={n: n for n in cache.recording(selection.trial).nodes}, signature=uri)
    return html.Div([view, message(problem)]) if problem else view


def signature_uri(cache: ReaderCache, trial: str, stored: StoredDiagnosis | None) -> tuple[str | None, str]:
    """The failure signature of the stored diagnosis' top hypothesis as a PNG data address (memoized per
    stored analysis), and why there is none when drawing it failed (``""`` otherwise; a healthy or missing
    analysis has none and needs no reason)."""
    if stored is None or stored.diagnosis.top is None:
        return None, ""

    def compute(recording: Recording) -> tuple[str | None, str]:
        try:
            return data_uri(failure_signature(load_series(recording), stored.diagnosis)), ""
        except ComgraError as error:
            return None, f"No failure signature: {error}"

    return cache.memo(trial, ("signature", cache.analysis_stamp(trial)), compute)


def focus(cache: ReaderCache, selection: Selection, options: ViewOptions) -> Focus | None:
    """The chosen hypothesis or event of the trial's stored diagnosis (None when none is chosen)."""
    if not options.focus:
        return None
    stored = cache.readable_diagnosis(selection.trial)
    return focus_of(stored.diagnosis if stored is not None else None, options.focus)


def thresholds_of(cache: ReaderCache, trial: str) -> dict[str, float | None]:
    """The thresholds the stored analysis ran with (the defaults where it stored none; None: a threshold
    that defers to another, as ``vanishing_decades`` to ``enter_decades``)."""
    stored = cache.readable_diagnosis(trial)
    found = dict(stored.diagnosis.thresholds) if stored is not None else {}
    return {**Thresholds().as_dict(), **found}


def evidence_panel(cache: ReaderCache, selection: Selection, options: ViewOptions) -> Any:
    """The evidence of the chosen item: facts, remedy, and its whole series with onset, baseline and
    threshold drawn and the current step marked."""
    chosen = focus(cache, selection, options)
    if chosen is None or chosen.evidence is None:
        return evidence_view(chosen, None, None)
    evidence = chosen.evidence
    marks = evidence_marks(chosen.event, evidence, thresholds_of(cache, selection.trial))
    series = evidence_series(cache, selection.trial, evidence.series)
    if series is None:
        series = (np.array(evidence.steps), np.array(evidence.values))
    values = np.asarray(series[1], dtype=np.float64)
    finite = values[np.isfinite(values)]
    log_y = bool(len(finite)) and finite.min() > 0 and finite.max() / finite.min() > 100
    figure = timeline_figure({evidence.series: series}, title=f"{evidence.series} · the rule fired at step "
                             f"{chosen.event.onset}", y_label=evidence.series.rsplit("/", 1)[-1],
                             step=selection.step, evidence=marks, log_y=log_y, theme=options.theme)
    return evidence_view(chosen, marks, figure)


def analysis_state(cache: ReaderCache, analyze_now: bool, selection_data: dict[str, Any] | None,
                   previous: dict[str, Any] | None) -> tuple[Any, Any]:
    """``(stamps, status)``: with ``analyze_now``, run ``comgra_ndbg.analyze`` on the selected trial (it
    stores ``analysis.json``) and say what it found; otherwise only look whether a stored analysis changed.
    ``no_update`` for what did not change."""
    selection = Selection.from_dict(selection_data["selection"]) if selection_data else None
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


def kpis_tab(cache: ReaderCache, selection: Selection, options: ViewOptions) -> Any:
    """One plot per KPI with a curve per step type, the current step marked."""
    recording = cache.recording(selection.trial)
    if not recording.kpi_names:
        return message("No KPIs in this recording — record some with Recorder.record_kpi(name, value).")
    graphs = []
    for name in recording.kpi_names:
        curves = {t: recording.kpi(name, t) for t in recording.step_types}
        curves = {t: c for t, c in curves.items() if len(c[0])}
        graphs.append(graph_of(kpi_figure(name, curves, selection.step, theme=options.theme), f"{ids.KPIS}-{name}",
                               height=260))
    return graphs


def layers_tab(cache: ReaderCache, selection: Selection, options: ViewOptions) -> tuple[Any, Any, Any]:
    """``(note, gradient flow, update ratio)``: the gradient norm of every parameter node over the steps, one
    line per layer in forward order, and each layer's update against its weight (‖ΔW‖ / ‖W‖) with the
    analysis' upper bound ``update_ratio_high``."""
    drawn = cache.drawn(selection.trial, selection.step_type)
    order = drawn.order if drawn is not None else tuple(cache.recording(selection.trial).nodes)
    gradient = layer_matrix(cache, selection.trial, order, "grad:l2")
    ratio = layer_matrix(cache, selection.trial, order, "update:ratio")
    if not gradient.nodes:
        text = "No parameter node in this recording — track a module (Recorder.track_module) to see its layers."
        return message(text), message_figure(text, theme=options.theme), message_figure("", theme=options.theme)
    flow = layers_figure(gradient.nodes, gradient.steps, gradient.values, title="gradient flow: L2 norm of each "
                         "layer's gradient", y_label="gradient L2", step=selection.step, theme=options.theme)
    high = thresholds_of(cache, selection.trial)["update_ratio_high"]
    updates = layers_figure(ratio.nodes, ratio.steps, ratio.values, title="update / weight ‖ΔW‖ / ‖W‖",
                            y_label="‖ΔW‖ / ‖W‖", step=selection.step, theme=options.theme)
    updates["layout"]["shapes"].append({"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": high,
                                        "y1": high, "line": {"color": "#DC2626", "dash": "dot", "width": 1.5}})
    updates["layout"]["annotations"] = [{"x": 1, "xref": "paper", "y": high, "yref": "y", "xanchor": "right",
                                         "yanchor": "bottom", "showarrow": False, "text": f"update_ratio_high {high:g}",
                                         "font": {"size": 10, "color": "#DC2626"}}]
    note = (f"{len(gradient.nodes)} layers (parameter nodes) in forward order · hover a line for its name · "
            f"click a point to go to its step")
    return note, flow, updates


def notes_tab(cache: ReaderCache, selection: Selection, options: ViewOptions) -> Any:
    """Damage found while reading and the recording's problems log (when there are any), then its notes."""
    recording = cache.recording(selection.trial)
    shown = problems_view(recording.damage, recording.problems())
    return html.Div([*shown, notes_table(recording.notes)]) if shown else notes_table(recording.notes)


def network_tab(cache: ReaderCache, selection: Selection, options: ViewOptions) -> Any:
    """The module tree of the tracked modules with their own and total parameter counts."""
    recording = cache.recording(selection.trial)
    tree = recording.module_tree()
    if not tree:
        return message("No module was tracked — call Recorder.track_module(name, model) to see the network.")
    classes = {m.path: m.class_name for m in recording.modules}
    total = sum(m.total_parameters for m in tree if m.parent is None)
    return html.Div([html.Div(f"{total:,} parameters in {len(tree)} modules", className="tensor-header"),
                     module_table(tree, classes)])


def compare_choice(cache: ReaderCache, selection: Selection, options: ViewOptions) -> tuple[str, str, int | None]:
    """``(mode, trial, step)`` the Compare tab shows: the chosen ones, else another trial when there are
    several (the first one that is not selected), else another step (the trial's first recorded step)."""
    others = [t for t in cache.trials if t != selection.trial]
    mode = options.compare_mode or ("trial" if others else "step")
    trial = options.compare_trial if options.compare_trial in cache.trials else (others[0] if others else
                                                                                 selection.trial)
    steps = cache.recording(selection.trial).steps
    step = options.compare_step if options.compare_step is not None else (int(steps.min()) if len(steps) else None)
    return mode, trial, step


def compare_tab(cache: ReaderCache, selection: Selection, options: ViewOptions) -> Any:
    """The selected tensor in another trial or at another step beside the current one: a table of every
    statistic (A, B, B − A) and both histograms overlaid on common bins."""
    mode, trial, step = compare_choice(cache, selection, options)
    wanted = selection.to_dict()
    if mode == "trial":
        wanted["trial"] = trial
    else:
        wanted["step"] = step
    other, _ = resolve(cache, wanted)
    if other.tensor != selection.tensor:
        return message(f"{selection.tensor} was not recorded in trial {other.trial}.")
    sides = [(selection, "A"), (other, "B")]
    stats = [statistics_at(cache, s) for s, _ in sides]
    names = list((stats[0] or stats[1] or {}).keys())
    rows = []
    for name in names:
        a, b = (s.get(name, np.nan) if s else np.nan for s in stats)
        rows.append((name, format_number(a), format_number(b), format_number(b - a)))
    titles = [f"{tag}: {s.trial} · step {s.step} · {s.kind}" for s, tag in sides]
    found = []
    for side, _ in sides:
        snapshot = (cache.snapshot(side.trial, side.tensor, side.kind, side.step, side.iteration)
                    if side.tensor and side.kind and side.step is not None else None)
        values = element_values(snapshot, side.sample) if snapshot is not None else None
        found.append(None if values is None else np.asarray(values.values, dtype=np.float64))
    return html.Div([
        html.Div(f"{selection.node} / {selection.tensor} — " + " vs ".join(titles), className="tensor-header"),
        html.Div([html.Div(html.Div(table(("statistic", "A", "B", "B − A"), rows, table_id=f"{ids.COMPARE}-table"),
                                    className="scroll"), style={"flex": "0 1 380px", "minWidth": "0"}),
                  html.Div(graph_of(_overlaid(found, titles, options.theme), f"{ids.COMPARE}-histogram", 320),
                           className="half")], className="row"),
    ])


def _overlaid(found: list[np.ndarray | None], titles: list[str], theme: str) -> dict[str, Any]:
    """Both histograms on the same bins, overlaid."""
    present = [v[np.isfinite(v)] for v in found if v is not None]
    if not present or not any(len(v) for v in present):
        return message_figure("no snapshot at either side", theme=theme)
    joined = np.concatenate(present)
    low, high = float(joined.min()), float(joined.max())
    if low == high:
        low, high = low - 0.5, high + 0.5
    figure = histogram_figure(joined, title="", theme=theme)
    data = []
    for values, name, colour in zip(found, titles, ("#4C72B0", "#DD8452")):
        if values is None:
            continue
        counts, edges = np.histogram(values[np.isfinite(values)], bins=40, range=(low, high))
        data.append({"type": "bar", "name": name, "x": ((edges[:-1] + edges[1:]) / 2).tolist(), "y": counts.tolist(),
                     "width": float(edges[1] - edges[0]), "opacity": 0.6, "marker": {"color": colour}})
    figure["data"] = data
    figure["layout"] = themed({**figure["layout"], "barmode": "overlay", "showlegend": True,
                               "legend": {"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right",
                                          "yanchor": "bottom"}}, theme)
    return figure


def custom_tab(cache: ReaderCache, visualization: Visualization | None, selection: Selection) -> Any:
    """The user's visualization for the current selection."""
    if visualization is None:
        return message("No visualization file — start the explorer with --visualization-file FILE.py.")
    return html.Div([html.H4(visualization.title), visualization.render(cache.recording(selection.trial), selection)])


def register_analysis_callbacks(app: Dash, cache: ReaderCache,
                                locked: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Wire Analyze now; ``locked`` serializes it on the cache's lock. (The watch for analyses stored from
    elsewhere, ``analysis_state(cache, False, ...)``, runs in the explorer's live refresh.)"""
    # One callback per trigger: the live interval only looks (in the view's refresh, which also looks for new
    # steps), the button analyses. (In one callback, a click arriving with an interval tick could be read as
    # the tick.)
    def _analyze(_n_clicks: int, selection_data: dict[str, Any] | None, previous: dict[str, Any] | None
                 ) -> tuple[Any, Any]:
        return analysis_state(cache, True, selection_data, previous)
    app.callback(Output(ids.ANALYSES, "data", allow_duplicate=True), Output(ids.ANALYZE_STATUS, "children"),
                 Input(ids.ANALYZE, "n_clicks"), State(ids.SELECTION, "data"), State(ids.ANALYSES, "data"),
                 prevent_initial_call=True)(locked(_analyze))
