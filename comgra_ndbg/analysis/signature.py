"""The failure signature: what every layer's gradient and activation norms did in the steps before a failure.

One picture a person can paste into a bug report: rows are the run's layers (its nodes in forward order,
inputs first, the loss last; targets left out), columns the ``steps`` recorded steps up to and including
the *failure step* — the first event of the top hypothesis's causal chain. When fewer steps precede it (a
fault present from the first step), the window runs on after it so that it still shows ``steps`` columns.
Each cell holds the node's l2 norm of its gradient or of its value at that step (NaN where that kind was
not recorded); ``nonfinite`` marks cells whose tensor held NaN or Inf. The onset step, the origin layer and
the top hypothesis's sentence come from the diagnosis, so the picture says what the analysis concluded.

Pure: a :class:`~comgra_ndbg.analysis.series.RunSeries` and a
:class:`~comgra_ndbg.analysis.events.Diagnosis` in, a frozen :class:`Signature` out;
:mod:`comgra_ndbg.signature` draws it.

>>> import numpy as np
>>> from comgra_ndbg.analysis.events import CausalChain, Diagnosis, Event, Hypothesis
>>> from comgra_ndbg.analysis.series import build_series
>>> from comgra_ndbg.analysis.synthetic import summary_rows
>>> rms = np.ones(8); rms[5:] = 1e-4
>>> s = build_series({("h", "value"): summary_rows(rms=np.ones(8)), ("h", "grad"): summary_rows(rms=rms)},
...                  roles={"h": "intermediate"}, kpis={})
>>> root = Event("gradient_health", "h", "grad", "healthy", "vanishing", 5, 7, 4.0, 1.0)
>>> top = Hypothesis("vanishing", "node", "h", 5, 0.9, "Vanishing signal in 'h'.", CausalChain(root))
>>> sig = failure_signature(s, Diagnosis("t", 8, 7, (root,), (), (top,)), steps=4)
>>> sig.steps, sig.layers, sig.origin_row, sig.onset_column
((2, 3, 4, 5), ('h',), 0, 3)
>>> [float(v) for v in sig.gradient[0]]
[8.0, 8.0, 8.0, 0.0008]
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from comgra_ndbg.analysis.events import Diagnosis
from comgra_ndbg.analysis.series import NodeSeries, RunSeries
from comgra_ndbg.errors import InvalidArgumentError, NoFailureError

__all__ = ["Signature", "failure_signature", "DEFAULT_STEPS", "KINDS"]

DEFAULT_STEPS = 50
KINDS = ("grad", "value")  # the gradient heatmap, then the activation heatmap
_LEFT_OUT = ("target",)


@dataclass(frozen=True)
class Signature:
    """A failure signature: ``gradient`` and ``activation`` are ``[layers, steps]`` l2 norms (NaN: not
    recorded), ``nonfinite`` a ``[2, layers, steps]`` mask (gradient, activation) of tensors that held NaN or
    Inf. ``onset`` is the top hypothesis's onset step, ``failure_step`` the first event of its chain;
    ``origin`` its node (``""`` for the optimizer) and ``origin_row`` that node's row (None when it has
    none); ``title`` the hypothesis's sentence."""

    trial: str
    layers: tuple[str, ...]
    roles: tuple[str, ...]
    steps: tuple[int, ...]
    gradient: np.ndarray = field(compare=False, repr=False)
    activation: np.ndarray = field(compare=False, repr=False)
    nonfinite: np.ndarray = field(compare=False, repr=False)
    onset: int
    failure_step: int
    origin: str
    origin_row: int | None
    title: str
    type: str
    origin_kind: str

    @property
    def onset_column(self) -> int | None:
        """The column of the onset step (None when the onset lies outside the window)."""
        return self.steps.index(self.onset) if self.onset in self.steps else None

    @property
    def failure_column(self) -> int | None:
        """The column of the failure step (None when it lies outside the window)."""
        return self.steps.index(self.failure_step) if self.failure_step in self.steps else None


def _window(all_steps: np.ndarray, failure_step: int, steps: int) -> slice:
    """Indices of ``steps`` recorded steps ending at ``failure_step`` (running on past it when fewer precede)."""
    end = int(np.searchsorted(all_steps, failure_step, side="right"))
    start = max(0, end - steps)
    return slice(start, min(len(all_steps), max(end, start + steps)))


def _norms(node: NodeSeries, kind: str, window: slice, width: int) -> tuple[np.ndarray, np.ndarray]:
    if not node.has(kind):
        return np.full(width, np.nan), np.zeros(width, bool)
    stats = node.stats[kind]
    present = stats["count"][window] > 0
    norms = np.where(present, stats["l2"][window], np.nan)
    return norms, np.nan_to_num(stats["nonfinite"][window], nan=0.0) > 0


def failure_signature(series: RunSeries, diagnosis: Diagnosis, *, steps: int = DEFAULT_STEPS) -> Signature:
    """The :class:`Signature` of the top hypothesis of ``diagnosis`` over ``steps`` recorded steps of
    ``series``. A healthy diagnosis raises :class:`~comgra_ndbg.errors.NoFailureError`."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidArgumentError(f"steps must be a positive number of recorded steps, got {steps!r}")
    top = diagnosis.top
    if top is None:
        raise NoFailureError(
            f"trial {diagnosis.trial!r} has no failure: the analysis of its {diagnosis.num_steps} recorded steps "
            f"found no failure hypothesis, so there is no failure signature to draw. Browse it with "
            f"`comgra-ndbg gui PATH`, or re-run `comgra-ndbg explain PATH` with lower thresholds "
            f"(--vanishing-threshold, --exploding-threshold, --activation-threshold) if you expected one.")
    failure_step = min(e.onset for e in top.chain.events)
    window = _window(series.steps, failure_step, steps)
    shown = tuple(int(s) for s in series.steps[window])
    nodes = [n for n in series.nodes if n.role not in _LEFT_OUT and any(n.has(k) for k in KINDS)]
    matrices = {kind: np.full((len(nodes), len(shown)), np.nan) for kind in KINDS}
    bad = np.zeros((len(KINDS), len(nodes), len(shown)), bool)
    for row, node in enumerate(nodes):
        for k, kind in enumerate(KINDS):
            matrices[kind][row], bad[k, row] = _norms(node, kind, window, len(shown))
    layers = tuple(n.name for n in nodes)
    origin_row = layers.index(top.node) if top.node in layers else None
    return Signature(diagnosis.trial, layers, tuple(n.role for n in nodes), shown, matrices["grad"],
                     matrices["value"], bad, int(top.onset), int(failure_step), top.node, origin_row, top.sentence,
                     top.type, top.origin)
