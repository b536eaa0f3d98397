"""The explorer's page: selectors with prev/next buttons, the step row, the graph with its toolbar, the tabs.

Every option list, value and figure is filled in by one callback (:mod:`comgra_ndbg.gui.callbacks`), so
one code path decides what is shown, whether on load (from the page's address), on a click or after the
live recording grew. Every component is on the page from the start, so that callback can answer any
action with one request.
"""
from __future__ import annotations

from typing import Any

import dash_cytoscape as cyto
from dash import dcc, html

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.clientside import CLIENT_STORES
from comgra_ndbg.gui.cyto import ROLE_COLORS, graph_stylesheet
from comgra_ndbg.gui.overview import COLOURS
from comgra_ndbg.gui.views import histogram_panel, plot
from comgra_ndbg.stats.statistics import STATISTICS

__all__ = ["build_layout"]

ROLE_LEGEND = ("input", "target", "parameter", "intermediate", "output", "loss")


def _stepper(selector: str, delta: int, text: str | None = None, hint: str = "") -> html.Button:
    label = selector.replace("_", " ")
    return html.Button(text or ("◀" if delta < 0 else "▶"), id=ids.stepper(selector, delta), className="stepper",
                       n_clicks=0, title=hint or f"{'previous' if delta < 0 else 'next'} {label}")


def _selector(label: str, selector: str, component_id: str, *, wide: bool = False, shown: bool = True) -> html.Div:
    return html.Div(style=None if shown else {"display": "none"}, children=[
        html.Label(label, htmlFor=component_id),
        _stepper(selector, -1),
        dcc.Dropdown(id=component_id, options=[], value=None, clearable=False,
                     className="dropdown wide" if wide else "dropdown"),
        _stepper(selector, +1),
    ], className="selector")


def _legend() -> html.Div:
    notes = ["blue ring: dependency · red ring: dependent", "orange halo: events · red halo: origin of the top "
             "hypothesis", "grey box: a module, click to open (click its frame to close)",
             "purple: into a later iteration (dotted: fed back)"]
    return html.Div([html.Span([html.Span(className="dot", style={"background": ROLE_COLORS[r]}), r])
                     for r in ROLE_LEGEND] + [html.Span(note) for note in notes], className="legend")


def _graph_panel() -> html.Div:
    return html.Div([
        html.Div([
            dcc.Dropdown(id=ids.GRAPH_SEARCH, options=[], value=None, placeholder="find a node…", clearable=True,
                         className="search"),
            html.Button("Fit", id=ids.GRAPH_FIT, n_clicks=0, className="tool", title="fit the graph (F)"),
            html.Button("Centre", id=ids.GRAPH_CENTRE, n_clicks=0, className="tool",
                        title="centre on the selected node (C)"),
            html.Button("Open all", id=ids.GRAPH_EXPAND, n_clicks=0, className="tool", title="open every module box"),
            html.Button("First view", id=ids.GRAPH_DEFAULT, n_clicks=0, className="tool",
                        title="the module boxes of the first view"),
            html.Label("colour", htmlFor=ids.COLOUR),
            dcc.Dropdown(id=ids.COLOUR, options=[{"label": v, "value": k} for k, v in COLOURS.items()],
                         value="role", clearable=False, className="colour"),
            dcc.Checklist(id=ids.GRAPH_OPTIONS, options=[{"label": "implied edges", "value": "implied"},
                                                         {"label": "unused parameters", "value": "unused"}],
                          value=[], inline=True),
            html.Button("PNG", id=ids.export(ids.GRAPH, "png"), n_clicks=0, className="tool",
                        title="save the graph as a PNG image"),
            html.Button("CSV", id=ids.export(ids.GRAPH, "csv"), n_clicks=0, className="tool",
                        title="save the drawn nodes (and their colour values) as CSV"),
        ], className="toolbar"),
        dcc.Loading(cyto.Cytoscape(id=ids.GRAPH, elements=[], layout={"name": "preset", "fit": True, "padding": 24},
                                   stylesheet=graph_stylesheet("light"), className="graph-canvas",
                                   style={"width": "100%", "height": "560px"}, minZoom=0.05, maxZoom=4,
                                   userZoomingEnabled=True, userPanningEnabled=True, autoungrabify=True,
                                   autounselectify=True,
                                   boxSelectionEnabled=False, autoRefreshLayout=False),
                    type="circle", delay_show=400, parent_style={"position": "relative"}),
        html.Div(id=ids.GRAPH_HOVER, className="hover"),
        html.Div(id=ids.COLOUR_SCALE, className="scale"),
        _legend(),
        html.Div(id=ids.GRAPH_NOTE, className="legend"),
    ], className="left")


