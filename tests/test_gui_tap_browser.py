"""What the page does itself when a node of the graph is pressed, in headless Chromium on a network of real size
(:mod:`benchmarks.gui_recording`, 497 graph nodes, 40 steps): the press sends the tap to the tap route, the
release highlights the lineage and shows the route's answer with no round of Dash's callbacks; an answer
overtaken by another change of the view is asked for again, one the route cannot give comes through the
view callback, a press dragged off the node shows nothing; a press does not resize (clear and redraw) a canvas
whose size did not change, while a canvas that did change size is still resized, and the canvas's place on
the page is read again either way; the hover line is written in the pointer event itself.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from browser_support import (By, chromium, click_at, click_node, console_problems, cy, rendered_at_rest, served, settled,
                             text, wait_for)
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys

from benchmarks import gui_recording
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.app import create_app

pytestmark = pytest.mark.slow

# In the page: when the tap's press and the tap itself are handled, each request to the tap route and to the
# view callback (a view request's outputs include the selection store), and the renderer's count of redraws
# at the press and at the request. With ``hold`` the tap route's answers are kept back until ``__hold`` is
# cleared, with ``holdView`` the view callback's until ``__holdView`` is; with ``fail`` the route answers an
# error.
WATCH_TAP = """
const cy = document.getElementById(arguments[0])._cyreg.cy;
const r = cy.renderer();
window.__tap = {route: [], view: []};
window.__hold = arguments[1] === 'hold';
window.__fail = arguments[1] === 'fail';
window.__holdView = arguments[1] === 'holdView';
if (!window.__tapWatched) {
  window.__tapWatched = true;
  document.addEventListener('mousedown', () => {
    if (window.__tap.pressAt === undefined) { window.__tap.pressAt = performance.now(); window.__tap.pressDrawn = r.redrawCount || 0; }
  }, true);
  cy.on('tap', 'node', () => { window.__tap.tapAt = performance.now(); });
  const original = window.fetch;
  window.fetch = function (...args) {
    const url = String(args[0]), body = String((args[1] || {}).body || '');
    if (url.includes('_comgra/tap')) {
      window.__tap.route.push({at: performance.now(), drawn: r.redrawCount || 0});
      if (window.__fail) { return Promise.resolve(new Response('{}', {status: 500})); }
      const answer = original.apply(this, args);
      if (!window.__hold) { return answer; }
      return new Promise((resolve) => { const wait = () => (window.__hold ? setTimeout(wait, 10) : resolve(answer)); wait(); });
    }
    if (url.includes('_dash-update-component') && body.startsWith('{"output":"..selection-store.data')) {
      window.__tap.view.push({at: performance.now(), body: body.slice(0, 4000)});
      const answer = original.apply(this, args);
      if (!window.__holdView) { return answer; }
      return new Promise((resolve) => { const wait = () => (window.__holdView ? setTimeout(wait, 10) : resolve(answer)); wait(); });
    }
    return original.apply(this, args);
  };
}
"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("tap")
    gui_recording.make_recording(folder, steps=40, fault_step=20)
    with served(create_app(folder)) as url, chromium() as driver:
        driver.get(url)
        wait_for(lambda: cy(driver, "return cy.nodes().length;"), "the graph", timeout=30)
        wait_for(lambda: settled(driver), "the first view")
        yield driver


def drawn_nodes(driver: Any) -> list[str]:
    """Graph nodes (not module boxes) drawn inside the canvas, away from its edges."""
    return cy(driver, "const w = cy.width(), h = cy.height(); return cy.nodes('[kind = \"node\"]')"
                      ".filter(n => !n.hasClass('focus')).filter(n => { const p = n.renderedPosition();"
                      " return p.x > 30 && p.y > 30 && p.x < w - 30 && p.y < h - 30; }).map(n => n.id());")


def shows(driver: Any, node: str) -> bool:
    return text(driver, ids.TENSOR_HEADER).startswith(node + " /") and settled(driver)


def test_a_press_sends_the_tap_and_the_release_shows_it_with_no_callback_round(browser: Any) -> None:
    for node in drawn_nodes(browser)[:4]:
        browser.execute_script(WATCH_TAP, ids.GRAPH, "")
        click_node(browser, node)
        wait_for(lambda: shows(browser, node), f"the panels of {node}")
        seen = browser.execute_script("return window.__tap;")
        assert "focus" in cy(browser, "return cy.getElementById(arguments[1]).classes();", node)  # highlighted
        views = [v for v in seen["view"] if v["at"] >= seen["pressAt"]]
        assert len(seen["route"]) == 1 and views == [], seen  # one request, not the view callback's
        assert seen["pressAt"] <= seen["route"][0]["at"] < seen["tapAt"], seen  # it left at the press
        assert seen["route"][0]["drawn"] == seen["pressDrawn"], seen  # before any redraw


