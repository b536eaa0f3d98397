"""Statistic tiers: at which recorded steps tracked parameters' updates (and, under ``NeuralDbg``, module
outputs) are measured.

Measuring an update needs a copy of every parameter at the step's start and a second pass over both after
the optimizer step; on a small model the two cost about as much as everything else the recorder does for
the parameters (``docs/recording.md``, "Statistic tiers"). ``detail="full"`` pays them at every recorded
step. ``detail="tiered"`` (``Tiers()``) summarises every parameter's value and gradient completely at every
recorded step, as ``"full"`` does, and its update only

- at the ``first`` recorded steps of a run (or of its continuation), where training is least settled, at every
  ``full_every``-th step (``step % full_every == 0``) and at every snapshot step;
- at a step that starts with a parameter changed since the last step ended (an edit under
  ``torch.no_grad()``, a checkpoint loaded: its version counter or storage moved) or with a parameter's
  ``requires_grad`` flipped;
- at a step whose optimizer's settings jumped, seen by a global pre-hook of every optimizer's ``step()``
  that holds a tracked parameter, right before it changes them (the parameters are copied there): a
  learning rate, momentum or weight decay that changed by more than ``settings_factor`` either way, to or
  from 0, or any other setting changed. A schedule that moves the learning rate a little at every step
  does not count; its effect shows at the next measured step;
- at the ``hold`` steps after a step whose parameter values *moved*: a value holds NaN or ±Inf, a parameter's
  norm or extremes changed since the previous step by more than ``edit_fraction`` of its scale beyond
  ``update_factor`` times its last measured update (an edit the version counter did not see, an update
  that grew), or a parameter that was moving is suddenly where it was, within a few float32 ulps of its
  summary (it stopped being updated; updates at the resolution of its values are neither moving nor a stop);
  once sentinel steps ran, also after one whose parameter *gradients* moved: a non-finite gradient, or a
  gradient norm that changed by more than ``gradient_factor`` either way since the step before.

At the other steps a parameter has a value row and no update row: the update is absent there, not
estimated. The state is a few floats per parameter; deciding costs microseconds. With ``sentinels``
(default), ``NeuralDbg``'s steps that the tiers would not measure are *sentinel steps*: light, with only
the parameters' values and gradients, the inputs and the KPIs (``recorder/sentinel_steps.py``); the steps
that measure updates, and the step after each, record everything.

>>> tiers = as_tiers("tiered")
>>> tiers.full_every, as_tiers("full") is None
(40, True)
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.stats.drift import BEYOND, NONFINITE, STOPPED, DriftState, gradients_moved
from comgra_ndbg.stats.fields import FIELD

__all__ = ["DETAILS", "FULL_EVERY", "Tiers", "TierState", "as_tiers", "settings_jumped", "optimizer_settings"]

DETAILS = ("full", "tiered")
"""The named presets of ``detail=``."""

FULL_EVERY = 40
"""The steps between two measured in full by default: ``NeuralDbg``'s snapshots follow the same schedule, so a
snapshot step is one the tiers measure anyway (``docs/recording.md``, "Every 40th step")."""

_SUM_SQ, _MIN, _MAX = FIELD["sum_sq"], FIELD["min"], FIELD["max"]
_REASONS = {NONFINITE: "tiers: a non-finite parameter value", STOPPED: "tiers: a parameter stopped changing",
            BEYOND: "tiers: a parameter changed beyond its updates"}


@dataclass(frozen=True)
class Tiers:
    """Parameter updates measured every ``full_every``-th step and where something moved (module docstring)."""

    full_every: int = FULL_EVERY
    edit_fraction: float = 0.01
    update_factor: float = 4.0
    hold: int = 2
    settings_factor: float = 2.0
    first: int = 20
    gradient_factor: float = 10.0
    sentinels: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.full_every, int) or isinstance(self.full_every, bool) or self.full_every < 1:
            raise InvalidArgumentError(f"Tiers(full_every=...) must be an int >= 1, got {self.full_every!r}")
        if not isinstance(self.sentinels, bool):
            raise InvalidArgumentError(f"Tiers(sentinels=...) must be True or False, got {self.sentinels!r}")
        for name in ("hold", "first"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgumentError(f"Tiers({name}=...) must be an int >= 0, got {value!r}")
        if (not (0 < self.edit_fraction < 1) or not (self.update_factor > 1) or not (self.settings_factor > 1)
                or not (self.gradient_factor > 1)):
            raise InvalidArgumentError(f"Tiers needs 0 < edit_fraction < 1 and update_factor, settings_factor and "
                                       f"gradient_factor > 1, got {self.edit_fraction!r}, {self.update_factor!r}, "
                                       f"{self.settings_factor!r} and {self.gradient_factor!r}")

    def describe(self) -> str:
        return (f"parameter updates: measured at the first {self.first} recorded steps, every {self.full_every} steps, "
                f"at snapshot steps and where a parameter, its requires_grad or an optimizer's settings changed "
                f"(values and gradients: every step)"
                + ("; under NeuralDbg, sentinel steps between the measured ones record only the parameters' "
                   "values and gradients, the inputs and the KPIs" if self.sentinels else ""))


def as_tiers(detail: object) -> Tiers | None:
    """``detail=`` as a :class:`Tiers`, or None for ``"full"`` (everything complete at every recorded step)."""
    if isinstance(detail, Tiers):
        return detail
    if detail == "full":
        return None
    if detail == "tiered":
        return Tiers()
    raise InvalidArgumentError(f"detail must be one of {DETAILS} or a Tiers(...), got {detail!r}")


class TierState:
    """What the previous steps showed of the parameters, and whether the next step measures updates."""

    def __init__(self, tiers: Tiers) -> None:
        self.tiers = tiers
        self._end: tuple[int, list[Any]] | None = None  # (step, marks of the parameters at its end)
        self._settings: dict[int, Any] = {}  # id of an optimizer -> its settings at its last step
        self._drift: DriftState | None = None  # the parameters' value facts at the last observed step
        self._values_step = -2  # ... which was this one
        self._allowed: np.ndarray | None = None  # [n, 2]: how far norms and extremes may move (last measured updates)
        self._hold_until = -1
        self._decided = 0  # steps decided so far: the first ``first`` of them measure their updates
        self._grad_norms: np.ndarray | None = None  # every parameter's squared gradient norm at the last observed step
        self._grads_step = -2  # ... which was this one

    def _changed(self, step: int, marks: Sequence[Any]) -> str:
        """Why the parameters' ``marks`` at the start of ``step`` differ from those at the end of the step
        before, or ``""``."""
        if self._end is None or self._end[0] != step - 1 or self._end[1] == marks:
            return ""
        before = self._end[1]
        if len(before) != len(marks) or any(m[2] != b[2] for m, b in zip(marks, before)):
            return "tiers: a parameter's requires_grad changed"
        return "tiers: a parameter was changed between steps" if any(m != b for m, b in zip(marks, before)) else ""

    def due(self, step: int, marks: Sequence[Any]) -> bool:
        """Whether ``step`` would measure its updates (:meth:`decide`, as a query that changes nothing)."""
        return (bool(self._changed(step, marks)) or self._decided < self.tiers.first
                or step % self.tiers.full_every == 0 or step <= self._hold_until)

    def decide(self, step: int, marks: Sequence[Any]) -> tuple[bool, str]:
        """Whether ``step`` measures every parameter's update from its start, and why when it is not the
        schedule. ``marks`` (``ParameterTracker.marks()``) say per parameter what changed it since the last
        step's end."""
        reason = self._changed(step, marks)
        self._decided += 1
        if reason:
            self._hold_until = step + self.tiers.hold
            return True, reason
        return (self._decided <= self.tiers.first or step % self.tiers.full_every == 0
                or step <= self._hold_until), ""

    def sentinel(self, step: int, marks: list[Any]) -> None:
        """``step`` was a sentinel step (its parameters' values and gradients only; ``marks`` at its end)."""
        self._decided += 1
        self._end = (step, marks)

    def settings_jumped(self, step: int, owner: int, settings: Any) -> bool:
        """Whether an optimizer's ``settings`` (``optimizer_settings``) jumped since its last step
        (:func:`settings_jumped`); if so, the ``hold`` steps after ``step`` measure their updates too."""
        before, self._settings[owner] = self._settings.get(owner), settings
        if before is None or before == settings or not settings_jumped(before, settings, self.tiers.settings_factor):
            return False
        self._hold_until = max(self._hold_until, step + self.tiers.hold)
        return True

    def finish(self, step: int, marks: list[Any]) -> None:
        """Remember the parameters' marks at the end of ``step`` (after its optimizer step)."""
        self._end = (step, marks)

    def observe_values(self, step: int, values: np.ndarray) -> str:
        """Rows of every parameter's value at the start of ``step``: why the next steps should measure their
        updates (they then do for ``hold`` steps), or ``""`` (``stats/drift.py``)."""
        drift, last = self._drift, self._values_step
        compare = drift is not None and drift.n == len(values) and last == step - 1
        if drift is None or drift.n != len(values):
            drift = self._drift = DriftState(len(values))
        self._values_step = step
        allowed = self._allowed if self._allowed is not None and len(self._allowed) == len(values) else None
        reason = _REASONS.get(drift.observe(values, compare=compare, allowed=allowed,
                                            fraction=self.tiers.edit_fraction), "")
        if reason:
            self._hold_until = max(self._hold_until, step + self.tiers.hold)
        return reason

    def observe_gradients(self, step: int, gradients: np.ndarray | None, missing: bool = False) -> str:
        """Rows of every parameter's gradient in ``step`` (None: not every parameter got one; ``missing``: a
        parameter that requires grad got none): why the next steps should measure everything (they then do
        for ``hold`` steps), or ``""``. A missing gradient, a gradient that holds NaN or ±Inf, or one whose
        norm changed by more than ``gradient_factor`` either way since the step before (to or from exactly 0
        included), moved: a layer left out of the loss, or one that started to vanish, explode or die."""
        last, self._grads_step = self._grads_step, step
        if gradients is None or missing:
            self._grad_norms = None
            if missing:
                self._hold_until = max(self._hold_until, step + self.tiers.hold)
                return "tiers: a parameter that requires grad got no gradient"
            return ""
        norms = self._grad_norms
        compare = norms is not None and last == step - 1 and len(norms) == len(gradients)
        if norms is None or len(norms) != len(gradients):
            norms = self._grad_norms = np.zeros(len(gradients))
        found = gradients_moved(gradients, norms, compare, self.tiers.gradient_factor ** 2)  # on squared norms
        if not found:
            return ""
        self._hold_until = max(self._hold_until, step + self.tiers.hold)
        return "tiers: a non-finite parameter gradient" if found == NONFINITE else "tiers: a parameter gradient jumped"

    def observe_updates(self, updates: np.ndarray, kept: np.ndarray) -> None:
        """Rows of the updates of a step that measured them (``kept`` marks the parameters that have one):
        ``update_factor`` times their norm and largest element is what the next steps' values may move."""
        size = np.zeros((len(kept), 2))
        size[kept] = np.stack([np.sqrt(updates[:, _SUM_SQ]),
                               np.fmax(np.abs(updates[:, _MIN]), np.abs(updates[:, _MAX]))], axis=1)
        self._allowed = self.tiers.update_factor * np.nan_to_num(size, nan=np.inf, posinf=np.inf)


