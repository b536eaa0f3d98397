"""The tutorial-shaped Comgra script's recording in the explorer, in real headless Chromium: the walk through
Comgra's README takes (type of training step, iteration, role of tensor, batch index), then the other trial,
the KPIs and the notes. The server, browser and helpers are those of ``browser_support`` and ``test_gui_browser``
(skipped, with the reason, where Chromium, ChromeDriver or selenium are missing)."""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from browser_support import By, chromium, choose, console_problems, served, settled, text, wait_for
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from test_gui_browser import click_stepper, select_node, statistic

from test_compat_comgra import record_attention

from comgra_ndbg.compat.comgra import CompatibilityWarning
from comgra_ndbg.compat.comgra.tutorial import CONFIGURATIONS, Demonstration
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.app import create_app

pytestmark = pytest.mark.slow

SMALL = dict(steps=26, batch_size=8, hidden_size=16, memory_size=6, dataset_size=64,
             min_training_steps_difference=20)
"""As in test_compat_comgra_tutorial: snapshots at steps 0-11 (every type's first step), 24 and 25."""
BUGGED, FIXED = (f"trial_{c}" for c in CONFIGURATIONS)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("tutorial")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompatibilityWarning)  # the tutorial asks for singular values, as Comgra's does
        Demonstration(root, "tutorial", **SMALL).run_all_configurations()
    with served(create_app(root / "tutorial", interval_ms=400)) as address:
        yield address


@pytest.fixture(scope="module")
def browser(url: str) -> Iterator[Any]:
    with chromium() as driver:
        driver.get(url)
        yield driver


def graph_nodes(driver: Any) -> list[str]:
    return driver.execute_script("const c = document.getElementById(arguments[0]);"
                                 "return c && c._cyreg && c._cyreg.cy.nodes().map(n => n.id()).sort();", ids.GRAPH)


OPEN_OPTIONS = ".dash-dropdown-options [role='option']"  # the open dropdown's, not the radio items'


def options(driver: Any, dropdown_id: str) -> list[str]:
    """The option labels of a Dash 4 dropdown (opened, read, closed again with Escape)."""
    wait_for(lambda: driver.find_elements(By.ID, dropdown_id), f"dropdown {dropdown_id}")[0].click()
    labels = wait_for(lambda: [o.text.strip() for o in driver.find_elements(By.CSS_SELECTOR, OPEN_OPTIONS)],
                      f"the options of {dropdown_id}")
    ActionChains(driver).send_keys(Keys.ESCAPE).perform()
    wait_for(lambda: not driver.find_elements(By.CSS_SELECTOR, OPEN_OPTIONS), f"{dropdown_id} closed")
    return labels


def header(driver: Any) -> str:
    return text(driver, ids.TENSOR_HEADER)


def test_the_group_opens_with_both_trials_and_comgras_nodes(browser: Any) -> None:
    nodes = wait_for(lambda: graph_nodes(browser), "graph nodes")
    assert {"input", "memory", "helper_partial_sums", "output", "loss_per_sample", "loss", "target",
            "root_module.subnet_pre", "root_module.subnet_pre__hidden_state", "root_module.subnet_out__out",
            "root_module.subnet_mem__out", "root_module.subnet_out.fnn2"} <= set(nodes)
    assert "root_module.subnet_pre.fnn1" not in nodes  # prefixes_for_grouping_module_parameters_in_nodes
    wait_for(lambda: text(browser, ids.STATUS) == f"{BUGGED}: 26 recorded steps, last 25 · complete", "the status")
    assert options(browser, ids.TRIAL) == [BUGGED, FIXED]
    assert options(browser, ids.STEP_TYPE) == [f"{n:02d}_iterations" for n in (*range(1, 11), 15, 20)]


