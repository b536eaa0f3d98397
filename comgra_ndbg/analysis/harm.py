"""Harm: what makes a change in the statistics a failure rather than training doing its work.

Statistics move for good reasons: a network leaving its initial plateau grows its activations by decades,
a learning-rate warm-up multiplies every update, a finished task shrinks every gradient. A relative rule
cannot tell these from faults; what tells them apart is harm. An event is *harm by itself* when it is a
pathology in absolute terms — non-finite values, units dead or saturated for every sample, a parameter that
stopped while the others train, the loss spiking or diverging, gradients attenuated by orders of magnitude
from the first step — or a *sudden* scale shift of values or gradients: training moves weights by small
updates, so a signal that jumps tenfold from one step to the next was changed, not trained (a huge update
shows as its own event) — except a gradient's jump once the task is learned (the loss at most ``SOLVED`` of
the untrained model's and no worse after it), where the few samples still wrong set the gradient's scale from
batch to batch. Every other event (a scale shift of values, gradients or updates) explains a failure
only when harm follows it: a hard event among its consequences, or the loss getting worse after it.

The loss is *worse* after step index ``i`` when the median of the next ``window`` losses exceeds the median
of the previous ``window`` by at least ``harm_factor`` × and by at least ``harm_fraction`` of the loss the
run started with — the second condition is the absolute floor that keeps a loss of 1e-7 doubling from being
harm. The floor holds when the loss sits at 0 (a task learned exactly, where the ratio of medians is
undefined): a loss of 0 becoming 1e-8 is no harm either; a non-finite loss after the step always is. A soft
state present from the first step is harm only when training does not work: no later stretch
of ``window`` steps has a median loss ``harm_factor`` × below the first's — or, for update sizes out of
band from the first step, when the loss rose ``divergence_factor`` × above the untrained model's (step 0)
while they lasted: a first window that the wrong learning rate itself blew up is no reference for learning.

>>> import numpy as np
>>> loss = np.r_[np.linspace(2.0, 0.5, 100), np.full(50, 1.6)]
>>> round(loss_worsening(loss, 100, window=20), 2), round(loss_worsening(loss, 60, window=20), 2)
(0.4, -0.12)
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Event
from comgra_ndbg.analysis.optimizer_stability import initial_loss
from comgra_ndbg.analysis.series import RunSeries

__all__ = ["is_hard", "loss_worsening", "loss_is_worse", "loss_improved_from_start", "loss_blew_up_from_start",
           "ends_worse_than_untrained", "optimizer_blew_up_at_start", "training_undone",
           "harmful", "solved_gradient_jump", "HARD_STATES", "SOLVED"]

HARD_STATES = frozenset({"non-finite", "dead", "saturated", "frozen", "spike", "diverging", "collapsed",
                         "imbalanced", "out_of_reach"})


def is_hard(event: Event) -> bool:
    """Whether ``event`` is a pathology in absolute terms (see the module docstring)."""
    if event.to_state in HARD_STATES or event.sudden:
        return True
    return event.family == "gradient_health" and event.at_start


def loss_worsening(loss: np.ndarray, i: int, *, window: int) -> float:
    """Decades by which the median loss of the ``window`` steps from index ``i`` exceeds the median of the
    ``window`` steps before it (``inf`` when a later loss is non-finite; NaN without enough loss)."""
    loss = np.asarray(loss, dtype=np.float64)
    before, after = loss[max(0, i - window):i], loss[i:i + window]
    if (np.isinf(after) | np.isnan(after)).any() and np.isfinite(before).any() and not np.isnan(after).all():
        return float("inf")
    before, after = before[np.isfinite(before)], after[np.isfinite(after)]
    if not len(before) or not len(after):
        return float("nan")
    b, a = float(np.median(before)), float(np.median(after))
    if b <= 0 or a <= 0:
        return float("nan") if b <= 0 and a <= 0 else (float("inf") if b <= 0 else float("-inf"))
    return float(np.log10(a / b))


def loss_is_worse(series: RunSeries, onset: int, t: Thresholds = Thresholds()) -> bool | None:
    """Whether the loss got worse after step ``onset`` (see the module docstring); None without a loss."""
    loss = np.asarray(series.loss, dtype=np.float64)
    if not np.isfinite(loss).any():
        return None
    i = int(np.searchsorted(series.steps, onset))
    decades = loss_worsening(loss, i, window=t.window)
    before, after = loss[max(0, i - t.window):i], loss[i:i + t.window]
    if np.isnan(decades) and not (np.isfinite(before).any() and np.isfinite(after).any()):
        return None
    if decades == np.inf and not np.isfinite(after).all():
        return True
    start = loss[np.isfinite(loss)][:t.start_steps]
    scale = float(np.median(np.abs(start))) if len(start) else 0.0
    rise = float(np.median(after[np.isfinite(after)]) - np.median(before[np.isfinite(before)]))
    if rise <= 0 or rise < t.harm_fraction * scale:
        return False
    return bool(np.isnan(decades) or decades >= np.log10(t.harm_factor))


SOLVED = 0.01
"""A loss at or below this share of the untrained model's (the first steps' median) is a task learned: its
gradients come from the few samples still wrong, and jump tenfold from one batch to the next."""


def solved_gradient_jump(event: Event, series: RunSeries, t: Thresholds = Thresholds()) -> bool:
    """Whether ``event`` is a sudden gradient jump of a model whose loss was at most ``SOLVED`` × the untrained
    model's over the ``window`` steps before it, and did not get worse after it: the noise of a learned task
    (the batch of the step had almost nothing left to learn), not a changed backward pass."""
    if event.family != "gradient_health" or event.at_start or not event.sudden:
        return False
    loss = np.asarray(series.loss, dtype=np.float64)
    i = int(np.searchsorted(series.steps, event.onset))
    before = loss[max(0, i - t.window):i]
    before = before[np.isfinite(before)]
    if np.isfinite(loss).sum() < t.start_steps or not len(before):
        return False
    untrained = initial_loss(loss, t)
    return bool(untrained > 0 and np.median(before) <= SOLVED * untrained
                and loss_is_worse(series, event.onset, t) is False)


def harmful(root: Event, effects: Iterable[Event], series: RunSeries, t: Thresholds = Thresholds()) -> bool:
    """Whether ``root`` with its consequences ``effects`` describes a failure: a hard event among them, or
    the loss worse after the root's onset. Without any loss recorded, every root counts (nothing to check
    against)."""
    if any(is_hard(e) and not solved_gradient_jump(e, series, t) for e in (root, *effects)):
        return True
    if root.at_start:
        if root.family == "optimizer_stability" and (loss_blew_up_from_start(series, root.end, t)
                                                     or ends_worse_than_untrained(series, t)):
            return True
        learned = loss_improved_from_start(series, t)
        return True if learned is None else not learned
    worse = loss_is_worse(series, root.onset, t)
    if root.family == "parameter_edit" and not worse and training_undone(series, root.onset, t):
        return True
    return True if worse is None else worse


def training_undone(series: RunSeries, onset: int, t: Thresholds = Thresholds()) -> bool:
    """Whether the loss after ``onset`` is back at the untrained model's (its first steps' median, within
    ``UNDONE`` of it) after training had taken it at least ``LEARNED`` below: an edit that re-initialised the
    weights undoes what training did, however little that was."""
    loss = np.asarray(series.loss, dtype=np.float64)
    i = int(np.searchsorted(series.steps, onset))
    start, before, after = loss[:3], loss[max(3, i - t.window):i], loss[i:i + t.window]
    start, before, after = (x[np.isfinite(x)] for x in (start, before, after))
    if not (len(start) and len(before) and len(after)):
        return False
    untrained, b, a = float(np.median(start)), float(np.median(before)), float(np.median(after))
    return untrained > 0 and b <= LEARNED * untrained and abs(a - untrained) <= UNDONE * untrained


LEARNED = 0.9
"""Training had taken the loss to at most this share of the untrained model's before an edit that undid it."""
UNDONE = 0.1


