"""The explorer serves plotly.js's cartesian bundle where Dash's graph component asks for plotly.js, and the full
bundle when a custom visualization may draw any trace type."""
from __future__ import annotations

import re
from pathlib import Path

import plotly
import pytest
from test_gui_support import make_recording

from comgra_ndbg.gui.app import create_app
from comgra_ndbg.gui.bundle import CARTESIAN, PLOTLY_ADDRESS

FULL = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_recording(tmp_path_factory.mktemp("group"), trials=("a",), steps=4)


def banner(script: bytes) -> str:
    """The first line of plotly.js's licence banner, naming the bundle and its version."""
    return re.search(rb"\* (plotly\.js[^\n]*)", script[:300]).group(1).decode()


def test_the_plotly_address_answers_with_the_cartesian_bundle_of_the_same_version(group: Path) -> None:
    client = create_app(group).server.test_client()
    page = client.get("/").get_data(as_text=True)
    assert f'href="/{PLOTLY_ADDRESS}"' in page  # the page preloads the address the graph component loads
    answer = client.get("/" + PLOTLY_ADDRESS)
    assert answer.status_code == 200 and answer.mimetype == "application/javascript"
    script = answer.get_data()
    assert script == CARTESIAN.read_bytes()
    assert banner(script).startswith("plotly.js (cartesian - minified) v")
    assert banner(script).rsplit(" v", 1)[1] == banner(FULL.read_bytes()).rsplit(" v", 1)[1]  # the same plotly.js
    assert len(script) < 0.4 * FULL.stat().st_size
    again = client.get("/" + PLOTLY_ADDRESS, headers={"If-None-Match": answer.headers["ETag"]})
    assert again.status_code == 304  # a later visit revalidates and downloads nothing


def test_an_app_with_a_custom_visualization_keeps_the_full_bundle(group: Path, tmp_path: Path) -> None:
    visualization = tmp_path / "viz.py"
    visualization.write_text("from dash import html\ndef visualize(recording, selection):\n    return html.Div('x')\n")
    client = create_app(group, visualization_file=visualization).server.test_client()
    assert banner(client.get("/" + PLOTLY_ADDRESS).get_data()).startswith("plotly.js v")
