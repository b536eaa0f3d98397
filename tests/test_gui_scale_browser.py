"""The explorer on a network of real size in headless Chromium: 497 graph nodes (a 70-block residual MLP
recorded by NeuralDbg, :mod:`benchmarks.gui_recording`), 250 steps, a fault from step 150 on.

One server and one browser serve the tests of the module, in order: the first view of the graph, opening
and closing module boxes, search, fit and centre, the hover line, colouring by a statistic, the keyboard
and the step box, snapshot stepping, the view in the address, the dark theme and a 1024 px wide window.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from browser_support import (By, chromium, choose, click_frame, click_node, console_problems, cy, graph_nodes,
                             screenshot, served, settled, text, type_into,
                             wait_for)
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys

from benchmarks import gui_recording
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.app import create_app
from comgra_ndbg.gui.clientside import NODE_MATCHES

pytestmark = pytest.mark.slow
FAULT_STEP = 150
DEEP = "model.decoder.blocks.20.mlp.1"  # inside two closed boxes in the first view


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("scale")
    gui_recording.make_recording(folder, steps=250, fault_step=FAULT_STEP)
    with served(create_app(folder)) as address:
        yield address


@pytest.fixture(scope="module")
def browser(url: str) -> Iterator[Any]:
    with chromium() as driver:
        driver.get(url)
        wait_for(lambda: cy(driver, "return cy.nodes().length;"), "the graph", timeout=30)
        yield driver


def drawn(driver: Any) -> list[dict[str, Any]]:
    """Every drawn item (not the frames): id, kind, label, parent, rendered box."""
    return cy(driver, "return cy.nodes().filter(n => n.data('kind') !== 'frame').map(n => ({id: n.id(),"
                      " kind: n.data('kind'), label: n.data('label'), parent: n.data('parent') || '',"
                      " box: n.renderedBoundingBox({includeLabels: false})}));")


def inside_canvas(driver: Any) -> bool:
    width, height = cy(driver, "return [cy.width(), cy.height()];")
    return all(i["box"]["x1"] >= -1 and i["box"]["y1"] >= -1 and i["box"]["x2"] <= width + 1
               and i["box"]["y2"] <= height + 1 for i in drawn(driver))


def address(driver: Any) -> str:
    return driver.execute_script("return window.location.search;")


def test_the_first_view_of_500_nodes_is_at_most_40_boxes_and_nodes_fitted_with_distinct_labels(browser: Any) -> None:
    items = drawn(browser)
    assert 5 <= len(items) <= 40
    assert any(i["kind"] == "box" for i in items)
    labels = Counter((i["parent"], i["label"].split("\n")[0]) for i in items)
    assert [label for label, count in labels.items() if count > 1] == []  # distinct within each frame
    wait_for(lambda: inside_canvas(browser), "the graph fitted into its canvas")
    assert cy(browser, "return cy.zoom();") >= 0.3
    assert "497 nodes" in text(browser, ids.GRAPH_NOTE)
    screenshot(browser, "graph-500.png")


def test_a_click_opens_a_box_and_a_click_on_its_frame_closes_it(browser: Any) -> None:
    box = next(i["id"] for i in drawn(browser) if i["kind"] == "box")
    before = len(drawn(browser))
    click_node(browser, box)
    wait_for(lambda: box in cy(browser, "return cy.nodes('.frame').map(n => n.id());"), "the box opened")
    assert len(drawn(browser)) > before and "boxes=%2B" in address(browser)
    frame = wait_for(lambda: (lambda b: b if b["y1"] > 0 and b["x1"] >= 0 and cy(browser, "return cy.zoom();") >= 0.6
                              else None)(cy(browser, "return cy.getElementById(arguments[1]).renderedBoundingBox();",
                                            box)), "the opened frame filling the view, readable")
    assert frame["y2"] < cy(browser, "return cy.height();")
    click_frame(browser, box)
    wait_for(lambda: len(drawn(browser)) == before, "the box closed again")


def test_the_search_offers_the_names_that_contain_what_is_typed(browser: Any) -> None:
    def offered() -> list[str]:
        return [o.text.strip() for o in browser.find_elements(By.CSS_SELECTOR, ".dash-dropdown-options [role='option']")]

    browser.find_element(By.ID, ids.GRAPH_SEARCH).click()
    first = wait_for(offered, "the first names")
    assert first[0] == "input" and len(first) <= NODE_MATCHES  # not all 497
    ActionChains(browser).send_keys("blocks.20.").perform()
    matching = wait_for(lambda: (lambda names: names if names and names != first and all(
        "blocks.20." in name for name in names) else None)(offered()), "the names with blocks.20.")
    assert DEEP in matching
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()
    wait_for(lambda: not offered(), "the list closed")


def test_the_overlay_list_offers_the_names_that_contain_what_is_typed_and_keeps_the_chosen_one(browser: Any) -> None:
    def offered() -> list[str]:
        return [o.text.strip() for o in browser.find_elements(By.CSS_SELECTOR, ".dash-dropdown-options [role='option']")]

    def held() -> list[str]:  # every option the dropdown holds (it draws only those in view), from Dash's store
        return browser.execute_script(
            "const s = window.store.getState(); let c = s.layout;"
            "for (const k of s.paths.strs[arguments[0]]) { c = c[k]; } return c.props.options;", ids.OVERLAY_NODES)

    wait_for(lambda: browser.find_elements(By.ID, ids.OVERLAY_NODES), "the overlay list")[0].click()
    first = wait_for(offered, "the first names")
    assert first[0] == "input" and len(held()) == NODE_MATCHES  # not all 497
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()
    choose(browser, ids.OVERLAY_NODES, DEEP)
    wait_for(lambda: browser.execute_script(
        "const p = document.querySelector('#timeline .js-plotly-plot');"
        "return p && p.data && p.data.map(t => t.name).includes(arguments[0]);", f"bench · {DEEP}"), "its curve")
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()
    browser.find_element(By.ID, ids.OVERLAY_NODES).click()
    wait_for(lambda: (lambda names: names[:1] == [DEEP] and len(names) <= NODE_MATCHES + 1)(offered()),
             "the chosen name first, then the first names")
    assert held()[0] == DEEP and len(held()) == NODE_MATCHES + 1
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()
    browser.execute_script("document.querySelectorAll('#' + arguments[0] + ' .dash-dropdown-clear, #' + "
                           "arguments[0] + ' [aria-label=\"Clear all\"]').forEach(b => b.click());", ids.OVERLAY_NODES)
    wait_for(lambda: browser.execute_script(
        "const p = document.querySelector('#timeline .js-plotly-plot'); return p && p.data && p.data.length === 1;"),
        "one curve again")


def test_search_selects_a_node_opens_the_boxes_around_it_and_centres_it(browser: Any) -> None:
    assert DEEP not in graph_nodes(browser)
    choose(browser, ids.GRAPH_SEARCH, DEEP)
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith(f"{DEEP} / "), "the searched node")
    wait_for(lambda: "focus" in cy(browser, "return cy.getElementById(arguments[1]).classes();", DEEP),
             "the node drawn and selected")
    def centred() -> bool:
        x, y, width, height = cy(browser, "const p = cy.getElementById(arguments[1]).renderedPosition();"
                                          "return [p.x, p.y, cy.width(), cy.height()];", DEEP)
        return math.hypot(x - width / 2, y - height / 2) < 30
    wait_for(centred, "the node centred")


def test_fit_shows_everything_and_centre_brings_back_the_selection(browser: Any) -> None:
    # The search before placed the view on its node: let that finish (callbacks answered, animation over)
    # before zooming, as a person would see it come to rest.
    wait_for(lambda: settled(browser) and not cy(browser, "return cy.animated();"), "the view at rest")
    cy(browser, "cy.zoom({level: 3, renderedPosition: {x: 0, y: 0}});")
    assert not inside_canvas(browser)
    browser.find_element(By.ID, ids.GRAPH_FIT).click()
    wait_for(lambda: inside_canvas(browser), "everything in view")
    browser.find_element(By.ID, ids.GRAPH_CENTRE).click()
    wait_for(lambda: (lambda p: abs(p[0] - p[2] / 2) < 30 and abs(p[1] - p[3] / 2) < 30)(cy(
        browser, "const p = cy.getElementById(arguments[1]).renderedPosition(); return [p.x, p.y, cy.width(),"
                 " cy.height()];", DEEP)), "the selection centred")


def test_hovering_a_node_shows_its_full_name(browser: Any) -> None:
    browser.find_element(By.ID, ids.GRAPH_FIT).click()
    target = next(i for i in drawn(browser) if i["kind"] == "node" and "." in i["id"] and i["id"] != DEEP)
    canvas = browser.find_element(By.ID, ids.GRAPH)

    def hover_shows_the_full_name() -> bool:
        # The view may still be moving (the fit animates, and refits once the canvas has its size): point at
        # the node where it is drawn now, coming from outside it so that the browser sends a fresh mouseover.
        x, y = cy(browser, "const p = cy.getElementById(arguments[1]).renderedPosition(); return [p.x, p.y];",
                  target["id"])
        half_width, half_height = canvas.size["width"] / 2, canvas.size["height"] / 2
        ActionChains(browser).move_to_element_with_offset(canvas, int(2 - half_width), int(2 - half_height)) \
            .move_to_element_with_offset(canvas, int(x - half_width), int(y - half_height)).perform()
        return text(browser, ids.GRAPH_HOVER).startswith(target["id"] + " (")

    wait_for(hover_shows_the_full_name, "the full name on hover")
    assert target["label"].split("\n")[0] != target["id"]  # the label is short, the hover line is whole


def heat(driver: Any) -> dict[str, str]:
    return cy(driver, "const h = {}; cy.nodes().forEach(n => { if (n.data('heat')) h[n.id()] = n.data('heat'); });"
                      "return h;")


def test_colouring_by_gradient_rms_shows_where_the_gradient_died(browser: Any) -> None:
    choose(browser, ids.COLOUR, "gradient RMS")
    wait_for(lambda: len(heat(browser)) == len(drawn(browser)), "every drawn item coloured")
    wait_for(lambda: text(browser, ids.COLOUR_SCALE).startswith("gradient RMS at step "), "the scale")
    for step in (100, 200):
        type_into(browser, ids.STEP_BOX, str(step))
        wait_for(lambda: text(browser, ids.STEP_LABEL).startswith(f"step {step} "), f"step {step}")
        wait_for(lambda: f"at step {step}:" in text(browser, ids.COLOUR_SCALE), "the colours of that step")
        if step == 100:
            before = heat(browser)
    after = heat(browser)
    changed = [item for item in after if after[item] != before.get(item)]
    assert "box:model.encoder.layers" in changed  # its gradients fell a hundredfold at the fault
    screenshot(browser, "graph-500-gradient.png")
    choose(browser, ids.COLOUR, "role")
    wait_for(lambda: not heat(browser), "the role colours back")


def test_arrow_keys_step_and_shift_arrows_go_to_the_next_snapshot(browser: Any) -> None:
    browser.execute_script("document.activeElement && document.activeElement.blur();")
    ActionChains(browser).send_keys(Keys.ARROW_LEFT).perform()
    wait_for(lambda: text(browser, ids.STEP_LABEL).startswith("step 199 "), "step 199 by ←")
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).send_keys(Keys.ARROW_RIGHT).perform()
    wait_for(lambda: text(browser, ids.STEP_LABEL).startswith("step 201 "), "step 201 by → →")
    ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ARROW_LEFT).key_up(Keys.SHIFT).perform()
    wait_for(lambda: text(browser, ids.STEP_LABEL).startswith("step 200 "), "the snapshot before, by Shift+←")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f"#{ids.VALUES} img.values-image"), "its element values")


def test_the_address_holds_the_view_and_reopens_it(browser: Any, url: str) -> None:
    tabs = {t.text: t for t in browser.find_elements(By.CSS_SELECTOR, ".tab")}
    tabs["Layers"].click()
    wait_for(lambda: "tab=layers" in address(browser), "the tab in the address")
    link = address(browser)
    assert f"node={DEEP}" in link and "step=200" in link
    browser.get("about:blank")
    browser.get(url + link)
    wait_for(lambda: text(browser, ids.STEP_LABEL).startswith("step 200 "), "the linked step")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f"#{ids.GRADIENT_FLOW} .js-plotly-plot"), "the tab")
    assert text(browser, ids.NODE) == DEEP
    assert "focus" in cy(browser, "return cy.getElementById(arguments[1]).classes();", DEEP)
    browser.back()
    wait_for(lambda: browser.execute_script("return location.href;") == "about:blank", "back")
    browser.forward()
    wait_for(lambda: text(browser, ids.STEP_LABEL).startswith("step 200 "), "forward to the link")


def test_a_link_with_overlaid_nodes_draws_them_and_keeps_them_chosen(browser: Any, url: str) -> None:
    browser.get(url + f"?node=model.embed&overlay={DEEP}")
    curves = ["bench · model.embed", f"bench · {DEEP}"]
    wait_for(lambda: browser.execute_script(
        "const p = document.querySelector('#timeline .js-plotly-plot');"
        "return p && p.data && p.data.map(t => t.name);") == curves, "the linked node and its overlay")
    chosen = browser.execute_script(  # what the overlay list holds, from Dash's store, once its options arrived
        "const s = window.store.getState(); let c = s.layout;"
        "for (const k of s.paths.strs[arguments[0]]) { c = c[k]; } return [c.props.value, c.props.options[0]];",
        ids.OVERLAY_NODES)
    assert chosen == [[DEEP], DEEP]
    assert f"overlay={DEEP}" in address(browser)


def test_the_dark_theme_darkens_page_graph_and_plots_and_is_kept_in_the_address(browser: Any) -> None:
    tabs = {t.text: t for t in browser.find_elements(By.CSS_SELECTOR, ".tab")}
    tabs["Tensors"].click()
    wait_for(lambda: "tab=" not in address(browser), "the Tensors tab")
    browser.find_element(By.CSS_SELECTOR, f"#{ids.THEME} input[value='dark']").click()
    wait_for(lambda: "theme=dark" in address(browser), "the theme in the address")
    wait_for(lambda: browser.execute_script("return document.documentElement.dataset.theme;") == "dark", "dark")
    background = browser.execute_script("return getComputedStyle(document.body).backgroundColor;")
    assert background == "rgb(11, 18, 32)"
    wait_for(lambda: browser.execute_script(
        "return document.querySelector('#timeline .js-plotly-plot').layout.paper_bgcolor;") == "#111827",
        "a dark timeline")
    screenshot(browser, "dark.png")
    browser.find_element(By.CSS_SELECTOR, f"#{ids.THEME} input[value='light']").click()
    wait_for(lambda: "theme=dark" not in address(browser), "light again")


def test_a_1024_px_window_shows_everything_without_sideways_scrolling(url: str) -> None:
    with chromium(width=1024, height=800) as driver:
        driver.get(url)
        wait_for(lambda: cy(driver, "return cy.nodes().length;"), "the graph", timeout=30)
        wait_for(lambda: settled(driver), "the first view")
        assert driver.execute_script("return document.documentElement.scrollWidth;") <= 1024
        widths = driver.execute_script(
            "return ['graph', 'timeline', 'tabs'].map(id => document.getElementById(id).getBoundingClientRect())"
            ".map(r => [r.left, r.right]);")
        assert all(left >= 0 and right <= 1024 and right - left > 400 for left, right in widths)
        screenshot(driver, "narrow-1024.png")
        assert console_problems(driver) == []


def test_the_plots_are_drawn_by_plotly_js_cartesian_bundle(browser: Any) -> None:
    traces = browser.execute_script("return Object.keys(window.Plotly.PlotSchema.get().traces);")
    assert {"scatter", "bar", "heatmap"} <= set(traces)  # every trace type the explorer draws
    assert "scatter3d" not in traces  # the smaller bundle, not the full one


COUNT_VIEWS = """
window.__views = 0;
if (!window.__counting) {
  window.__counting = true;
  const original = window.fetch;
  window.fetch = function (...args) {
    if (String(((args[1] || {}).body) || '').includes(arguments[0])) { window.__views += 1; }
    return original.apply(this, args);
  };
}
""".replace("arguments[0]", repr(ids.STEP_ASK))


def shown_step(driver: Any) -> dict[str, Any]:
    """What the page shows of the step: label, header, table, step box, marker, histogram note, address."""
    return driver.execute_script(
        "const plot = (id) => document.querySelector('#' + id + ' .js-plotly-plot');"
        "const t = (id) => (document.getElementById(id) || {}).textContent || '';"
        "const m = plot(arguments[1]).layout;"
        "return {label: t(arguments[2]), header: t(arguments[3]), table: t(arguments[4]),"
        " box: document.getElementById(arguments[5]).value, marker: (m.shapes || [{}])[0].x0,"
        " note: t(arguments[0]), values: t(arguments[6]), address: location.search,"
        " views: window.__views};",
        ids.HISTOGRAM_NOTE, ids.TIMELINE, ids.STEP_LABEL, ids.TENSOR_HEADER, ids.STATS_TABLE, ids.STEP_BOX, ids.VALUES)


def window_held(driver: Any) -> bool:
    """Whether the page holds a window of nearby steps (Dash's store of the window says so)."""
    return bool(driver.execute_script(
        "const s = window.store.getState(); let c = s.layout;"
        "for (const k of s.paths.strs[arguments[0]]) { c = c[k]; } return c.props.data && c.props.data.local;",
        ids.STEP_DATA))


def test_stepping_near_the_step_drawn_is_shown_by_the_page_without_a_request(browser: Any, url: str) -> None:
    browser.get(url + f"?node={DEEP}&step=202")
    wait_for(lambda: text(browser, ids.STEP_LABEL).startswith("step 202 "), "step 202 drawn by the server")
    wait_for(lambda: settled(browser) and "No snapshot at step 202 " in shown_step(browser)["note"], "its view")
    wait_for(lambda: window_held(browser), "the window of nearby steps, asked for once the first view is drawn")
    drawn_by_server = {k: v for k, v in shown_step(browser).items() if k not in ("views", "address")}
    browser.execute_script(COUNT_VIEWS)
    browser.execute_script("document.activeElement && document.activeElement.blur();")
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()
    wait_for(lambda: shown_step(browser)["label"].startswith("step 203 "), "step 203")
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()
    wait_for(lambda: shown_step(browser)["label"].startswith("step 204 "), "step 204")
    ActionChains(browser).send_keys(Keys.ARROW_LEFT).send_keys(Keys.ARROW_LEFT).perform()
    wait_for(lambda: shown_step(browser)["label"].startswith("step 202 "), "back at step 202")
    wait_for(lambda: "step=202" in address(browser), "the address")
    again = shown_step(browser)
    assert again.pop("views") == 0  # four steps, not one request
    assert "step=202" in again.pop("address")  # (the link's address as typed, the page's in full)
    assert again == drawn_by_server  # the page drew the step exactly as the server did
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()
    wait_for(lambda: shown_step(browser)["label"].startswith("step 203 "), "step 203 again")
    at_203 = shown_step(browser)
    assert at_203["views"] == 0 and at_203["marker"] == 203 and at_203["box"] == "203"
    assert "· step 203 (train)" in at_203["header"] and at_203["note"].startswith("No snapshot at step 203 ")
    assert at_203["values"] == at_203["note"]
    wait_for(lambda: "step=203" in address(browser), "the address of step 203")
    browser.back()  # the previous view's address, and that view, drawn by the server
    wait_for(lambda: shown_step(browser)["label"].startswith("step 202 "), "back to step 202")
    wait_for(lambda: shown_step(browser)["views"] == 1 and settled(browser), "one request for it")
    assert shown_step(browser)["table"] == drawn_by_server["table"]
    ActionChains(browser).send_keys(Keys.ARROW_LEFT).perform()  # step 201 from the window, then the snapshot of 200
    wait_for(lambda: shown_step(browser)["label"].startswith("step 201 "), "step 201")
    ActionChains(browser).send_keys(Keys.ARROW_LEFT).perform()
    wait_for(lambda: shown_step(browser)["label"].startswith("step 200 "), "step 200")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f"#{ids.VALUES} img.values-image"), "its element values")
    assert "· step 200 ·" in browser.execute_script(  # the snapshot's histogram, sent along with the window
        "return document.querySelector(arguments[0]).textContent;", f"#{ids.HISTOGRAM} .histogram-title")
    ActionChains(browser).send_keys(Keys.ARROW_LEFT).perform()  # and from the snapshot to a note again
    wait_for(lambda: shown_step(browser)["note"].startswith("No snapshot at step 199 "), "step 199's note")
    wait_for(lambda: shown_step(browser)["values"] == shown_step(browser)["note"], "the note in place of values")
    assert shown_step(browser)["views"] == 1
    browser.get(url + f"?node={DEEP}&step=203")  # what the server draws at 203 is what the page showed there
    wait_for(lambda: window_held(browser), "the window of the first view")
    wait_for(lambda: shown_step(browser)["label"].startswith("step 203 ") and settled(browser), "step 203 drawn")
    wait_for(lambda: "No snapshot at step 203 " in shown_step(browser)["note"], "its note")
    assert {k: v for k, v in shown_step(browser).items() if k not in ("views", "address")} == \
        {k: v for k, v in at_203.items() if k not in ("views", "address")}


