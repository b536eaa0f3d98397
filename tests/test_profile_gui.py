"""The Profile tab: its figures as plain functions on a real profiled recording, and the tab in real headless
Chromium (``browser_support``) showing the per-layer bars and ringing the hot layer on the graph."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.gui.profile_tab import (PROFILE_MEMORY, PROFILE_PROCESS, PROFILE_TIME, hot_layer_stylesheet,
                                         hot_layers, profile_tab)
from comgra_ndbg.gui.state import ReaderCache, Selection, ViewOptions
from comgra_ndbg.recorder.profile_config import ProfileConfig

MODULES = ["model", "model.0", "model.1", "model.2", "model.3", "model.4"]


def record(folder: Path, *, profile: Any) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2048), nn.Tanh(), nn.Linear(2048, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model, folder, trial="t", profile=profile, snapshots=None):
        for _ in range(6):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(128, 8)), torch.randint(0, 2, (128,))).backward()
            optimizer.step()
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("profiled"), profile=ProfileConfig(steps=True))


def test_the_tab_shows_bars_of_every_profiled_module_and_the_memory_over_steps(folder: Path) -> None:
    cache = ReaderCache(folder)
    content = profile_tab(cache, at_step(3), ViewOptions(tab="profile"))
    figures = {graph.id: graph.figure for graph in _graphs(content)}
    time = figures[PROFILE_TIME]
    assert [t["name"] for t in time["data"]] == ["forward", "backward"]
    assert sorted(label.removeprefix("🔥 ") for label in time["data"][0]["y"]) == MODULES
    assert "step 3" in time["layout"]["title"]["text"]
    memory = figures[PROFILE_MEMORY]["data"][0]
    saved = dict(zip(memory["y"], memory["x"]))
    assert saved["🔥 model.3"] == max(saved.values()) == 128 * 2048 * 4 / 2**20  # Tanh keeps its output
    assert figures[PROFILE_PROCESS]["data"][0]["x"] == list(range(6))
    assert "model.3" in hot_layers(cache, "t")


def test_a_trial_without_profile_says_how_to_record_one(tmp_path: Path) -> None:
    record(tmp_path, profile=None)
    content = profile_tab(ReaderCache(tmp_path), at_step(0), ViewOptions(tab="profile"))
    assert "profile=True" in str(content) and not list(_graphs(content))
    assert hot_layers(ReaderCache(tmp_path), "t") == []


class Residual(nn.Module):
    """24 residual blocks, block 20 much wider than the others: a graph large enough that it opens with its
    blocks collapsed, and a hot layer inside one of them."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 1024 if i == 20 else 16), nn.ReLU(),
                                                   nn.Linear(1024 if i == 20 else 16, 16)) for i in range(24)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


@pytest.fixture(scope="module")
def nested(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("nested")
    torch.manual_seed(0)
    model = Residual()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model, folder, trial="t", profile=ProfileConfig(steps=True, flops=False), snapshots=None):
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(256, 16)).square().mean().backward()
            optimizer.step()
    return folder


def test_a_hot_layer_inside_a_collapsed_block_rings_the_block_until_it_is_opened(nested: Path) -> None:
    cache = ReaderCache(nested)
    assert "model.blocks.20.1" in hot_layers(cache, "t")  # the wide ReLU keeps the largest activation
    closed = at_step(2)
    assert "model.blocks.20" in cache.drawn("t", "train").collapsed  # how the graph opens
    for selection, ringed, unringed in [(closed, "box:model.blocks.20", "model.blocks.20.1"),
                                        (replace(closed, boxes=("+model.blocks.20",)), "model.blocks.20.1",
                                         "box:model.blocks.20")]:
        rings = [rule["selector"].split('"')[1] for rule in hot_layer_stylesheet(cache, selection, ViewOptions())]
        assert ringed in rings and unringed not in rings
        drawn = {item.id for item in cache.drawn("t", "train", selection.boxes).view.items}
        assert set(rings) <= drawn  # every ring is on something drawn (time-hot layers vary with the load)


def at_step(step: int) -> Selection:
    return Selection("t", "train", step, 0, None, None, None)


def _graphs(component: Any) -> Iterator[Any]:
    if getattr(component, "figure", None) is not None and getattr(component, "id", None):
        yield component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children] if children is not None else []:
        yield from _graphs(child)


@pytest.mark.slow
def test_the_profile_tab_in_chromium_shows_the_bars_and_rings_the_hot_layer(folder: Path) -> None:
    from browser_support import By, chromium, console_problems, cy, served, wait_for

    from comgra_ndbg.gui.app import create_app

    with served(create_app(folder, interval_ms=60000)) as address, chromium() as driver:
        driver.get(address)
        wait_for(lambda: cy(driver, "return cy.nodes().length;") > 0, "the graph")
        assert cy(driver, "return cy.getElementById('model.3').style('border-style');") == "double"
        assert cy(driver, "return cy.getElementById('model.1').style('border-style');") != "double"
        tabs = {t.text: t for t in driver.find_elements(By.CSS_SELECTOR, ".tab")}
        tabs["Profile"].click()

        def bars() -> Any:
            return driver.execute_script(
                "const p = document.querySelector('#' + arguments[0] + ' .js-plotly-plot'); if (!p || !p.data) "
                "return null; return p.data.map(t => [t.name, t.type, t.y.length,"
                " p.querySelectorAll('.bars path').length]);", PROFILE_TIME)

        shown = wait_for(bars, "the per-layer time bars")
        assert [row[:3] for row in shown] == [["forward", "bar", 6], ["backward", "bar", 6]]
        assert shown[0][3] > 0  # bars were painted
        memory = wait_for(lambda: driver.execute_script(
            "const p = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
            "return p && p.data ? p.data[0].x.length : null;", PROFILE_MEMORY), "the memory bars")
        assert memory == 6
        wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, f"#{PROFILE_PROCESS} .js-plotly-plot"),
                 "the process memory plot")
        assert console_problems(driver) == []


@pytest.mark.slow
def test_in_chromium_a_collapsed_block_holding_a_hot_layer_is_ringed(nested: Path) -> None:
    from browser_support import chromium, console_problems, cy, served, wait_for

    from comgra_ndbg.gui.app import create_app

    with served(create_app(nested, interval_ms=60000)) as address, chromium() as driver:
        driver.get(address)
        wait_for(lambda: cy(driver, "return cy.getElementById('box:model.blocks.20').length;") > 0, "the graph")
        assert cy(driver, "return cy.getElementById('box:model.blocks.20').style('border-style');") == "double"
        assert console_problems(driver) == []


def test_the_profile_command_prints_the_layers_hot_first_and_the_memory_verdict(folder: Path, tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture) -> None:
    from comgra_ndbg.cli import main

    assert main(["profile", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("t: 6 profiled steps, median step")
    rows = [line for line in out[2:] if line.startswith(("* ", "  "))]
    assert sorted(row.split()[1 if row.startswith("*") else 0] for row in rows) == MODULES
    assert any(row.startswith("* model.3") for row in rows)  # hot in memory
    assert out[-1].startswith("Too few steps to test process memory") or out[-1].startswith("No memory leak")
    record(tmp_path, profile=None)
    assert main(["profile", str(tmp_path)]) == 1 and "no profile" in capsys.readouterr().out
