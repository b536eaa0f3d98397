"""A tap on the graph answered by a plain request instead of a round of Dash's callbacks.

A tap through Dash waits for the browser to finish the frame the tap started and for Dash's renderer to
gather the view callback's sixty inputs (some 13 ms before the request leaves); the page's script
(:mod:`comgra_ndbg.gui.tapscript`) instead sends the tapped item, the selection store and the keys store
itself, as the mouse button goes down, to the route this module adds to the explorer's Flask server. The
route runs the same :func:`~comgra_ndbg.gui.callbacks.update_view` the view callback runs and answers what
Dash's callback would answer: every changed output as ``{component id: {property: value}}`` (patches in
Dash's patch form), and which of them are the view callback's own inputs, which the page sets without
running callbacks on them (Dash does not send a callback its own outputs back).
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from dash import Dash, Patch, no_update
from plotly.io.json import to_json_plotly

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.gui.custom import Visualization
from comgra_ndbg.gui.outputs import OUTPUTS
from comgra_ndbg.gui.state import ReaderCache

__all__ = ["ROUTE", "TAP_KINDS", "changed_outputs", "parse_tap", "register_direct", "shared_inputs", "tap_answer",
           "tap_item"]

ROUTE = "_comgra/tap"  # under the app's routes_pathname_prefix
TAP_KINDS = ("node", "box", "frame")  # what cytoscape's nodes are: a graph node, a closed module, an open one


def tap_item(item: Any) -> tuple[str, str] | None:
    """``(element id, kind)`` of a tapped item as the page sends it (``[id, kind]``), or None when it is not
    one (the route refuses it; the view callback ignores it)."""
    if (isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(part, str) for part in item)
            and item[0] and item[1] in TAP_KINDS):
        return item[0], item[1]
    return None


def parse_tap(body: Any) -> tuple[tuple[str, str], dict[str, Any] | None, dict[str, Any] | None]:
    """The tapped ``(id, kind)``, the selection store and the keys store of a request's JSON body.

    Raises :class:`~comgra_ndbg.errors.InvalidArgumentError` naming what is wrong with the body."""
    if not isinstance(body, dict):
        raise InvalidArgumentError("a tap request's body must be a JSON object with 'item', 'store' and 'keys'; "
                                   f"got {type(body).__name__}")
    item = tap_item(body.get("item"))
    if item is None:
        raise InvalidArgumentError(f"a tap request's 'item' must be [element id, kind] with kind one of {TAP_KINDS}; "
                                   f"got {body.get('item')!r}")
    stores = []
    for name in ("store", "keys"):
        value = body.get(name)
        if value is not None and not isinstance(value, dict):
            raise InvalidArgumentError(f"a tap request's {name!r} must be the page's {name} store (an object) or "
                                       f"null; got {type(value).__name__}")
        stores.append(value)
    return item, stores[0], stores[1]


def changed_outputs(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``update_view``'s result as Dash's answer carries it: ``{component id: {property: value}}`` of every
    output that changed (``no_update`` left out; a :class:`dash.Patch` in the form Dash's renderer applies)."""
    changed: dict[str, dict[str, Any]] = {}
    for name, value in out.items():
        if isinstance(value, type(no_update)):
            continue
        component, prop = OUTPUTS[name]
        if isinstance(component, dict):
            raise InvalidArgumentError(f"output {name!r} has a pattern id and cannot be answered by the tap route")
        changed.setdefault(component, {})[prop] = value.to_plotly_json() if isinstance(value, Patch) else value
    return changed


def shared_inputs(app: Dash, view_inputs: set[str]) -> set[str]:
    """The components among ``view_inputs`` whose ``value`` another callback reads too (the search box's and
    the overlay list's options, the theme): set quietly, that callback would not run."""
    values = {f"{component}.value" for component in view_inputs}
    others: set[str] = set()
    for callback in app.callback_map.values():
        names = {f"{i['id']}.{i['property']}" for i in callback["inputs"]}
        if not names >= values:  # not the view callback, the one callback reading them all
            others |= names
    return {component for component in view_inputs if f"{component}.value" in others}


def tap_answer(changed: dict[str, dict[str, Any]], view_inputs: set[str], shared: set[str]) -> dict[str, Any]:
    """The route's answer: the changed outputs and which of them the page sets quietly (the values of the
    view callback's inputs: Dash does not send a callback its own outputs back). An answer that sets a value
    another callback reads too to anything but empty (the search box is only ever cleared) is not applied by
    the page but asked for again through the view callback (``ask``), so that callback runs as Dash runs it;
    so is one that patches such a value (a patch is applied by Dash's ``set_props`` only)."""
    patched = any(isinstance(value, dict) and "__dash_patch_update" in value
                  for component in view_inputs for value in changed.get(component, {}).values())
    if patched or any(changed.get(component, {}).get("value") is not None for component in shared):
        return {"outputs": {}, "quiet": [], "ask": True}
    return {"outputs": changed, "quiet": sorted(component for component in changed if component in view_inputs),
            "ask": False}


def register_direct(app: Dash, cache: ReaderCache, visualization: Visualization | None,
                    locked: Callable[[Callable[..., Any]], Callable[..., Any]], view_inputs: set[str]) -> None:
    """Add the tap route to ``app``'s server. ``view_inputs``: the ids whose ``value`` is an input of the view
    callback; ``locked`` serializes the route with the callbacks on the cache's lock."""
    import flask

    from comgra_ndbg.gui.callbacks import update_view

    @functools.cache
    def shared() -> frozenset[str]:  # asked at the first tap, when every callback is registered
        return frozenset(shared_inputs(app, view_inputs))

    @locked
    def answer(item: tuple[str, str], store: dict[str, Any] | None, keys: dict[str, Any] | None) -> dict[str, Any]:
        return changed_outputs(update_view(cache, "graph", item, store, keys, visualization=visualization))

    def tap() -> Any:
        try:
            item, store, keys = parse_tap(flask.request.get_json(silent=True))
        except InvalidArgumentError as error:
            return flask.Response(json.dumps({"error": str(error)}), status=400, mimetype="application/json")
        body = tap_answer(answer(item, store, keys), view_inputs, shared())
        return flask.Response(to_json_plotly(body), mimetype="application/json")

    app.server.add_url_rule(app.config.routes_pathname_prefix + ROUTE, endpoint="comgra_tap", view_func=tap,
                            methods=["POST"])
