"""The views of one selection, as plain functions of (cache, selection, options): the graph's elements and
browser-side state, the tensor panel, the timeline and the distribution over steps.

Each returns figure dicts, element lists or components; the view callback decides which of them
changed and sends only those. Where only the step moved, :func:`timeline_shapes` gives the marks to patch
into the timeline already drawn, so 10,000 points are never sent again to move a line.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from dash import html

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.cyto import graph_elements, heat_colours, item_marks, item_values
from comgra_ndbg.gui.evidence import evidence_marks, focus_of
from comgra_ndbg.gui.figures import (as_matrix, bar_colour, distribution_figure, histogram_bins, message_figure,
                                     statistics_rows, value_rows)
from comgra_ndbg.gui.overview import colour_label, distribution, node_matrix
from comgra_ndbg.gui.queries import element_values, evidence_statistic, node_events, statistics_at, trace_curves
from comgra_ndbg.gui.selection import tensor_label
from comgra_ndbg.gui.state import ReaderCache, Selection, ViewOptions
from comgra_ndbg.gui.tabs import thresholds_of
from comgra_ndbg.gui.timelines import EvidenceMarks, event_shapes, evidence_shapes, step_marker, timeline_figure
from comgra_ndbg.gui.value_image import value_image
from comgra_ndbg.gui.views import histogram_view, markdown_table, message, table, value_view

__all__ = ["HEATMAP_LIMIT", "distribution_view", "graph_state", "graph_view", "kind_label", "no_snapshot_text",
           "tensor_header", "tensor_panel", "timeline_evidence", "timeline_shapes", "timeline_view"]

HEATMAP_LIMIT = 65_536  # cells above which element values are shown as a table


def kind_label(kind: str) -> str:
    """A kind as the selectors show it.

    >>> [kind_label(k) for k in ("value", "grad", "grad:aux", "update")]
    ['value', 'gradient', 'gradient (aux)', 'update']
    """
    if kind == "grad":
        return "gradient"
    if kind.startswith("grad:"):
        return f"gradient ({kind[5:]})"
    return kind


# ---- graph ---------------------------------------------------------------------------------------------
def graph_view(cache: ReaderCache, selection: Selection, options: ViewOptions) -> dict[str, Any]:
    """The drawn graph: ``elements`` (diagnosis marks included), the ``search`` options (every node, in
    reading order) and a ``note`` on what is left out."""
    drawn = cache.drawn(selection.trial, selection.step_type, selection.boxes, show_implied=options.show_implied,
                        show_unused=options.show_unused)
    if drawn is None:
        return {"elements": [], "search": [], "note": "No dependency graph was recorded for this step type."}
    stored = cache.readable_diagnosis(selection.trial)
    marks = {}
    if stored is not None:
        top = stored.diagnosis.top
        marks = item_marks(drawn.view, stored.diagnosis.events, top.node if top is not None else None)
    view = drawn.view
    notes = [f"{len(view.items)} drawn of {len(drawn.order)} nodes, {len(drawn.collapsed)} module boxes collapsed"]
    if view.implied:
        notes.append(f"{view.implied} edges implied by longer paths not drawn (residual skips; ancestors are kept)")
    if view.unused:
        notes.append(f"{len(view.unused)} unused parameter nodes {'drawn' if options.show_unused else 'not drawn'}")
    return {"elements": graph_elements(view, drawn.positions, marks),
            "search": [{"label": name, "value": name} for name in drawn.order], "note": " · ".join(notes)}


def graph_state(cache: ReaderCache, selection: Selection, options: ViewOptions, *, centre: bool,
                fit: str | None = None) -> tuple[dict[str, Any], Any]:
    """``(state, scale)``: what the browser applies to the drawn graph — the item showing the selected node,
    the colour of every item when colouring by a statistic at the step, whether to centre on the selection
    — and the colour scale's legend. ``fit`` names a frame just opened, which the view then fills (else a
    new graph is fitted whole)."""
    drawn = cache.drawn(selection.trial, selection.step_type, selection.boxes, show_implied=options.show_implied,
                        show_unused=options.show_unused)
    if drawn is None:
        return {"selected": None, "colours": None, "centre": False, "fit": None}, ""
    selected = drawn.view.shown_as.get(selection.node) if selection.node else None
    colours, scale = None, ""
    if options.colour != "role":
        matrix = node_matrix(cache, selection.trial, drawn.order, options.colour)
        values = item_values(drawn.view, matrix.at(selection.step), log=matrix.log)
        colours = heat_colours(values, [i.id for i in drawn.view.items], matrix.low, matrix.high, log=matrix.log)
        low, high = (f"10^{matrix.low:.1f}", f"10^{matrix.high:.1f}") if matrix.log else (f"{matrix.low:.3g}",
                                                                                          f"{matrix.high:.3g}")
        scale = [f"{colour_label(options.colour)} at step {selection.step}:", f" {low}",
                 _scale_bar(), f"{high} (1st–99th percentile over the run) · grey: not recorded"]
    return {"selected": selected, "colours": colours, "centre": centre, "fit": fit}, scale


def _scale_bar() -> Any:
    return html.Span(className="bar")


# ---- tensor panel --------------------------------------------------------------------------------------
def missing_statistics_text(cache: ReaderCache, selection: Selection, where: str) -> str:
    """Why the selection has no statistics at its step; for a statistic the statistic tiers record at some
    steps only (a parameter update; a module output or its gradient, absent at sentinel steps), the nearest
    steps that have one."""
    text = f"No statistics of {selection.tensor} ({selection.kind}) at step {selection.step}, {where}."
    if selection.sample is not None:
        return text
    steps, _ = cache.series_rows(selection.trial, selection.tensor, selection.kind, selection.iteration)
    before, after = steps[steps < selection.step], steps[steps > selection.step]
    near = [f"{int(before[-1])}" if len(before) else "", f"{int(after[0])}" if len(after) else ""]
    nearest = " and ".join(n for n in near if n)
    if selection.kind == "update":
        if not nearest:
            return text
        return (text + " Its update was measured at other steps (the statistic tiers measure updates periodically "
                "and where something changed): nearest " + nearest + ".")
    if not (len(before) and len(after)):
        return text
    return (text + " It was recorded at other steps (between the steps the statistic tiers measure in full, "
            "sentinel steps record only the parameters' values and gradients): nearest " + nearest + ".")


def tensor_panel(cache: ReaderCache, selection: Selection, options: ViewOptions) -> dict[str, Any]:
    """The Tensors tab's header, statistics table, histogram and element values for the selection."""
    theme = options.theme
    if selection.tensor is None or selection.kind is None or selection.step is None:
        text = "Nothing recorded to show: no tensor or no recorded step in this trial."
        return {"header": text, "stats": message(text), "histogram": message(text, element_id=ids.HISTOGRAM_NOTE),
                "values": ""}
    where = "whole batch" if selection.sample is None else f"sample {selection.sample}"
    header = tensor_header(cache, selection)
    label = tensor_label(selection.tensor, selection.node or _tensor_info(cache, selection).node)
    stats = statistics_at(cache, selection)
    rows = statistics_rows(stats) if stats is not None else None
    stats_view = (markdown_table(("statistic", "value"), rows, table_id=ids.STATS_TABLE + "-table")
                  if rows is not None else message(missing_statistics_text(cache, selection, where)))
    snapshot = cache.snapshot(selection.trial, selection.tensor, selection.kind, selection.step,
                              selection.iteration)
    values = element_values(snapshot, selection.sample) if snapshot is not None else None
    if values is None:
        text = no_snapshot_text(cache, selection)
        return {"header": header, "stats": stats_view,
                "histogram": message(text, element_id=ids.HISTOGRAM_NOTE),
                "values": message(text, element_id=ids.VALUES_NOTE)}
    title = f"{label} {kind_label(selection.kind)} · step {selection.step} · {where}"
    bins = histogram_bins(values.values)
    histogram = (histogram_view(bins, title=title, colour=bar_colour(theme)) if bins.finite else
                 message(bins.caption(title), element_id=ids.HISTOGRAM_NOTE))
    if options.values_mode != "table" and values.dense.size <= HEATMAP_LIMIT:
        by_sample = values.first_axis is not None and values.dense.ndim == 2
        matrix = as_matrix(values.dense)
        values_view: Any = value_view(value_image(matrix), title=f"element values · {values.dense.shape}",
                                      row_label="sample" if by_sample else "row", column_label="index",
                                      row_names=[int(i) for i in values.first_axis] if by_sample else None,
                                      height=min(max(18 * len(matrix), 24), 320))
    else:
        page = max(int(options.values_page or 1), 1)
        rows, pages = value_rows(values.values, values.shape, values.positions, page=page - 1,
                                 first_axis=values.first_axis)
        values_view = [table(("position", "value"), rows, table_id=ids.VALUES + "-table"),
                       message(f"page {min(page, pages)} of {pages} · {len(values.values)} stored values")]
    return {"header": header, "stats": stats_view, "histogram": histogram,
            "values": values_view}


