"""What the browser needs to show the steps around the current one without asking the server.

A step change moves the timeline's marker and changes what depends on the step: the tensor header, the
statistics table, the step label and box, the address, the histogram's "no snapshot" note and, when the
graph is coloured by a statistic, the colour of every drawn item. :func:`step_window` gives all of these for
a window of recorded steps around the current one, as the view sends them, so the page
(``clientside.SCRIPT``'s ``localStep``) shows a step of the window at once and asks the server only for a
step outside it, a step with a snapshot (its histogram and element values) or a view it cannot patch.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from comgra_ndbg.gui.figures import statistics_rows
from comgra_ndbg.gui.panels import graph_state, no_snapshot_text, tensor_header
from comgra_ndbg.gui.queries import statistics_at, statistics_over
from comgra_ndbg.gui.state import ReaderCache, Selection, ViewOptions
from comgra_ndbg.gui.urlstate import to_address
from comgra_ndbg.gui.views import markdown_text

__all__ = ["COLOUR_RADIUS", "RADIUS", "step_window"]

RADIUS = 32  # recorded steps on each side of the current one whose views are sent along
COLOUR_RADIUS = 8  # fewer when the graph is coloured by a statistic: each step then colours every drawn item


def step_window(cache: ReaderCache, selection: Selection, options: ViewOptions) -> dict[str, Any]:
    """The current step's position and, where the browser can show nearby steps itself, their views.

    Always: ``position`` and ``step`` (what the page shows now) and ``local`` (whether the rest is there).
    With ``local``: ``first`` (the position of ``steps[0]``), ``steps``, and per step ``stats`` (the
    statistics table's Markdown text) and ``note`` (the histogram's "no snapshot" text), each None where
    the server must draw that step (a snapshot, or no statistics); ``header`` and ``scale`` as the text
    before and after the step number; ``label_tail`` for the step label; ``address`` of the current view;
    ``snapshot_shown`` (the histogram shows a snapshot, not a note); and when the graph is coloured by a
    statistic, ``items`` and ``colours`` (per step, one colour per item) — else ``colours`` is None.
    """
    steps = cache.steps_of_type(selection.trial, selection.step_type) if selection.step_type is not None else []
    if selection.step is None or not len(steps):
        return {"position": 0, "step": None, "local": False}
    position = int(np.searchsorted(steps, selection.step))
    found: dict[str, Any] = {"position": position, "step": selection.step, "local": False}
    if options.tab != "tensors" or selection.tensor is None or selection.kind is None or selection.sample is not None:
        return found  # the other tabs and one sample's statistics (from its snapshots) are drawn by the server
    header = tensor_header(cache, selection).split(f" · step {selection.step} ", 1)
    if len(header) != 2:
        return found
    radius = RADIUS if options.colour == "role" else COLOUR_RADIUS
    first = max(position - radius, 0)
    window = [int(s) for s in steps[first:position + radius + 1]]
    snapshots = set(int(s) for s in cache.snapshot_steps(selection.trial, selection.tensor, selection.kind))
    stats, notes = [], []
    for step, values in zip(window, statistics_over(cache, selection, window)):
        values = values if step not in snapshots else None
        stats.append(markdown_text(("statistic", "value"), statistics_rows(values)) if values is not None else None)
        notes.append(no_snapshot_text(cache, dataclasses.replace(selection, step=step)) if values is not None else None)
    found.update(local=True, first=first, steps=window, stats=stats, note=notes, header=header,
                 label_tail=f" of {len(steps)} {selection.step_type} steps", address=to_address(selection, options),
                 snapshot_shown=cache.snapshot(selection.trial, selection.tensor, selection.kind, selection.step,
                                                   selection.iteration) is not None, stats_shown=statistics_at(cache, selection) is not None,
                 colours=None, scale=None)
    if options.colour != "role":
        state, scale = graph_state(cache, selection, options, centre=False)
        if state["colours"] and scale:
            items = list(state["colours"])
            found["items"] = items
            found["colours"] = [[(graph_state(cache, dataclasses.replace(selection, step=step), options,
                                              centre=False)[0]["colours"] or {}).get(item) for item in items]
                                for step in window]
            found["scale"] = re.split(rf"at step {selection.step}(?=:$)", scale[0])
    return found
