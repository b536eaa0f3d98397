"""The byte budget: how many bytes snapshots may write, per step and per run.

Summaries are small (one row of sufficient statistics per series and step, gzip-compressed on disk) and
the analysis needs every step of them, so they are never dropped. Snapshots are what grows: on a 12-block
Transformer of width 64 one step's snapshots of every tensor are about 6 MB, so a snapshot every 10th step
of a 100 000-step run would be 60 GB. The budget bounds them in three ways:

- **per snapshot step**: a step's snapshots larger than ``step_bytes`` are sub-sampled (fewer samples,
  evenly spaced fewer element values per tensor, in the spirit of Comgra's
  ``max_num_batch_size_to_record``) until they fit; the fraction that fitted is kept
  (:attr:`SnapshotBudget.scale`) and the next step's snapshots are *taken* at it, so a model whose
  snapshots never fit does not gather what is thrown away at every snapshot step;
- **per run**: policy snapshots may spend ``run_bytes × (1 − reserve)``; the frequency backs off
  geometrically: level ``k`` (every ``2**k``-th snapshot the policy asks for is taken) may spend
  ``(1 − decay) × decay**k`` of that share, so the snapshots thin out as the run goes on but never stop
  while a share is left, and their sum stays under the share however long the run;
- **flight recorder first**: the last ``reserve`` of ``run_bytes`` is kept for the steps the flight
  recorder writes when a trigger fires (its ring before the trigger, the trigger step, the forced steps
  after it): the snapshots just before a failure are the ones a diagnosis needs most.

What the budget dropped or shrank is written to the recording's log (category ``budget``, shown by
``comgra-ndbg info``). :class:`SnapshotBudget` is the stateful part the recorder holds; :func:`shrink` is a
pure function of one snapshot.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.recorder.snapshot import evenly_spaced
from comgra_ndbg.recorder.step_record import StepRecord
from comgra_ndbg.store.segment import SnapshotData

__all__ = ["ByteBudget", "SnapshotBudget", "as_byte_budget", "shrink", "snapshot_bytes", "DEFAULT_BYTE_BUDGET"]

SNAPSHOT_OVERHEAD = 64
"""Bytes of the per-snapshot table rows (step, series, shape, offsets) beside its arrays."""


@dataclass(frozen=True)
class ByteBudget:
    """Bounds on the bytes snapshots write: ``run_bytes`` in the whole run, ``step_bytes`` in one step.

    ``reserve`` is the fraction of ``run_bytes`` kept for flight-recorder dumps; ``decay`` sets how fast the
    snapshot frequency backs off (the share of each level over the next).

    >>> ByteBudget(run_bytes=100 * 2**20, step_bytes=2**20).policy_bytes / 2**20
    75.0
    """

    run_bytes: int = 256 * 2**20
    step_bytes: int = 2**20
    reserve: float = 0.25
    decay: float = 0.8

    def __post_init__(self) -> None:
        for name in ("run_bytes", "step_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1024:
                raise InvalidArgumentError(f"ByteBudget.{name} must be an int of at least 1024 bytes, got {value!r}; "
                                           f"pass byte_budget=None for no bound")
        if self.step_bytes > self.run_bytes:
            raise InvalidArgumentError(f"ByteBudget.step_bytes ({self.step_bytes}) exceeds run_bytes "
                                       f"({self.run_bytes}); a step's snapshots cannot be larger than the run's")
        for name, value in (("reserve", self.reserve), ("decay", self.decay)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise InvalidArgumentError(f"ByteBudget.{name} must be a number in [0, 1), got {value!r}")

    @property
    def policy_bytes(self) -> float:
        """What snapshots the policy asks for may spend in the run (the rest is the flight recorder's)."""
        return self.run_bytes * (1.0 - self.reserve)

    def describe(self) -> str:
        """One line for the start of a recording."""
        return (f"byte budget: snapshots at most {_human(self.run_bytes)} per run ({self.reserve:.0%} of it kept "
                f"for flight-recorder dumps) and {_human(self.step_bytes)} per step; summaries are always kept")


DEFAULT_BYTE_BUDGET = ByteBudget()
"""The default: 256 MiB of snapshots per run, 1 MiB per snapshot step (``docs/recording.md``, "Byte budget")."""


def as_byte_budget(value: object) -> ByteBudget | None:
    """``byte_budget`` as given to the recorder: a ``ByteBudget``, an int (run bytes; a step gets at most
    1 MiB or the whole), or None for no bound.

    >>> as_byte_budget(10 * 2**20).step_bytes == 2**20, as_byte_budget(None)
    (True, None)
    """
    if value is None or isinstance(value, ByteBudget):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return ByteBudget(run_bytes=int(value), step_bytes=min(int(value), DEFAULT_BYTE_BUDGET.step_bytes))
    raise InvalidArgumentError(f"byte_budget must be a ByteBudget, an int (bytes of snapshots per run) or None "
                               f"(no bound), got {type(value).__name__}")


def snapshot_bytes(data: SnapshotData) -> int:
    """Bytes one snapshot adds to the file at most. The recorder's own value indices are cached read-only
    arrays the store keeps once per pattern and are not counted; any other index is."""
    index = data.value_index
    shared = index is None or not index.flags.writeable
    return (int(data.values.nbytes + data.sample_stats.nbytes + data.sample_index.nbytes)
            + (0 if shared else int(index.nbytes)) + SNAPSHOT_OVERHEAD)


def shrink(data: SnapshotData, fraction: float) -> SnapshotData:
    """``data`` with about ``fraction`` of its samples' share and element values: a batched snapshot keeps
    its first ``ceil(n × √fraction)`` samples and, of their values, evenly spaced ones down to ``fraction`` of
    the original count; a batch-less one keeps evenly spaced values. Indices stay valid for the reader.

    >>> import numpy as np
    >>> s = SnapshotData((4, 3), np.arange(4), np.zeros((4, 17)), np.arange(12, dtype=np.float32), None)
    >>> t = shrink(s, 0.25)
    >>> t.sample_index.tolist(), t.values.tolist(), t.value_index.tolist()
    ([0, 1], [0.0, 2.0, 5.0], [0, 2, 5])
    """
    if fraction >= 1.0:
        return data
    total = len(data.values)
    index = np.arange(total, dtype=np.int64) if data.value_index is None else np.asarray(data.value_index)
    values, samples = data.values, len(data.sample_index)
    sample_index, sample_stats, category = data.sample_index, data.sample_stats, data.sample_category
    if samples > 1 and len(data.shape) >= 1:
        keep_samples = max(1, math.ceil(samples * math.sqrt(fraction)))
        units = math.prod(data.shape[1:])
        inside = index < keep_samples * units
        index, values = index[inside], values[inside]
        sample_index, sample_stats = sample_index[:keep_samples], sample_stats[:keep_samples]
        category = None if category is None else category[:keep_samples]
    count = max(1, int(total * fraction)) if total else 0
    if len(values) > count:
        chosen = evenly_spaced(len(values), count)
        index, values = index[chosen], values[chosen]
    return SnapshotData(data.shape, sample_index, sample_stats, np.ascontiguousarray(values),
                        np.ascontiguousarray(index), category)


class SnapshotBudget:
    """The run's account of snapshot bytes: :meth:`admit` thins out the policy's snapshots, :meth:`fit`
    shrinks or drops a step's snapshots before they are written, :attr:`dropped` and :attr:`shrunk` count
    what it changed."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.policy_spent = 0
        self.spent = 0
        self.level = 0
        self._asked = 0  # policy snapshots asked for since the level began
        self.skipped = 0  # policy snapshots not taken (back-off)
        self.dropped = 0  # snapshot steps not written (the share was spent)
        self.shrunk = 0  # snapshot steps sub-sampled to fit step_bytes
        self.last_fraction = 1.0
        self.scale = 1.0  # the fraction of samples² and values the next snapshots are taken at (see take_limits)

    def take_limits(self, num_samples: int, max_elements: int) -> tuple[int, int]:
        """The ``num_samples`` and ``max_elements`` to take the next snapshots with: scaled down to the
        fraction that fitted ``step_bytes`` at the last snapshot step, as ``shrink`` would scale them.

        >>> budget = SnapshotBudget(ByteBudget()); budget.scale = 0.25
        >>> budget.take_limits(8, 4096)
        (4, 1024)
        """
        if self.scale >= 1.0:
            return num_samples, max_elements
        return max(1, math.ceil(num_samples * math.sqrt(self.scale))), max(1, int(max_elements * self.scale))

    @property
    def interval(self) -> int:
        """Every how many-th snapshot the policy asks for is taken now."""
        return 2 ** self.level

    def _level_of(self, spent: float) -> int:
        """The smallest level whose cumulative share ``policy × (1 − decay**(k+1))`` exceeds ``spent``."""
        share, decay = self.budget.policy_bytes, self.budget.decay
        left = 1.0 - spent / share
        if left <= 0.0:
            return 64
        if decay == 0.0:
            return 0
        return max(0, math.floor(math.log(left) / math.log(decay)))

    def admit(self) -> bool:
        """Whether a snapshot the policy asks for is taken (back-off: every ``interval``-th one)."""
        if self.policy_spent >= self.budget.policy_bytes:
            self.skipped += 1
            return False
        taken = self._asked % self.interval == 0
        self._asked += 1
        if not taken:
            self.skipped += 1
        return taken

    def fit(self, record: StepRecord, *, preferred: bool) -> tuple[StepRecord, str | None]:
        """``record`` with its snapshots shrunk to the step bound, or without them when the run's share is
        spent; ``preferred`` (flight-recorder and forced steps) may spend the reserve. Also returns a
        sentence for the log when the snapshot frequency backed off or the snapshots were dropped."""
        if not record.snapshots:
            return record, None
        sizes = [snapshot_bytes(data) for _, _, data in record.snapshots]
        total = sum(sizes)
        allowed = self.budget.run_bytes - self.spent if preferred else self.budget.policy_bytes - self.policy_spent
        limit = min(self.budget.step_bytes, allowed) if preferred else self.budget.step_bytes
        scale = self.scale
        fraction = 1.0
        if total > limit and limit >= max(1024, SNAPSHOT_OVERHEAD * len(sizes) * 2):
            record, total, fraction = self._shrink(record, total, limit)
        if limit == self.budget.step_bytes:  # learn the scale from steps bound by step_bytes alone
            if fraction < 1.0:
                self.scale = max(scale * fraction, 2.0 ** -30)
            elif scale < 1.0 and total <= limit / 2:  # room for twice as much: the snapshots got smaller
                self.scale = min(1.0, scale * 2.0)
        if scale * fraction < 1.0:
            self.shrunk += 1
            self.last_fraction = scale * fraction
        if total > min(limit, allowed):
            self.dropped += 1
            which = "the run's snapshot budget" if preferred else "the share of policy snapshots"
            return dataclasses.replace(record, snapshots=[]), (
                f"snapshots of step {record.step} dropped: {which} is spent ({_human(self.spent)} written)")
        self.spent += total
        if not preferred:
            self.policy_spent += total
        level = self._level_of(self.policy_spent)
        if level > self.level and level < 64:
            self.level, self._asked = level, 1  # this snapshot is the first of the new level
            return record, (f"snapshot frequency backed off to one in {self.interval} of the snapshots the policy "
                            f"asks for, after step {record.step}: {_human(self.policy_spent)} of "
                            f"{_human(self.budget.policy_bytes)} spent")
        return record, None

    def _shrink(self, record: StepRecord, total: int, limit: int) -> tuple[StepRecord, int, float]:
        """``record`` with its snapshots shrunk by the largest power-of-two fraction that fits ``limit``
        (powers of two make the same index patterns recur, which the store keeps once), their size and
        that fraction."""
        fraction = 2.0 ** -math.ceil(math.log2(total / limit))
        while True:
            snaps = [(sid, it, shrink(data, fraction)) for sid, it, data in record.snapshots]
            size = sum(snapshot_bytes(data) for _, _, data in snaps)
            if size <= limit or fraction < 1e-9:
                break
            fraction /= 2
        return dataclasses.replace(record, snapshots=snaps), size, fraction

    def report(self) -> str:
        """One sentence of what the budget did, for the log at the end of the run."""
        return (f"{_human(self.spent)} of snapshots written of a {_human(self.budget.run_bytes)} budget; "
                f"{self.skipped} policy snapshots skipped by back-off (interval now {self.interval}), "
                f"{self.dropped} snapshot steps dropped, {self.shrunk} shrunk to fit {_human(self.budget.step_bytes)}"
                + (f" (last to {self.last_fraction:.1%} of their values)" if self.shrunk else ""))

    def detail(self) -> dict:
        """The counts of :meth:`report` as numbers (the log row's detail)."""
        return dict(spent=self.spent, policy_spent=self.policy_spent, run_bytes=self.budget.run_bytes,
                    step_bytes=self.budget.step_bytes, skipped=self.skipped, dropped=self.dropped,
                    shrunk=self.shrunk, interval=self.interval)


def _human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
