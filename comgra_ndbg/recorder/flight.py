"""The flight recorder: the last steps' full records kept in RAM, written only when a trigger fires.

Long runs record rarely to stay cheap, yet the steps right before a failure are the ones that explain it.
With a flight recorder every step is summarized and snapshotted into a ring buffer bounded in steps and
bytes; when a trigger fires (non-finite values, a loss spike, a gradient norm above a threshold, or a user
predicate) the ring is written into the recording, marked as retroactive, and every following step is
recorded in full for ``after`` more steps. Triggers are independent: each fires when its own condition
starts to hold and re-arms when that condition clears, so a loss spike that persists never keeps the
non-finite trigger from firing at the first NaN.

Any trigger built with ``halt=True`` also asks the training run to stop when it fires: the recorder
exposes the request (``Recorder.halt_request``) after writing and flushing the ring, and ``NeuralDbg``
acts on it (raises ``TrainingHalted`` or sets ``should_stop``; ``docs/neuraldbg.md``, "Halting on failure").

>>> fr = FlightRecorder(steps=3, triggers=[LossSpike(factor=10, window=5, min_history=3)])
>>> [fr.check(StepFacts(step, {"loss": loss}, [], {})) for step, loss in enumerate([1.0, 1.1, 0.9, 25.0])]
[None, None, None, "loss 25 exceeds 10x its running median 1 (KPI 'loss')"]
"""
from __future__ import annotations

import abc
import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.recorder.step_record import StepRecord

__all__ = ["FlightRecorder", "Trigger", "NonFinite", "LossSpike", "GradNormAbove", "Predicate", "StepFacts"]


@dataclass(frozen=True)
class StepFacts:
    """What triggers look at, for one finished step."""

    step: int
    kpis: dict[str, float]
    nonfinite: list[str]  # "tensor (kind)" labels of series with NaN or Inf elements
    # tensor name -> L2 norm of its gradient over the step's iterations; "name (grad:set)" for named sets
    grad_norms: dict[str, float]


class Trigger(abc.ABC):
    """Decides, from a step's facts, whether to dump the flight recorder; returns the reason or None.

    ``halt``: when this trigger fires, training is asked to stop (see the module docstring)."""

    halt: bool = False

    def _set_halt(self, halt: bool) -> None:
        if not isinstance(halt, bool):
            raise InvalidArgumentError(f"{type(self).__name__}(halt=...) must be True or False, got {halt!r}")
        self.halt = halt

    def _halt_repr(self) -> str:
        return ", halt=True" if self.halt else ""

    @abc.abstractmethod
    def check(self, facts: StepFacts) -> str | None: ...


class NonFinite(Trigger):
    """Fires on the first step with a NaN or ±Inf element in any recorded tensor, gradient or update."""

    def __init__(self, *, halt: bool = False) -> None:
        self._set_halt(halt)

    def check(self, facts: StepFacts) -> str | None:
        if not facts.nonfinite:
            return None
        shown = ", ".join(facts.nonfinite[:3]) + (" …" if len(facts.nonfinite) > 3 else "")
        return f"non-finite values in {shown}"

    def __repr__(self) -> str:
        return "NonFinite(halt=True)" if self.halt else "NonFinite()"


class LossSpike(Trigger):
    """Fires when a KPI exceeds ``factor`` times its running median over the last ``window`` steps
    (also when the KPI itself becomes NaN or Inf).

    Before ``min_history`` values are known the median is not trusted, yet a run whose learning rate is far
    too high explodes in its first steps and never again rises ``factor`` times above the median of the
    diverged values that follow. So in those first steps the bar is ``factor`` squared times the largest
    value seen so far: a loss 100 times its start is no warm-up noise.

    >>> spike = LossSpike(factor=10)
    >>> [spike.check(StepFacts(step, {"loss": loss}, [], {})) for step, loss in enumerate([1.4, 5e3, 40.0])]
    [None, "loss 5e+03 exceeds 100x the largest of its first 1 values 1.4 (KPI 'loss')", None]
    """

    def __init__(self, kpi: str = "loss", factor: float = 10.0, window: int = 50, min_history: int = 10, *,
                 halt: bool = False) -> None:
        self._set_halt(halt)
        if factor <= 1 or window < 1 or not 1 <= min_history <= window:
            raise InvalidArgumentError(f"LossSpike needs factor > 1 and 1 <= min_history <= window, got "
                                       f"factor={factor}, window={window}, min_history={min_history}")
        self.kpi, self.factor, self.min_history = kpi, factor, min_history
        self._history: collections.deque[float] = collections.deque(maxlen=window)

    def check(self, facts: StepFacts) -> str | None:
        value = facts.kpis.get(self.kpi)
        if value is None:
            return None
        if value != value or value in (float("inf"), float("-inf")):
            return f"KPI {self.kpi!r} is {value}"
        reason = None
        if len(self._history) >= self.min_history:
            median = _median(self._history)
            if median > 0 and value > self.factor * median:
                reason = (f"{self.kpi} {value:.3g} exceeds {self.factor:g}x its running median {median:.3g} "
                          f"(KPI {self.kpi!r})")
        elif self._history:
            largest, bar = max(self._history), self.factor ** 2
            if largest > 0 and value > bar * largest:
                reason = (f"{self.kpi} {value:.3g} exceeds {bar:g}x the largest of its first {len(self._history)} "
                          f"values {largest:.3g} (KPI {self.kpi!r})")
        self._history.append(value)
        return reason

    def __repr__(self) -> str:
        return f"LossSpike(kpi={self.kpi!r}, factor={self.factor:g}{self._halt_repr()})"


