"""Halting on failure: stop the training run cleanly when a flight-recorder trigger with ``halt=True`` fires.

``Halting`` is a mixin of ``NeuralDbg`` and works on its state. ``halt_on=[...]`` adds halting triggers to
the flight recorder (one is made when none was given); any trigger built with ``halt=True`` halts too.
When one fires, the recorder has already written the ring buffer (the steps before the failure, with
their snapshots) and the step that tripped, and flushed them to disk (``recorder.dispatch``). After
``halt_delay`` more steps (recorded in full), at the step boundary, NeuralDbg runs the analysis on what was
recorded, prints it, and then

- ``halt_mode="raise"``: closes itself (the recording is complete, every hook removed) and raises
  :class:`~comgra_ndbg.errors.TrainingHalted`, carrying the diagnosis, out of the call that ended the step:
  ``optimizer.step()`` with ``optimizer=``, else the next step's forward pass (before it runs);
- ``halt_mode="flag"``: sets ``dbg.should_stop`` (and ``dbg.halt``) for a loop that checks it, and goes
  on recording (the flight recorder's ``after`` steps in full) until the loop ends.

``halt_delay`` defaults to 2: the analysis enters a state only when it holds for 3 consecutive steps (its
hysteresis against false alarms, ``analysis.config.Thresholds.persist``), so a run stopped at the very step
that tripped is often "no failure found" although the failure is on disk; two more steps of a run that has
already failed cost nothing and let the diagnosis name it. ``halt_delay=0`` stops at the step that tripped.
A halt found while the block ends (a trigger in the last steps) is printed and flagged, never raised.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comgra_ndbg.errors import InvalidArgumentError, TrainingHalted
from comgra_ndbg.recorder.flight import FlightRecorder, LossSpike, NonFinite, Trigger

__all__ = ["Halt", "Halting", "HALT_MODES", "halting_flight_recorder"]

HALT_MODES = ("raise", "flag")
_NAMED = {"nonfinite": NonFinite, "loss_spike": LossSpike}


@dataclass(frozen=True)
class Halt:
    """Why training was halted: the step whose trigger fired, its reason, the last step recorded before the
    halt, the diagnosis of the recording at that moment (None if the analysis failed) and its path."""

    step: int
    reason: str
    last_step: int
    diagnosis: Any
    path: Path | None

    def text(self) -> str:
        """What is printed at the halt: the step, the reason, the recording and the explanation."""
        explained = self.diagnosis.explain() if self.diagnosis is not None else "(the analysis failed; see the warning)"
        return (f"comgra_ndbg: training halted after step {self.last_step}; trigger at step {self.step}: "
                f"{self.reason}\nthe steps up to it are in {self.path}\n{explained}")


def halting_flight_recorder(flight: FlightRecorder | None, halt_on: Sequence[Trigger | str] | None
                            ) -> FlightRecorder | None:
    """The flight recorder to record with: ``flight`` with the triggers of ``halt_on`` added (marked
    ``halt=True``; ``"nonfinite"`` and ``"loss_spike"`` name ``NonFinite()`` and ``LossSpike()``). With
    ``halt_on``, a new ``FlightRecorder`` of the same bounds is made, so the one given can be reused.

    >>> halting_flight_recorder(None, ["nonfinite"]).triggers
    [NonFinite(halt=True)]
    """
    if flight is not None and not isinstance(flight, FlightRecorder):
        raise InvalidArgumentError(f"flight_recorder must be a FlightRecorder, got {type(flight).__name__}")
    if halt_on is None:
        return flight
    if isinstance(halt_on, (str, Trigger)) or not isinstance(halt_on, Sequence):
        halt_on = [halt_on]
    triggers = []
    for item in halt_on:
        if isinstance(item, str) and item in _NAMED:
            item = _NAMED[item]()
        if not isinstance(item, Trigger):
            raise InvalidArgumentError(f"halt_on takes flight-recorder triggers (NonFinite(), LossSpike(...), "
                                       f"GradNormAbove(x), Predicate(fn)) or the names {sorted(_NAMED)}, got {item!r}")
        item.halt = True
        triggers.append(item)
    if flight is None:
        return FlightRecorder(triggers=triggers)
    kept = list(flight.triggers)
    kept += [t for t in triggers if not any(t is k for k in kept)]
    return FlightRecorder(steps=flight.steps, max_bytes=flight.max_bytes, after=flight.after, triggers=kept)


class Halting:
    """Halting on failure for ``NeuralDbg`` (see the module docstring); not used on its own."""

    def _init_halting(self, halt_mode: str, halt_delay: int) -> None:
        if halt_mode not in HALT_MODES:
            raise InvalidArgumentError(f"halt_mode is 'raise' (TrainingHalted from the step that tripped) or 'flag' "
                                       f"(dbg.should_stop for the loop to check), got {halt_mode!r}")
        if isinstance(halt_delay, bool) or not isinstance(halt_delay, int) or halt_delay < 0:
            raise InvalidArgumentError(f"halt_delay is the number of steps recorded after a halting trigger before "
                                       f"training stops, an int >= 0; got {halt_delay!r}")
        self._halt_mode, self._halt_delay = halt_mode, halt_delay
        self._halt: Halt | None = None
        self._finished: int | None = None  # the last step finished (written)

    @property
    def should_stop(self) -> bool:
        """True once a halting trigger fired (``halt_mode="flag"`` loops check it after each step)."""
        return self._halt is not None

    @property
    def halt(self) -> Halt | None:
        """Why training was halted, or None."""
        return self._halt

    def _act_on_halt(self, *, can_raise: bool) -> None:
        """At a step boundary: when the recorder reports a halting trigger, diagnose, print, and stop."""
        if self._halt is not None or not self.enabled:
            return
        request = self.recorder.halt_request
        if request is None or (can_raise and (self._finished or 0) < request[0] + self._halt_delay):
            return
        diagnosis = None
        try:
            diagnosis = self.diagnose()
        except Exception as error:  # the halt stands without its diagnosis
            self._warn_once("halt analysis", f"the analysis of the halted run failed ({type(error).__name__}: "
                                             f"{error}); the recording is complete, run comgra-ndbg explain on it")
        halt = self._halt = Halt(request[0], request[1], self._finished, diagnosis, self.path)
        print(halt.text(), flush=True)
        if can_raise and self._halt_mode == "raise":
            self.close()
            raise TrainingHalted(f"training halted after step {halt.last_step}; trigger at step {halt.step}: "
                                 f"{halt.reason} (recording: {self.path})", step=halt.step, reason=halt.reason,
                                 last_step=halt.last_step, diagnosis=diagnosis, path=self.path)
