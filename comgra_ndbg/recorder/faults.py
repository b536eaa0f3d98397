"""Fault isolation of the recorder: wrong calls raise typed errors; problems of its own never reach the
training loop, and are logged in the recording and warned about per subject (``problems``) instead of
disappearing (a mixin of ``Recorder``)."""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from comgra_ndbg.errors import ComgraError, RecorderStateError, RecorderWarning
from comgra_ndbg.recorder.step_record import SummaryRows
from comgra_ndbg.store import schema

__all__ = ["FaultIsolation"]

_SUM_SQ, _NAN, _INF, _MIN, _MAX = (schema.FIELD[f] for f in ("sum_sq", "nan", "inf", "min", "max"))


class FaultIsolation:
    """Checks and fault isolation of ``Recorder``; not used on its own."""

    def _check_open_recorder(self, call: str) -> None:
        if self._closed:
            raise RecorderStateError(f"{call} on a closed recorder; create a new Recorder (with another trial name) "
                                     f"to record more")

    def _check_step_open(self, call: str) -> None:
        self._check_open_recorder(call)
        if not self._step_open:
            raise RecorderStateError(f"{call} outside a step; call start_step(step) first (or use `with "
                                     f"rec.step(step):`)")

    def _guard(self, what: str, fn: Any, key: str = "") -> Any:
        try:
            return fn()
        except ComgraError:
            raise
        except Exception as error:  # a recorder problem must not break the training run
            self._warn(what, error, key)
            return None

    def _note_once(self, key: str, message: str) -> None:
        """Warn about a recording choice (not a failure) once per run and ``key``."""
        if key not in self._noted:
            self._noted.add(key)
            warnings.warn(f"comgra_ndbg: {message}", RecorderWarning, stacklevel=3)

    def _add_log(self, step: int, category: str, subject: str, message: str, detail: dict | None = None) -> None:
        self._writer.add_log(step, category, subject, message, detail)

    def _warn(self, what: str, error: BaseException, key: str = "") -> None:
        """A part of the recorder failed: logged in the recording (category ``recorder_error``), warned about
        per part, and the run goes on without it."""
        step = self._step if self._step_open else self._last_step  # a flush runs after its step closed
        step = -1 if step is None else step
        self._problems.record(step, schema.PROBLEM_RECORDER, what + (f" {key}" if key else ""),
                              f"{what} failed at step {step} ({type(error).__name__}: {error}); training continues "
                              f"and this part is not recorded", {"error": type(error).__name__})

    def _trigger_failed(self, step: int, trigger: object, error: BaseException) -> None:
        self._problems.record(step, schema.PROBLEM_TRIGGER, repr(trigger),
                              f"flight-recorder trigger {trigger!r} raised {type(error).__name__}: {error} at step "
                              f"{step}; it counted as not firing", {"error": type(error).__name__})

    def _skipped(self, name: str, kind: str, error: BaseException) -> None:
        """A tensor (or its gradient) that cannot be summarised or snapshotted: skipped alone, logged with
        its step (category ``skipped_tensor``), warned about per tensor."""
        step = self._step if self._step_open else self._last_step
        step = -1 if step is None else step
        self._problems.record(step, schema.PROBLEM_SKIPPED_TENSOR, name,
                              f"tensor {name!r} ({kind}) was skipped at step {step}: {type(error).__name__}: "
                              f"{error}", {"kind": kind, "error": type(error).__name__})

    def _check_overflow(self, rows: SummaryRows) -> None:
        """Log rows whose Σx² overflowed float64 although every element is finite (|x| above ~1e154): their
        std, rms and l2 read as inf or NaN, which must not pass for a recorded value."""
        data = rows.data
        if not len(data) or math.inf not in data[:, _SUM_SQ].tolist():  # the common case (a list: no ufunc's overhead)
            return
        overflowed = np.isinf(data[:, _SUM_SQ]) & (data[:, _NAN] + data[:, _INF] == 0)
        for i in np.flatnonzero(overflowed).tolist():
            tid, kind = self.catalog.series[int(rows.series[i])]
            name = self.catalog.tensors[tid].name
            self._problems.record(self._step, schema.PROBLEM_OVERFLOW, name,
                                  f"the sum of squares of {name!r} ({kind}) overflows float64 at step {self._step} "
                                  f"(|x| up to {max(abs(data[i, _MIN]), abs(data[i, _MAX])):.3g}): its std, rms "
                                  f"and l2 are not recorded; count, mean, min and max are", {"kind": kind})
