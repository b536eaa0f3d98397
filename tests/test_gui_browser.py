"""The explorer in real headless Chromium (Debian's /usr/bin/chromium driven by /usr/bin/chromedriver).

One server (a thread on a free port) and one browser serve every test of the module, in order: open the
recording, click a node, step and pick selectors, see the values change, click the timeline, overlay nodes
and trials and save the plot, open the other tabs, analyse a faulty trial and jump to its hypothesis' evidence,
follow a live recording. Screenshots go to a temporary folder, or to ``$COMGRA_SCREENSHOT_DIR``
(``docs/screenshots`` to refresh the docs' images). Without Chromium, ChromeDriver or selenium the module is
skipped with the reason; CI installs all three.
"""
from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from browser_support import (By, chromium, choose, click_frame, click_node, console_problems, graph_nodes,
                             node_classes, screenshot, served, text, type_into, wait_for)
from selenium.webdriver.common.action_chains import ActionChains
from test_gui_support import FAULT_NODE, make_faulty, make_recording, new_model, train_steps

from comgra_ndbg import Recorder, open_recording
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.app import create_app
from comgra_ndbg.gui.figures import histogram_bins
from comgra_ndbg.gui.histogramscript import MARGIN

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
    app = create_app(folder, interval_ms=400, visualization_file=docs_visualization(tmp_path_factory.mktemp("viz")))
    with served(app) as address:
        yield address


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(url: str, downloads: Path) -> Iterator[Any]:
    with chromium(downloads=downloads) as driver:
        driver.get(url)
        yield driver


def statistic(driver: Any, name: str) -> str | None:
    """The value cell of one row of the statistics table."""
    return driver.execute_script(
        "const rows = document.querySelectorAll(arguments[0] + ' tbody tr');"
        "for (const r of rows) { if (r.cells[0].textContent === arguments[1]) return r.cells[1].textContent; }"
        "return null;", f"#{ids.STATS_TABLE}-table", name)


def click_stepper(driver: Any, selector: str, delta: int) -> None:
    button_id = ((ids.STEP_PREV if delta < 0 else ids.STEP_NEXT) if selector == "step"
                 else ids.stepper_button_id(selector, delta))
    button = driver.execute_script("return document.getElementById(arguments[0]);", button_id)
    button.click()


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


def test_opening_a_recording_paints_the_graph_and_the_tensor(browser: Any) -> None:
    nodes = wait_for(lambda: browser.execute_script(
        "const c = document.getElementById(arguments[0]);"
        "return c && c._cyreg && c._cyreg.cy.nodes().map(n => n.id()).sort();", ids.GRAPH), "graph nodes")
    assert nodes == ["box:model", "hidden", "input", "loss", "model.0", "model.2", "output", "target"]
    wait_for(lambda: statistic(browser, "count") == "12", "the output's statistics")
    assert text(browser, ids.STEP_LABEL) == "step 7 · 4 of 4 short steps"
    assert text(browser, ids.STATUS) == "a: 8 recorded steps, last 7 · complete"
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f"#{ids.TIMELINE_BOX} .js-plotly-plot"), "the timeline")
    assert console_problems(browser) == []


def test_the_page_got_its_layout_and_callbacks_once_through_its_preloads(browser: Any) -> None:
    fetched = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => [new URL(e.name).pathname, e.initiatorType])"
        ".filter(([path]) => path === '/_dash-layout' || path === '/_dash-dependencies');")
    assert sorted(fetched) == [["/_dash-dependencies", "link"], ["/_dash-layout", "link"]]


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


