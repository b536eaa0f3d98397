"""Where a finished step goes: to the writer as the policies asked, and through the flight recorder.

The flight recorder sees every step; when a trigger fires, the steps in its ring that were not written
(or written without snapshots) are written now, marked retroactive, the trigger is stored, and the next
``after`` steps are forced to be recorded in full. Each trigger is armed on its own: it fires when its
condition starts to hold and fires again only after that condition has cleared for a step, so a persistent
NaN is one trigger, not one per step, and a loss spike still holding does not stop the NaN trigger. A trigger
that raises is reported (``report``) and counts as not holding. The first trigger with ``halt=True`` that
fires is kept as :attr:`StepDispatcher.halt` (its step and reason) for the caller to stop training.

With a byte budget (``budget``), every write of snapshots goes through :meth:`SnapshotBudget.fit` first:
the flight recorder's dumps and the forced steps after a trigger may spend its reserve, policy snapshots
only their share.
"""
from __future__ import annotations

import numpy as np

from collections.abc import Callable

from comgra_ndbg.recorder.budget import SnapshotBudget
from comgra_ndbg.recorder.flight import FlightRecorder, StepFacts
from comgra_ndbg.recorder.step_record import StepRecord
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog
from comgra_ndbg.store.writer import RecordingWriter

__all__ = ["StepDispatcher"]


class StepDispatcher:
    """Writes finished steps and runs the flight recorder's triggers (the recorder owns one)."""

    def __init__(self, writer: RecordingWriter, catalog: Catalog, flight: FlightRecorder | None,
                 report: Callable[[int, object, BaseException], None] | None = None,
                 budget: SnapshotBudget | None = None) -> None:
        self.writer = writer
        self.budget = budget
        self.catalog = catalog
        self.flight = flight
        self.report = report  # (step, trigger, error) of a trigger that raised
        self.forced_until = -1
        self.trigger_step = -1
        self.flush_now = False  # set when a trigger fired: the caller flushes at once
        self.halt: tuple[int, str] | None = None  # (step, reason) of the first halting trigger that fired
        self.last: tuple[StepRecord, dict[str, float]] | None = None  # the last step dispatched, and its KPIs
        self._armed = [True] * len(flight.triggers) if flight is not None else []

    def is_forced(self, step: int) -> bool:
        """Whether ``step`` falls in the window recorded in full after a trigger."""
        return step <= self.forced_until

    def forced_reason(self, step: int) -> str:
        after = self.flight.after if self.flight is not None else 0
        return f"forced: step {step - self.trigger_step} of {after} after the trigger at step {self.trigger_step}"

    def dispatch(self, record: StepRecord, kpis: dict[str, float], write_summary: bool,
                 write_snapshot: bool) -> bool:
        """Write what the policies asked for and feed the flight recorder; True when the step was written."""
        self.last = (record, kpis)
        written = write_summary or write_snapshot
        snapshots_written = write_snapshot
        if written:
            fitted = self._fit(record, write_snapshot, preferred=self.is_forced(record.step))
            snapshots_written = write_snapshot and bool(fitted.snapshots)
            fitted.write(self.writer, summaries=write_summary, snapshots=write_snapshot)
        flight = self.flight
        if flight is None:
            return written
        holding, failures = flight.evaluate(self._facts(record, kpis))
        for index, error in failures:
            if self.report is not None:
                self.report(record.step, flight.triggers[index], error)
        fired = [(index, why) for index, why in holding if self._armed[index]]
        held = {index for index, _ in holding}
        self._armed = [index not in held for index in range(len(self._armed))]  # re-armed where it cleared
        if not fired:
            flight.push(record, summaries_written=write_summary, snapshots_written=snapshots_written)
            return written
        reason = fired[0][1]
        dumped = f"flight recorder: retroactive, trigger at step {record.step}: {reason}"
        pending: list[tuple[StepRecord, bool, str | None, bool]] = []  # (record, summaries, reason, step entry)
        for entry in flight.drain():
            if not (entry.summaries_written or entry.snapshots_written):
                pending.append((entry.record, True, dumped, True))
            elif not entry.snapshots_written:
                pending.append((entry.record, False, None, False))
        if not written:
            pending.append((record, True, f"trigger: {reason}", True))
        elif not snapshots_written:
            pending.append((record, False, None, False))
        # the budget is spent from the trigger step backwards: the steps closest to the failure come first
        fitted_records = [self._fit(item[0], True, preferred=True) for item in reversed(pending)][::-1]
        for fitted, (_, summaries, why_written, step_entry) in zip(fitted_records, pending):
            if fitted.snapshots or summaries or step_entry:
                fitted.write(self.writer, summaries=summaries, snapshots=True, reason=why_written,
                             step_entry=step_entry)
        for index, why in fired:
            self.writer.add_trigger(record.step, why)
            if self.halt is None and flight.triggers[index].halt:
                self.halt = (record.step, why)
        self.trigger_step = record.step
        self.forced_until = record.step + flight.after
        self.flush_now = True  # a crash often follows a trigger
        return True

    def _fit(self, record: StepRecord, snapshots: bool, *, preferred: bool) -> StepRecord:
        """``record`` with its snapshots fitted to the byte budget (a log row when the budget backed off or
        dropped them); unchanged without a budget or when no snapshots are written."""
        if not snapshots or self.budget is None:
            return record
        fitted, note = self.budget.fit(record, preferred=preferred)
        if note is not None:
            self.writer.add_log(record.step, schema.LOG_BUDGET, "snapshots", note, self.budget.detail())
        return fitted

    def _facts(self, record: StepRecord, kpis: dict[str, float]) -> StepFacts:
        labels = []
        for sid in record.nonfinite_series():
            tid, kind = self.catalog.series[sid]
            labels.append(f"{self.catalog.tensors[tid].name!r} ({kind})")
        squares: dict[str, float] = {}
        sum_sq = schema.FIELD["sum_sq"]
        for sid, row_sum_sq in zip(record.rows.series.tolist(), record.rows.data[:, sum_sq].tolist()):
            tid, kind = self.catalog.series[sid]
            if kind == schema.KIND_GRAD or kind.startswith(schema.KIND_GRAD + schema.GRAD_SET_SEPARATOR):
                name = self.catalog.tensors[tid].name
                label = name if kind == schema.KIND_GRAD else f"{name} ({kind})"
                # one norm over the step's iterations: the square root of the summed squares, not a sum of norms
                squares[label] = squares.get(label, 0.0) + max(row_sum_sq, 0.0)
        return StepFacts(record.step, kpis, labels, {label: float(np.sqrt(q)) for label, q in squares.items()})
