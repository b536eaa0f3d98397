"""A Recorder's training steps: opening and closing steps and iterations, the state a step keeps, and the
record a finished step hands to the dispatcher (:class:`StepCycle`, a mixin of the Recorder).

A step is opened by ``start_step`` (the policies decide there whether it is summarised or snapshotted, so a
skipped step costs a few attribute checks), filled by registrations and hooks, and closed by
``finish_step`` (one host copy of every statistic, then the writer) or dropped by ``discard_step``.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from comgra_ndbg.errors import ComgraError, InvalidArgumentError, RecorderStateError
from comgra_ndbg.recorder.policy import Decision
from comgra_ndbg.recorder.sentinel_steps import Sentinel
from comgra_ndbg.recorder.device_snapshots import materialize
from comgra_ndbg.recorder.snapshot import DeferredSnapshot, SnapshotData
from comgra_ndbg.recorder.step_record import StepRecord
from comgra_ndbg.recorder.step_rows import StepRows
from comgra_ndbg.recorder.validation import check_name, check_step
from comgra_ndbg.stats.reducer import Reducer
from comgra_ndbg.store import schema

if TYPE_CHECKING:
    from comgra_ndbg.recorder.recorder import Recorder

__all__ = ["StepCycle"]

_SKIP = Decision(False, "", "never")
SKIPPED_BATCH = 64
"""Steps ``skip_step`` keeps before handing their KPIs to the writer at once."""


class StepCycle:
    """Steps and iterations of a :class:`~comgra_ndbg.recorder.recorder.Recorder` (which holds the policies,
    reducers, trackers, writer and dispatcher these methods use)."""

    # ---- step state ----------------------------------------------------------------------------------
    def _reset_step_state(self) -> None:
        self._grad_batch.clear()
        if self._tap_keys:
            self._end_taps()
        for handle in self._hooks:  # a leaf, or a graph node kept across steps, would otherwise keep it for good
            handle.remove()
        self._hooks = []
        if len(self._reducer):  # left by a step that failed midway
            self._reducer = Reducer(self._saturation_margin)
        self._structure.clear()
        self._step_open = False
        self._step = -1
        self.current_step = None
        self._step_type: str | None = None
        self._iteration = 0
        self._iterations_started = 0
        self._iteration_open = False
        self._names: set[str] = set()
        self._step_names: set[str] = set()  # every name registered in the step (add_dependency checks them)
        self._batch_size: int | None = None
        self._summary_decision = _SKIP
        self._snapshot_decision = _SKIP
        self._forced = False
        self._tiered = False  # whether this step's updates are measured is the tiers' decision (``tiers``)
        self._tier_rows: list[int] | None = None  # the rows of its parameter values in ``_values``
        self._start_snapshots: dict[int, SnapshotData] = {}  # tensor id -> its value's snapshot at the step's start
        self._tier_reason = ""  # why the tiers measure updates off their schedule (``tiers``)
        self._summarize = False  # compute summaries this step (policy, forced, or flight recorder)
        self._snapshot = False  # compute snapshots this step
        self._deferring = False  # snapshots wait for decide_step's sample choice
        self._sample_positions: np.ndarray | None = None
        self._sample_categories: np.ndarray | None = None
        self._value_keys: list[tuple[int, int, int]] = []  # (series, iteration, row in the reducer)
        self._value_blocks: list[tuple[np.ndarray, list[int]]] = []  # (series, rows in the reducer), iteration 0
        self._last_viewed: tuple | None = None  # (tensor, version, plan, iteration, row): the last viewed registration
        self._grad_aliases: list[tuple[tuple[int, int], tuple[int, int]]] = []  # (first key, key of the same tensor)
        self._grad_keys: dict[tuple[int, int], int] = {}  # (tensor, iteration) -> row in the reducer
        self._grad_snaps: dict[tuple[int, int], Any] = {}  # (tensor, iteration) -> snapshot
        self._set_grads: dict[tuple[int, int], tuple[torch.Tensor | None, int]] = {}  # (gradient, version) so far
        self._set_grad_bytes = 0
        self._parameter_grads: dict[int, int] = {}  # tensor id -> row in the reducer (gradients_in_hook)
        self._parameter_grad_snaps: dict[int, Any] = {}
        self._deferred_values: list[DeferredSnapshot] = []
        self._deferred_grads: list[DeferredSnapshot] = []
        self._step_rows = StepRows()  # the blocks of the step's rows in ``_reducer``, and what was taken
        self._snaps: list[tuple[int, int, Any]] = []
        self._kpis: list[tuple[Any, ...]] = []  # (kpi id, value) or (kpi id, value, step type id)
        self._grad_kinds: list[str] = []

    # ---- steps -----------------------------------------------------------------------------------------
    @contextmanager
    def step(self, step: int, step_type: str | None = "default") -> Iterator[Recorder]:
        """``with rec.step(i):`` — start_step on entry, finish_step on exit (also after an exception, so
        what was recorded before the failure, e.g. the first NaN, is kept)."""
        self.start_step(step, step_type)
        try:
            yield self
        finally:
            if self.enabled and self._step_open:
                if self._step_type is None:
                    self.decide_step(self._last_step_type)
                self.finish_step()

    def start_step(self, step: int, step_type: str | None = "default") -> None:
        """Begin training step ``step`` (an int, unique within the trial) of type ``step_type``.

        ``step_type=None`` leaves the type open: the step is recorded tentatively if any type could be
        recorded now, and ``decide_step(type)`` settles it before ``finish_step()``.
        """
        if not self.enabled:
            return
        if self._closed:
            self._check_open_recorder("start_step")
        if self._skipped_steps:
            self._write_skipped()
        if self._step_open:
            raise RecorderStateError(f"start_step({step}) while step {self._step} is still open; call finish_step() "
                                     f"at the end of each step")
        step = check_step(step)
        if step in self._seen_steps:
            raise RecorderStateError(f"step {step} was already started once in this trial; step numbers must be "
                                     f"unique (use a global step counter, not the batch index of an epoch)")
        if step_type is not None and (not isinstance(step_type, str) or not step_type):
            raise InvalidArgumentError(f"step_type must be a non-empty str (or None to decide it at the end of the "
                                       f"step), got {step_type!r}")
        if step_type is not None:
            check_name(step_type, "step types")
        self._seen_steps.add(step)
        self._sentinel_step = None  # a light step the full path goes on with is no sentinel step
        self._replayed = self.resume_after is not None and step <= self.resume_after
        self._step_open = True
        self._before_step = (self._last_step, self._last_step_type)  # what discard_step() puts back
        self._step = self._last_step = self.current_step = step
        self._step_type = step_type
        if step_type is not None:
            self._last_step_type = step_type
        self._token += 1
        self._resync_parameters(step)
        self._summary_decision = self.summary_policy.decide(step, step_type)
        self._snapshot_decision = self.snapshot_policy.decide(step, step_type)
        if self._snapshot_decision.record and self._budget is not None and not self._budget.admit():
            self._snapshot_decision = _SKIP  # the budget's back-off: this snapshot is not taken
        self._forced = self._dispatcher.is_forced(step)
        if self._replayed:
            self._note_once("replayed", f"trial {self.trial!r} was continued after step {self.resume_after}: steps "
                                        f"up to it are already in the recording and are not recorded again (from "
                                        f"step {step} on)")
            self._summary_decision = self._snapshot_decision = _SKIP
            self._forced = self._summarize = self._snapshot = self._deferring = False
            self._parameters.unwatch()
            return
        if self._profiler is not None:
            self._profile_start(step, step_type)
        flight = self.flight_recorder is not None
        self._summarize = self._summary_decision.record or self._forced or flight
        self._snapshot = self._snapshot_decision.record or self._forced or flight
        self._deferring = self._snapshot and step_type is None
        if self._summarize or self._snapshot:
            try:  # (``_guard``, inline: every step)
                self._start_parameters()
            except ComgraError:
                raise
            except Exception as error:  # a recorder problem must not break the training run
                self._warn("recording parameters", error)
        else:
            self._parameters.unwatch()  # a skipped step's backward pass pays nothing for them

    def would_skip(self, step: int, step_type: str) -> bool:
        """Whether ``start_step(step, step_type)`` would record nothing at all: no summary or snapshot by the
        policies, no forced or flight-recorder step, no profiler, not a step continued over. A pure query;
        a caller that gets True may hand the whole step to :meth:`skip_step` instead."""
        return (self.enabled and not self._closed and not self._step_open and self.flight_recorder is None
                and self._profiler is None and (self.resume_after is None or step > self.resume_after)
                and not self.summary_policy.decide(step, step_type).record
                and not self.snapshot_policy.decide(step, step_type).record
                and not self._dispatcher.is_forced(step))

    def skip_step(self, step: int, step_type: str, kpis: list[tuple[int, float | torch.Tensor]],
                  sentinel: Sentinel | None = None) -> None:
        """A whole step that records nothing (:meth:`would_skip` said so), in one call: its number is taken
        and its KPIs (``(catalog.kpi_id, value)`` pairs) are written, as ``start_step``, ``record_kpi`` and
        ``finish_step`` would, at a fraction of their cost: the steps are kept and handed to the writer
        :data:`SKIPPED_BATCH` at a time, or sooner when anything else is written (a step, a note, a KPI
        outside a step, a flush, the close) and when the periodic flush is due, so that a live reader sees
        them as soon as it would see a recorded step. ``sentinel`` (from :meth:`sentinel_rows`) makes it a
        sentinel step (``sentinel_steps``): written as a summary step holding its parameters' rows."""
        if step in self._seen_steps or self._step_open:
            raise RecorderStateError(f"skip_step({step}): the step was started before or step {self._step} is "
                                     f"open; skip_step takes a new step number between steps")
        self._seen_steps.add(step)
        self._last_step, self._last_step_type = step, step_type
        if sentinel is not None:
            sentinel = self._end_sentinel(step, sentinel)
        self._skipped_steps.append((step, step_type, kpis, sentinel, time.time()))
        if (len(self._skipped_steps) >= SKIPPED_BATCH
                or time.monotonic() - self._last_flush >= self.flush_every_seconds):
            self._write_skipped()

    def _write_skipped(self) -> None:
        """Hand the steps kept by :meth:`skip_step` to the writer (their KPIs and sentinel rows), oldest first."""
        skipped, self._skipped_steps = self._skipped_steps, []
        if not skipped or not self.enabled or self._closed:
            return
        names, add, type_of = self.catalog.kpi_names, self._writer.add_kpi, self.catalog.step_type_id
        for step, step_type, kpis, sentinel, when in skipped:
            values = {}
            if kpis or sentinel is not None:
                type_id = type_of(step_type)
                if sentinel is not None:
                    self._write_sentinel(step, type_id, sentinel, when)
                for kpi, value in kpis:
                    number = float(value.item()) if isinstance(value, torch.Tensor) else float(value)
                    add(step, kpi, number, type_id)
                    values[names[kpi]] = number
            self._last_kpis = (step, values)
        if self._flush_due():
            self._flush(wait=False)
        else:
            self._writer.poll()

    def start_iteration(self) -> int:
        """Begin the next iteration (forward pass) of a multi-iteration step; returns its index.

        Tensors registered before the first call belong to iteration 0, those after ``finish_iteration`` to
        the last iteration.
        """
        if not self.enabled:
            return 0
        if self._closed or not self._step_open:
            self._check_step_open("start_iteration")
        if self._iteration_open:
            raise RecorderStateError(f"start_iteration() while iteration {self._iteration} of step {self._step} is "
                                     f"open; call finish_iteration() first")
        if self._iterations_started:
            self._iteration += 1
            self._names = set()
        self._iterations_started += 1
        self._iteration_open = True
        return self._iteration

    def finish_iteration(self) -> None:
        """End the current iteration."""
        if not self.enabled:
            return
        if self._closed or not self._step_open:
            self._check_step_open("finish_iteration")
        if not self._iteration_open:
            raise RecorderStateError(f"finish_iteration() without start_iteration() in step {self._step}; call "
                                     f"start_iteration() at the beginning of each forward pass")
        self._iteration_open = False

    # ---- finishing a step --------------------------------------------------------------------------------
    def finish_step(self) -> None:
        """End the step: derive parameter updates, collect every statistic in one host copy, and write."""
        if not self.enabled:
            return
        if self._closed:
            self._check_open_recorder("finish_step")
        if not self._step_open:
            raise RecorderStateError("finish_step() without start_step(); call start_step(step) at the beginning of "
                                     "each training step")
        if self._step_type is None:
            raise RecorderStateError(f"step {self._step} was started without a step type; call "
                                     f"decide_step(step_type) before finish_step()")
        if self._replayed:
            self._token += 1
            self._reset_step_state()
            return
        type_id = self.catalog.step_type_id(self._step_type)
        record = None
        urgent = False
        # each part as ``_guard`` runs it (a problem of its own is logged and the run goes on), inline: every step
        if self._summarize or self._snapshot:
            try:
                record = self._build_record(type_id)
            except ComgraError:
                raise
            except Exception as error:  # a recorder problem must not break the training run
                self._warn("finishing the step", error)
        try:
            kpis = self._write_kpis(type_id) or {}
        except ComgraError:
            raise
        except Exception as error:  # a recorder problem must not break the training run
            self._warn("recording KPIs", error)
            kpis = {}
        self._last_kpis = (self._step, kpis)
        write_summary = self._summary_decision.record or self._forced
        write_snapshot = self._snapshot_decision.record or self._forced
        if record is not None:
            try:
                written = self._dispatcher.dispatch(record, kpis, write_summary, write_snapshot)
            except ComgraError:
                raise
            except Exception as error:  # a recorder problem must not break the training run
                self._warn("writing the step", error)
                written = None
            self._steps_since_flush += 1 if written else 0
            if self._dispatcher.flush_now:  # a trigger fired: its steps go to disk before the next step
                self._dispatcher.flush_now = False
                urgent = True
        elif not (write_summary or write_snapshot):
            self._parameters.forget_gradients()
        self.summary_policy.commit(self._step, self._step_type, write_summary and record is not None)
        self.snapshot_policy.commit(self._step, self._step_type, write_snapshot and record is not None)
        if self._profiler is not None:
            self._profile_finish()
        self._token += 1
        self._reset_step_state()
        if urgent:
            self._flush(wait=True)
        elif self._flush_due():  # periodic: written on a worker thread while training goes on
            self._flush(wait=False)
        else:
            self._writer.poll()  # a background write that failed is reported now

    def discard_step(self) -> None:
        """Drop the open step without writing any of it (values, gradients, updates, KPIs); its step number
        may be started again. For a step that turned out not to be one: ``NeuralDbg`` discards the passes of
        a model run inside another model's update (a GAN's discriminator during the generator's step)."""
        if not self.enabled:
            return
        self._check_step_open("discard_step()")
        self._structure.rollback()
        self._seen_steps.discard(self._step)
        self._last_step, self._last_step_type = self._before_step
        self._parameters.release()
        self._parameters.forget_gradients()
        self._profile_discard()
        self._token += 1
        self._reset_step_state()

    def _build_record(self, type_id: int) -> StepRecord:
        if self._unflushed():
            self._flush_gradients()
        pending = (self._grad_keys or self._grad_snaps or self._deferred_grads or self._parameter_grads
                   or self._parameter_grad_snaps)
        if pending or (not self._grad_kinds and self._parameters.has_fresh_gradients()):
            kind = schema.KIND_GRAD if not self._grad_kinds else self._grad_kinds[-1]
            self._collect_gradients(kind)
        if self._structure.pending:
            self._guard("discovering the dependency graph", self._discover_graph)
        if self._value_keys or self._value_blocks or self._tier_rows is not None:
            self._collect_values(take=False)  # (before the updates: the tiers take the rows they measure)
        self._finish_parameters()
        rows = self._step_rows.finish(self._reducer, self._report_failed)
        if self._tiered and self._sentinels_on:
            self._observe_tier_gradients(rows)
        summary, snapshot = self._summary_decision, self._snapshot_decision
        if snapshot.record or self._tier_reason or self._forced:
            reasons = [d.reason for d in (summary, snapshot) if d.record]
            if self._tier_reason:
                reasons.append(self._tier_reason)
            if self._forced:
                reasons.insert(0, self._dispatcher.forced_reason(self._step))
            reason = "; ".join(dict.fromkeys(reasons))
        else:  # the common case: a summary step
            reason = summary.reason if summary.record else ""
        self._check_overflow(rows)
        return StepRecord(self._step, type_id, self._iteration + 1, reason, time.time(), rows,
                          materialize(self._snaps) if self._snaps else self._snaps)

    def _flush_due(self) -> bool:
        if self.flush_every_steps is not None and self._steps_since_flush >= self.flush_every_steps:
            return True
        return time.monotonic() - self._last_flush >= self.flush_every_seconds
