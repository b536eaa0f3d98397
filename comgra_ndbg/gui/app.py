"""Build and serve the explorer: ``create_app(path)`` returns a Dash 4 app over a recording.

``path`` is a group folder (its trials are selectable), a trial folder or one recording file. The app
keeps one cached reader per trial (:class:`~comgra_ndbg.gui.state.ReaderCache`) and checks the recording
for new steps every ``interval_ms``, so a run that is still training shows up live.
"""
from __future__ import annotations

import errno
import functools
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import flask
from dash import Dash, no_update

from comgra_ndbg.errors import ComgraError
from comgra_ndbg.gui.bundle import serve_cartesian_plotly
from comgra_ndbg.gui.callbacks import OUTPUTS, register_callbacks, update_view
from comgra_ndbg.gui.custom import load_visualization
from comgra_ndbg.gui.layout import build_layout
from comgra_ndbg.gui.state import ReaderCache
from comgra_ndbg.gui.style import index_string
from comgra_ndbg.gui.trials import register_trial_callbacks, sort_columns, trial_controls, trial_table

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ServerAddressError", "check_address", "create_app", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8055
TITLE = "comgra_ndbg explorer"


def create_app(path: str | Path, *, visualization_file: str | Path | None = None, interval_ms: int = 2000,
               cache: ReaderCache | None = None) -> Dash:
    """The explorer for the recording(s) at ``path``.

    Raises ``RecordingNotFoundError`` when ``path`` holds no recording, ``CorruptRecordingError`` when no
    trial of it can be opened at all (damage in part of a trial is read around and shown), and
    ``CustomVisualizationError`` when ``visualization_file`` cannot be used, before anything is served.
    Pass ``cache`` to share or inspect the readers (tests and benchmarks do). The page with its default first
    view is built once here, so the readers hold what it needs before the first visit asks for it (on the
    10,000-step, 500-node benchmark recording the first page otherwise waits some 0.3 s for it).
    """
    cache = cache if cache is not None else ReaderCache(path)
    visualization = load_visualization(visualization_file) if visualization_file is not None else None
    app = Dash(__name__, title=TITLE, update_title=None, suppress_callback_exceptions=True)
    app.index_string = index_string(TITLE, app.config.requests_pathname_prefix)
    app.layout = functools.partial(_page, cache, visualization, source=str(Path(path)), interval_ms=interval_ms)
    register_callbacks(app, cache, visualization)
    register_trial_callbacks(app, cache)
    app.layout()  # the first page's reads (trials, graph, statistics, snapshots) happen now, not in the first visit
    if visualization is None:  # a custom visualization may draw any trace type: it keeps the full plotly.js
        serve_cartesian_plotly(app)
    return app


def _page(cache: ReaderCache, visualization: Any, *, source: str, interval_ms: int) -> Any:
    """The page for one visit, with the view its address names already in it (graph, selectors, figures).

    The browser asks for the page's layout with the page's address as the referrer, so the first view is
    drawn without a callback's round trip (Dash would also hold that callback back until plotly.js has
    loaded). Without a referrer the first view is the default one; the page's address component then
    reports the address and the view callback moves there.
    """
    search = _address_of(flask.request.referrer if flask.has_request_context() else None)
    with cache.lock:
        generations = cache.refresh()
        layout = build_layout(cache.trials, title=TITLE, source=source, interval_ms=interval_ms,
                              has_custom=visualization is not None, generations=generations,
                              analyses=cache.analysis_stamps(), ranked=any(cache.ranks(t) for t in cache.trials),
                              notices=[f"Trial {trial!r} cannot be shown: {text}" for trial, text in
                                       cache.unreadable.items()],
                              trial_controls=trial_controls(sort_columns(trial_table(cache)))
                              if len(cache.trials) > 1 else None)
        outputs = update_view(cache, "url", search, None, None, visualization=visualization, nearby=False)
        outputs["url"] = search  # as the browser has it, so the address component reports no change
        return fill(layout, outputs)


def _address_of(referrer: str | None) -> str:
    """The query string (with ``?``) of the page's address, from the layout request's referrer."""
    query = urlsplit(referrer).query if referrer else ""
    return f"?{query}" if query else ""


def fill(layout: Any, outputs: dict[str, Any]) -> Any:
    """``layout`` with the view callback's ``outputs`` set as the initial properties of its components."""
    by_id: dict[str, list[tuple[str, Any]]] = {}
    for name, value in outputs.items():
        if value is no_update or name not in OUTPUTS:
            continue
        component, prop = OUTPUTS[name]
        by_id.setdefault(component, []).append((prop, value))

    def visit(node: Any) -> None:
        if isinstance(node, (list, tuple)):
            for child in node:
                visit(child)
            return
        if not hasattr(node, "to_plotly_json"):
            return
        for prop, value in by_id.get(getattr(node, "id", None), []) if isinstance(getattr(node, "id", None), str) \
                else []:
            setattr(node, prop, value)
        visit(getattr(node, "children", None))
    visit(layout)
    return layout


class ServerAddressError(ComgraError, OSError):
    """The explorer cannot listen where it was asked to (the port is taken, or the address is not this
    machine's)."""


def check_address(host: str, port: int) -> None:
    """Raise :class:`ServerAddressError` with what to do when nothing could listen on ``host:port``.

    Checked before the explorer says where it is served, so a taken port is reported as such, in one line,
    and not after a line that claims the explorer is running there.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise ServerAddressError(f"port {port} on {host} is already in use (another explorer or server is "
                                         f"listening there): stop it, or pass --port with a free port") from None
            raise ServerAddressError(f"cannot listen on {host}:{port} ({error.strerror}): pass --host with an "
                                     f"address of this machine (default {DEFAULT_HOST})") from None


def serve(app: Dash, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve ``app`` until interrupted (Dash's development server: one local user)."""
    app.run(host=host, port=port, debug=False)
