"""Thresholds of every analysis rule, in one frozen dataclass with documented defaults.

The defaults were chosen on diagbench (``python -m benchmarks.diagbench``): they are the values at which
healthy controls — including an easy task whose gradients shrink 1000×, LR warm-up and step decay — raise
no hypothesis, while every catalogue fault is found. ``docs/diagnosis.md`` lists them with their rules.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields

from comgra_ndbg.errors import InvalidArgumentError

__all__ = ["Thresholds"]


@dataclass(frozen=True)
class Thresholds:
    """Parameters of the detectors; pass a modified copy (``dataclasses.replace``) to any detector."""

    # relative rules: a series' level against the median of its own recent history, in decades (log10)
    window: int = 20  # steps of history in the rolling baseline
    min_history: int = 10  # finite history values needed before a relative rule may fire
    persist: int = 3  # consecutive steps needed to enter a state, and to leave it (hysteresis)
    settle_steps: int = 50  # relative rules start after these steps: early training moves everything fast
    enter_decades: float = 1.0  # level shift that starts a scale event (10×)
    exit_decades: float = 0.5  # level shift under which a scale event ends (≈3×)
    # absolute rules, also applied from step 0
    start_steps: int = 10  # the first recorded steps whose median defines "present from step 0"
    dead_enter: float = 0.9  # share of units that are 0 for every sample
    dead_exit: float = 0.7
    dead_rise: float = 0.5  # a mid-run dead state must rise this much above the recent median
    saturated_enter: float = 0.5  # share of elements within the saturation margin of a bounded activation
    saturated_exit: float = 0.3
    saturated_rise: float = 0.3
    collapse_decades: float = 1.0  # the spread across samples falls this much against its history ...
    collapse_level: float = 0.02  # ... to below this share of the second moment: mode collapse
    imbalance_decades: float = 1.5  # the ratio of two parallel paths' gradients or updates shifts this much ...
    imbalance_steps: int = 20  # ... and stays shifted this long: one path dwarfs the other
    vanishing_decades: float | None = None  # relative gradient rule, falling side: entry shift (None: enter_decades)
    exploding_decades: float | None = None  # relative gradient rule, rising side: entry shift (None: enter_decades)
    start_gradient_decades: float = 4.0  # |log10(gradient rms / output gradient rms)| at start: vanishing/exploding
    update_ratio_high: float = 0.1  # ‖ΔW‖/‖W‖ above this for `persist` steps is out of band
    frozen_steps: int = 10  # steps of exactly-zero updates while the other parameters move: a frozen parameter
    edit_fraction: float = 0.05  # share of a parameter's change between two steps its update cannot explain: an edit
    isolated_update_decades: float = 2.0  # one parameter's update jump, alone, must be this large to be a root
    optimizer_share: float = 0.5  # share of parameter nodes whose updates jump together: the optimizer
    optimizer_spread: int = 1  # steps between those jumps
    abrupt_steps: int = 3  # before the first non-finite step, single-step jumps this close to it are looked for ...
    abrupt_decades: float = 1.5  # ... of at least this size (see analysis/abrupt.py)
    # output range (see analysis/output_range.py): over the last 1/range_tail of the run, the prediction ...
    range_tail: int = 3
    range_gap: float = 0.2  # ... stays this share of the target's range short of it, or ...
    range_push: float = 0.3  # ... its gradient's |mean| is this × its rms ...
    range_persist_share: float = 0.8  # ... at this share of the steps; the loss stays above ...
    range_loss_share: float = 0.2  # ... this share of its first steps' median; and a node on its path ...
    range_compression: float = 20.0  # ... makes the side it cannot reach this many times smaller than the other
    # loss rules
    spike_factor: float = 10.0  # loss above this × its recent median: a spike
    spike_recovery_steps: int = 5  # a spike back under `spike_recovery_factor` × median within these steps is transient
    spike_recovery_factor: float = 3.0
    spike_floor: float = 1.0  # ... and peaking at least at this × the loss of the untrained model (first steps)
    jump_factor: float = 5.0  # loss above this × its recent median at once, and `spike_recovery_factor` × for
    # `window` steps after: a lasting jump (a spike that does not come back)
    divergence_floor: float = 2.0  # an optimizer event after which the loss settles at this × the untrained
    # model's loss (the model is worse than untrained) is a divergence, not an instability
    divergence_factor: float = 100.0  # loss above this × its median before the event: diverging
    # harm: what turns a relative change into a failure (see analysis/harm.py)
    harm_factor: float = 1.25  # the loss after an event at least this × the loss before it ...
    harm_fraction: float = 0.05  # ... and higher by at least this share of the loss the run started with
    sudden_fraction: float = 0.8  # a scale shift that covers this share of enter_decades in one step is sudden
    # causal linking
    max_lag: int = 30  # an effect starts at most this many steps after its cause (through training)
    propagation_lag: int = 2  # a value or gradient event reaches other nodes within these steps (same pass)
    same_time: int = 1  # events this close (steps) count as simultaneous when localising

    def __post_init__(self) -> None:
        """Refuse values no rule can run with (a window of 0 steps, a NaN factor), saying which and why."""
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None and item.name in _OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise InvalidArgumentError(f"Thresholds.{item.name} must be a finite number, got {value!r}")
            least = _LEAST.get(item.name, 1 if item.type == "int" else 0)
            if (item.type == "int" and not isinstance(value, numbers.Integral)) or value < least or (
                    item.type != "int" and least == 0 and value <= 0 and item.name not in _MAY_BE_ZERO):
                kind = "an int" if item.type == "int" else "a number"
                bound = f">= {least}" if item.type == "int" or item.name in _MAY_BE_ZERO else "> 0"
                raise InvalidArgumentError(f"Thresholds.{item.name} must be {kind} {bound}, got {value!r}; the "
                                           f"default is {item.default!r}")

    def as_dict(self) -> dict:
        return asdict(self)


_OPTIONAL = frozenset({"vanishing_decades", "exploding_decades"})
_LEAST = {"settle_steps": 0, "optimizer_spread": 0, "abrupt_steps": 0, "same_time": 0, "propagation_lag": 0}
_MAY_BE_ZERO = frozenset({"harm_fraction", "dead_rise", "saturated_rise", "spike_floor"})
