"""The explorer's page: selectors with prev/next buttons, the dependency graph, and the tabs.

Every option list, value and figure is filled in by the callbacks, so one code path decides what is
shown, whether on load, on a click or after the live recording grew. The one exception is the graph of
the first view, which the page carries itself (computed by the same callback functions), so it is drawn
without waiting for a round trip.
"""
from __future__ import annotations

from typing import Any

import dash_cytoscape as cyto
from dash import dcc, html

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.figures import ROLE_COLORS, graph_stylesheet, message_figure
from comgra_ndbg.gui.views import GRAPH_CONFIG
from comgra_ndbg.statistics import STATISTICS

__all__ = ["CSS", "build_layout", "index_string", "tensors_tab"]

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0; color: #222;
       background: #f6f7f9; font-size: 14px; }
.header { display: flex; align-items: baseline; gap: 16px; padding: 8px 16px; background: #1f2937; color: #fff; }
.header h1 { font-size: 17px; margin: 0; font-weight: 600; }
.header .path { color: #cbd5e1; font-size: 12px; }
.header .status { margin-left: auto; font-size: 12px; color: #e5e7eb; }
.controls { display: flex; flex-wrap: wrap; gap: 6px 18px; padding: 8px 16px; background: #fff;
            border-bottom: 1px solid #e5e7eb; align-items: center; }
.selector { display: flex; align-items: center; gap: 4px; }
.selector label { font-size: 12px; color: #555; margin-right: 2px; }
.selector .dropdown { width: 150px; }
.selector .dropdown.wide { width: 230px; }
.stepper { border: 1px solid #cbd5e1; background: #f8fafc; border-radius: 4px; cursor: pointer; padding: 2px 7px;
           font-size: 12px; line-height: 18px; }
.stepper:hover { background: #e2e8f0; }
.step-row { display: flex; align-items: center; gap: 8px; padding: 4px 16px 8px; background: #fff;
            border-bottom: 1px solid #e5e7eb; }
.step-row .slider { flex: 1; }
.step-label { min-width: 190px; font-size: 13px; font-weight: 600; }
.main { display: flex; gap: 12px; padding: 12px 16px; }
.left { flex: 0 0 40%; min-width: 360px; background: #fff; border: 1px solid #e5e7eb; border-radius: 6px;
        padding: 8px; }
.right { flex: 1; min-width: 0; background: #fff; border: 1px solid #e5e7eb; border-radius: 6px; padding: 8px; }
.legend { font-size: 11px; color: #555; display: flex; flex-wrap: wrap; gap: 10px; margin-top: 4px; }
.legend span.dot { display: inline-block; width: 10px; height: 10px; border-radius: 5px; margin-right: 3px; }
.tensor-header { font-weight: 600; margin: 6px 0; }
.row { display: flex; gap: 12px; align-items: flex-start; }
.row > .half { flex: 1; min-width: 0; }
.data-table { border-collapse: collapse; font-size: 12px; }
.data-table th, .data-table td { border-bottom: 1px solid #eee; padding: 2px 8px; text-align: left; }
.data-table th { background: #f1f5f9; font-weight: 600; }
.data-table td:nth-child(n+2) { font-variant-numeric: tabular-nums; }
.message { color: #555; padding: 12px; font-style: italic; }
.message.error { color: #b91c1c; font-style: normal; white-space: pre-wrap; font-family: monospace; }
.values-controls { display: flex; gap: 12px; align-items: center; font-size: 12px; }
.message.warning { color: #92400e; background: #fef3c7; font-style: normal; border-radius: 4px; }
.message.healthy { color: #166534; background: #dcfce7; font-style: normal; border-radius: 4px; }
.analyze { border: 1px solid #1f2937; background: #1f2937; color: #fff; border-radius: 4px; padding: 3px 10px;
           cursor: pointer; font-size: 12px; }
.analyze-status { font-size: 12px; color: #555; }
.hypothesis { border: 1px solid #e5e7eb; border-left: 4px solid #F28C28; border-radius: 4px; padding: 6px 10px;
              margin: 6px 0; cursor: pointer; }
.hypothesis:hover, .event-row:hover { background: #fff7ed; }
.hypothesis.current { border-left-color: #D62728; background: #fff1f2; }
.hypothesis-head { display: flex; align-items: center; gap: 8px; }
.hypothesis .rank { font-weight: 700; min-width: 24px; }
.hypothesis .bar { display: inline-block; width: 60px; height: 8px; background: #e5e7eb; border-radius: 4px;
                   overflow: hidden; flex: 0 0 60px; }
.hypothesis .bar span { display: block; height: 100%; background: #D62728; }
.hypothesis .percent { font-variant-numeric: tabular-nums; min-width: 36px; font-weight: 600; }
.hypothesis .sentence { font-weight: 600; }
.hypothesis .facts { font-size: 12px; color: #555; margin: 2px 0 2px 32px; }
.hypothesis .remedy { font-size: 13px; margin: 4px 0 4px 32px; color: #065f46; }
.hypothesis .chain { font-size: 12px; margin-left: 32px; font-family: monospace; color: #374151; }
.event-row { cursor: pointer; }
.event-row.current td { background: #fff1f2; }
"""

ROLE_LEGEND = ("input", "target", "parameter", "intermediate", "output", "loss")


def index_string(title: str) -> str:
    """Dash's page template with the explorer's stylesheet inlined (no asset folder to install)."""
    return ("<!DOCTYPE html><html><head>{%metas%}<title>" + title + "</title>{%favicon%}{%css%}<style>" + CSS
            + "</style></head><body>{%app_entry%}<footer>{%config%}{%scripts%}{%renderer%}</footer></body></html>")


def _stepper(selector: str, delta: int) -> html.Button:
    return html.Button("◀" if delta < 0 else "▶", id=ids.stepper(selector, delta), className="stepper",
                       n_clicks=0, title=f"{'previous' if delta < 0 else 'next'} {selector.replace('_', ' ')}")


def _selector(label: str, selector: str, component_id: str, *, wide: bool = False) -> html.Div:
    return html.Div([
        html.Label(label, htmlFor=component_id),
        _stepper(selector, -1),
        dcc.Dropdown(id=component_id, options=[], value=None, clearable=False,
                     className="dropdown wide" if wide else "dropdown"),
        _stepper(selector, +1),
    ], className="selector")


def _legend() -> html.Div:
    notes = ["blue ring: dependency · red ring: dependent",
             "orange halo: events · red halo: origin of the top hypothesis"]
    return html.Div([html.Span([html.Span(className="dot", style={"background": ROLE_COLORS[r]}), r])
                     for r in ROLE_LEGEND] + [html.Span(note) for note in notes],
                    className="legend")


def tensors_tab() -> html.Div:
    """The Tensors tab's body. It is inserted by a callback after the first paint: its plotly graphs load
    plotly.js, which would otherwise hold back the first drawing of the whole page, graph included."""
    return html.Div([
        html.Div(id=ids.TENSOR_HEADER, className="tensor-header"),
        html.Div([
            html.Div(html.Div(id=ids.STATS_TABLE), className="half", style={"flex": "0 0 230px"}),
            html.Div(dcc.Graph(id=ids.HISTOGRAM, figure=message_figure(""), style={"height": "300px"},
                               config=GRAPH_CONFIG), className="half"),
        ], className="row"),
        html.Div(dcc.Graph(id=ids.TIMELINE, figure=message_figure(""), style={"height": "260px"},
                           config=GRAPH_CONFIG), id=ids.TIMELINE_BOX),
        html.Div([
            html.Div([
                dcc.RadioItems(id=ids.VALUES_MODE, options=[{"label": "heatmap", "value": "heatmap"},
                                                            {"label": "table", "value": "table"}],
                               value="heatmap", inline=True),
                html.Label("page", htmlFor=ids.VALUES_PAGE),
                dcc.Input(id=ids.VALUES_PAGE, type="number", min=1, step=1, value=1, style={"width": "70px"}),
            ], className="values-controls"),
            html.Div(id=ids.VALUES),
        ]),
    ])


def _diagnosis_tab() -> html.Div:
    return html.Div([
        html.Div([html.Button("Analyze now", id=ids.ANALYZE, n_clicks=0, className="analyze",
                              title="run comgra_ndbg.analyze on this trial and store the results"),
                  dcc.Loading(html.Span(id=ids.ANALYZE_STATUS, className="analyze-status"), type="dot",
                              parent_style={"display": "inline-block", "minWidth": "60px"})],
                 className="values-controls", style={"marginTop": "8px"}),
        html.Div(id=ids.DIAGNOSIS),
    ])


def _compare_tab(trials: list[str]) -> html.Div:
    return html.Div([
        html.Div([
            dcc.RadioItems(id=ids.COMPARE_MODE, options=[{"label": "another step", "value": "step"},
                                                         {"label": "another trial", "value": "trial"}],
                           value="step" if len(trials) < 2 else "trial", inline=True),
            html.Label("trial", htmlFor=ids.COMPARE_TRIAL),
            dcc.Dropdown(id=ids.COMPARE_TRIAL, options=trials, value=trials[min(1, len(trials) - 1)], clearable=False,
                         className="dropdown", style={"width": "160px"}),
            html.Label("step", htmlFor=ids.COMPARE_STEP),
            dcc.Input(id=ids.COMPARE_STEP, type="number", value=0, debounce=True, style={"width": "90px"}),
        ], className="values-controls"),
        html.Div(id=ids.COMPARE),
    ])


def build_layout(trials: list[str], *, title: str, source: str, interval_ms: int, has_custom: bool,
                 graph: dict[str, Any] | None = None, generations: dict[str, int] | None = None,
                 analyses: dict[str, str | None] | None = None, notices: list[str] | None = None) -> html.Div:
    """The whole page. ``interval_ms`` is how often the live recording is checked for new steps.

    ``graph`` (``elements``, ``stylesheet``, ``key``) paints the graph with the page itself, before any
    callback answered; ``generations`` and ``analyses`` are the trials' generations and stored analyses'
    stamps the page starts from. ``notices`` are sentences shown above everything (trials that could not
    be opened at all, and why).
    """
    graph = graph or {"elements": [], "stylesheet": graph_stylesheet(None), "key": None}
    tabs = [
        dcc.Tab(label="Tensors", value=ids.TAB_TENSORS, children=html.Div(id=ids.TENSORS_BODY)),
        dcc.Tab(label="Diagnosis", value=ids.TAB_DIAGNOSIS, children=_diagnosis_tab()),
        dcc.Tab(label="KPIs", value=ids.TAB_KPIS, children=html.Div(id=ids.KPIS)),
        dcc.Tab(label="Notes & problems", value=ids.TAB_NOTES, children=html.Div(id=ids.NOTES)),
        dcc.Tab(label="Network", value=ids.TAB_NETWORK, children=html.Div(id=ids.NETWORK)),
        dcc.Tab(label="Compare", value=ids.TAB_COMPARE, children=_compare_tab(trials)),
        dcc.Tab(label="Custom", value=ids.TAB_CUSTOM, children=html.Div(id=ids.CUSTOM), disabled=not has_custom),
    ]
    return html.Div([
        dcc.Store(id=ids.SELECTION, data=None),
        dcc.Store(id=ids.GENERATION, data=generations or {}),
        dcc.Store(id=ids.ANALYSES, data=analyses or {}),
        dcc.Store(id=ids.GRAPH_KEY, data=graph["key"]),
        dcc.Store(id=ids.TIMELINE_KEY, data=None),
        dcc.Interval(id=ids.INTERVAL, interval=interval_ms, n_intervals=0),
        html.Div([html.H1(title), html.Span(source, className="path"), html.Span(id=ids.STATUS, className="status")],
                 className="header"),
        *[html.Div(text, className="message error") for text in notices or ()],
        html.Div([
            _selector("trial", "trial", ids.TRIAL),
            _selector("step type", "step_type", ids.STEP_TYPE),
            _selector("iteration", "iteration", ids.ITERATION),
            _selector("node", "node", ids.NODE, wide=True),
            _selector("tensor", "tensor", ids.TENSOR),
            _selector("kind", "kind", ids.KIND),
            _selector("sample", "sample", ids.SAMPLE),
            html.Div([html.Label("timeline statistic", htmlFor=ids.STAT),
                      dcc.Dropdown(id=ids.STAT, options=list(STATISTICS), value="mean", clearable=False,
                                   className="dropdown")], className="selector"),
        ], className="controls"),
        html.Div([
            _stepper("step", -1),
            html.Div(dcc.Slider(id=ids.STEP, min=0, max=0, step=1, value=0, marks=None, updatemode="mouseup",
                                allow_direct_input=False), className="slider"),
            _stepper("step", +1),
            html.Span(id=ids.STEP_LABEL, className="step-label"),
        ], className="step-row"),
        html.Div([
            html.Div([
                cyto.Cytoscape(id=ids.GRAPH, elements=graph["elements"],
                               layout={"name": "preset", "fit": True, "padding": 30},
                               stylesheet=graph["stylesheet"], style={"width": "100%", "height": "560px"},
                               minZoom=0.1, maxZoom=4, userZoomingEnabled=True, userPanningEnabled=True,
                               autoungrabify=True, boxSelectionEnabled=False),
                _legend(),
                html.Div([html.Label("collapse parameters of modules", htmlFor=ids.COLLAPSE),
                          dcc.Dropdown(id=ids.COLLAPSE, options=[], value=[], multi=True,
                                       placeholder="expanded: one node per module")],
                         style={"marginTop": "8px"}),
            ], className="left"),
            html.Div(dcc.Tabs(id=ids.TABS, value=ids.TAB_TENSORS, children=tabs), className="right"),
        ], className="main"),
    ])
