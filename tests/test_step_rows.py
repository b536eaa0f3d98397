"""A step's rows claimed in one reducer (``recorder/step_rows``): blocks added in any order come out next to
their series, rows taken in several chunks keep their place, and a row that could not be computed is reported
with the series of the block that holds it."""
from __future__ import annotations

import numpy as np
import torch

from comgra_ndbg.recorder.step_record import zeros
from comgra_ndbg.recorder.step_rows import StepRows
from comgra_ndbg.stats.collected import Collected
from comgra_ndbg.stats.reducer import Reducer
from comgra_ndbg.store import schema

SUM = schema.FIELD["sum"]


def frozen(*values: int) -> np.ndarray:
    array = np.array(values, dtype=np.int64)
    array.flags.writeable = False
    return array


def test_blocks_added_out_of_claim_order_come_out_next_to_their_series() -> None:
    reducer, rows = Reducer(), StepRows()
    claimed = [reducer.add(torch.full((2,), float(k))) for k in range(5)]  # sums 0, 2, 4, 6, 8
    rows.add(frozen(30, 40), zeros(2), claimed[3:5])
    rows.add(frozen(10), frozen(1), [claimed[1]])
    rows.add(frozen(0), zeros(1), range(claimed[0], claimed[0] + 1))
    done = rows.finish(reducer, lambda failures: None)
    assert done.series.tolist() == [0, 10, 30, 40]  # in the order of their rows; row 2 is in no block
    assert done.iterations.tolist() == [0, 1, 0, 0]
    assert done.data[:, SUM].tolist() == [0.0, 2.0, 6.0, 8.0]
    assert len(reducer) == 0


def test_rows_taken_in_chunks_keep_their_place_and_a_repeated_layout_reads_the_same() -> None:
    reducer = Reducer()
    series = frozen(5, 6, 7)
    results = []
    for step in range(3):
        rows = StepRows()
        rows.add(series[:1], zeros(1), range(reducer.add(torch.ones(4)), len(reducer)))
        rows.take(reducer, wait=False)
        first = len(reducer)
        reducer.add(torch.full((3,), float(step)))
        reducer.add(torch.full((1,), -1.0))
        at = rows.add(series[1:], zeros(2), range(first, len(reducer)))
        assert at == slice(1, 3)  # the step's rows 1 and 2: the reducer's 0 and 1 after the take
        results.append(rows.finish(reducer, lambda failures: None))
    for step, done in enumerate(results):
        assert done.series.tolist() == [5, 6, 7]
        assert done.data[:, SUM].tolist() == [4.0, 3.0 * step, -1.0]


class FailingReducer:
    """Hands its rows over as a device's would, with ``failed`` rows (the reducer's numbering)."""

    ready = False

    def __init__(self, count: int, failed: dict[int, str]) -> None:
        self.count, self.failed = count, failed

    def take_ready(self) -> None:
        return None

    def collect_later(self) -> Collected:
        return Collected.ready(np.tile(schema.identity_row(), (self.count, 1)), dict(self.failed))


def test_a_row_that_failed_in_a_later_chunk_is_reported_with_the_series_of_its_block() -> None:
    rows, reports = StepRows(), []
    rows.add(frozen(1, 2), zeros(2), range(0, 2))
    rows.take(FailingReducer(2, {}), wait=False)
    rows.add(frozen(3, 4), zeros(2), np.array([1, 0]))  # the step's rows 3 and 2
    rows.add(frozen(9), zeros(1), [2])
    done = rows.finish(FailingReducer(4, {0: "first", 3: "outside"}), reports.extend)
    # the second chunk's row 0 is the step's row 2 (series 4); its row 3, the step's row 5, is in no block
    assert reports == [(4, 2, "first"), (None, 5, "outside")]
    assert done.series.tolist() == [1, 2, 3, 4, 9]  # blocks by their first row, each in its own order
    assert rows.read(slice(0, 2), reports.extend).shape == (2, schema.NUM_FIELDS)
    assert len(reports) == 2  # reported once


def test_consecutive_rows_given_as_a_list_become_a_slice_and_others_stay_an_index() -> None:
    rows = StepRows()
    assert rows.add(frozen(1, 2), zeros(2), [4, 5]) == slice(4, 6)
    assert rows.add(frozen(3, 4, 5, 6), zeros(4), [0, 2, 1, 3]).tolist() == [0, 2, 1, 3]
    assert rows.add(frozen(7), zeros(1), []).tolist() == []
