"""Headless Chromium (Debian's /usr/bin/chromium driven by /usr/bin/chromedriver) and the explorer served on a
free port, for the browser tests: starting both, waiting, reading the page, clicking where cytoscape drew.

Screenshots go to a temporary folder, or to ``$COMGRA_SCREENSHOT_DIR`` (``docs/screenshots`` to refresh the
docs' images). Importing this module skips the importing test module when Chromium, ChromeDriver or
selenium is missing.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from comgra_ndbg.gui import ids

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SCREENSHOTS = Path(os.environ.get("COMGRA_SCREENSHOT_DIR") or Path(tempfile.gettempdir()) / "comgra_ndbg_screenshots")

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip(f"browser tests need {CHROMIUM} and {CHROMEDRIVER} (Debian packages chromium, chromium-driver)",
                allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="browser tests need selenium (pip install selenium)")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402


@contextmanager
def served(app: Any) -> Iterator[str]:
    """The app's address while it is served from a thread on a free port."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request would drown the report
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        thread.join(timeout=5)


@contextmanager
def chromium(width: int = 1440, height: int = 1080, downloads: Path | None = None) -> Iterator[Any]:
    """A headless Chromium of that window size whose console messages of every level are kept."""
    profile = tempfile.mkdtemp(prefix="comgra-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage", "--disable-sync",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    if downloads is not None:
        driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    try:
        yield driver
    finally:
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


def settled(driver: Any) -> bool:
    """No Dash callback is running (the renderer marks the page while one is pending)."""
    return not driver.execute_script("return !!document.querySelector('[data-dash-is-loading=\"true\"]');")


def console_problems(driver: Any) -> list[str]:
    """The browser's console errors and warnings since the last call (Dash reports failed callbacks there)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]


def cy(driver: Any, script: str, *args: Any) -> Any:
    """Run ``script`` with ``cy`` bound to the graph's cytoscape instance."""
    return driver.execute_script("const cy = document.getElementById(arguments[0])._cyreg.cy;" + script,
                                 ids.GRAPH, *args)


def graph_nodes(driver: Any) -> list[str]:
    return sorted(cy(driver, "return cy.nodes().map(n => n.id());"))


def node_classes(driver: Any, node: str) -> list[str]:
    """The classes cytoscape holds for a graph node."""
    return cy(driver, "return cy.getElementById(arguments[1]).classes();", node)


def click_at(driver: Any, x: float, y: float) -> None:
    """A real mouse click at rendered coordinates of the graph's canvas."""
    canvas = driver.find_element(By.ID, ids.GRAPH)
    size = canvas.size
    ActionChains(driver).move_to_element_with_offset(canvas, int(x - size["width"] / 2),
                                                     int(y - size["height"] / 2)).click().perform()


def rendered_at_rest(driver: Any, element: str, script: str) -> list[float]:
    """Where ``script`` (``e`` bound to the element) reads the element on screen, once no callback is pending,
    no animation runs and two reads 0.1 s apart agree: a reopened module's layout and the refit after it move
    every node for a while, and a click at a position read during that lands elsewhere (on a frame, say)."""
    read = "const e = cy.getElementById(arguments[1]); if (cy.animated() || e.animated()) return null;" + script

    def steady() -> list[float] | None:
        if not settled(driver):
            return None
        first = cy(driver, read, element)
        time.sleep(0.1)
        return first if first is not None and first == cy(driver, read, element) else None

    return wait_for(steady, f"{element} at rest on screen")


def click_node(driver: Any, node: str) -> None:
    """Click a graph node (or a closed module box) where cytoscape drew it, once the view is at rest."""
    x, y = rendered_at_rest(driver, node, "const p = e.renderedPosition(); return [p.x, p.y];")
    click_at(driver, x, y)


def click_frame(driver: Any, frame: str) -> None:
    """Click inside an open module's frame, on its padding (not on a node inside it)."""
    x, y = rendered_at_rest(driver, frame, "const b = e.renderedBoundingBox(); return [b.x1 + 5, b.y2 - 5];")
    click_at(driver, x, y)


def choose(driver: Any, dropdown_id: str, label: str, attempts: int = 3) -> None:
    """Open a Dash 4 dropdown (once the page has rendered it) and click the option with ``label``.

    Long lists show only some options until filtered, so the label is typed into the search field when the
    dropdown has one, replacing what an earlier search left there. A try whose option does not show within a
    few seconds closes the dropdown and opens it again: a click that lands while the page re-renders the
    dropdown (after an earlier choice, or the list it filters arriving late) can leave it closed or unfocused.
    The last try fails saying what the field held and what was offered."""
    def offered() -> Any:
        return next((o for o in driver.find_elements(By.CSS_SELECTOR, "[role='option']") if o.text.strip() == label),
                    None)

    for attempt in range(attempts):
        wait_for(lambda: driver.find_elements(By.ID, dropdown_id), f"dropdown {dropdown_id}")[0].click()
        if driver.execute_script("return document.activeElement.classList.contains('dash-dropdown-search');"):
            ActionChains(driver).key_down(Keys.CONTROL).send_keys("a").key_up(Keys.CONTROL).send_keys(label).perform()
        last = attempt == attempts - 1
        try:
            option = wait_for(offered, f"option {label!r} of {dropdown_id}", timeout=15.0 if last else 5.0)
        except AssertionError:
            if last:
                field = driver.execute_script("const a = document.activeElement; return a && a.value;")
                shown = [o.text.strip() for o in driver.find_elements(By.CSS_SELECTOR, "[role='option']")][:8]
                raise AssertionError(f"option {label!r} of {dropdown_id} never shown: the focused field held "
                                     f"{field!r}, the options shown were {shown}") from None
            ActionChains(driver).send_keys(Keys.ESCAPE).perform()
            continue
        option.click()
        return

def type_into(driver: Any, element_id: str, typed: str) -> None:
    """Replace the text of an input field and press Enter."""
    field = driver.find_element(By.ID, element_id)
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(typed + "\n")


def screenshot(driver: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    wait_for(lambda: settled(driver), "callbacks to settle")
    time.sleep(0.3)  # let plotly finish its transition
    driver.save_screenshot(str(SCREENSHOTS / name))
