"""Deciding a step's type at its end: ``decide_step`` and the snapshots that waited for its sample choice
(a mixin of ``Recorder``; see ``docs/recording.md``, "Retroactive decisions")."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from comgra_ndbg.errors import InvalidArgumentError, RecorderStateError
from comgra_ndbg.recorder.policy import Decision
from comgra_ndbg.recorder.snapshot import balanced_samples, take_snapshot
from comgra_ndbg.recorder.validation import check_name, check_text

__all__ = ["RetroactiveDecision"]


class RetroactiveDecision:
    """``decide_step`` of ``Recorder`` and the snapshots taken for it; not used on its own."""

    def decide_step(self, step_type: str, *, sample_categories: Sequence | torch.Tensor | np.ndarray | None = None
                    ) -> bool:
        """Settle the type of a step started with ``step_type=None``; returns whether it is recorded.

        ``sample_categories`` (one label per sample of the batch, e.g. the class or the sequence length)
        makes the snapshot keep a category-balanced choice of samples instead of the first ones.
        """
        if not self.enabled:
            return False
        self._check_step_open("decide_step()")
        if self._step_type is not None:
            raise RecorderStateError(f"step {self._step} already has the type {self._step_type!r}; decide_step() is "
                                     f"for steps started with start_step({self._step}, step_type=None)")
        check_name(step_type, "step types")
        categories = None
        if sample_categories is not None and (self._summarize or self._snapshot):  # else nothing can be kept
            categories = np.asarray(sample_categories.detach().cpu() if isinstance(sample_categories, torch.Tensor)
                                    else sample_categories).reshape(-1)
            if self._batch_size is not None and len(categories) != self._batch_size:
                raise InvalidArgumentError(f"sample_categories has {len(categories)} entries but the batch of step "
                                           f"{self._step} has {self._batch_size} samples; give one category per sample")
            for label in dict.fromkeys(str(c) for c in categories.tolist()):
                check_text("a sample category", label)
        self._step_type = self._last_step_type = step_type
        if self._replayed:
            return False
        summary = self.summary_policy.decide(self._step, step_type)
        snapshot = self.snapshot_policy.decide(self._step, step_type)
        self._summary_decision = Decision(summary.record, f"retroactive decision: {summary.reason}", summary.rule)
        self._snapshot_decision = Decision(snapshot.record, f"retroactive decision: {snapshot.reason}", snapshot.rule)
        keep_snapshots = snapshot.record or self._forced or self.flight_recorder is not None
        if categories is not None and keep_snapshots:
            self._sample_categories = categories
            self._sample_positions = balanced_samples(categories.tolist(), self.num_samples)
        if keep_snapshots:
            self._guard("taking deferred snapshots", self._take_deferred)
        self._deferring = False
        self._deferred_values, self._deferred_grads = [], []
        self._snapshot = keep_snapshots
        if not (summary.record or self._forced or self.flight_recorder is not None):
            self._summarize = False
        return summary.record or snapshot.record or self._forced

    def _take(self, tensor: torch.Tensor, batched: bool, bounds: tuple[float, float] | None = None) -> Any:
        num_samples, max_elements = self._snapshot_limits()
        positions = self._sample_positions
        data = take_snapshot(tensor, batched=batched, num_samples=num_samples, max_elements=max_elements,
                             bounds=bounds, saturation_margin=self._saturation_margin,
                             sample_positions=positions[:num_samples] if batched and positions is not None else None,
                             on_device=True)
        if batched and self._sample_categories is not None and len(data.sample_index):
            labels = np.array([str(c) for c in self._sample_categories[data.sample_index]], dtype=object)
            data = type(data)(data.shape, data.sample_index, data.sample_stats, data.values, data.value_index, labels)
        return data

    def _snapshot_limits(self) -> tuple[int, int]:
        """``num_samples`` and ``max_elements`` scaled to what the byte budget kept at the last snapshot step
        (``SnapshotBudget.take_limits``): what would be sub-sampled away is not gathered."""
        budget = getattr(self, "_budget", None)
        if budget is None:
            return self.num_samples, self.max_elements
        return budget.take_limits(self.num_samples, self.max_elements)

    def _take_deferred(self) -> None:
        for item in self._deferred_values:
            self._snaps.append((item.key, item.iteration, self._take(item.tensor, True, item.bounds)))
        for item in self._deferred_grads:
            if item.kind is None:  # not collected yet: the next _collect_gradients maps tensor to series
                self._grad_snaps[(item.key, item.iteration)] = self._take(item.tensor, True)
            else:
                self._snaps.append((self.catalog.series_id(item.key, item.kind), item.iteration,
                                    self._take(item.tensor, True)))