def test_type_of_training_step_iteration_and_batch_index_as_in_comgras_readme(browser: Any) -> None:
    choose(browser, ids.STEP_TYPE, "05_iterations")  # "type of training step"
    wait_for(lambda: text(browser, ids.STEP_LABEL).endswith("of 2 05_iterations steps"), "the 05_iterations steps")
    select_node(browser, "input")
    wait_for(lambda: header(browser).startswith("input / input · value · step 16 (05_iterations)"), "the input")
    assert options(browser, ids.ITERATION) == ["1", "2", "3", "4", "5"]  # iteration 0 holds the initial memory
    click_stepper(browser, "step", -1)  # step 4, the recorded one of the two
    wait_for(lambda: text(browser, ids.STEP_LABEL) == "step 4 · 1 of 2 05_iterations steps", "step 4")
    choose(browser, ids.ITERATION, "3")
    wait_for(lambda: "· iteration 3 · whole batch ·" in header(browser), "iteration 3")
    wait_for(lambda: statistic(browser, "count") == "40", "the batch's statistics (8 samples × 5)")
    assert options(browser, ids.SAMPLE) == ["whole batch", "sample 0", "sample 1", "sample 2", "sample 3",
                                            "sample 4"]  # max_num_batch_size_to_record=5
    choose(browser, ids.SAMPLE, "sample 2")  # "batch index"
    wait_for(lambda: "· iteration 3 · sample 2 ·" in header(browser), "sample 2")
    wait_for(lambda: statistic(browser, "count") == "5", "one sample's statistics")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f"#{ids.VALUES} img.values-image"), "its element values")


def test_role_of_tensor_in_the_helper_node_and_the_memory_node(browser: Any) -> None:
    select_node(browser, "helper_partial_sums")
    roles = options(browser, ids.TENSOR)  # "role of tensor": one per partial sum, the last one "final"
    assert roles[:3] == ["final", "up_to_iteration_00", "up_to_iteration_01"] and len(roles) == 5
    choose(browser, ids.TENSOR, "up_to_iteration_01")
    wait_for(lambda: header(browser).startswith("helper_partial_sums / up_to_iteration_01 · value · step 4"),
             "the helper's role up_to_iteration_01")
    select_node(browser, "memory")
    assert options(browser, ids.TENSOR) == ["initial_memory", "memory_out"]
    choose(browser, ids.TENSOR, "initial_memory")
    wait_for(lambda: header(browser).startswith("memory / initial_memory · value · step 4 (05_iterations) · "
                                                "iteration 0"), "the initial value in iteration 0")
    wait_for(lambda: statistic(browser, "max") == "0", "the zero initial memory")


def test_the_other_trial_keeps_the_selection_and_kpis_and_notes_render(browser: Any) -> None:
    choose(browser, ids.TRIAL, FIXED)
    wait_for(lambda: text(browser, ids.STATUS).startswith(f"{FIXED}: 26 recorded steps"), "the fixed trial")
    wait_for(lambda: header(browser).startswith("memory / initial_memory · value · step 4 (05_iterations)"),
             "the same tensor and step in the fixed trial")
    tabs = {t.text: t for t in browser.find_elements(By.CSS_SELECTOR, ".tab")}
    tabs["KPIs"].click()
    wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, f"#{ids.KPIS} .js-plotly-plot")) >= 1, "the KPI plots")
    kpis = text(browser, ids.KPIS)
    assert all(name in kpis for name in ("loss", "accuracy/all", "accuracy/first_ten_samples")), kpis
    tabs["Notes & problems"].click()
    wait_for(lambda: "Configuration: no_activation_function_on_output_layer, 26 steps" in text(browser, ids.NOTES),
             "the notes")
    notes = text(browser, ids.NOTES)  # the page collapses the notes' runs of spaces
    assert "Step 4: 5 iterations (training)" in notes and "Step 11: 20 iterations (testing)" in notes
    tabs["Tensors"].click()
    wait_for(lambda: settled(browser), "callbacks to settle")
    assert console_problems(browser) == []



def test_visual_prefixes_are_boxes_in_the_page(tmp_path: Any) -> None:
    """prefixes_for_grouping_module_parameters_visually=["net.attn_", "net"]: Chromium shows the attention's
    two parameter nodes in a box of their own beside the box of the other two, nested in no module box."""
    group = record_attention(tmp_path / "root", ["net.attn_", "net"])
    with served(create_app(group, interval_ms=400)) as address, chromium() as driver:
        driver.get(address)
        wait_for(lambda: "box:net.attn_" in graph_nodes(driver), "the box of the visual prefix 'net.attn_'")
        parents = driver.execute_script(
            "const cy = document.getElementById(arguments[0])._cyreg.cy;"
            "return Object.fromEntries(cy.nodes().filter(n => n.id().startsWith('net.'))"
            ".map(n => [n.id(), n.parent().length ? n.parent().id() : null]));", ids.GRAPH)
        assert parents == {"net.attn_k": "box:net.attn_", "net.attn_q": "box:net.attn_", "net.ff": "box:net",
                           "net.head": "box:net"}
        assert console_problems(driver) == []
