"""The values a ``Recording`` hands out: notes, trigger marks, log entries, stored graphs and snapshots."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from comgra_ndbg.graph import DependencyGraph
from comgra_ndbg.stats.statistics import STATISTICS, derive

__all__ = ["Note", "TriggerMark", "LogEntry", "StoredGraph", "Snapshot"]


@dataclass(frozen=True)
class Note:
    """A free-text note; ``step`` is -1 for notes written before the first step."""

    step: int
    time: float
    text: str


@dataclass(frozen=True)
class TriggerMark:
    """A flight-recorder trigger: the step it fired at and why."""

    step: int
    reason: str


@dataclass(frozen=True)
class LogEntry:
    """A row of the recording's log: the step it concerns (-1 before the first), its category (a problem
    category of ``schema.PROBLEM_CATEGORIES``, or another kind of finding), what it is about, one sentence,
    and details (a dict, empty when none)."""

    step: int
    time: float
    category: str
    subject: str
    message: str
    detail_json: str = ""

    @property
    def detail(self) -> dict:
        return json.loads(self.detail_json) if self.detail_json else {}


@dataclass(frozen=True)
class StoredGraph:
    """A dependency graph as recorded: its structure hash, the graph and the node positions of its layout."""

    structure_hash: str
    graph: DependencyGraph
    positions: dict[str, tuple[float, float]]
    step_types: tuple[str, ...]


@dataclass(frozen=True)
class Snapshot:
    """The stored arrays of one snapshot.

    ``values`` are element values (float32; float64 for a float64 tensor); ``value_index`` gives their flat
    positions in a tensor of ``shape`` (``None`` when every element is stored, in C order). For batched
    tensors ``sample_index`` are the batch positions whose per-sample statistics are in ``sample_stats``
    (name -> array over samples).
    """

    step: int
    iteration: int
    tensor: str
    kind: str
    shape: tuple[int, ...]
    values: np.ndarray
    value_index: np.ndarray | None
    sample_index: np.ndarray
    sample_rows: np.ndarray
    sample_categories: tuple[str, ...] = ()

    @property
    def sample_stats(self) -> dict[str, np.ndarray]:
        return derive(self.sample_rows) if len(self.sample_rows) else {k: np.zeros(0) for k in STATISTICS}

    def dense(self) -> np.ndarray:
        """Element values laid out in the tensor's shape (batched tensors: the recorded samples only);
        positions that were not kept are NaN."""
        if self.value_index is None:
            if self.sample_index.size:
                return self.values.reshape((len(self.sample_index),) + self.shape[1:])
            return self.values.reshape(self.shape)
        rows = len(self.sample_index) if self.sample_index.size else 1
        per_row = int(np.prod(self.shape[1:] if self.sample_index.size else self.shape))
        out = np.full(rows * per_row, np.nan, dtype=self.values.dtype)
        out[self.value_index] = self.values
        return out.reshape(((rows,) + self.shape[1:]) if self.sample_index.size else self.shape)
