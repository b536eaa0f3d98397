"""The views of nearby steps the explorer sends along (gui/stepping.py), put together as the page's script
puts them together, equal the views the server draws for those steps; and after a step the page showed
itself, the server's next answer is drawn from that step."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from dash import no_update
from plotly.utils import PlotlyJSONEncoder
from test_gui_support import FAULT_NODE, make_faulty

from comgra_ndbg.gui import callbacks, ids
from comgra_ndbg.gui.stepscript import FORGET
from comgra_ndbg.gui.state import ReaderCache
from comgra_ndbg.gui.stepping import COLOUR_RADIUS, RADIUS, SNAPSHOTS

LINK = f"?trial=fault&node={FAULT_NODE}&step=9"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReaderCache]:
    cache = ReaderCache(make_faulty(tmp_path_factory.mktemp("stepping")))  # snapshots at the even steps
    yield cache
    cache.close()


def as_json(value: Any) -> Any:
    """A value (components included) as the page receives it."""
    return json.loads(json.dumps(value, cls=PlotlyJSONEncoder))


def shown_by_page(window: dict[str, Any], position: int) -> dict[str, Any] | None:
    """What clientside.SCRIPT's ``localStep`` shows at slider ``position``; None where it asks the server."""
    i = position - window["first"]
    if not 0 <= i < len(window["steps"]) or window["stats"][i] is None:
        return None
    step = window["steps"][i]
    values, panel = window["stats"][i], window["panels"][i]
    if panel is not None:
        histogram, note = panel["histogram"], panel["values"]
    else:
        note = window["notes"][window["note"][i]].replace("{step}", str(step), 1)
        histogram = as_json(window["note_histogram"])
        histogram["props"]["children"] = note
    return {
        "table": window["head"] + "".join(f"\n| {name} | {value} |" for name, value in zip(window["names"], values)
                                          if value is not None),
        "histogram": as_json(histogram), "values": as_json(note),
        "header": f"{window['header'][0]} · step {step} {window['header'][1]}",
        "label": f"step {step} · {position + 1}{window['label_tail']}",
        "address": re.sub(r"([?&]step=)-?[0-9]+", rf"\g<1>{step}", window["address"]),
        "colours": None if window["colours"] is None else window["colours"][i],
        "scale": None if window["scale"] is None else f"{window['scale'][0]}at step {step}{window['scale'][1]}",
    }


def drawn_by_server(cache: ReaderCache, address: str) -> dict[str, Any]:
    out = callbacks.update_view(cache, "url", address, None, None)
    colours = out["graph_view"]["colours"]
    return {"table": out["stats"].children, "histogram": as_json(out["histogram"]),
            "values": as_json(out["values"].children if out["values"].children and isinstance(
                out["values"].children, str) else out["values"]), "header": out["header"], "label": out["step_label"],
            "address": out["url"], "colours": colours, "scale": out["colour_scale"][0] if colours else None}


@pytest.mark.parametrize("colour", ["", "&colour=grad%3Arms"])
def test_every_step_of_the_window_is_shown_as_the_server_draws_it(cache: ReaderCache, colour: str) -> None:
    window = callbacks.update_view(cache, "url", LINK + colour, None, None)["step_data"]
    radius = COLOUR_RADIUS if colour else RADIUS
    assert window["local"] and window["step"] == 9 and not window["snapshot_shown"]
    assert window["steps"] == list(range(max(9 - radius, 0), min(9 + radius + 1, 24)))
    assert window["first"] == window["steps"][0]
    asked = []
    for position, step in enumerate(window["steps"], window["first"]):
        shown = shown_by_page(window, position)
        if step % 2 == 0 and step not in (8, 10):  # a snapshot's histogram and values: the server draws them,
            assert shown is None  # but for the two snapshots nearest the step
            asked.append(step)
            continue
        assert shown is not None
        server = drawn_by_server(cache, re.sub(r"step=9", f"step={step}", LINK + colour))
        assert shown["histogram"] == server["histogram"] and shown["values"] == server["values"]
        if step % 2:
            assert f"No snapshot at step {step} " in shown["histogram"]["props"]["children"]
        else:
            assert "histogram-canvas" in json.dumps(shown["histogram"]) and ids.VALUES_IMAGE in json.dumps(shown["values"])
        assert shown["table"] == server["table"] and shown["header"] == server["header"]
        assert shown["label"] == server["label"] and shown["address"] == server["address"]
        if colour:
            assert shown["colours"] == [server["colours"][item] for item in window["items"]]
            assert shown["scale"] == server["scale"]
    assert len(asked) == len(window["steps"]) // 2 - SNAPSHOTS


