"""The tap route of the explorer's server (the page's script sends a tap there instead of through Dash's
callbacks): what it answers for a node, a box and a frame, which outputs the page is to set quietly, when
it sends the tap back through the view callback, and its answers to malformed requests."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dash import Patch, no_update
from plotly.io.json import to_json_plotly
from test_gui_support import make_recording

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.gui import callbacks, direct, ids
from comgra_ndbg.gui.app import create_app
from comgra_ndbg.gui.outputs import OUTPUTS
from comgra_ndbg.gui.state import ReaderCache

ROUTE = "/" + direct.ROUTE


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_recording(tmp_path_factory.mktemp("tap-route"))


@pytest.fixture(scope="module")
def client(group: Path) -> Any:
    return create_app(group).server.test_client()


@pytest.fixture
def first(group: Path) -> Iterator[dict[str, Any]]:
    """The page's first view: its stores as the page holds them (plain JSON) and its graph's elements."""
    cache = ReaderCache(group)
    out = callbacks.update_view(cache, "url", "", None, None)
    cache.close()
    yield {"store": json.loads(json.dumps(out["store"])), "keys": json.loads(json.dumps(out["keys"])),
           "elements": out["elements"]}


def post(client: Any, body: Any) -> Any:
    return client.post(ROUTE, data=json.dumps(body), content_type="application/json")


def test_a_node_tap_answers_the_outputs_the_view_callback_answers(client: Any, group: Path,
                                                                  first: dict[str, Any]) -> None:
    response = post(client, {"item": ["hidden", "node"], "store": first["store"], "keys": first["keys"]})
    assert response.status_code == 200
    answer = response.get_json()
    cache = ReaderCache(group)
    expected = callbacks.update_view(cache, "graph", ("hidden", "node"), first["store"], first["keys"])
    cache.close()
    expected = {name: value for name, value in expected.items() if value is not no_update}
    assert set(answer["outputs"]) == {OUTPUTS[name][0] for name in expected}
    outputs = answer["outputs"]
    assert outputs[ids.SELECTION]["data"]["selection"]["node"] == "hidden"
    assert outputs[ids.NODE]["value"] == "hidden" and outputs[ids.TENSOR]["value"] == "hidden"
    assert outputs[ids.TIMELINE]["figure"]["data"]  # the node's timeline, drawn in full
    assert outputs[ids.KEYS]["data"] == json.loads(to_json_plotly(expected["keys"]))
    # The selectors' values are the view callback's own inputs: set quietly. The stores, the panels and the
    # figures are read by no callback or by others (the graph's state by the page's graph script): set loudly.
    assert {ids.NODE, ids.TENSOR} <= set(answer["quiet"]) <= set(answer["outputs"])
    assert {ids.SELECTION, ids.KEYS, ids.TIMELINE, ids.TENSOR_HEADER}.isdisjoint(answer["quiet"])
    assert answer["ask"] is False


def test_a_box_tap_answers_the_graph_with_the_box_open_and_fitted(client: Any, first: dict[str, Any]) -> None:
    frame = next(e["data"]["id"] for e in first["elements"] if e["data"].get("kind") == "frame")
    closed = post(client, {"item": [frame, "frame"], "store": first["store"], "keys": first["keys"]}).get_json()
    elements = closed["outputs"][ids.GRAPH]["elements"]
    assert len(elements) < len(first["elements"])  # the frame closed: its nodes stand as one box
    box = next(e["data"]["id"] for e in elements if e["data"].get("kind") == "box")
    store, keys = closed["outputs"][ids.SELECTION]["data"], closed["outputs"][ids.KEYS]["data"]
    opened = post(client, {"item": [box, "box"], "store": store, "keys": keys}).get_json()
    assert len(opened["outputs"][ids.GRAPH]["elements"]) == len(first["elements"])
    assert opened["outputs"][ids.GRAPH_VIEW]["data"]["fit"] == box  # the opened frame fills the view
    assert opened["outputs"][ids.GRAPH_SEARCH]["value"] is None  # the search cleared, quietly: not sent back
    assert ids.GRAPH_SEARCH in opened["quiet"] and opened["ask"] is False


@pytest.mark.parametrize("body, said", [
    ([1, 2], "must be a JSON object"),
    ({"item": "hidden"}, "'item' must be [element id, kind]"),
    ({"item": ["hidden", "edge"]}, "kind one of"),
    ({"item": ["", "node"]}, "'item' must be"),
    ({"item": ["hidden", "node"], "store": "x"}, "'store' must be the page's store"),
    ({"item": ["hidden", "node"], "keys": [1]}, "'keys' must be the page's keys store"),
])
def test_a_malformed_request_is_refused_saying_what_is_wrong(client: Any, body: Any, said: str) -> None:
    with pytest.raises(InvalidArgumentError, match=said.replace("[", r"\[").replace("]", r"\]")):
        direct.parse_tap(body)
    response = post(client, body)
    assert response.status_code == 400 and said in response.get_json()["error"]


def test_a_request_without_json_is_refused(client: Any) -> None:
    response = client.post(ROUTE, data="item=hidden", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400 and "JSON object" in response.get_json()["error"]


def test_values_other_callbacks_read_are_found_in_the_app(group: Path) -> None:
    app = create_app(group)
    view_inputs = set(callbacks.SELECTION_INPUTS) | set(callbacks.OPTION_INPUTS)
    shared = direct.shared_inputs(app, view_inputs)
    assert {ids.GRAPH_SEARCH, ids.OVERLAY_NODES, ids.THEME} <= shared  # their options, the page's theme
    assert {ids.NODE, ids.TENSOR, ids.KIND, ids.TRIAL}.isdisjoint(shared)


def test_an_answer_that_sets_a_shared_value_or_patches_an_input_is_sent_back_through_the_view_callback() -> None:
    view_inputs, shared = {ids.NODE, ids.THEME, ids.GRAPH_SEARCH}, {ids.THEME, ids.GRAPH_SEARCH}
    plain = {ids.NODE: {"value": "hidden"}, ids.GRAPH_SEARCH: {"value": None}, ids.KEYS: {"data": {}}}
    assert direct.tap_answer(plain, view_inputs, shared) == {
        "outputs": plain, "quiet": sorted([ids.NODE, ids.GRAPH_SEARCH]), "ask": False}
    themed = {**plain, ids.THEME: {"value": "dark"}}
    assert direct.tap_answer(themed, view_inputs, shared) == {"outputs": {}, "quiet": [], "ask": True}
    patch = Patch()
    patch.append("x")
    patched = direct.changed_outputs({"node": patch, "keys": {}, "header": no_update})
    assert set(patched) == {ids.NODE, ids.KEYS}
    assert direct.tap_answer(patched, view_inputs, shared)["ask"] is True


def test_the_view_callback_takes_a_tap_from_the_ask_store_as_the_route_would() -> None:
    assert callbacks._trigger(ids.STEP_ASK, ["graph", ["hidden", "node"], 1], {}) == ("graph", ("hidden", "node"))
    assert callbacks._trigger(ids.STEP_ASK, ["graph", ["box:model", "box"], 1], {}) == ("graph", ("box:model", "box"))
    assert callbacks._trigger(ids.STEP_ASK, ["graph", ["hidden", "edge"], 1], {}) == (None, None)
    assert callbacks._trigger(ids.STEP_ASK, ["graph", "hidden", 1], {}) == (None, None)


def test_the_route_lives_under_the_apps_address_prefix(group: Path, first: dict[str, Any],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # an explorer served under a path (a proxy, a notebook server) has its route there, and the page, which
    # builds the route's address from Dash's config, asks there
    monkeypatch.setenv("DASH_URL_BASE_PATHNAME", "/explorer/")
    app = create_app(group)
    client = app.server.test_client()
    body = {"item": ["hidden", "node"], "store": first["store"], "keys": first["keys"]}
    answer = client.post("/explorer/" + direct.ROUTE, data=json.dumps(body), content_type="application/json")
    assert answer.status_code == 200 and answer.get_json()["outputs"][ids.NODE]["value"] == "hidden"
    assert client.post(ROUTE, data=json.dumps(body), content_type="application/json").status_code == 404  # not at the root
    page = client.get("/explorer/").get_data(as_text=True)
    config = json.loads(re.search(r'<script id="_dash-config" type="application/json">(.*?)</script>', page).group(1))
    assert config["requests_pathname_prefix"] == "/explorer/"
