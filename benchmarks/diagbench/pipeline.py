"""diagbench data pipelines: seeded mini-batches, normalised the way data loaders do, with their bugs.

A ``Pipeline`` holds raw data (sensor units, 0–255 grey levels, token ids) and hands out one normalised
batch per call of ``next()``. Data faults are the bugs of such code, switched on by ``corrupt(name)``:

- ``nan_element`` (one batch): a missing value parsed as NaN in one sample.
- ``zero_std``: a sensor gets stuck (constant) and the normaliser, refitted on the new shard, divides by
  its zero std (from now on); for sequences, one flat-lined sequence is z-normalised (one batch).
- ``outlier`` (one batch): a corrupted shard, values ×100 and random labels.
- ``unnormalised`` (from now on): a refactor drops the normalisation step (features in raw units, images
  not divided by 255).
- ``empty_labels`` (one batch): the collate function masks every position of a batch (prompts longer
  than the limit), so every label is the ignore index.
"""
from __future__ import annotations

import torch

from benchmarks.diagbench.data import IGNORE

KINDS = ("features", "images", "sequences", "tokens", "unit_features")
ONCE = {"nan_element", "outlier", "empty_labels"}
PERSISTENT = {"unnormalised"}


class Pipeline:
    """Seeded batches of ``inputs`` (a list of raw tensors sharing the first dimension) and ``target``.

    ``kind`` chooses the normalisation: ``features`` (per-feature standardisation with statistics fitted on
    the first 512 samples), ``images`` (``/255`` then ``(x - 0.5) / 0.25``), ``sequences`` (each sequence
    z-normalised over all its values), ``unit_features`` (``/255``), ``tokens`` (none).
    """

    def __init__(self, inputs: list[torch.Tensor], target: torch.Tensor, *, kind: str, batch_size: int,
                 seed: int, classes: int = 0) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown pipeline kind {kind!r}; choose one of {KINDS}")
        self.inputs, self.target, self.kind = inputs, target, kind
        self.batch_size, self.classes = batch_size, classes
        self.generator = torch.Generator().manual_seed(20_000 + seed)
        self.once: str | None = None
        self.persistent: set[str] = set()
        self.stuck: tuple[int, int] | None = None  # (input index, feature) of a stuck sensor
        self.refit = False
        self.stats = [self._fit(x[:512]) for x in inputs] if kind == "features" else []

    @staticmethod
    def _fit(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.mean(dim=0), x.std(dim=0)

    def corrupt(self, fault: str) -> None:
        """Switch a data fault on (see the module's table)."""
        if fault == "zero_std" and self.kind == "features":
            self.stuck, self.refit = (0, int(torch.randint(0, self.inputs[0].shape[1], (1,),
                                                           generator=self.generator))), True
        elif fault in ONCE or fault == "zero_std":
            self.once = fault
        elif fault in PERSISTENT:
            self.persistent.add(fault)
        else:
            raise ValueError(f"unknown data fault {fault!r}")

    def _normalise(self, i: int, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "tokens":
            return x
        if "unnormalised" in self.persistent:
            return (x - 0.5) / 0.25 if self.kind == "images" else x
        if self.kind == "images":
            return (x / 255 - 0.5) / 0.25
        if self.kind == "unit_features":
            return x / 255
        if self.kind == "sequences":
            flat = x.flatten(1)
            mean, std = flat.mean(dim=1), flat.std(dim=1)
            return (x - mean[:, None, None]) / std[:, None, None]
        if self.refit:
            self.stats[i] = self._fit(x)
        mean, std = self.stats[i]
        return (x - mean) / std

    def next(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The next batch: normalised inputs and the target, with the active faults applied."""
        index = torch.randint(0, len(self.target), (self.batch_size,), generator=self.generator)
        raw = [x[index].clone() for x in self.inputs]
        target = self.target[index].clone()
        once, self.once = self.once, None
        if self.stuck is not None:
            which, feature = self.stuck
            raw[which][:, feature] = self.inputs[which][0, feature]
        if once == "nan_element":
            raw[0].view(len(index), -1)[0, 0] = float("nan")
        elif once == "zero_std":
            raw[0][0] = raw[0][0].mean()
        elif once == "empty_labels":
            target[:] = IGNORE
        batch = [self._normalise(i, x) for i, x in enumerate(raw)]
        self.refit = False
        if once == "outlier":
            batch = [x * 100.0 for x in batch]
            if self.classes:
                target = torch.randint(0, self.classes, target.shape, generator=self.generator)
            else:
                target = target * 100.0
        return batch, target
