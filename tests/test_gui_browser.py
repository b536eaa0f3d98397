"""The explorer in real headless Chromium (Debian's /usr/bin/chromium driven by /usr/bin/chromedriver).

One server (a thread on a free port) and one browser serve every test of the module, in order: open the
recording, click a node, step and pick selectors, see the values change, click the timeline, open the
other tabs, analyse a faulty trial and jump to its hypothesis, follow a live recording. Screenshots go to
a temporary folder, or to ``$COMGRA_SCREENSHOT_DIR`` (``docs/screenshots`` to refresh the docs' images). Without Chromium, ChromeDriver or selenium the module is skipped with the reason; CI
installs all three.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_gui_support import FAULT_NODE, make_faulty, make_recording, new_model, train_steps

from comgra_ndbg import Recorder
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.app import create_app

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# Screenshots go to a temporary folder, so a test run leaves the checkout clean; set
# COMGRA_SCREENSHOT_DIR=docs/screenshots to refresh the ones the README and docs show.
SCREENSHOTS = Path(os.environ.get("COMGRA_SCREENSHOT_DIR") or Path(tempfile.gettempdir()) / "comgra_ndbg_screenshots")

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip(f"browser tests need {CHROMIUM} and {CHROMEDRIVER} (Debian packages chromium, chromium-driver)",
                allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="browser tests need selenium (pip install selenium)")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

pytestmark = pytest.mark.slow


class Live:
    """A trial that is still being recorded while the explorer is open."""

    def __init__(self, folder: Path) -> None:
        self.model = new_model(1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.recorder = Recorder(folder, trial="live", snapshots=1, flush_every_steps=1)
        self.recorder.track_module("model", self.model)
        self.next = 0

    def record(self, steps: int) -> None:
        train_steps(self.recorder, self.model, self.optimizer, range(self.next, self.next + steps))
        self.next += steps


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Live]]:
    folder = make_faulty(make_recording(tmp_path_factory.mktemp("group"), steps=8))
    live = Live(folder)
    live.record(2)
    yield folder, live
    live.recorder.close()


def docs_visualization(folder: Path) -> Path:
    """The custom visualization example of docs/gui.md, as a file."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "gui.md").read_text()
    path = folder / "my_views.py"
    path.write_text(text.split("```python\n# my_views.py\n")[1].split("```")[0])
    return path


@pytest.fixture(scope="module")
def url(live: tuple[Path, Live], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder, _ = live
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request would drown the report
    app = create_app(folder, interval_ms=400,
                     visualization_file=docs_visualization(tmp_path_factory.mktemp("viz")))
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    thread.join(timeout=5)


@pytest.fixture(scope="module")
def browser(url: str) -> Iterator[Any]:
    profile = tempfile.mkdtemp(prefix="comgra-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage", "--disable-sync",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1440, "height": 1080, "deviceScaleFactor": 1, "mobile": False})
    driver.get(url)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """Poll ``condition`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except Exception:  # the page is re-rendering under us; look again
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def text(driver: Any, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def statistic(driver: Any, name: str) -> str | None:
    """The value cell of one row of the statistics table."""
    return driver.execute_script(
        "const rows = document.querySelectorAll(arguments[0] + ' tbody tr');"
        "for (const r of rows) { if (r.cells[0].textContent === arguments[1]) return r.cells[1].textContent; }"
        "return null;", f"#{ids.STATS_TABLE}-table", name)


def settled(driver: Any) -> bool:
    """No Dash callback is running (the renderer marks the page while one is pending)."""
    return not driver.execute_script("return !!document.querySelector('[data-dash-is-loading=\"true\"]');")


def click_stepper(driver: Any, selector: str, delta: int) -> None:
    button = driver.execute_script("return document.getElementById(arguments[0]);",
                                   ids.stepper_button_id(selector, delta))
    button.click()


def choose(driver: Any, dropdown_id: str, label: str) -> None:
    """Open a Dash 4 dropdown (once the page has rendered it) and click the option with ``label``."""
    wait_for(lambda: driver.find_elements(By.ID, dropdown_id), f"dropdown {dropdown_id}")[0].click()
    option = wait_for(lambda: next(o for o in driver.find_elements(By.CSS_SELECTOR, "[role='option']")
                                   if o.text.strip() == label), f"option {label!r} of {dropdown_id}")
    option.click()


def click_node(driver: Any, node: str) -> None:
    """Click a graph node where cytoscape drew it."""
    x, y = driver.execute_script(
        "const cy = document.getElementById(arguments[0])._cyreg.cy;"
        "const p = cy.getElementById(arguments[1]).renderedPosition(); return [p.x, p.y];", ids.GRAPH, node)
    canvas = driver.find_element(By.ID, ids.GRAPH)
    size = canvas.size
    ActionChains(driver).move_to_element_with_offset(canvas, int(x - size["width"] / 2),
                                                     int(y - size["height"] / 2)).click().perform()


def select_node(driver: Any, node: str, attempts: int = 4) -> None:
    """Click a graph node until the tensor panel shows it: a click misses when cytoscape moves its view
    between reading the node's position and the click (a live trial refreshing beside the test)."""
    def shown() -> bool:
        header = driver.execute_script("return document.getElementById(arguments[0]).textContent;",
                                       ids.TENSOR_HEADER)
        return header.startswith(f"{node} /")

    for _ in range(attempts - 1):
        click_node(driver, node)
        try:
            wait_for(shown, f"node {node} selected", timeout=4.0)
            return
        except AssertionError:
            continue
    click_node(driver, node)
    wait_for(shown, f"node {node} selected")


