"""The Profile tab: per-layer time and memory bars at the selected step (the latest profiled step at or
before it), process memory over the steps, and the hot layers, which :func:`hot_layers` also hands to the
graph's stylesheet (``profile_figures.hot_layer_rules``). Reads ``Recording.profile()`` and the pure
``analysis.profile``; computes nothing the figures do not show."""
from __future__ import annotations

from typing import Any

import numpy as np
from dash import html

from comgra_ndbg.analysis.profile import ProfileReport, profile_report
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.profile_figures import hot_items, hot_layer_rules, layer_bars, memory_bars, process_figure
from comgra_ndbg.gui.state import ReaderCache, Selection, ViewOptions
from comgra_ndbg.gui.views import graph_of, message
from comgra_ndbg.store import schema
from comgra_ndbg.store.profile_reading import ProfileTables

__all__ = ["profile_tab", "hot_layers", "hot_layer_stylesheet", "PROFILE_TIME", "PROFILE_MEMORY", "PROFILE_PROCESS"]

PROFILE_TIME = f"{ids.PROFILE}-time"
PROFILE_MEMORY = f"{ids.PROFILE}-memory"
PROFILE_PROCESS = f"{ids.PROFILE}-process"


def _report(tables: ProfileTables) -> ProfileReport:
    return profile_report(tables.modules, tables.data, schema.PROFILE_FIELDS, tables.process_steps,
                          tables.process_field("rss"), tables.process_field("step_time"))


def hot_layers(cache: ReaderCache, trial: str) -> list[str]:
    """The trial's hot layers (time or memory), empty when it was recorded without ``profile=``; remembered
    per generation of the trial, as the graph's stylesheet asks again whenever a box opens or closes."""
    def compute(recording: Any) -> list[str]:
        tables = recording.profile()
        return [] if not len(tables.steps) else [layer.module for layer in _report(tables).hot]
    return list(cache.memo(trial, ("hot_layers",), compute))


def hot_layer_stylesheet(cache: ReaderCache, selection: Selection, options: ViewOptions) -> list[dict[str, Any]]:
    """Stylesheet rules ringing the trial's hot layers on the graph as drawn for ``selection`` (a hot layer
    inside a collapsed box rings the box); none without a profile."""
    hot = hot_layers(cache, selection.trial)
    drawn = cache.drawn(selection.trial, selection.step_type, selection.boxes, show_implied=options.show_implied,
                        show_unused=options.show_unused) if hot and selection.step_type is not None else None
    return hot_layer_rules(hot_items(drawn.view, hot) if drawn is not None else hot)


def shown_step(profiled: np.ndarray, step: int | None) -> int:
    """The profiled step the bars show: the latest at or before ``step``, else the first.

    >>> shown_step(np.array([0, 1, 2, 15]), 9), shown_step(np.array([3, 8]), 1), shown_step(np.array([3]), None)
    (2, 3, 3)
    """
    if step is None:
        return int(profiled[-1])
    before = profiled[profiled <= step]
    return int(before[-1]) if len(before) else int(profiled[0])


def profile_tab(cache: ReaderCache, selection: Selection, options: ViewOptions) -> Any:
    """The tab's content for the selected trial and step."""
    tables = cache.recording(selection.trial).profile()
    if tables.is_empty:
        return html.Div([message("This trial has no profile: record it with NeuralDbg(model, profile=True) or "
                                 "Recorder(..., profile=True) and profile_module(...) to see time and memory per "
                                 "layer here.")])
    report = _report(tables)
    parts: list[Any] = [html.Div("; ".join(report.notes()) or "No findings.", className="message",
                                 id=f"{ids.PROFILE}-note")]
    if len(tables.steps):
        step = shown_step(tables.steps, selection.step)
        row = tables.at(step)
        hot = {layer.module for layer in report.hot}
        time = np.nan_to_num(row[:, schema.PROFILE_FIELD["forward_time"]])
        if not np.isfinite(row[:, schema.PROFILE_FIELD["forward_time"]]).any():  # the FLOP-counting step
            others = ", ".join(str(s) for s in tables.steps[tables.steps != step][:5])
            parts.append(message(f"Step {step} counted FLOPs, which distorts its times: its bars are empty; pick "
                                 f"another profiled step ({others or 'none'})."))
        parts.append(graph_of(layer_bars(tables.modules, time, row[:, schema.PROFILE_FIELD["backward_time"]], step,
                                         hot, theme=options.theme), PROFILE_TIME, 360))
        parts.append(graph_of(memory_bars(tables.modules, row[:, schema.PROFILE_FIELD["saved_bytes"]],
                                          row[:, schema.PROFILE_FIELD["peak_delta"]], step, hot,
                                          theme=options.theme), PROFILE_MEMORY, 360))
    leaking = report.memory is not None and report.memory.leaking
    parts.append(graph_of(process_figure(tables.process_steps, tables.process_field("rss"),
                                         tables.process_field("device_allocated"), selection.step, leaking=leaking,
                                         theme=options.theme), PROFILE_PROCESS, 300))
    return html.Div(parts)