def test_a_view_changed_while_a_tap_is_answered_is_asked_again_from_the_view_shown(browser: Any) -> None:
    node = next(n for n in drawn_nodes(browser) if not shows(browser, n))
    browser.execute_script(WATCH_TAP, ids.GRAPH, "hold")
    before = text(browser, ids.STEP_LABEL)
    try:
        click_node(browser, node)
        browser.execute_script("document.activeElement && document.activeElement.blur();")
        first = before.split()[3] == "1"  # "step 0 · 1 of 40 train steps"
        ActionChains(browser).send_keys(Keys.ARROW_RIGHT if first else Keys.ARROW_LEFT).perform()  # while held
        wait_for(lambda: text(browser, ids.STEP_LABEL) != before and settled(browser), "the step changed")
        stepped = text(browser, ids.STEP_LABEL)
        assert not text(browser, ids.TENSOR_HEADER).startswith(node + " /")
    finally:
        browser.execute_script("window.__hold = false;")
    wait_for(lambda: shows(browser, node), f"the panels of {node}")
    step = stepped.split()[1]
    assert text(browser, ids.STEP_LABEL) == stepped  # the tap's answer did not take the step back
    assert f"· step {step} " in text(browser, ids.TENSOR_HEADER)
    assert len(browser.execute_script("return window.__tap.route;")) == 2  # asked again, from the step shown


def test_a_tap_answered_while_the_view_callback_is_under_way_waits_for_it_and_is_asked_again(browser: Any
                                                                                            ) -> None:
    first, node = [n for n in drawn_nodes(browser) if not shows(browser, n)][:2]
    click_node(browser, first)  # after a tap the page holds no window of steps: the next step asks the server
    wait_for(lambda: shows(browser, first), f"the panels of {first}")
    before = text(browser, ids.STEP_LABEL)
    x, y = rendered_at_rest(browser, node, "const p = e.renderedPosition(); return [p.x, p.y];")  # a step keeps it
    browser.execute_script(WATCH_TAP, ids.GRAPH, "holdView")
    try:
        browser.execute_script("document.activeElement && document.activeElement.blur();")
        ActionChains(browser).send_keys(Keys.ARROW_RIGHT if before.split()[3] == "1" else Keys.ARROW_LEFT).perform()
        wait_for(lambda: browser.execute_script("return window.__tap.view.length;") == 1, "the step's request")
        click_at(browser, x, y)  # not click_node: it waits for the view callback, which is held
        wait_for(lambda: browser.execute_script("return window.__tap.route.length;") == 1, "the tap's request")
        browser.execute_script("return new Promise((done) => setTimeout(done, 400));")
        assert text(browser, ids.TENSOR_HEADER).startswith(first + " /")  # the tap's answer waits
    finally:
        browser.execute_script("window.__holdView = false;")
    wait_for(lambda: shows(browser, node) and text(browser, ids.STEP_LABEL) != before, f"{node} at the new step")
    step = text(browser, ids.STEP_LABEL).split()[1]
    assert f"· step {step} " in text(browser, ids.TENSOR_HEADER)
    assert len(browser.execute_script("return window.__tap.route;")) == 2  # asked again after the step's answer


def test_a_tap_the_route_cannot_answer_is_shown_through_the_view_callback(browser: Any) -> None:
    node = next(n for n in drawn_nodes(browser) if not shows(browser, n))
    browser.execute_script(WATCH_TAP, ids.GRAPH, "fail")
    try:
        click_node(browser, node)
        wait_for(lambda: shows(browser, node), f"the panels of {node}")
    finally:
        browser.execute_script("window.__fail = false;")
    seen = browser.execute_script("return window.__tap;")
    views = [v for v in seen["view"] if v["at"] >= seen["pressAt"]]
    assert len(views) == 1 and '"graph",' in views[0]["body"], seen


def test_a_press_dragged_off_the_node_shows_nothing(browser: Any) -> None:
    shown = text(browser, ids.TENSOR_HEADER)
    node = next(n for n in drawn_nodes(browser) if not shows(browser, n))
    browser.execute_script(WATCH_TAP, ids.GRAPH, "")
    x, y = rendered_at_rest(browser, node, "const p = e.renderedPosition(); return [p.x, p.y];")
    kept = cy(browser, "return [cy.getElementById(arguments[1]).position(), cy.pan(), cy.zoom()];", node)
    canvas = browser.find_element(By.ID, ids.GRAPH)
    half_width, half_height = canvas.size["width"] / 2, canvas.size["height"] / 2
    ActionChains(browser).move_to_element_with_offset(canvas, int(x - half_width), int(y - half_height)) \
        .click_and_hold().move_by_offset(60, 40).release().perform()
    wait_for(lambda: browser.execute_script("return window.__tap.route.length;") == 1, "the press's request")
    browser.execute_script("return new Promise((done) => setTimeout(done, 500));")
    assert text(browser, ids.TENSOR_HEADER) == shown  # the answer to the press was not shown
    cy(browser, "cy.getElementById(arguments[1]).position(arguments[2][0]); cy.viewport({pan: arguments[2][1], "
                "zoom: arguments[2][2]});", node, kept)  # the node dragged (or the view panned) back


