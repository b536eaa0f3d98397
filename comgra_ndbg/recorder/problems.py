"""The recorder's problems log: what could not be recorded as asked, in the recording and in warnings.

Every problem (a tensor that cannot be summarised, rows a full disk made the writer drop, a failed write,
a trigger that raised, a statistic that overflowed) becomes a row of the recording's ``log`` table with its
step, category, subject and reason (``Recording.problems()``, ``comgra-ndbg info`` and ``check``, the GUI).
Warnings are per subject: the first occurrence of each (category, subject) warns at once, later ones are
counted, and ``close()`` warns once more with the counts of everything that recurred, so one bad tensor
never hides another and nothing is lost without a word.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from comgra_ndbg.errors import RecorderWarning

__all__ = ["ProblemLog"]


@dataclass
class _Tally:
    count: int
    first_step: int
    last_step: int


class ProblemLog:
    """Problems of one recorder: ``record`` writes the row and warns; ``warn`` only warns (for problems the
    writer has already put into the table itself)."""

    def __init__(self, add_log) -> None:
        self._add_log = add_log  # RecordingWriter.add_log
        self._tallies: dict[tuple[str, str], _Tally] = {}

    @property
    def count(self) -> int:
        """Problems seen so far."""
        return sum(t.count for t in self._tallies.values())

    def record(self, step: int, category: str, subject: str, message: str, detail: dict | None = None) -> None:
        """A problem at ``step``: a row of the log table, and a warning the first time for its subject."""
        self._add_log(step, category, subject, message, detail)
        self.warn(step, category, subject, message, detail)

    def warn(self, step: int, category: str, subject: str, message: str, detail: dict | None = None) -> None:
        """Warn about the first occurrence of (``category``, ``subject``); count the later ones."""
        key = (category, subject)
        tally = self._tallies.get(key)
        if tally is not None:
            tally.count += 1
            tally.last_step = max(tally.last_step, step)
            return
        self._tallies[key] = _Tally(1, step, step)
        warnings.warn(f"comgra_ndbg: {message}. Training is unaffected; this is logged in the recording "
                      f"(Recording.problems(), `comgra-ndbg info`), later occurrences for {subject!r} are "
                      f"counted there", RecorderWarning, stacklevel=4)

    def recurring(self) -> str | None:
        """One sentence with the counts of every problem that occurred more than once, or None."""
        parts = [f"{subject!r} ({category}) {t.count} times, steps {t.first_step}–{t.last_step}"
                 for (category, subject), t in self._tallies.items() if t.count > 1]
        if not parts:
            return None
        shown = "; ".join(parts[:10]) + (f"; and {len(parts) - 10} more" if len(parts) > 10 else "")
        return f"problems recurred during this run: {shown}; every occurrence is in Recording.problems()"

    def warn_recurring(self) -> None:
        """At ``close()``: one warning with the counts (nothing when no problem recurred)."""
        text = self.recurring()
        if text is not None:
            warnings.warn(f"comgra_ndbg: {text}", RecorderWarning, stacklevel=4)