class GradNormAbove(Trigger):
    """Fires when the L2 norm of any recorded gradient exceeds ``threshold``."""

    def __init__(self, threshold: float, *, halt: bool = False) -> None:
        self._set_halt(halt)
        if not threshold > 0:
            raise InvalidArgumentError(f"GradNormAbove needs a positive threshold, got {threshold}")
        self.threshold = threshold

    def check(self, facts: StepFacts) -> str | None:
        over = {n: v for n, v in facts.grad_norms.items() if v > self.threshold}
        if not over:
            return None
        name = max(over, key=over.get)
        return f"gradient norm of {name!r} is {over[name]:.3g} > {self.threshold:g}"

    def __repr__(self) -> str:
        return f"GradNormAbove({self.threshold:g}{self._halt_repr()})"


class Predicate(Trigger):
    """Fires when ``fn(facts)`` is true. An exception in ``fn`` counts as false: the recorder logs it in the
    recording's problems (``trigger_error``) and warns about it once, with a count at ``close()``."""

    def __init__(self, fn: Callable[[StepFacts], bool], description: str | None = None, *,
                 halt: bool = False) -> None:
        self._set_halt(halt)
        if not callable(fn):
            raise InvalidArgumentError(f"Predicate needs a function of StepFacts, got {type(fn).__name__}")
        self.fn = fn
        self.description = description or getattr(fn, "__name__", "predicate")

    def check(self, facts: StepFacts) -> str | None:
        return f"predicate {self.description!r}" if self.fn(facts) else None

    def __repr__(self) -> str:
        return f"Predicate({self.description!r}{self._halt_repr()})"


@dataclass
class _Entry:
    record: StepRecord
    summaries_written: bool
    snapshots_written: bool
    nbytes: int


@dataclass
class FlightRecorder:
    """Configuration and ring buffer of the flight recorder (give one to ``Recorder(flight_recorder=...)``).

    ``steps`` and ``max_bytes`` bound the ring (the oldest steps are dropped first); ``after`` is how many
    steps after a trigger are recorded in full; ``triggers`` default to ``NonFinite()`` and ``LossSpike()``.
    """

    steps: int = 20
    max_bytes: int = 256 * 2**20
    after: int = 10
    triggers: Iterable[Trigger] | None = None
    _ring: collections.deque = field(default_factory=collections.deque, repr=False)
    _bytes: int = field(default=0, repr=False)
    peak_bytes: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise InvalidArgumentError(f"FlightRecorder(steps=...) must be an int >= 1, got {self.steps!r}")
        if not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise InvalidArgumentError(f"FlightRecorder(max_bytes=...) must be a positive int, got {self.max_bytes!r}")
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 0:
            raise InvalidArgumentError(f"FlightRecorder(after=...) must be an int >= 0, got {self.after!r}")
        self.triggers = list(self.triggers) if self.triggers is not None else [NonFinite(), LossSpike()]
        for trigger in self.triggers:
            if not isinstance(trigger, Trigger):
                raise InvalidArgumentError(f"flight-recorder triggers must be Trigger objects (NonFinite(), "
                                           f"LossSpike(), GradNormAbove(x), Predicate(fn)), got {trigger!r}")

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    @property
    def buffered_steps(self) -> list[int]:
        return [e.record.step for e in self._ring]

    def check(self, facts: StepFacts) -> str | None:
        """The reason of the first trigger whose condition holds for this step, or None (a trigger that
        raises counts as not holding)."""
        holding, _ = self.evaluate(facts)
        return holding[0][1] if holding else None

    def evaluate(self, facts: StepFacts) -> tuple[list[tuple[int, str]], list[tuple[int, BaseException]]]:
        """Every trigger sees every step (so running medians stay current): ``(index, reason)`` of those whose
        condition holds, and ``(index, error)`` of those that raised (counted as not holding)."""
        holding, failures = [], []
        for index, trigger in enumerate(self.triggers):
            try:
                reason = trigger.check(facts)
            except Exception as error:  # noqa: BLE001 - a trigger must not break the training run
                failures.append((index, error))
                continue
            if reason is not None:
                holding.append((index, str(reason)))
        return holding, failures

    def push(self, record: StepRecord, *, summaries_written: bool, snapshots_written: bool) -> None:
        """Keep ``record``; drop the oldest records beyond ``steps`` or ``max_bytes``. A record larger than
        ``max_bytes`` on its own is not kept."""
        size = record.nbytes
        if size > self.max_bytes:
            return
        self._ring.append(_Entry(record, summaries_written, snapshots_written, size))
        self._bytes += size
        while len(self._ring) > self.steps or self._bytes > self.max_bytes:
            self._bytes -= self._ring.popleft().nbytes
        self.peak_bytes = max(self.peak_bytes, self._bytes)

    def drain(self) -> list[_Entry]:
        """Every buffered entry, oldest first; the ring is empty afterwards."""
        entries = list(self._ring)
        self._ring.clear()
        self._bytes = 0
        return entries


def _median(values: Iterable[float]) -> float:
    """``statistics.median`` (which imports ``decimal`` and ``fractions``: half a MiB, for one median).

    >>> _median([3.0, 1.0, 2.0]), _median([4.0, 1.0, 3.0, 2.0])
    (2.0, 2.5)
    """
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
