"""The diverging-loss clause quotes the rise at the step the hypothesis names, and the peak after it apart:
the event's magnitude is the highest loss over the rest of the run, and quoted as the rise of the onset step
it read "the loss rose 34550554046× its recent median" for a step where it rose 1 000×."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.optimizer_stability import loss_events
from comgra_ndbg.analysis.sentences import describe
from comgra_ndbg.analysis.series import build_series


def _diverging(loss: np.ndarray):
    series = build_series({}, roles={}, kpis={"loss": (np.arange(len(loss)), loss)})
    [event] = [e for e in loss_events(series, settle=50) if e.to_state == "diverging"]
    return event


def test_a_loss_that_goes_on_rising_is_quoted_at_its_onset_and_at_its_peak() -> None:
    loss = np.full(300, 0.005)
    loss[180:] = 5.0 * np.logspace(0, 10, 120)  # 1 000x at step 180, then on to 1e13x
    event = _diverging(loss)
    assert event.onset == 180 and event.magnitude > 1e12
    assert describe(event) == "after the loss rose to 1,000× its recent median, and on to 1e+13× later"


def test_a_loss_that_jumps_once_and_stays_is_quoted_once() -> None:
    loss = np.full(300, 0.5)
    loss[200:] = 60.0
    event = _diverging(loss)
    assert describe(event) == "after the loss rose to 120× its recent median"