def optimizer_settings(optimizer: Any) -> tuple:
    """The settings of every param group of ``optimizer`` that are numbers, flags or tuples of them (learning
    rate, momentum, betas, weight decay, ...), in a comparable tuple; tensors (a capturable learning rate)
    are left out, as reading them could wait for a device."""
    return tuple([tuple([(key, value) for key, value in group.items()
                         if key != "params" and isinstance(value, (int, float, tuple))])
                  for group in optimizer.param_groups])


def settings_jumped(before: Any, now: Any, factor: float) -> bool:
    """Whether settings ``now`` differ from ``before`` by a jump: another structure, a changed non-number, a
    number that changed sign, became or stopped being 0, or changed by more than ``factor`` either way.

    >>> settings_jumped((("lr", 0.1),), (("lr", 0.099),), 2.0), settings_jumped((("lr", 0.1),), (("lr", 0.0),), 2.0)
    (False, True)
    """
    if isinstance(before, tuple) and isinstance(now, tuple):
        return len(before) != len(now) or any(settings_jumped(b, n, factor) for b, n in zip(before, now))
    numbers = (int, float)
    if (isinstance(before, numbers) and isinstance(now, numbers) and not isinstance(before, bool)
            and not isinstance(now, bool)):
        if before == now:
            return False
        if before == 0 or now == 0 or (before < 0) != (now < 0):
            return True
        ratio = abs(now / before)
        return not (1 / factor <= ratio <= factor)
    return before != now