def _tensors_tab() -> html.Div:
    return html.Div([
        html.Div(id=ids.TENSOR_HEADER, className="tensor-header"),
        html.Div([
            html.Div(html.Div(id=ids.STATS_TABLE), style={"flex": "0 0 230px"}),
            html.Div(histogram_panel(), className="half"),
        ], className="row"),
        html.Div([
            dcc.Dropdown(id=ids.OVERLAY_NODES, options=[], value=[], multi=True, placeholder="overlay nodes…",
                         style={"minWidth": "220px", "flex": "1"}),
            dcc.Dropdown(id=ids.OVERLAY_TRIALS, options=[], value=[], multi=True, placeholder="overlay trials…",
                         style={"minWidth": "160px"}),
            dcc.Checklist(id=ids.TIMELINE_OPTIONS, options=[{"label": "log y", "value": "log"}], value=[],
                          inline=True),
            html.Label("EMA", htmlFor=ids.EMA),
            dcc.Input(id=ids.EMA, type="number", min=0, max=0.999, step=0.05, value=0, debounce=True,
                      style={"width": "70px"}, placeholder="0: off"),
        ], className="values-controls", style={"marginTop": "6px"}),
        html.Div(plot(ids.TIMELINE, 270), id=ids.TIMELINE_BOX),
        html.Div([
            html.Div([
                dcc.RadioItems(id=ids.VALUES_MODE, options=[{"label": "heatmap", "value": "heatmap"},
                                                            {"label": "table", "value": "table"}],
                               value="heatmap", inline=True),
                html.Label("page", htmlFor=ids.VALUES_PAGE),
                dcc.Input(id=ids.VALUES_PAGE, type="number", min=1, step=1, value=1, debounce=True,
                          style={"width": "70px"}),
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
        html.Div(id=ids.EVIDENCE),
        html.Div(id=ids.DIAGNOSIS),
    ])


def _layers_tab() -> html.Div:
    return html.Div([
        html.Div(id=ids.LAYERS_NOTE, className="message"),
        dcc.Loading([plot(ids.GRADIENT_FLOW, 320), plot(ids.UPDATE_RATIO, 320)], type="circle", delay_show=300),
    ])


def _compare_tab(trials: list[str]) -> html.Div:
    return html.Div([
        html.Div([
            dcc.RadioItems(id=ids.COMPARE_MODE, options=[{"label": "another step", "value": "step"},
                                                         {"label": "another trial", "value": "trial"}],
                           value="step", inline=True),
            html.Label("trial", htmlFor=ids.COMPARE_TRIAL),
            dcc.Dropdown(id=ids.COMPARE_TRIAL, options=trials, value=trials[min(1, len(trials) - 1)],
                         clearable=False, style={"width": "160px"}),
            html.Label("step", htmlFor=ids.COMPARE_STEP),
            dcc.Input(id=ids.COMPARE_STEP, type="number", value=None, debounce=True, style={"width": "90px"}),
        ], className="values-controls"),
        html.Div(id=ids.COMPARE),
    ])


def build_layout(trials: list[str], *, title: str, source: str, interval_ms: int, has_custom: bool,
                 generations: dict[str, int] | None = None, analyses: dict[str, str | None] | None = None,
                 notices: list[str] | None = None, ranked: bool = False, trial_controls: Any = None) -> html.Div:
    """The whole page. ``interval_ms`` is how often the live recording is checked for new steps;
    ``ranked`` shows the rank selector (some trial is a distributed run, ``gui/ranks.py``);
    ``generations`` and ``analyses`` are the trials' generations and stored analyses' stamps it starts from;
    ``notices`` are sentences shown above everything (trials that could not be opened at all, and why);
    ``trial_controls`` sort and filter the trial selector (:mod:`comgra_ndbg.gui.trials`)."""
    tabs = [
        dcc.Tab(label="Tensors", value=ids.TAB_TENSORS, children=_tensors_tab()),
        dcc.Tab(label="Distribution", value=ids.TAB_DISTRIBUTION,
                children=dcc.Loading(plot(ids.DISTRIBUTION, 420), type="circle", delay_show=300)),
        dcc.Tab(label="Diagnosis", value=ids.TAB_DIAGNOSIS, children=_diagnosis_tab()),
        dcc.Tab(label="Layers", value=ids.TAB_LAYERS, children=_layers_tab()),
        dcc.Tab(label="KPIs", value=ids.TAB_KPIS, children=html.Div(id=ids.KPIS)),
        dcc.Tab(label="Notes & problems", value=ids.TAB_NOTES, children=html.Div(id=ids.NOTES)),
        dcc.Tab(label="Network", value=ids.TAB_NETWORK, children=html.Div(id=ids.NETWORK)),
        dcc.Tab(label="Compare", value=ids.TAB_COMPARE, children=_compare_tab(trials)),
        dcc.Tab(label="Profile", value=ids.TAB_PROFILE, children=html.Div(id=ids.PROFILE)),
        dcc.Tab(label="Custom", value=ids.TAB_CUSTOM, children=html.Div(id=ids.CUSTOM), disabled=not has_custom),
    ]
    stores: list[Any] = [
        dcc.Store(id=ids.SELECTION, data=None),
        dcc.Store(id=ids.KEYS, data={}),
        dcc.Store(id=ids.ADDRESS, data=None),
        dcc.Store(id=ids.STEP_DATA, data=None),
        dcc.Store(id=ids.STEP_ASK, data=[]),  # not None: a store with no data reports one at mount, a request
        dcc.Store(id=ids.GRAPH_VIEW, data=None),
        dcc.Store(id=ids.TIMELINE_RANGE, data=None),
        dcc.Store(id=ids.NODE_NAMES, data=[]),
        *[dcc.Store(id=store, data=None) for store in CLIENT_STORES],
        dcc.Store(id=ids.GENERATION, data=generations or {}),
        dcc.Store(id=ids.ANALYSES, data=analyses or {}),
        dcc.Interval(id=ids.INTERVAL, interval=interval_ms, n_intervals=0),
    ]
    return html.Div(stores + [
        html.Div([html.H1(title), html.Span(source, className="path"), html.Span(id=ids.STATUS, className="status"),
                  dcc.RadioItems(id=ids.THEME, options=[{"label": "light", "value": "light"},
                                                        {"label": "dark", "value": "dark"}],
                                 value="light", inline=True, className="theme")], className="header"),
        *[html.Div(text, className="message error") for text in notices or ()],
        html.Div([
            _selector("trial", "trial", ids.TRIAL),
            _selector("rank", "rank", ids.RANK, shown=ranked),
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
        *([trial_controls] if trial_controls is not None else []),
        html.Div([
            html.Button("◀", id=ids.STEP_PREV, className="stepper", n_clicks=0, title="previous recorded step (←)"),
            html.Div(dcc.Slider(id=ids.STEP, min=0, max=0, step=1, value=0, marks=None, updatemode="mouseup",
                                allow_direct_input=False),
                     className="slider"),
            html.Button("▶", id=ids.STEP_NEXT, className="stepper", n_clicks=0, title="next recorded step (→)"),
            dcc.Input(id=ids.STEP_BOX, type="number", placeholder="go to step", debounce=True, className="step-box"),
            _stepper(ids.SNAPSHOT_STEPPER, -1, "◀ snapshot", "previous step with a snapshot (Shift+←)"),
            _stepper(ids.SNAPSHOT_STEPPER, +1, "snapshot ▶", "next step with a snapshot (Shift+→)"),
            html.Span(id=ids.STEP_LABEL, className="step-label"),
            dcc.Checklist(id=ids.FOLLOW, options=[{"label": "follow live", "value": "follow"}], value=["follow"],
                          inline=True),
        ], className="step-row"),
        html.Div([
            _graph_panel(),
            html.Div(dcc.Tabs(id=ids.TABS, value=ids.TAB_TENSORS, children=tabs), className="right"),
        ], className="main"),
    ])