RESIZES = """
const cy = document.getElementById(arguments[0])._cyreg.cy;
if (window.__resizes === undefined) { window.__resizes = 0; cy.on('resize', () => { window.__resizes += 1; }); }
return [window.__resizes, cy.width(), cy.height()];
"""


def press_background(driver: Any) -> None:
    """A real press and release on an empty corner of the canvas, as a pan starts."""
    canvas = driver.find_element(By.ID, ids.GRAPH)
    ActionChains(driver).move_to_element_with_offset(canvas, int(4 - canvas.size["width"] / 2),
                                                     int(4 - canvas.size["height"] / 2)).click().perform()


def test_a_press_resizes_the_canvas_only_when_its_size_changed(browser: Any) -> None:
    before, width, height = browser.execute_script(RESIZES, ids.GRAPH)
    press_background(browser)
    browser.execute_script("return new Promise((done) => setTimeout(done, 200));")  # dash-cytoscape waits 50 ms
    assert browser.execute_script(RESIZES, ids.GRAPH) == [before, width, height]
    kept = cy(browser, "const box = cy.container(); const kept = box.style.height;"
                       " box.style.height = (box.clientHeight - 100) + 'px'; return kept;")
    try:
        press_background(browser)
        wait_for(lambda: browser.execute_script(RESIZES, ids.GRAPH)[0] == before + 1, "the canvas resized")
        assert browser.execute_script(RESIZES, ids.GRAPH)[1:] == [width, height - 100]
    finally:
        cy(browser, "cy.container().style.height = arguments[1];", kept)
        press_background(browser)
        wait_for(lambda: browser.execute_script(RESIZES, ids.GRAPH)[1:] == [width, height], "the size back")


def test_a_resize_of_unchanged_size_still_drops_the_canvas_place_kept(browser: Any) -> None:
    # cytoscape keeps where its canvas sits on the page; when the page above the graph changes height without
    # a scroll or a resize, the press's late resize (dash-cytoscape calls cy.resize on every press) made it
    # read that again. Without the resize, a place kept is still dropped, to be read at the next pointer event.
    press_background(browser)  # a first press sizes the canvas to its box, if the page's layout moved it since
    browser.execute_script("return new Promise((done) => setTimeout(done, 200));")
    before = browser.execute_script(RESIZES, ids.GRAPH)
    place = cy(browser, "const r = cy.renderer(); r.findContainerClientCoords(); const kept = r.containerBB;"
                        " cy.resize(); return [kept, r.containerBB];")
    assert place[0] is not None and place[1] is None
    assert browser.execute_script(RESIZES, ids.GRAPH) == before  # and the canvas was not resized


def test_hovering_writes_the_full_name_in_the_pointer_event_itself(browser: Any) -> None:
    node = drawn_nodes(browser)[0]
    x, y = rendered_at_rest(browser, node, "const p = e.renderedPosition(); return [p.x, p.y];")
    canvas = browser.find_element(By.ID, ids.GRAPH)
    half_width, half_height = canvas.size["width"] / 2, canvas.size["height"] / 2
    # what the hover line says while cytoscape's mouseover is still being handled (a Dash callback would
    # write it only after the event, from a timer)
    cy(browser, "window.__hovered = null; cy.on('mouseover', 'node', (event) => { if (event.target.id() === "
                "arguments[1]) { window.__hovered = document.getElementById(arguments[2]).textContent; } });",
       node, ids.GRAPH_HOVER)
    ActionChains(browser).move_to_element_with_offset(canvas, int(2 - half_width), int(2 - half_height)) \
        .move_to_element_with_offset(canvas, int(x - half_width), int(y - half_height)).perform()
    wait_for(lambda: browser.execute_script("return window.__hovered;"), "the mouseover")
    assert browser.execute_script("return window.__hovered;").startswith(node + " (")
    assert text(browser, ids.GRAPH_HOVER).startswith(node + " (")


def test_no_console_error_or_warning(browser: Any) -> None:
    assert console_problems(browser) == []
