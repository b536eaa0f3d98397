"""Sentinel steps: between the steps the tiers measure, only the parameters' values and gradients, the
model's inputs and the KPIs (a mixin of ``Recorder``).

A recorded step of a small model spends most of its overhead in Python per registered tensor: a hook per
module output and per gradient, their registration and bookkeeping (``docs/recording.md``, "Statistic
tiers"). With ``Tiers(sentinels=True)`` (the default of ``detail="tiered"``), a ``NeuralDbg`` step that the
tiers would not measure in full — not among the first steps, not a ``full_every``-th or snapshot step, not
held after something moved — runs as a light step (no hooks in the modules) that records the loss and
learning-rate KPIs, the model's inputs and *every parameter's value and gradient*, summarised at the
optimizer's step by one kernel call (``ParameterTracker.summarize_with_gradients``; apart, by the general
path, where it does not apply). Those rows are the sentinels: the tiers watch them (a non-finite value or
gradient, a missing gradient, a parameter edited, a gradient norm that jumped by ``gradient_factor``) and
measure everything — module outputs, their gradients, updates — at the ``hold`` steps after one moved, so
the steps around an onset are complete. A sentinel step is written as a summary step whose module outputs
are absent (not estimated).
"""
from __future__ import annotations

from functools import partial
from operator import attrgetter, is_
from typing import NamedTuple

import numpy as np
import torch

from comgra_ndbg.recorder.plan import fits, work_tensor
from comgra_ndbg.recorder.step_record import SummaryRows, rows_at
from comgra_ndbg.store import schema

__all__ = ["Sentinel", "SentinelSteps", "SENTINEL_REASON"]

_GRAD, _IS_NONE, _REQUIRES_GRAD = attrgetter("grad"), partial(is_, None), attrgetter("requires_grad")

SENTINEL_REASON = schema.SENTINEL_REASON


class Sentinel(NamedTuple):
    """What a sentinel step records: its parameters' rows, and why the tiers measure the next steps (or "")."""

    rows: SummaryRows
    moved: str


