"""The timeline's zoom: a zoom or pan of the timeline in the browser asks for the zoomed range of steps, and
the server answers with the timeline of that range, each line reduced over that range only.

A long run is sent reduced (:data:`~comgra_ndbg.gui.timelines.MAX_POINTS` per line) with every node tap, so
its detail arrives as the user zooms into it rather than all at once. The browser side (``zoomRange`` in
:mod:`comgra_ndbg.gui.clientside`) turns plotly.js's relayout events into the range store this reads.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from dash import Dash, Input, Output, State, no_update

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.panels import timeline_view
from comgra_ndbg.gui.state import ReaderCache, Selection, ViewOptions

__all__ = ["register_zoom", "zoom_timeline"]


def zoom_timeline(cache: ReaderCache, x_range: Any, store: dict[str, Any] | None) -> Any:
    """The timeline of the current selection zoomed to ``x_range`` (``[low, high]`` steps), each line reduced
    over that range only, or the whole run again for any other value (``"all"``: the zoom was reset);
    ``no_update`` while nothing was zoomed (``None``: the page only reports its empty store) or before a
    first view.

    The figure is sent in the reduced form (:data:`~comgra_ndbg.gui.timelines.MAX_POINTS` per line), so the
    detail of a long run arrives as the user zooms into it rather than all at once with every node tap."""
    if x_range is None or not store or not store.get("selection"):
        return no_update
    selection = Selection.from_dict(store["selection"])
    options = ViewOptions.from_dict(store.get("options"))
    if selection.trial not in cache.trial_keys():
        return no_update
    shown = None
    if isinstance(x_range, (list, tuple)) and len(x_range) == 2:
        try:
            low, high = sorted(float(x) for x in x_range)
        except (TypeError, ValueError):
            low, high = float("nan"), float("nan")
        shown = (low, high) if np.isfinite(low) and np.isfinite(high) and high > low else None
    return timeline_view(cache, selection, options, shown)


def register_zoom(app: Dash, cache: ReaderCache, locked: Callable[[Callable[..., Any]], Callable[..., Any]]
                  ) -> None:
    """Wire :func:`zoom_timeline` to the range store, serialized on the cache's lock like every callback."""
    app.callback(Output(ids.TIMELINE, "figure", allow_duplicate=True), Input(ids.TIMELINE_RANGE, "data"),
                 State(ids.SELECTION, "data"), prevent_initial_call=True)(
        locked(lambda x_range, store: zoom_timeline(cache, x_range, store)))