def node_classes(driver: Any, node: str) -> list[str]:
    """The classes cytoscape holds for a graph node."""
    return driver.execute_script("return document.getElementById(arguments[0])._cyreg.cy.getElementById(arguments[1])"
                                 ".classes();", ids.GRAPH, node)


def screenshot(driver: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    wait_for(lambda: settled(driver), "callbacks to settle")
    time.sleep(0.3)  # let plotly finish its transition
    driver.save_screenshot(str(SCREENSHOTS / name))


def test_opening_a_recording_paints_the_graph_and_the_tensor(browser: Any) -> None:
    nodes = wait_for(lambda: browser.execute_script(
        "const c = document.getElementById(arguments[0]);"
        "return c && c._cyreg && c._cyreg.cy.nodes().map(n => n.id()).sort();", ids.GRAPH), "graph nodes")
    assert nodes == ["hidden", "input", "loss", "model.0", "model.2", "output", "target"]
    wait_for(lambda: statistic(browser, "count") == "12", "the output's statistics")
    assert text(browser, ids.STEP_LABEL) == "step 7 · 4 of 4 short steps"
    assert text(browser, ids.STATUS) == "a: 8 recorded steps, last 7 · complete"
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f"#{ids.TIMELINE_BOX} .js-plotly-plot"), "the timeline")
    assert console_errors(browser) == []


