"""The whole-model stagnation sentence says how many trainable parameter nodes stopped: the rule fires when
most of them stop together, so "no parameter changed" is only true when all of them did; the remedy then
points at the param groups."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.optimizer_stability import OPTIMIZER
from comgra_ndbg.analysis.reading import Reading
from comgra_ndbg.analysis.remedies import remedy
from comgra_ndbg.analysis.sentences import describe
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.stagnation import stagnation_events
from comgra_ndbg.analysis.synthetic import summary_rows


def _series(stopped: int, moving: int):
    """``stopped`` parameter nodes that receive gradients and never move, ``moving`` nodes that train."""
    rows, roles = {}, {}
    for k in range(stopped + moving):
        name = f"p{k}"
        update = np.zeros(60) if k < stopped else np.full(60, 1e-3)
        rows[(name, "update")] = summary_rows(rms=update)
        rows[(name, "grad")] = summary_rows(rms=1e-2 * (1 + 0.1 * np.sin(np.arange(60))))  # a new gradient each step
        roles[name] = "parameter"
    return build_series(rows, roles=roles, kpis={})


def test_most_nodes_stopping_is_described_with_their_share() -> None:
    [event] = [e for e in stagnation_events(_series(stopped=16, moving=1)) if e.node == OPTIMIZER]
    text = describe(event)
    assert "94% of the trainable parameter nodes stopped changing together for 60 steps" in text
    assert "no parameter changed" not in text


def test_every_node_stopping_is_described_as_no_parameter_changed() -> None:
    [event] = [e for e in stagnation_events(_series(stopped=4, moving=0)) if e.node == OPTIMIZER]
    assert describe(event) == "after no parameter changed for 60 steps"


def test_the_remedy_of_most_nodes_stopping_points_at_the_param_groups() -> None:
    series = _series(stopped=16, moving=1)
    [event] = [e for e in stagnation_events(series) if e.node == OPTIMIZER]
    text = remedy(Reading("update_stagnation", "optimizer", ""), event, series)
    assert text.startswith("94% of the trainable parameter nodes stopped changing at step 0")
    assert "param group" in text and "no parameter changed" not in text
    every = _series(stopped=4, moving=0)
    [event] = [e for e in stagnation_events(every) if e.node == OPTIMIZER]
    assert remedy(Reading("update_stagnation", "optimizer", ""), event, every).startswith("no parameter changed")