def test_element_values_read_out_the_cell_under_the_pointer_and_save_as_png_and_csv(
        browser: Any, live: tuple[Path, Live], downloads: Path) -> None:
    select_node(browser, "hidden")
    image = wait_for(lambda: browser.find_elements(By.ID, ids.VALUES_IMAGE), "the element values' image")[0]
    step = int(re.search(r"· step (\d+) ", text(browser, ids.TENSOR_HEADER)).group(1))
    dense = open_recording(live[0], "a").snapshot(step, "hidden").dense()  # 4 samples × 8
    size = browser.execute_script("return [arguments[0].clientWidth, arguments[0].clientHeight, "
                                  "arguments[0].naturalWidth, arguments[0].naturalHeight];", image)
    assert size[2:] == [8, 4]  # one pixel per element, stretched over the panel
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", image)
    for row, column in ((0, 0), (2, 5), (3, 7)):
        x = (column + 0.5) * size[0] / 8 - size[0] / 2
        y = (row + 0.5) * size[1] / 4 - size[1] / 2
        ActionChains(browser).move_to_element_with_offset(image, round(x), round(y)).perform()
        said = wait_for(lambda: re.fullmatch(rf"sample {row}, index {column}: (\S+)", browser.find_element(
            By.CSS_SELECTOR, ".values-readout").text), f"the readout of sample {row}, index {column}")
        assert float(said.group(1)) == pytest.approx(float(dense[row, column]), rel=1e-5)
    for fmt in ("csv", "png"):
        browser.execute_script("document.getElementById(arguments[0]).click();",
                               '{"format":"%s","target":"%s","type":"%s"}' % (fmt, ids.VALUES_IMAGE, ids.EXPORT_TYPE))
        wait_for(lambda: list(downloads.glob(f"comgra-{ids.VALUES_IMAGE}-*.{fmt}")), f"the {fmt} file")
    rows = next(downloads.glob(f"comgra-{ids.VALUES_IMAGE}-*.csv")).read_text().splitlines()
    assert rows[0] == "sample,index,value" and len(rows) == 1 + 32
    assert rows[1 + 2 * 8 + 5].startswith("2,5,") and float(rows[1 + 2 * 8 + 5].split(",")[2]) == pytest.approx(
        float(dense[2, 5]), rel=1e-6)
    png = next(downloads.glob(f"comgra-{ids.VALUES_IMAGE}-*.png")).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (2048, 1024)  # 256 px a cell


def test_the_histogram_is_drawn_reads_out_the_bar_under_the_pointer_and_saves_as_png_and_csv(
        browser: Any, live: tuple[Path, Live], downloads: Path) -> None:
    select_node(browser, "hidden")
    canvas = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f"#{ids.HISTOGRAM} canvas.histogram-canvas"),
                      "the histogram")[0]
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", canvas)
    wait_for(lambda: browser.execute_script("return window.dash_clientside.comgraHistogram.drawn(arguments[0]);",
                                            canvas), "the histogram drawn")
    step = int(re.search(r"· step (\d+) ", text(browser, ids.TENSOR_HEADER)).group(1))
    bins = histogram_bins(open_recording(live[0], "a").snapshot(step, "hidden").values)
    width, height = browser.execute_script("return [arguments[0].clientWidth, arguments[0].clientHeight];", canvas)
    inner = width - MARGIN["left"] - MARGIN["right"]
    tallest = max(range(len(bins.counts)), key=lambda i: bins.counts[i])
    for i in (tallest, min(range(len(bins.counts)), key=lambda i: bins.counts[i])):
        x = MARGIN["left"] + (i + 0.5) / len(bins.counts) * inner
        pixel = browser.execute_script(  # the bar's colour just above the axis where there are values
            "const copy = document.createElement('canvas'); copy.width = arguments[0].width;"
            "copy.height = arguments[0].height; const c = copy.getContext('2d', {willReadFrequently: true});"
            "c.drawImage(arguments[0], 0, 0);"
            "return Array.from(c.getImageData(arguments[1], arguments[2], 1, 1).data);",
            canvas, round(x), height - MARGIN["bottom"] - 2)
        assert (pixel[:3] == [0x4C, 0x72, 0xB0]) == (bins.counts[i] > 0)
        ActionChains(browser).move_to_element_with_offset(canvas, round(x - width / 2), 0).perform()
        wait_for(lambda: browser.find_element(By.CSS_SELECTOR, ".histogram-readout").text.endswith(
            f": {bins.counts[i]} value" + ("" if bins.counts[i] == 1 else "s")), f"the readout of bar {i}")
    for fmt in ("csv", "png"):
        browser.execute_script("document.getElementById(arguments[0]).click();",
                               '{"format":"%s","target":"%s","type":"%s"}' % (fmt, ids.HISTOGRAM, ids.EXPORT_TYPE))
        wait_for(lambda: list(downloads.glob(f"comgra-{ids.HISTOGRAM}-*.{fmt}")), f"the {fmt} file")
    rows = next(downloads.glob(f"comgra-{ids.HISTOGRAM}-*.csv")).read_text().splitlines()
    assert rows[0] == "low,high,count" and [int(r.split(",")[2]) for r in rows[1:]] == bins.counts
    assert float(rows[1].split(",")[0]) == pytest.approx(bins.edges[0])
    png = next(downloads.glob(f"comgra-{ids.HISTOGRAM}-*.png")).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (2 * width, 2 * (height + 22))


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