def console_errors(driver: Any) -> list[str]:
    """The browser's console errors since the last call (Dash reports failed callbacks there)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def test_clicking_a_node_selects_it_and_stepping_changes_the_values(browser: Any) -> None:
    select_node(browser, "hidden")
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith("hidden / hidden · value · step 7"), "hidden")
    wait_for(lambda: statistic(browser, "count") == "48", "the hidden node's statistics")
    at_7 = statistic(browser, "mean")
    click_stepper(browser, "step", -1)
    wait_for(lambda: text(browser, ids.STEP_LABEL) == "step 5 · 3 of 4 short steps", "step 5")
    wait_for(lambda: statistic(browser, "mean") not in (None, at_7), "another mean at step 5")
    assert text(browser, ids.TENSOR_HEADER).startswith("hidden / hidden · value · step 5")
    screenshot(browser, "explorer.png")


def test_selectors_change_kind_sample_and_node_without_resetting_the_rest(browser: Any) -> None:
    choose(browser, ids.KIND, "gradient")
    wait_for(lambda: "· gradient · step 5" in text(browser, ids.TENSOR_HEADER), "the gradient")
    value_mean = statistic(browser, "mean")
    click_stepper(browser, "sample", +1)
    wait_for(lambda: "· sample 0 ·" in text(browser, ids.TENSOR_HEADER), "sample 0")
    wait_for(lambda: statistic(browser, "count") == "8", "one sample's statistics")
    assert statistic(browser, "mean") != value_mean
    choose(browser, ids.SAMPLE, "whole batch")
    select_node(browser, "model.2")
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith("model.2 / weight · gradient · step 5"),
             "model.2's weight gradient at the same step")
    choose(browser, ids.KIND, "update")
    wait_for(lambda: "· update · step 5" in text(browser, ids.TENSOR_HEADER), "the update")
    click_stepper(browser, "tensor", -1)
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith("model.2 / bias · update · step 5"), "the bias")


def test_clicking_the_timeline_moves_the_step(browser: Any) -> None:
    points = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f"#{ids.TIMELINE_BOX} g.trace.scatter path.point"),
                      "timeline points")
    assert len(points) == 8  # two step types, four steps each
    first = min(points, key=lambda p: p.location["x"])
    ActionChains(browser).move_to_element(first).click().perform()
    wait_for(lambda: text(browser, ids.STEP_LABEL) == "step 0 · 1 of 4 long steps", "step 0 from the timeline")
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith("model.2 / bias · update · step 0 (long)"),
             "the tensor panel at step 0")
    marker = wait_for(lambda: browser.execute_script(
        "return String(document.querySelector(arguments[0]).layout.shapes[0].x0);",
        f"#{ids.TIMELINE_BOX} .js-plotly-plot") == "0", "the step marker at step 0")
    assert marker


def test_collapsing_modules_groups_parameter_nodes(browser: Any) -> None:
    choose(browser, ids.COLLAPSE, "model")
    nodes = wait_for(lambda: (lambda n: n if "model" in n else None)(browser.execute_script(
        "return document.getElementById(arguments[0])._cyreg.cy.nodes().map(n => n.id()).sort();", ids.GRAPH)),
        "the collapsed node")
    assert nodes == ["hidden", "input", "loss", "model", "output", "target"]
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith("model / 2.bias"), "the same tensor, regrouped")


def test_other_tabs_render(browser: Any) -> None:
    tabs = {t.text: t for t in browser.find_elements(By.CSS_SELECTOR, ".tab")}
    tabs["KPIs"].click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f"#{ids.KPIS} .js-plotly-plot"), "the KPI plot")
    tabs["Network"].click()
    wait_for(lambda: "58 parameters in 3 modules" in text(browser, ids.NETWORK), "the module tree")
    screenshot(browser, "network.png")
    tabs["Notes & problems"].click()
    wait_for(lambda: "learning rate kept" in text(browser, ids.NOTES), "the note")
    tabs["Diagnosis"].click()
    wait_for(lambda: "No analysis stored for this trial yet" in text(browser, ids.DIAGNOSIS), "the diagnosis")
    click_node(browser, "hidden")  # the tensor panel is on another tab: the comparison below shows the choice
    for _ in range(3):
        click_stepper(browser, "step", +1)
    wait_for(lambda: text(browser, ids.STEP_LABEL) == "step 6 · 4 of 4 long steps", "step 6")
    tabs["Compare"].click()
    wait_for(lambda: "hidden — A: a · step 6 · value vs B: b · step 6 · value" in text(browser, ids.COMPARE),
             "hidden in trial a against trial b")
    screenshot(browser, "compare.png")
    tabs["Custom"].click()
    wait_for(lambda: "Weight norm per layer" in text(browser, ids.CUSTOM)
             and browser.find_elements(By.CSS_SELECTOR, f"#{ids.CUSTOM} .js-plotly-plot"), "the docs' custom view")
    tabs["Tensors"].click()


def test_analyzing_a_faulty_trial_marks_its_node_and_choosing_the_hypothesis_jumps_there(browser: Any) -> None:
    choose(browser, ids.TRIAL, "fault")
    wait_for(lambda: text(browser, ids.STATUS) == "fault: 24 recorded steps, last 23 · complete", "the faulty trial")
    def nodes() -> set[str]:
        return set(browser.execute_script(
            "return document.getElementById(arguments[0])._cyreg.cy.nodes().map(n => n.id());", ids.GRAPH))
    wait_for(lambda: FAULT_NODE in nodes(), "its graph")
    if "model.2" not in nodes():
        choose(browser, ids.COLLAPSE, "model")  # expand the module an earlier test collapsed
    wait_for(lambda: "model.2" in nodes(), "its graph, expanded")
    assert "has-event" not in node_classes(browser, FAULT_NODE)
    tabs = {t.text: t for t in browser.find_elements(By.CSS_SELECTOR, ".tab")}
    tabs["Diagnosis"].click()
    wait_for(lambda: "No analysis stored for this trial yet" in text(browser, ids.DIAGNOSIS), "no analysis yet")
    browser.find_element(By.ID, ids.ANALYZE).click()
    wait_for(lambda: text(browser, ids.ANALYZE_STATUS).startswith("Analysed 24 steps of trial fault"), "the analysis")
    card = f"#{ids.DIAGNOSIS} .hypothesis"
    wait_for(lambda: f"Saturation originated in '{FAULT_NODE}' at step 10" in browser.find_element(
        By.CSS_SELECTOR, card).text, "the hypothesis")
    shown = browser.find_element(By.CSS_SELECTOR, card).text
    confidence = float(shown.split("(confidence ")[1][:4])
    assert f"\n{round(confidence * 100)}%\n" in shown  # the card shows the sentence's confidence as a percentage
    wait_for(lambda: {"has-event", "event-origin"} <= set(node_classes(browser, FAULT_NODE)), "the event mark")
    assert [n for n in ("input", "hidden0", "output", "loss") if "has-event" in node_classes(browser, n)] == []
    wait_for(lambda: browser.find_element(By.CSS_SELECTOR, card).click() or True, "a click on the hypothesis")
    wait_for(lambda: text(browser, ids.STEP_LABEL) == "step 10 · 11 of 24 default steps", "the onset step")
    wait_for(lambda: text(browser, ids.NODE) == FAULT_NODE, "the node selector on the hypothesis' node")
    wait_for(lambda: "current" in browser.find_element(By.CSS_SELECTOR, card).get_attribute("class"),
             "the chosen hypothesis highlighted")
    wait_for(lambda: browser.execute_script(  # figures.SELECTED_COLOR: the graph selected it too
        "return document.getElementById(arguments[0])._cyreg.cy.getElementById(arguments[1]).style('border-color');",
        ids.GRAPH, FAULT_NODE) == "rgb(17,17,17)", "the node selected in the graph")
    screenshot(browser, "diagnosis.png")
    tabs["Tensors"].click()
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith(f"{FAULT_NODE} / {FAULT_NODE} · value · step 10"),
             "the tensor at the onset")
    label = wait_for(lambda: browser.execute_script(
        "const p = document.querySelector(arguments[0]); return p && p.layout.annotations.length && "
        "p.layout.annotations[0].text;", f"#{ids.TIMELINE_BOX} .js-plotly-plot"), "the event on the timeline")
    assert label == "⚑ saturated"


def test_steps_recorded_while_the_explorer_is_open_appear(browser: Any, live: tuple[Path, Live]) -> None:
    _, recording = live
    choose(browser, ids.TRIAL, "live")
    wait_for(lambda: text(browser, ids.STATUS) == "live: 2 recorded steps, last 1 · live", "the live trial")
    recording.record(3)
    wait_for(lambda: text(browser, ids.STATUS) == "live: 5 recorded steps, last 4 · live", "the new steps")
    click_stepper(browser, "step_type", -1)
    wait_for(lambda: text(browser, ids.STEP_LABEL).endswith("of 3 long steps"), "the grown slider")


def test_the_whole_journey_left_no_console_error(browser: Any) -> None:
    assert console_errors(browser) == []