def loss_blew_up_from_start(series: RunSeries, end: int, t: Thresholds = Thresholds()) -> bool:
    """Whether the loss went non-finite, or ``divergence_factor`` × above its value at step 0 (the untrained
    model, before any update), by step ``end``; False when step 0's loss was not recorded."""
    loss = _from_step_zero(series)
    if loss is None:
        return False
    head = loss[:int(np.searchsorted(series.steps, end, side="right"))]
    return bool((np.isinf(head) | (head >= t.divergence_factor * loss[0])).any())


def _from_step_zero(series: RunSeries) -> np.ndarray | None:
    """The loss per recorded step, when step 0 (the untrained model) was recorded with a positive finite loss;
    None otherwise."""
    steps = np.asarray(series.steps)
    loss = np.asarray(series.loss, dtype=np.float64)
    if not len(steps) or steps[0] != 0 or len(loss) != len(steps) or not np.isfinite(loss[0]) or loss[0] <= 0:
        return None
    return loss


def ends_worse_than_untrained(series: RunSeries, t: Thresholds = Thresholds()) -> bool:
    """Whether the median loss of the last ``window`` steps is ``divergence_floor`` × the loss at step 0 (the
    untrained model) or more, and no stretch of ``window`` steps was better than step 0: updates from the
    first step on left the model worse than it started, whatever it recovered after a first blow-up (a run
    that trained and later diverged is not harmed from the start); False when step 0's loss was not
    recorded."""
    loss = _from_step_zero(series)
    if loss is None:
        return False
    tail = loss[-t.window:]
    tail = tail[np.isfinite(tail)]
    if not (len(tail) * 2 >= min(t.window, len(loss)) and np.median(tail) >= t.divergence_floor * loss[0]):
        return False
    windows = [w[np.isfinite(w)] for w in np.array_split(loss[1:], max(1, (len(loss) - 1) // t.window))]
    return all(np.median(w) >= loss[0] for w in windows if len(w))  # never better than untrained: from the start


def optimizer_blew_up_at_start(series: RunSeries, t: Thresholds = Thresholds()) -> bool:
    """Whether the first recorded update moved the median parameter node by ``update_ratio_high`` of its norm
    and the loss then blew up or ended worse than the untrained model's."""
    ratios = [float(ratio[np.isfinite(ratio)][0]) for node in series.parameters
              if node.has("update") and node.has("value")
              for ratio in (node.stats["update"]["l2"] / node.stats["value"]["l2"],) if np.isfinite(ratio).any()]
    if not ratios or np.median(ratios) < t.update_ratio_high:
        return False
    end = int(series.steps[min(len(series.steps) - 1, t.window)]) if len(series.steps) else 0
    return loss_blew_up_from_start(series, end, t) or ends_worse_than_untrained(series, t)


def loss_improved_from_start(series: RunSeries, t: Thresholds = Thresholds()) -> bool | None:
    """Whether some later stretch of ``window`` steps has a median loss ``harm_factor`` × below the first
    ``window``'s — in a run shorter than two windows, the second half's below the first's: training works, so
    a state present from the first step did not stop it (None without a loss, or in a run under 10 steps)."""
    loss = np.asarray(series.loss, dtype=np.float64)
    size = t.window if len(loss) >= 2 * t.window else max(len(loss) // 2, 1)  # a short run: its two halves
    chunks = [loss[i:i + size] for i in range(0, len(loss), size)]
    medians = [float(np.median(c[np.isfinite(c)])) for c in chunks if np.isfinite(c).sum() * 2 >= len(c)]
    if len(medians) < 2 or size < MIN_HALF or not np.isfinite(loss[:size]).any():
        return None
    return bool(min(medians[1:]) * t.harm_factor <= medians[0])


MIN_HALF = 5
"""The fewest steps per half for a run shorter than two windows to tell whether its loss fell."""
