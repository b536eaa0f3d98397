"""The row tables that hang off steps: KPIs, notes, trigger marks and the log (a mixin of ``Recording``).

Each is a set of parallel tables in every file, read whole; a file whose tables fail their checksums is
left out of them and reported (``damaged="skip"``) or raises ``CorruptRecordingError``.
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.errors import UnknownSeriesError
from comgra_ndbg.store import schema
from comgra_ndbg.store.damage import DamagedData
from comgra_ndbg.store.records import LogEntry, Note, TriggerMark

__all__ = ["StepTables"]


class StepTables:
    """KPIs, notes, trigger marks and log entries of ``Recording``; not used on its own."""

    def kpi(self, name: str, step_type: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of a KPI, optionally restricted to one step type."""
        from comgra_ndbg.store.reader import require

        require(name, str, "a KPI name", f"a str; KPIs are {self.kpi_names}")
        require(step_type, (str, type(None)), "step_type", "a step type (str) or None")
        if name not in self.catalog.kpi_names:
            raise UnknownSeriesError(f"no KPI {name!r}; KPIs are {self.kpi_names}")
        ids, steps, values = (self._concat(schema.KPI_ID), self._concat(schema.KPI_STEP),
                              self._concat(schema.KPI_VALUE))
        mask = ids == self.catalog.kpi_names.index(name)
        if step_type is not None:
            types = self._concat(schema.KPI_STEP_TYPE)
            if step_type not in self.catalog.step_types:
                raise UnknownSeriesError(f"no step type {step_type!r}; step types are {self.step_types}")
            mask &= types == self.catalog.step_types.index(step_type)
        return steps[mask].astype(np.int64), values[mask].astype(np.float64)

    @property
    def triggers(self) -> list[TriggerMark]:
        """Flight-recorder triggers that fired, in order."""
        return [TriggerMark(int(s), str(r)) for s, r in self._rows(schema.TRIGGER_STEP, schema.TRIGGER_REASON)]

    @property
    def notes(self) -> list[Note]:
        return [Note(int(s), float(t), str(x)) for s, t, x in self._rows(schema.NOTE_STEP, schema.NOTE_TIME,
                                                                          schema.NOTE_TEXT)]

    def log(self, category: str | tuple[str, ...] | None = None) -> list[LogEntry]:
        """Rows of the recording's log (``schema.LOG_*``) in the order they were written, of one category (or
        several), or all. Problems are the categories in ``schema.PROBLEM_CATEGORIES``; other features write
        other categories (``resumed`` marks where a trial was continued)."""
        if not (category is None or isinstance(category, str)
                or (isinstance(category, (tuple, list)) and all(isinstance(c, str) for c in category))):
            raise UnknownSeriesError(f"category must be a log category (str), several (a tuple of str) or None "
                                     f"for all, got {category!r:.40}; categories include {schema.LOG_CATEGORIES}")
        wanted = (category,) if isinstance(category, str) else category
        rows = self._rows(schema.LOG_STEP, schema.LOG_TIME, schema.LOG_CATEGORY, schema.LOG_SUBJECT,
                          schema.LOG_MESSAGE, schema.LOG_DETAIL)
        return [LogEntry(int(s), float(t), str(c), str(subject), str(m), str(d)) for s, t, c, subject, m, d in rows
                if wanted is None or c in wanted]

    def problems(self) -> list[LogEntry]:
        """What the recorder could not record as asked (skipped tensors, dropped rows, disk errors, trigger
        failures, overflows), each with its step and reason; empty for a clean run."""
        return self.log(schema.PROBLEM_CATEGORIES)

    def _rows(self, *names: str) -> list[tuple]:
        """Parallel tables of every file, row by row; a file whose tables fail is left out (and reported)."""
        out: list[tuple] = []
        for view in self._views.values():
            try:
                columns = [view.array(name) for name in names]
            except DamagedData as error:
                self._damaged(error, f"its {names[0].split('/')[0]} table was unreadable and is left out")
                continue
            out.extend(zip(*columns))
        return out
