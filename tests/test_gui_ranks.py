"""The explorer on a distributed trial: one trial entry per run, a rank selector, per-rank timeline overlays;
the view callback called as a plain function on real rank recordings."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from dash import no_update

from rank_support import record_two_ranks
from comgra_ndbg import Recorder
from comgra_ndbg.gui import callbacks, ids
from comgra_ndbg.gui.app import create_app
from comgra_ndbg.gui.state import ReaderCache, Selection


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ranks")
    record_two_ranks(folder)
    with Recorder(folder, "solo") as rec:
        for step in range(2):
            with rec.step(step):
                rec.register_tensor("x", torch.full((2, 3), -1.0), role="input")
    return folder


@pytest.fixture
def cache(group: Path) -> Iterator[ReaderCache]:
    cache = ReaderCache(group)
    yield cache
    cache.close()


def act(cache: ReaderCache, trigger: str | None, value: Any, before: dict[str, Any] | None = None) -> dict[str, Any]:
    """One action through the view callback; every output as the page then shows it."""
    if before is None:
        out = callbacks.update_view(cache, "url", value if trigger == "url" else "", None, None)
        return {k: v for k, v in out.items() if v is not no_update}
    out = callbacks.update_view(cache, trigger, value, before["store"], before["keys"])
    shown = {**before, trigger: value} if trigger in callbacks.SETTABLE else before  # what the user set
    return {**shown, **{k: v for k, v in out.items() if v is not no_update}}


def selection_of(out: dict[str, Any]) -> Selection:
    return Selection.from_dict(out["store"]["selection"])


def timeline_means(out: dict[str, Any]) -> dict[str, list[float]]:
    return {t["name"]: list(t["y"]) for t in out["timeline"]["data"] if t.get("showlegend", True)}


def test_one_entry_per_run_and_a_rank_selector(cache: ReaderCache) -> None:
    out = act(cache, None, None)
    assert out["trial_options"] == ["run", "solo"] and out["trial"] == "run"
    assert out["rank_options"] == [{"label": "rank 0", "value": 0}, {"label": "rank 1", "value": 1}]
    assert out["rank"] == 0 and selection_of(out).trial == "run/rank0"
    assert timeline_means(out) == {"default": [0.0, 1.0, 2.0, 3.0]}  # one curve per step type
    assert out["status"].startswith("run/rank0: 4 recorded steps")
    json.dumps(out["store"])


def test_choosing_a_rank_shows_its_recording_and_keeps_the_other_selectors(cache: ReaderCache) -> None:
    out = act(cache, None, None)
    out = act(cache, "stepper", ("step", -1), out)
    step = selection_of(out).step
    out = act(cache, "rank", 1, out)
    assert (out["rank"], out["trial"], selection_of(out).trial) == (1, "run", "run/rank1")
    assert selection_of(out).step == step and selection_of(out).node == "x"
    assert timeline_means(out) == {"default": [10.0, 11.0, 12.0, 13.0]}
    assert "rank=1" not in out["url"] and "trial=run%2Frank1" in out["url"]  # the address keeps the rank
    out = act(cache, "stepper", ("rank", -1), out)
    assert (out["rank"], selection_of(out).trial) == (0, "run/rank0")
    out = act(cache, "trial", "solo", out)
    assert (out["trial"], out["rank_options"], out["rank"]) == ("solo", [], None)
    assert selection_of(out).trial == "solo"


def test_a_rank_named_in_the_address_is_shown(cache: ReaderCache) -> None:
    out = act(cache, "url", "?trial=run%2Frank1&node=x", None)
    assert (out["trial"], out["rank"]) == ("run", 1)


def test_other_ranks_overlay_the_timeline(cache: ReaderCache) -> None:
    out = act(cache, None, None)
    assert out["overlay_trials_options"] == ["run/rank1", "solo"]
    out = act(cache, "overlay_trials", ["run/rank1"], out)
    assert timeline_means(out) == {"run/rank0 · x": [0.0, 1.0, 2.0, 3.0], "run/rank1 · x": [10.0, 11.0, 12.0, 13.0]}


def test_the_page_shows_the_rank_selector_only_for_distributed_trials(group: Path, tmp_path: Path) -> None:
    layout = json.dumps(create_app(group).server.test_client().get("/_dash-layout").get_json())
    assert f'"id": "{ids.RANK}"' in layout and '"display": "none"' not in layout
    with Recorder(tmp_path, "alone") as rec:
        with rec.step(0):
            rec.register_tensor("x", torch.ones(2, 3), role="input")
    layout = json.dumps(create_app(tmp_path).server.test_client().get("/_dash-layout").get_json())
    assert f'"id": "{ids.RANK}"' in layout and '"display": "none"' in layout
