"""Queries over the whole network: a statistic of every node at every step, per-layer series, and the
distribution of a tensor's values over its snapshots.

They read one series per node (or per parameter tensor) the first time and keep only the derived
statistic — a float32 matrix of nodes × steps — so colouring the graph by a statistic, or stepping with
the gradient-flow plots open, is a column lookup afterwards. On a 500-node, 10,000-step recording the first
read takes a few seconds; the explorer shows a spinner meanwhile.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from comgra_ndbg.gui.queries import all_steps, element_values, node_rows, primary_tensor
from comgra_ndbg.gui.state import ReaderCache, Selection
from comgra_ndbg.stats.statistics import derive_one
from comgra_ndbg.store import schema
from comgra_ndbg.store.reader import Recording

__all__ = ["COLOURS", "Distribution", "NodeMatrix", "colour_label", "distribution", "layer_matrix", "node_matrix"]

# The node colours one can choose: "role", or "<kind>:<statistic>" at the selected step ("update:ratio" is
# the update of a parameter node against its value, ‖ΔW‖ / ‖W‖).
COLOURS: dict[str, str] = {
    "role": "role",
    "grad:rms": "gradient RMS",
    "value:rms": "value RMS",
    "value:abs_max": "value |max|",
    "update:ratio": "update / weight",
    "value:dead_fraction": "dead units",
    "value:saturated_fraction": "saturated share",
    "value:nonfinite_fraction": "non-finite share (value)",
    "grad:nonfinite_fraction": "non-finite share (gradient)",
}
LOG_SCALED = ("rms", "abs_max", "l2", "ratio", "std", "abs_mean")  # statistics coloured by their decade


def colour_label(colour: str) -> str:
    """The name of a colour choice as the explorer shows it.

    >>> colour_label("grad:rms"), colour_label("value:std")
    ('gradient RMS', 'value std')
    """
    return COLOURS.get(colour) or colour.replace(":", " ")


@dataclass(frozen=True)
class NodeMatrix:
    """A statistic of every node (rows, in ``nodes`` order) at every recorded step (columns, ``steps``);
    NaN where a node has no such series or was not recorded at a step. ``log``: shown by decade."""

    nodes: tuple[str, ...]
    steps: np.ndarray
    values: np.ndarray
    log: bool
    low: float = field(default=float("nan"))
    high: float = field(default=float("nan"))

    def at(self, step: int | None) -> dict[str, float]:
        """Node -> value at ``step`` (the nearest recorded step before it when it was not recorded)."""
        if step is None or not len(self.steps):
            return {}
        column = int(np.clip(np.searchsorted(self.steps, step, side="right") - 1, 0, len(self.steps) - 1))
        return {n: float(v) for n, v in zip(self.nodes, self.values[:, column]) if np.isfinite(v)}


def _place(columns: np.ndarray, steps: np.ndarray, values: np.ndarray) -> np.ndarray:
    row = np.full(len(columns), np.nan, np.float32)
    if len(steps):
        row[np.searchsorted(columns, steps)] = values
    return row


def _node_values(recording: Recording, node: str, colour: str) -> tuple[np.ndarray, np.ndarray] | None:
    kind, stat = colour.split(":", 1)
    if stat == "ratio":
        update, value = node_rows(recording, node, schema.KIND_UPDATE), node_rows(recording, node, "value")
        if update is None or value is None:
            return None
        steps, a, b = np.intersect1d(update[0], value[0], assume_unique=True, return_indices=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            return steps, derive_one(update[1][a], "l2") / derive_one(value[1][b], "l2")
    found = node_rows(recording, node, kind)
    return None if found is None else (found[0], derive_one(found[1], stat))


def node_matrix(cache: ReaderCache, trial: str, nodes: tuple[str, ...], colour: str) -> NodeMatrix:
    """The statistic ``colour`` (``<kind>:<statistic>``) of each node in ``nodes`` at every step, with the
    range the colour scale spans (the 1st to 99th percentile over nodes and steps, in decades when
    ``log``)."""
    def compute(recording: Recording) -> NodeMatrix:
        columns = all_steps(cache, trial)
        matrix = np.full((len(nodes), len(columns)), np.nan, np.float32)
        for i, node in enumerate(nodes):
            found = _node_values(recording, node, colour)
            if found is not None:
                matrix[i] = _place(columns, *found)
        log = colour.split(":", 1)[1] in LOG_SCALED
        shown = np.log10(np.where(matrix > 0, matrix, np.nan)) if log else matrix
        finite = shown[np.isfinite(shown)]
        low, high = (np.percentile(finite, [1, 99]) if len(finite) else (np.nan, np.nan))
        return NodeMatrix(nodes, columns, matrix, log, float(low), float(high))
    return cache.memo(trial, ("node-matrix", nodes, colour), compute)


def layer_matrix(cache: ReaderCache, trial: str, nodes: tuple[str, ...], colour: str) -> NodeMatrix:
    """:func:`node_matrix` of the parameter nodes among ``nodes`` (the layers), in the order given."""
    recording = cache.recording(trial)
    roles = {t.node: t.role for t in recording.tensors}
    return node_matrix(cache, trial, tuple(n for n in nodes if roles.get(n) == "parameter"), colour)


@dataclass(frozen=True)
class Distribution:
    """Histograms of a tensor's stored values at each of its snapshot steps, over common bins: ``counts`` is
    ``[bins, steps]``; ``nonfinite`` counts NaN and ±Inf per step (not binned)."""

    steps: np.ndarray
    edges: np.ndarray
    counts: np.ndarray
    nonfinite: np.ndarray


def distribution(cache: ReaderCache, selection: Selection, *, bins: int = 40) -> Distribution | None:
    """The :class:`Distribution` of the selected tensor (of its kind, iteration and sample) over every step
    with a snapshot; None when it has fewer than two snapshots."""
    if selection.tensor is None or selection.kind is None:
        return None
    tensor, kind = selection.tensor, selection.kind

    def compute(recording: Recording) -> Distribution | None:
        steps = np.sort(cache.snapshot_steps(selection.trial, tensor, kind))
        found, kept = [], []
        for step in steps.tolist():
            snapshot = cache.snapshot(selection.trial, tensor, kind, int(step), selection.iteration)
            values = element_values(snapshot, selection.sample) if snapshot is not None else None
            if values is not None:
                found.append(np.asarray(values.values, np.float64))
                kept.append(step)
        if len(found) < 2:
            return None
        finite = np.concatenate([v[np.isfinite(v)] for v in found])
        low, high = (float(finite.min()), float(finite.max())) if len(finite) else (-0.5, 0.5)
        if low == high:
            low, high = low - 0.5, high + 0.5
        edges = np.linspace(low, high, bins + 1)
        counts = np.stack([np.histogram(v[np.isfinite(v)], bins=edges)[0] for v in found], axis=1)
        nonfinite = np.array([int((~np.isfinite(v)).sum()) for v in found])
        return Distribution(np.array(kept, np.int64), edges, counts, nonfinite)
    return cache.memo(selection.trial, ("distribution", tensor, kind, selection.iteration, selection.sample),
                      compute)


def primary_of(cache: ReaderCache, trial: str, node: str, kind: str | None = None) -> str | None:
    """:func:`~comgra_ndbg.gui.queries.primary_tensor` of a node, through the cache's open reader."""
    return primary_tensor(cache.recording(trial), node, kind)
