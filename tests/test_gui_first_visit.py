"""What a first visit finds ready: the first view read from the recording when the app is made, not while the
first page waits for it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_gui_support import make_recording

from comgra_ndbg.gui.app import create_app
from comgra_ndbg.gui.state import ReaderCache


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_recording(tmp_path_factory.mktemp("group"), trials=("a", "b"), steps=4)


def counting_reads(cache: ReaderCache) -> list[tuple[Any, ...]]:
    """The keys of every value the cache computes from the recording from now on (its memo's misses)."""
    misses: list[tuple[Any, ...]] = []
    remembered = cache.memo

    def memo(trial: str, key: tuple[Any, ...], compute: Any) -> Any:
        def read(recording: Any) -> Any:
            misses.append((trial,) + key)
            return compute(recording)
        return remembered(trial, key, read)
    cache.memo = memo  # type: ignore[method-assign]
    return misses


def test_the_first_page_and_its_layout_read_nothing_the_app_did_not_read_when_it_was_made(group: Path) -> None:
    cache = ReaderCache(group)
    app = create_app(group, cache=cache)
    misses = counting_reads(cache)
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    layout = client.get("/_dash-layout")
    assert layout.status_code == 200 and b'"step 3 \\u00b7 2 of 2 short steps"' in layout.data
    assert misses == []


def test_a_view_the_app_did_not_prepare_is_read_when_asked_for(group: Path) -> None:
    cache = ReaderCache(group)
    app = create_app(group, cache=cache)
    misses = counting_reads(cache)
    layout = app.server.test_client().get("/_dash-layout", headers={"Referer": "http://localhost/?trial=b"})
    assert layout.status_code == 200
    assert {key[0] for key in misses} == {"b"}  # the other trial's first view was read now, and only it


def test_the_page_preloads_its_layout_and_callbacks(group: Path) -> None:
    page = create_app(group).server.test_client().get("/").get_data(as_text=True)
    for name in ("_dash-layout", "_dash-dependencies"):
        assert f'<link rel="preload" as="fetch" crossorigin="anonymous" href="/{name}">' in page