def timeline_steps(driver: Any) -> list[list[int]]:
    """The steps of each line of the timeline as drawn."""
    return driver.execute_script("return document.querySelector(arguments[0]).data.map(t => t.x);",
                                 f"#{ids.TIMELINE} .js-plotly-plot")


def test_zooming_the_timeline_draws_the_zoomed_range_and_a_reset_the_whole_run(browser: Any) -> None:
    whole = timeline_steps(browser)
    assert whole == [[0, 2, 4, 6], [1, 3, 5, 7]]  # long and short steps
    relayout = "Plotly.relayout(document.querySelector(arguments[0]), arguments[1]);"
    browser.execute_script(relayout, f"#{ids.TIMELINE} .js-plotly-plot", {"xaxis.range": [2.5, 3.5]})  # as a drag
    wait_for(lambda: timeline_steps(browser) == [[2, 4], [1, 3, 5]], "the zoomed range, and a point beyond each edge")
    assert browser.execute_script("return document.querySelector(arguments[0]).layout.xaxis.range;",
                                  f"#{ids.TIMELINE} .js-plotly-plot") == [2.5, 3.5]
    browser.execute_script(relayout, f"#{ids.TIMELINE} .js-plotly-plot", {"xaxis.autorange": True})  # a double click
    wait_for(lambda: timeline_steps(browser) == whole, "the whole run again")


def test_clicking_a_module_frame_closes_it_and_clicking_the_box_opens_it(browser: Any) -> None:
    click_frame(browser, "box:model")
    wait_for(lambda: graph_nodes(browser) == ["box:model", "hidden", "input", "loss", "output", "target"],
             "the module closed into one box")
    assert "box" in node_classes(browser, "box:model")
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith("model.2 / bias"), "the selection kept")
    click_node(browser, "box:model")
    wait_for(lambda: "model.0" in graph_nodes(browser), "the module opened again")


def plot_data(driver: Any, plot_id: str) -> list[dict[str, Any]]:
    """Name, type and point count of each trace of a drawn plot, and its y axis type as ``axis``."""
    return driver.execute_script(
        "const p = document.querySelector('#' + arguments[0] + ' .js-plotly-plot'); if (!p || !p.data) return null;"
        "return p.data.map(t => ({name: t.name, type: t.type, points: (t.x || []).length,"
        "                          axis: p.layout.yaxis.type}));", plot_id)


def test_a_timeline_overlays_nodes_and_trials_with_log_y_and_smoothing_and_saves_as_png_and_csv(
        browser: Any, downloads: Path) -> None:
    select_node(browser, "hidden")
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith("hidden / hidden"), "hidden")
    choose(browser, ids.OVERLAY_NODES, "output")
    choose(browser, ids.OVERLAY_TRIALS, "b")
    wait_for(lambda: [t["name"] for t in plot_data(browser, ids.TIMELINE)] == ["a · hidden", "a · output",
                                                                             "b · hidden"], "three curves")
    browser.find_element(By.CSS_SELECTOR, f"#{ids.TIMELINE_OPTIONS} input").click()
    wait_for(lambda: plot_data(browser, ids.TIMELINE)[0]["axis"] == "log", "a log y axis")
    type_into(browser, ids.EMA, "0.6")
    wait_for(lambda: "a · hidden (EMA 0.6)" in [t["name"] for t in plot_data(browser, ids.TIMELINE)], "smoothed")
    screenshot(browser, "overlay.png")
    for fmt in ("csv", "png"):
        browser.execute_script("document.getElementById(arguments[0]).click();",
                               '{"format":"%s","target":"%s","type":"%s"}' % (fmt, ids.TIMELINE, ids.EXPORT_TYPE))
        saved = wait_for(lambda: [p for p in downloads.glob(f"comgra-{ids.TIMELINE}-*.{fmt}")], f"the {fmt} file")
    rows = saved and next(downloads.glob(f"comgra-{ids.TIMELINE}-*.csv")).read_text().splitlines()
    assert rows[0] == "trace,x,y" and rows[1].startswith("a · hidden,0,")
    assert next(downloads.glob(f"comgra-{ids.TIMELINE}-*.png")).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for option in (ids.OVERLAY_NODES, ids.OVERLAY_TRIALS):  # back to one curve for the tests after this one
        browser.execute_script("document.querySelectorAll('#' + arguments[0] + ' .dash-dropdown-clear, #' + "
                               "arguments[0] + ' [aria-label=\"Clear all\"]').forEach(b => b.click());", option)
    browser.find_element(By.CSS_SELECTOR, f"#{ids.TIMELINE_OPTIONS} input").click()