def _tensor_info(cache: ReaderCache, selection: Selection) -> Any:
    return next(t for t in cache.recording(selection.trial).tensors if t.name == selection.tensor)


def tensor_header(cache: ReaderCache, selection: Selection) -> str:
    """The line above the tensor panel: node, tensor, kind, step, iteration, sample, shape."""
    info = _tensor_info(cache, selection)
    where = "whole batch" if selection.sample is None else f"sample {selection.sample}"
    label = tensor_label(selection.tensor or "", selection.node or info.node)
    return (f"{selection.node} / {label} · {kind_label(selection.kind or '')} · step {selection.step} "
            f"({selection.step_type}) · iteration {selection.iteration} · {where} · shape {info.shape} "
            f"{info.dtype}")


def no_snapshot_text(cache: ReaderCache, selection: Selection) -> str:
    """Why there are no element values, and where the nearest snapshots are."""
    assert selection.tensor is not None and selection.kind is not None and selection.step is not None
    steps = np.sort(cache.snapshot_steps(selection.trial, selection.tensor, selection.kind))
    if not len(steps):
        return f"No snapshot of {selection.tensor} ({selection.kind}) was recorded in this trial."
    position = int(np.searchsorted(steps, selection.step))
    near = sorted({int(steps[i]) for i in (position - 1, position) if 0 <= i < len(steps)})
    if selection.step in steps and selection.sample is not None:
        return f"Sample {selection.sample} was not stored in the snapshot of step {selection.step}."
    return (f"No snapshot at step {selection.step} (iteration {selection.iteration}); nearest snapshots at "
            f"step {' and '.join(map(str, near))} — Shift+← / Shift+→ or the snapshot buttons go there.")


