"""The rank selector in a real browser: headless Chromium on the explorer served for a two-rank trial."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from browser_support import chromium, choose, console_problems, served, text, wait_for
from rank_support import record_two_ranks

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.app import create_app


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("ranks")
    record_two_ranks(folder)
    with served(create_app(folder)) as address, chromium() as driver:
        driver.get(address)
        yield driver


def mean_shown(driver: Any) -> str | None:
    return driver.execute_script(
        "const rows = document.querySelectorAll(arguments[0] + ' tbody tr');"
        "for (const r of rows) { if (r.cells[0].textContent === 'mean') return r.cells[1].textContent; }"
        "return null;", f"#{ids.STATS_TABLE}-table")


def test_choosing_a_rank_shows_that_ranks_values(browser: Any) -> None:
    wait_for(lambda: text(browser, ids.STATUS).startswith("run/rank0: 4 recorded steps"), "rank 0 shown first")
    wait_for(lambda: mean_shown(browser) is not None, "the statistics of x")
    first = mean_shown(browser)
    choose(browser, ids.RANK, "rank 1")
    wait_for(lambda: text(browser, ids.STATUS).startswith("run/rank1: 4 recorded steps"), "rank 1")
    wait_for(lambda: mean_shown(browser) not in (None, first), "rank 1's mean")
    assert float(mean_shown(browser)) == float(first) + 10
    assert "trial=run%2Frank1" in browser.current_url
    browser.execute_script("document.getElementById(arguments[0]).click();", ids.stepper_button_id("rank", -1))
    wait_for(lambda: text(browser, ids.STATUS).startswith("run/rank0:"), "back to rank 0 with the stepper")
    wait_for(lambda: mean_shown(browser) == first, "rank 0's mean again")
    assert console_problems(browser) == []
