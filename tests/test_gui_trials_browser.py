"""In real headless Chromium: filter and sort the trial selector by the sweep table, choose the failing trial
and see its failure signature in the Diagnosis tab, with no console error or warning on the way."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from browser_support import By, chromium, choose, console_problems, served, text, type_into, wait_for

from benchmarks.sweep import record_tiny_run
from comgra_ndbg.analysis import analyze
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.app import create_app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("trials-browser") / "runs"
    for trial, lr in {"a": 0.05, "b": 20.0, "c": 0.01}.items():
        record_tiny_run(folder, trial, lr=lr, steps=40, seed=2)
        analyze(folder, trial=trial)
    with served(create_app(folder, interval_ms=60000)) as address, chromium() as driver:
        driver.get(address)
        yield driver


def option_labels(driver: Any) -> list[str]:
    """The trial dropdown's option labels, read by opening it (and closing it again with Escape)."""
    from selenium.webdriver.common.keys import Keys

    driver.find_element(By.ID, ids.TRIAL).click()
    labels = wait_for(lambda: driver.execute_script(
        "return [...document.querySelectorAll('.dash-dropdown-option')].map(o => o.textContent.trim());"),
        "the trial options")
    driver.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    return labels


def test_filter_sort_and_the_signature_of_the_failing_trial(browser: Any) -> None:
    wait_for(lambda: text(browser, ids.STATUS).startswith("a: 40 recorded steps"), "the first trial")
    type_into(browser, ids.TRIAL_FILTER, "type!=healthy")
    wait_for(lambda: text(browser, ids.TRIAL_NOTE) == "1 of 3 trials match", "the filter's count")
    labels = option_labels(browser)
    assert len(labels) == 2 and labels[0].startswith("a · healthy") and labels[0].endswith("(filtered out)")
    assert labels[1].startswith("b · ") and "healthy" not in labels[1] and "loss nan · lr=20" in labels[1]
    type_into(browser, ids.TRIAL_FILTER, " ")
    choose(browser, ids.TRIAL_SORT, "lr")
    wait_for(lambda: [label.split(" · ")[0] for label in option_labels(browser)] == ["c", "a", "b"], "sorted by lr")
    choose(browser, ids.TRIAL, next(label for label in option_labels(browser) if label.startswith("b · ")))
    wait_for(lambda: text(browser, ids.STATUS).startswith("b: 40 recorded steps"), "the failing trial")
    browser.find_element(By.XPATH, "//*[contains(@class, 'tab') and normalize-space()='Diagnosis']").click()
    image = wait_for(lambda: browser.find_element(By.ID, ids.SIGNATURE), "the failure signature")
    size = wait_for(lambda: browser.execute_script(
        "const i = arguments[0]; return i.complete && i.naturalWidth ? [i.naturalWidth, i.naturalHeight] : null;",
        image), "the signature image decoded")
    assert size[0] > 600 and size[1] > 200
    assert console_problems(browser) == []