# ---- timeline ------------------------------------------------------------------------------------------
def timeline_evidence(cache: ReaderCache, selection: Selection, options: ViewOptions) -> EvidenceMarks | None:
    """The marks of the chosen item's evidence when the timeline shows the series its rule fired on (the
    node, kind and statistic of its evidence); None otherwise."""
    if not options.focus:
        return None
    stored = cache.readable_diagnosis(selection.trial)
    chosen = focus_of(stored.diagnosis if stored is not None else None, options.focus)
    if chosen is None or chosen.evidence is None:
        return None
    named = evidence_statistic(chosen.evidence.series)
    if named != (selection.node, selection.kind, selection.stat):
        return None
    marks = evidence_marks(chosen.event, chosen.evidence, thresholds_of(cache, selection.trial))
    if "÷" in chosen.evidence.series:  # the timeline shows the numerator: onset and span only
        return EvidenceMarks(marks.onset, marks.end, (), (), float("nan"))
    return marks


def timeline_view(cache: ReaderCache, selection: Selection, options: ViewOptions,
                  x_range: tuple[float, float] | None = None) -> dict[str, Any]:
    """The timeline of the selected tensor's statistic (with the overlaid nodes and trials), the node's
    events and the chosen evidence marked; with ``x_range`` zoomed to those steps, in the detail of that
    range."""
    theme = options.theme
    if selection.tensor is None or selection.kind is None:
        return message_figure("no tensor selected", theme=theme)
    curves, notes = trace_curves(cache, selection, options.overlay_nodes, options.overlay_trials)
    if not any(len(steps) for steps, _ in curves.values()):
        return message_figure(f"{selection.tensor} ({selection.kind}) has no summaries", theme=theme)
    title = (f"{selection.stat} of {selection.tensor} ({kind_label(selection.kind)}) over steps · click to select"
             + (f" · not drawn: {'; '.join(notes)}" if notes else ""))
    return timeline_figure(curves, title=title, y_label=selection.stat, step=selection.step,
                           events=node_events(cache, selection), log_y=options.log_y, smoothing=options.ema,
                           evidence=timeline_evidence(cache, selection, options), theme=theme, x_range=x_range)


def timeline_shapes(cache: ReaderCache, selection: Selection, options: ViewOptions) -> list[dict[str, Any]]:
    """The shapes of the timeline for the current step (marker, event lines, evidence), to patch in."""
    evidence = timeline_evidence(cache, selection, options)
    return (step_marker(selection.step, options.theme) + event_shapes(node_events(cache, selection))
            + (evidence_shapes(evidence)[0] if evidence is not None else []))


def distribution_view(cache: ReaderCache, selection: Selection, options: ViewOptions) -> dict[str, Any]:
    """The histograms of the selected tensor's snapshots over the steps, as a heatmap."""
    found = distribution(cache, selection)
    if found is None:
        return message_figure("the distribution over steps needs snapshots at two steps or more",
                              theme=options.theme)
    where = "whole batch" if selection.sample is None else f"sample {selection.sample}"
    title = (f"distribution of {selection.tensor} ({kind_label(selection.kind or '')}, {where}) over "
             f"{len(found.steps)} snapshot steps")
    if found.nonfinite.any():
        title += f" · {int(found.nonfinite.sum())} non-finite values not binned"
    return distribution_figure(found.steps, found.edges, found.counts, title=title, step=selection.step,
                               theme=options.theme)
