"""Build and serve the explorer: ``create_app(path)`` returns a Dash 4 app over a recording.

``path`` is a group folder (its trials are selectable), a trial folder or one recording file. The app
keeps one cached reader per trial (:class:`~comgra_ndbg.gui.state.ReaderCache`) and checks the recording
for new steps every ``interval_ms``, so a run that is still training shows up live.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from dash import Dash

from comgra_ndbg.gui.callbacks import graph_style, graph_view, register_callbacks, update_selection
from comgra_ndbg.gui.custom import load_visualization
from comgra_ndbg.gui.layout import build_layout, index_string
from comgra_ndbg.gui.state import ReaderCache

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "create_app", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8055
TITLE = "comgra_ndbg explorer"


def create_app(path: str | Path, *, visualization_file: str | Path | None = None, interval_ms: int = 2000,
               cache: ReaderCache | None = None) -> Dash:
    """The explorer for the recording(s) at ``path``.

    Raises ``RecordingNotFoundError`` when ``path`` holds no recording, ``CorruptRecordingError`` when no
    trial of it can be opened at all (damage in part of a trial is read around and shown), and
    ``CustomVisualizationError`` when ``visualization_file`` cannot be used, before anything is served.
    Pass ``cache`` to share or inspect the readers (tests and benchmarks do).
    """
    cache = cache if cache is not None else ReaderCache(path)
    visualization = load_visualization(visualization_file) if visualization_file is not None else None
    app = Dash(__name__, title=TITLE, update_title=None, suppress_callback_exceptions=True)
    app.index_string = index_string(TITLE)
    app.layout = functools.partial(_page, cache, source=str(Path(path)), interval_ms=interval_ms,
                                   has_custom=visualization is not None)
    register_callbacks(app, cache, visualization)
    return app


def _page(cache: ReaderCache, *, source: str, interval_ms: int, has_custom: bool) -> Any:
    """The page for one visit: the layout with the first view's graph already in it."""
    with cache.lock:
        generations = cache.refresh()
        first = update_selection(cache, None, None, None)
        elements, key = graph_view(cache, first["store"], None)
        graph = {"elements": elements, "stylesheet": graph_style(cache, first["store"]), "key": key}
        return build_layout(cache.trials, title=TITLE, source=source, interval_ms=interval_ms,
                            has_custom=has_custom, graph=graph, generations=generations,
                            analyses=cache.analysis_stamps(),
                            notices=[f"Trial {trial!r} cannot be shown: {text}" for trial, text in
                                     cache.unreadable.items()])


def serve(app: Dash, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve ``app`` until interrupted (Dash's development server: one local user)."""
    app.run(host=host, port=port, debug=False)
