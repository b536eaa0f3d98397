"""What damage to a recording looks like to its readers: one record per finding, and one sentence for it.

A damaged file, chunk or text table, a foreign file or a missing segment becomes a :class:`Damage`: which
file, what of it (the whole file, the summaries of one tensor, snapshot values, ...), which steps and
tensors lost data, and why. ``Recording`` raises them as one :class:`~comgra_ndbg.errors.CorruptRecordingError`
(or, opened with ``damaged="skip"``, reads around them and lists them in ``Recording.damage``);
``comgra-ndbg check`` prints them and ``--salvage`` copies everything else into a clean recording.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from comgra_ndbg.errors import CorruptRecordingError

__all__ = ["Damage", "DamagedData", "corrupt_error", "step_text", "READ_ERRORS"]

READ_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError)
"""What h5py raises for damaged files, chunks and headers (a Fletcher-32 mismatch, a truncated file, a
garbled attribute or layout message)."""


class DamagedData(Exception):
    """Raised inside the store when a dataset fails its checksum; turned into :class:`Damage` records."""

    def __init__(self, file: str | Path, dataset: str, reason: str, rows: object = None) -> None:
        super().__init__(f"{file}: {dataset}: {reason}")
        self.file, self.dataset, self.reason = Path(file), dataset, reason
        self.rows = rows  # the rows of ``dataset`` that failed, when a chunked read could tell


@dataclass(frozen=True)
class Damage:
    """One finding: ``kind`` is ``unreadable`` (the file cannot be opened or its index read), ``checksum``
    (data failing its checksum), ``foreign`` (a file of another recording), ``missing`` (a segment that
    should exist does not) or ``inconsistent`` (tables that contradict each other).

    ``steps`` are the recorded steps known to have lost data; when the file is lost as a whole they are
    unknown and ``between`` gives the last step before and the first step after the gap (-1: none).
    """

    kind: str
    file: Path | None
    what: str
    reason: str = ""
    steps: tuple[int, ...] = ()
    tensors: tuple[str, ...] = ()
    between: tuple[int, int] | None = None
    sequences: tuple[int, ...] = ()

    def describe(self) -> str:
        """One sentence: where, what, which steps and tensors, why."""
        where = self.file.name if self.file is not None else "segment files"
        parts = [f"{where}: {self.what}"]
        if self.steps:
            parts.append(f"at {step_text(self.steps)}")
        elif self.between is not None:
            parts.append(_between_text(self.between))
        if self.tensors:
            shown = ", ".join(repr(t) for t in self.tensors[:4]) + (" …" if len(self.tensors) > 4 else "")
            parts.append(f"of {shown}")
        if self.sequences:
            parts.append(f"(sequences {_range_text(self.sequences)})")
        return " ".join(parts) + (f" ({self.reason})" if self.reason else "")


def step_text(steps: tuple[int, ...] | list[int]) -> str:
    """``steps 3, 4, 5`` as ``steps 3–5``; gaps listed: ``steps 1–3, 7``.

    >>> step_text([1, 2, 3, 7]), step_text([4])
    ('steps 1–3, 7', 'step 4')
    """
    steps = sorted(set(int(s) for s in steps))
    if len(steps) == 1:
        return f"step {steps[0]}"
    return f"steps {_range_text(steps)}"


def _range_text(values: tuple[int, ...] | list[int]) -> str:
    values = sorted(set(values))
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    shown = [f"{a}–{b}" if b > a else f"{a}" for a, b in runs[:8]]
    return ", ".join(shown) + (" …" if len(runs) > 8 else "")


def _between_text(between: tuple[int, int]) -> str:
    before, after = between
    if before < 0 and after < 0:
        return "(which steps is unknown: no other file holds any)"
    if before < 0:
        return f"steps before step {after}"
    if after < 0:
        return f"steps after step {before}"
    return f"steps between {before} and {after}"


def corrupt_error(location: Path, damage: list[Damage] | tuple[Damage, ...], *, trial_path: Path | None = None
                  ) -> CorruptRecordingError:
    """The one error a reader raises for ``damage``: each finding, then what to run."""
    target = trial_path if trial_path is not None else location
    lines = "; ".join(d.describe() for d in damage[:5]) + (f"; and {len(damage) - 5} more" if len(damage) > 5 else "")
    return CorruptRecordingError(
        f"the recording at {location} is damaged: {lines}. Run `comgra-ndbg check {target}` for the full list and "
        f"`comgra-ndbg check {target} --salvage` to copy everything still readable into a new recording "
        f"(or open it with open_recording(..., damaged='skip') to read around the damage)", tuple(damage))
