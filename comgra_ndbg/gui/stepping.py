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

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.figures import format_number
from comgra_ndbg.gui.panels import graph_state, no_snapshot_text, tensor_header, tensor_panel
from comgra_ndbg.gui.queries import statistics_at, statistics_over
from comgra_ndbg.gui.state import ReaderCache, Selection, ViewOptions
from comgra_ndbg.gui.urlstate import to_address
from comgra_ndbg.gui.views import markdown_cell, markdown_text, message
from comgra_ndbg.stats.statistics import STATISTICS

__all__ = ["COLOUR_RADIUS", "RADIUS", "SNAPSHOTS", "step_window"]

RADIUS = 32  # recorded steps on each side of the current one whose views are sent along
SNAPSHOTS = 2  # the snapshots nearest the current step whose histogram and values are sent along
COLOUR_RADIUS = 8  # fewer when the graph is coloured by a statistic: each step then colours every drawn item


def step_window(cache: ReaderCache, selection: Selection, options: ViewOptions, *, nearby: bool = True
                ) -> dict[str, Any]:
    """The current step's position and, with ``nearby`` and where the browser can show nearby steps itself,
    their views.

    Always: ``position`` and ``step`` (what the page shows now) and ``local`` (whether the rest is there).
    With ``local``, for the recorded ``steps`` of the window (``first``: the slider position of the first):

    - the statistics table: ``head`` (its header lines), ``names`` (its first column) and per step ``stats``,
      the value of each name (None: not listed) — the table is ``head`` and a line ``| name | value |`` per
      listed value, the text :func:`~comgra_ndbg.gui.views.markdown_table` makes;
    - the histogram's note: ``notes`` (texts with the step as ``{step}``) and per step ``note``, an index;
    - ``panels``: at the :data:`SNAPSHOTS` snapshot steps nearest the current one, the histogram figure and
      the element values (components) the tensor panel draws there; None elsewhere; ``note_histogram`` and
      ``note_values``: the histogram's and values' notes with no text, to show in place of a snapshot;
    - ``stats`` is None at a step the server must draw (another snapshot, or no statistics), ``note`` there
      and at the steps of ``panels``;
    - ``header`` and ``scale``: the tensor header and the colour scale's first line, before and after the
      step number; ``label_tail``: the step label after the position; ``address``: the current view's;
    - ``snapshot_shown`` / ``stats_shown``: whether the page shows a snapshot's histogram / a table now;
    - when the graph is coloured by a statistic, ``items`` and per step ``colours`` (one per item); else
      ``colours`` is None.
    """
    steps = cache.steps_of_type(selection.trial, selection.step_type) if selection.step_type is not None else []
    if selection.step is None or not len(steps):
        return {"position": 0, "step": None, "local": False}
    position = int(np.searchsorted(steps, selection.step))
    found: dict[str, Any] = {"position": position, "step": selection.step, "local": False}
    if not nearby or options.tab != "tensors" or selection.tensor is None or selection.kind is None \
            or selection.sample is not None:
        return found  # the other tabs and one sample's statistics (from its snapshots) are drawn by the server
    header = tensor_header(cache, selection).split(f" · step {selection.step} ", 1)
    if len(header) != 2:
        return found
    radius = RADIUS if options.colour == "role" else COLOUR_RADIUS
    first = max(position - radius, 0)
    window = [int(s) for s in steps[first:position + radius + 1]]
    snapshots = set(int(s) for s in cache.snapshot_steps(selection.trial, selection.tensor, selection.kind))
    drawn = sorted((s for s in window if s in snapshots), key=lambda s: (abs(s - selection.step), s))[:SNAPSHOTS]
    panels = [_panel(cache, selection, options, step) if step in drawn else None for step in window]
    values = [None if step in snapshots and panel is None else v
              for step, panel, v in zip(window, panels, statistics_over(cache, selection, window))]
    names = [name for name in STATISTICS if any(v is not None and name in v for v in values)]
    notes: list[str] = []
    found.update(
        local=True, first=first, steps=window, head=markdown_text(("statistic", "value"), []),
        names=[markdown_cell(name) for name in names],
        stats=[None if v is None else [markdown_cell(format_number(v[n])) if n in v else None for n in names]
               for v in values],
        notes=notes,
        note=[None if v is None or panel is not None else _note(cache, selection, step, notes)
              for step, panel, v in zip(window, panels, values)],
        panels=panels, note_histogram=message("", element_id=ids.HISTOGRAM_NOTE),
        note_values=message("", element_id=ids.VALUES_NOTE),
        header=header, label_tail=f" of {len(steps)} {selection.step_type} steps",
        address=to_address(selection, options), colours=None, scale=None,
        snapshot_shown=cache.snapshot(selection.trial, selection.tensor, selection.kind, selection.step,
                                      selection.iteration) is not None,
        stats_shown=statistics_at(cache, selection) is not None)
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


def _panel(cache: ReaderCache, selection: Selection, options: ViewOptions, step: int) -> dict[str, Any] | None:
    """The histogram and element values of the snapshot at ``step`` as the tensor panel draws them (None
    where it draws a note instead)."""
    panel = tensor_panel(cache, dataclasses.replace(selection, step=step), options)
    drawn = getattr(panel["histogram"], "id", None) != ids.HISTOGRAM_NOTE
    return {"histogram": panel["histogram"], "values": panel["values"]} if drawn else None


def _note(cache: ReaderCache, selection: Selection, step: int, notes: list[str]) -> int:
    """The index in ``notes`` (added to when new) of the histogram's note at ``step``, the step as ``{step}``."""
    text = no_snapshot_text(cache, dataclasses.replace(selection, step=step))
    template = text.replace(f" step {step} ", " step {step} ", 1)
    template = template if template.replace("{step}", str(step), 1) == text else text
    if template not in notes:
        notes.append(template)
    return notes.index(template)