def test_other_tabs_render(browser: Any) -> None:
    tabs = {t.text: t for t in browser.find_elements(By.CSS_SELECTOR, ".tab")}
    tabs["KPIs"].click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f"#{ids.KPIS} .js-plotly-plot"), "the KPI plot")
    tabs["Layers"].click()
    flow = wait_for(lambda: plot_data(browser, ids.GRADIENT_FLOW), "the gradient flow")
    assert [(t["name"], t["points"]) for t in flow] == [("model.0", 8), ("model.2", 8)]
    assert [t["name"] for t in wait_for(lambda: plot_data(browser, ids.UPDATE_RATIO), "the update ratio")] == [
        "model.0", "model.2"]
    tabs["Distribution"].click()
    heatmap = wait_for(lambda: plot_data(browser, ids.DISTRIBUTION), "the distribution over steps")
    assert heatmap[0]["type"] == "heatmap" and heatmap[0]["points"] == 8  # one column per snapshot step
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
    overflow = browser.execute_script(  # the table and the overlaid histograms fit in the tab
        "const tab = document.getElementById(arguments[0]).getBoundingClientRect();"
        "return [...document.querySelectorAll('#' + arguments[0] + ' table, #' + arguments[0] + ' .js-plotly-plot')]"
        ".filter(e => e.getBoundingClientRect().right > tab.right + 1).length;", ids.COMPARE)
    assert overflow == 0
    assert [t["name"] for t in plot_data(browser, f"{ids.COMPARE}-histogram")] == [
        "A: a · step 6 · value", "B: b · step 6 · value"]
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
    wait_for(lambda: FAULT_NODE in nodes() and "model.2" in nodes(), "its graph")
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
    screenshot(browser, "diagnosis.png")
    wait_for(lambda: browser.find_element(By.CSS_SELECTOR, card).click() or True, "a click on the hypothesis")
    wait_for(lambda: text(browser, ids.STEP_LABEL) == "step 10 · 11 of 24 default steps", "the onset step")
    wait_for(lambda: text(browser, ids.NODE) == FAULT_NODE, "the node selector on the hypothesis' node")
    wait_for(lambda: "current" in browser.find_element(By.CSS_SELECTOR, card).get_attribute("class"),
             "the chosen hypothesis highlighted")
    wait_for(lambda: browser.execute_script(  # figures.SELECTED_COLOR: the graph selected it too
        "return document.getElementById(arguments[0])._cyreg.cy.getElementById(arguments[1]).style('border-color');",
        ids.GRAPH, FAULT_NODE) == "rgb(17,17,17)", "the node selected in the graph")
    evidence = wait_for(lambda: text(browser, ids.EVIDENCE), "the evidence")
    assert evidence.startswith(f"Evidence · Saturation originated in '{FAULT_NODE}' at step 10")
    assert "Remedy: " in evidence and "saturated_enter = 0.5" in evidence
    marks = wait_for(lambda: browser.execute_script(
        "const p = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
        "return p && p.layout.annotations.map(a => a.text);", ids.EVIDENCE + "-plot"), "the evidence plot")
    assert "onset 10" in marks and "saturated_enter 0.5" in marks
    screenshot(browser, "evidence.png")
    tabs["Tensors"].click()
    wait_for(lambda: text(browser, ids.TENSOR_HEADER).startswith(f"{FAULT_NODE} / {FAULT_NODE} · value · step 10"),
             "the tensor at the onset")
    assert browser.execute_script(  # the timeline shows the statistic the rule fired on
        "return document.querySelector(arguments[0]).layout.yaxis.title.text;",
        f"#{ids.TIMELINE_BOX} .js-plotly-plot") == "saturated_fraction"
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
    wait_for(lambda: text(browser, ids.STEP_LABEL) == "step 3 · 2 of 2 short steps", "following the last step")
    browser.find_element(By.CSS_SELECTOR, f"#{ids.FOLLOW} input").click()  # stop following
    wait_for(lambda: "follow=0" in browser.execute_script("return window.location.search;"), "not following")
    recording.record(2)
    wait_for(lambda: text(browser, ids.STATUS) == "live: 7 recorded steps, last 6 · live", "more steps")
    assert text(browser, ids.STEP_LABEL) == "step 3 · 2 of 3 short steps"  # the slider grew; the step stayed
    click_stepper(browser, "step_type", -1)
    wait_for(lambda: text(browser, ids.STEP_LABEL) == "step 2 · 2 of 4 long steps", "the nearest long step")


def test_the_whole_journey_left_no_console_error_or_warning(browser: Any) -> None:
    assert console_problems(browser) == []