def test_the_node_selector_holds_the_chosen_node_lists_matches_as_typed_and_follows_a_tap(browser: Any) -> None:
    # last but one: choosing a node deep in the network opens the boxes around it, a view the tests above
    # do not start from
    def held() -> list[str]:  # every option the dropdown holds, from Dash's store
        return browser.execute_script(
            "const s = window.store.getState(); let c = s.layout;"
            "for (const k of s.paths.strs[arguments[0]]) { c = c[k]; } return c.props.options;", ids.NODE)

    chosen = text(browser, ids.NODE)
    assert held() == [chosen]  # not 497 names, each indexed by every substring when they arrive
    browser.find_element(By.ID, ids.NODE).click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".dash-dropdown-search"), "the search field")[0].click()
    ActionChains(browser).send_keys("blocks.3.mlp").perform()  # typed: the names containing it are offered
    option = wait_for(lambda: next((o for o in browser.find_elements(By.CSS_SELECTOR, "[role='option']")
                                    if o.text.strip() == "model.decoder.blocks.3.mlp.1"), None), "the matching names")
    assert 1 < len(held()) <= NODE_MATCHES + 1 and all("blocks.3.mlp" in n for n in held()[1:])
    option.click()
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith("model.decoder.blocks.3.mlp.1 /"), "the node chosen")
    wait_for(lambda: held() == ["model.decoder.blocks.3.mlp.1"], "the selector back to the chosen node")
    width, height = cy(browser, "return [cy.width(), cy.height()];")
    tapped = next(n["id"] for n in drawn(browser) if n["kind"] == "node" and n["id"] != text(browser, ids.NODE)
                  and n["box"]["x1"] > 10 and n["box"]["y1"] > 10 and n["box"]["x2"] < width - 10
                  and n["box"]["y2"] < height - 10)
    click_node(browser, tapped)
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith(tapped + " /"), "the tapped node shown")
    assert text(browser, ids.NODE) == tapped and held() == [tapped]  # the value is among the options, not cleared


def test_no_console_error_or_warning(browser: Any) -> None:
    assert console_problems(browser) == []