class SentinelSteps:
    """``sentinel_step`` and ``sentinel_rows`` of ``Recorder`` (see the module docstring); not used on its own."""

    def sentinel_step(self, step: int, step_type: str) -> bool:
        """Whether ``step`` may run as a sentinel step: the tiers keep sentinels and would not measure it
        (no snapshot, forced, flight-recorder or profiled step; summaries are due; no parameter changed
        since the last step ended). A pure query."""
        state = self._tier_state
        if (not self._sentinels_on or not self.enabled or self._closed or self._step_open
                or not self.record_updates or self.flight_recorder is not None or self._profiler is not None
                or not self._parameters.tracked or (self.resume_after is not None and step <= self.resume_after)
                or self._dispatcher.is_forced(step) or not self.summary_policy.decide(step, step_type).record
                or self.snapshot_policy.decide(step, step_type).record):
            return False
        return not state.due(step, self._parameters.marks())

    def use_sentinels(self) -> None:
        """Sentinel steps may run (``NeuralDbg``, which runs them as light steps): the tiers then watch the
        parameters' gradients at the steps recorded in full too (a jump or a missing gradient there holds
        the steps after in full)."""
        state = self._tier_state
        self._sentinels_on = state is not None and state.tiers.sentinels

    def open_sentinel(self, step: int) -> None:
        """Sentinel step ``step`` begins: its gradients are read from ``.grad`` at its optimizer's step, so
        the parameters' gradient hooks of the last recorded step come off."""
        self._sentinel_step = step
        self._tier_stepped = 0
        self._resync_parameters(step)
        self._parameters.unwatch()
        self._parameters.release()

    def sentinel_inputs(self, inputs: list[tuple[str, torch.Tensor]]) -> None:
        """The model's inputs at the first pass of a sentinel step, named as the full path registers them
        (``input``, ``input[i]``): summarised with the step's parameters where their registration plan
        holds (the same dtype, shape and kind of tensor as at the last recorded step), so data faults (a NaN
        or an outlier batch) show at the step they happen."""
        pending = self._sentinel_inputs = []
        for name, tensor in inputs:
            plan = self._plans.get(name)
            if plan is None or not fits(plan, tensor, plan.batch_before):
                continue
            host = work_tensor(tensor, plan) if plan.convert else tensor
            pending.append((plan.series_id, self._reducer.add_planned(host, plan.batch, plan.thresholds, plan.kernel,
                                                                     plan.work_dtype)))

    @property
    def sentinel_eligible(self) -> bool:
        """Whether the open step is one the tiers did not measure (its updates not measured, no snapshot, not
        forced): the step after it may be a sentinel step."""
        return (self._sentinels_on and self._step_open and self._tiered
                and not self._parameters.captured and not self._snapshot and not self._forced)

    def sentinel_rows(self, step: int) -> Sentinel | None:
        """The value and gradient rows of every tracked parameter now (at the optimizer's step of sentinel
        step ``step``), watched by the tiers; None when something failed (the step then has no rows)."""
        return self._guard("recording parameter sentinels", lambda: self._sentinel_rows(step))

    def _sentinel_rows(self, step: int) -> Sentinel:
        tracker, state = self._parameters, self._tier_state
        inputs, self._sentinel_inputs = self._sentinel_inputs, []
        tracked, params = tracker.tracked, tracker.parameters()
        grads = list(map(_GRAD, params))
        if False in list(map(_REQUIRES_GRAD, params)):  # a frozen parameter's .grad is left from before it froze
            grads = [grad if p.requires_grad else None for p, grad in zip(params, grads)]
        complete = not any(map(_IS_NONE, grads))  # (``None in grads`` would compare tensors with ==)
        with_grad = grads if complete else [g for g in grads if g is not None]
        both = tracker.summarize_with_gradients(self._reducer, grads) if complete else None
        if both is not None:  # one kernel call over the values and the gradients
            value_rows, grad_rows = both[:len(grads)], both[len(grads):]
        else:
            value_rows = tracker.summarize_values(self._reducer)
            grad_rows = self._reducer.add_many(with_grad) if with_grad else []
        rows = self._reducer.collect()
        value_data = rows[rows_at(value_rows)]
        grad_data = rows[rows_at(grad_rows)] if with_grad else np.zeros((0, schema.NUM_FIELDS))
        missing = not complete and any(g is None and t.parameter.requires_grad for g, t in zip(grads, tracked))
        moved = state.observe_values(step, value_data)
        moved = state.observe_gradients(step, None if missing else grad_data, missing) or moved
        input_rows = [row for _, row in inputs]
        key = (complete, len(tracked), tuple(sid for sid, _ in inputs))
        if (both is not None and not self._reducer.failed and both.start == len(input_rows)
                and both.stop == len(rows) and input_rows == list(range(len(input_rows)))):
            # the usual step: the collected rows are the inputs', the values' and the gradients', in that order
            cached = self._sentinel_series.get(key)
            if cached is None:
                series = np.concatenate([np.array(key[2], dtype=np.int64), self._parameter_series(schema.KIND_VALUE),
                                         self._parameter_series(schema.KIND_GRAD)])
                cached = self._sentinel_series[key] = (series, np.zeros(len(series), np.int64))
            return Sentinel(SummaryRows(cached[0], cached[1], rows), moved)
        apart = ("apart",) + key  # the general order: values, gradients, inputs
        cached = self._sentinel_series.get(apart) if complete else None
        if cached is None:
            if complete:
                grad_series = self._parameter_series(schema.KIND_GRAD)
            else:
                tids = tracker.tensor_ids()
                grad_series = np.array([self.catalog.series_id(tid, schema.KIND_GRAD)
                                        for tid, g in zip(tids, grads) if g is not None], dtype=np.int64)
            series = np.concatenate([self._parameter_series(schema.KIND_VALUE), grad_series,
                                     np.array(key[2], dtype=np.int64)])
            cached = (series, np.zeros(len(series), np.int64))
            if complete:
                self._sentinel_series[apart] = cached
        series = cached[0]
        data = np.concatenate([value_data, grad_data, rows[input_rows]])
        failed = self._reducer.failed
        if failed:  # a row that could not be computed stays absent
            keep = ~np.isin(np.concatenate([np.asarray(value_rows), np.asarray(grad_rows, dtype=np.int64),
                                            np.asarray(input_rows, dtype=np.int64)]), list(failed))
            series, data = series[keep], data[keep]
        return Sentinel(SummaryRows(series, np.zeros(len(series), np.int64), data), moved)

    def _write_sentinel(self, step: int, type_id: int, sentinel: Sentinel, when: float) -> None:
        """A sentinel step's entry and rows, to the writer."""
        rows = sentinel.rows
        reason = SENTINEL_REASON if not sentinel.moved else (
            f"{SENTINEL_REASON}; {sentinel.moved}: the next steps are measured in full")
        self._writer.add_step(step, type_id, 1, schema.FLAG_SUMMARY if len(rows) else 0, reason, when=when)
        if len(rows):
            self._writer.add_summaries(step, 0, rows.series, rows.data)

    def _end_sentinel(self, step: int, sentinel: Sentinel) -> Sentinel:
        """Sentinel step ``step`` is over: the tiers note its parameters' marks at its end, and when an
        optimizer's settings jumped in it (the parameters were copied right before that optimizer's step,
        ``ParameterSteps._tier_optimizer_step``), its updates join its rows."""
        self._sentinel_step = None
        if self._parameters.captured:
            sentinel = self._guard("measuring the updates of a sentinel step",
                                   lambda: self._sentinel_updates(sentinel)) or sentinel
        self._tier_state.sentinel(step, self._parameters.marks())
        return sentinel

    def _sentinel_updates(self, sentinel: Sentinel) -> Sentinel:
        tracker = self._parameters
        try:
            keep = tracker.update_mask()
            indices = tracker.summarize_updates(self._reducer)
            rows = self._reducer.collect()
            failed = set(self._reducer.failed)
            keep = keep & np.array([row not in failed for row in indices], dtype=bool)
            rows = rows[indices][keep]
            self._tier_state.observe_updates(rows, keep)
        finally:
            tracker.release()
        series = self._parameter_series(schema.KIND_UPDATE)[keep]
        joined = SummaryRows.join([sentinel.rows, SummaryRows(series, np.zeros(len(series), np.int64), rows)])
        return Sentinel(joined, "; ".join(filter(None, (sentinel.moved, "tiers: an optimizer's settings jumped"))))