def test_other_tabs_and_one_samples_statistics_are_drawn_by_the_server(cache: ReaderCache) -> None:
    window = callbacks.update_view(cache, "url", LINK + "&tab=diagnosis", None, None)["step_data"]
    assert window == {"position": 9, "step": 9, "local": False}
    out = callbacks.update_view(cache, "url", LINK.replace("step=9", "step=8") + "&sample=1", None, None)
    assert "· sample 1 ·" in out["header"] and out["step_data"] == {"position": 8, "step": 8, "local": False}


def test_after_a_step_the_page_showed_the_next_answer_is_drawn_from_that_step(cache: ReaderCache) -> None:
    first = callbacks.update_view(cache, "url", LINK, None, None)
    store, keys = json.loads(json.dumps(first["store"])), json.loads(json.dumps(first["keys"]))
    store["selection"]["step"] = store["wanted"]["step"] = 11  # what the page's script writes for step 11
    for name in FORGET:
        keys.pop(name, None)
    out = callbacks.update_view(cache, "theme", "dark", store, keys)
    assert "· step 11 (" in out["header"] and out["step"] == 11 and out["step_box"] == 11
    assert out["step_data"]["step"] == 11 and "step=11" in out["url"]
    assert out["timeline"] is not no_update  # the marker moves to step 11 in the server's figure too
    again = callbacks.update_view(cache, None, None, out["store"], out["keys"])
    assert again["step"] is no_update and again["step_data"] is no_update  # nothing of the step sent twice


def test_a_tap_answers_without_the_window_and_the_next_step_brings_it(cache: ReaderCache) -> None:
    first = callbacks.update_view(cache, "url", LINK, None, None)
    tap = callbacks.update_view(cache, "graph", ("hidden0", "node"), first["store"], first["keys"])
    assert tap["header"].startswith("hidden0 / ") and tap["step_data"] is no_update  # the page drops its window
    step = callbacks.update_view(cache, "step", 10, tap["store"], tap["keys"])  # asked by the page
    assert step["step_data"]["local"] and step["step_data"]["step"] == 10
    assert step["step_data"]["header"][0].startswith("hidden0 / ")


def test_an_answer_that_changes_nothing_keeps_the_window_the_page_holds(cache: ReaderCache) -> None:
    first = callbacks.update_view(cache, "url", LINK, None, None)
    assert first["step_data"]["local"]
    idle = callbacks.update_view(cache, None, None, first["store"], first["keys"])  # e.g. a component's mount
    assert idle["step_data"] is no_update


def test_the_first_page_comes_without_the_window_and_the_page_asks_for_it(cache: ReaderCache) -> None:
    first = callbacks.update_view(cache, "url", LINK, None, None, nearby=False)
    assert first["step_data"] == {"position": 9, "step": 9, "local": False}
    store = json.loads(json.dumps(first["store"]).replace('"ema": 0.0', '"ema": 0'))  # as the browser writes it
    asked = callbacks.update_view(cache, "window", None, store, first["keys"])
    assert asked["step_data"]["local"] and asked["step_data"]["step"] == 9
    assert asked["header"] is no_update and asked["timeline"] is no_update  # nothing else is sent again
    assert callbacks._trigger(ids.STEP_ASK, ["window", None, 1.0], {}) == ("window", None)
