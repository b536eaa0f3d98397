"""The query API on hand-made series: values, changes, first crossings, ordering, events."""
from __future__ import annotations

import numpy as np
import pytest

from comgra_ndbg.analysis.api import diagnose
from comgra_ndbg.analysis.query import Query
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.synthetic import summary_rows
from comgra_ndbg.errors import InvalidArgumentError, UnknownSeriesError


@pytest.fixture()
def q() -> Query:
    grow = np.r_[np.ones(150), np.linspace(1, 50, 30), np.full(20, 50.0)]
    quiet = np.full(200, 0.5)
    loss = np.ones(200)
    loss[170] = 100.0
    series = build_series({("a", "value"): summary_rows(rms=grow), ("b", "value"): summary_rows(rms=quiet),
                           ("logits", "value"): summary_rows(rms=quiet)},
                          roles={"a": "intermediate", "b": "intermediate", "logits": "output"},
                          kpis={"loss": (np.arange(200), loss)})
    return Query(series, diagnose(series))


def test_series_values_and_medians(q: Query) -> None:
    steps, values = q.series("b", "value", "rms")
    assert steps[:3].tolist() == [0, 1, 2] and values[:3].tolist() == [0.5, 0.5, 0.5]
    assert q.at("a", "value", "rms", 199) == 50.0
    assert q.median("a", "value", "abs_mean", 0, 150) == 1.0
    assert q.series("loss", "kpi")[1][170] == 100.0
    assert q.nodes() == ["a", "b", "logits"] and q.nodes("output") == ["logits"]


def test_did_a_grow_before_the_loss_spiked(q: Query) -> None:
    [spike] = q.loss_spikes()
    assert spike == 170
    assert q.grew_before("a", "value", "abs_mean", event_step=spike)
    assert not q.grew_before("b", "value", "abs_mean", event_step=spike)
    assert q.change("a", "value", "rms", at=150) == pytest.approx(np.log10(np.median(np.linspace(1, 50, 30)[:20])))
    assert q.change("b", "value", "rms", at=150) == 0.0


def test_first_crossing_and_order_of_moves(q: Query) -> None:
    assert q.first_step("a", "value", "rms", above=10.0) == 156
    assert q.first_step("b", "value", "rms", below=0.1) is None
    assert q.precedes(("a", "value", "rms"), ("loss", "kpi", "")) is True
    assert q.precedes(("b", "value", "rms"), ("loss", "kpi", "")) is None
    with pytest.raises(InvalidArgumentError):
        q.first_step("a", "value", "rms")


def test_events_of_the_diagnosis_and_unknown_names(q: Query) -> None:
    assert [(e.node, e.to_state) for e in q.events(node="a")] == [("a", "exploding")]
    assert q.events(family="gradient_health") == []
    with pytest.raises(UnknownSeriesError, match="no node 'zz'"):
        q.series("zz", "value", "rms")
