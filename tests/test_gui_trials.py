"""The trial selector sorted and filtered by the sweep table: rows from the explorer's cache (stored
analyses, loss KPI, stored hyperparameters) of real tiny training runs, the options the callback returns,
and the controls on the page of a group (none for a single trial)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.sweep import record_tiny_run
from comgra_ndbg.analysis import analyze
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.app import _page
from comgra_ndbg.gui.state import ReaderCache
from comgra_ndbg.gui.trials import sort_columns, trial_table, update_trial_options

RATES = {"a": 0.05, "b": 20.0, "c": 0.01}


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trials") / "runs"
    for trial, lr in RATES.items():
        record_tiny_run(folder, trial, lr=lr, steps=40, seed=2)
    for trial in ("a", "b"):  # "c" stays unanalysed
        analyze(folder, trial=trial)
    return folder


@pytest.fixture()
def cache(group: Path) -> Iterator[ReaderCache]:
    opened = ReaderCache(group)
    yield opened
    opened.close()


def values(options: list[dict[str, str]]) -> list[str]:
    return [o["value"] for o in options]


def test_rows_come_from_the_stored_analyses_and_the_recordings(cache: ReaderCache, group: Path) -> None:
    rows = {row["trial"]: row for row in trial_table(cache)}
    assert sort_columns(list(rows.values())) == ["trial", "type", "origin", "node", "onset", "confidence",
                                                 "final_loss", "steps", "lr", "seed"]
    assert rows["a"]["type"] == "healthy" and rows["c"]["type"] == ""  # c: no analysis stored, none run
    top = analyze(group, trial="b", store=False).top
    assert (rows["b"]["type"], rows["b"]["node"], rows["b"]["onset"]) == (top.type, top.node, top.onset)
    assert [rows[t]["lr"] for t in "abc"] == [0.05, 20.0, 0.01] and rows["a"]["steps"] == 40


def test_options_sort_filter_and_keep_the_current_trial(cache: ReaderCache) -> None:
    options, note = update_trial_options(cache, "lr", "ascending", "", "a")
    assert values(options) == ["c", "a", "b"] and note == ""
    assert options[1]["label"].startswith("a · healthy · loss ") and options[1]["label"].endswith("lr=0.05 · seed=2")
    assert options[0]["label"].startswith("c · not analysed · loss ")
    options, _ = update_trial_options(cache, "lr", "descending", "", "a")
    assert values(options) == ["b", "a", "c"]
    options, note = update_trial_options(cache, None, None, "type=healthy", "b")
    assert values(options) == ["b", "a"] and note == "1 of 3 trials match"
    assert options[0]["label"].endswith("(filtered out)")
    options, note = update_trial_options(cache, None, None, "lr>=1, type!=healthy", "b")
    assert values(options) == ["b"] and not options[0]["label"].endswith("(filtered out)")
    options, note = update_trial_options(cache, None, None, "rate>1", "a")
    assert values(options) == ["a", "b", "c"] and note.startswith("unknown column 'rate' in the filter")


def test_the_page_has_the_controls_for_a_group_only(group: Path, cache: ReaderCache) -> None:
    def ids_in(node: object) -> set[str]:
        found = {node.id} if isinstance(getattr(node, "id", None), str) else set()
        children = getattr(node, "children", None)
        for child in children if isinstance(children, (list, tuple)) else [children] if children is not None else []:
            found |= ids_in(child)
        return found

    controls = {ids.TRIAL_SORT, ids.TRIAL_ORDER, ids.TRIAL_FILTER, ids.TRIAL_NOTE}
    assert controls <= ids_in(_page(cache, None, source=str(group), interval_ms=2000))
    single = ReaderCache(group / "a")
    try:
        assert not controls & ids_in(_page(single, None, source=str(group / "a"), interval_ms=2000))
    finally:
        single.close()
