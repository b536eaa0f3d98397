"""What a peer recorded, counted as tensors x statistics x steps, from what it wrote or handed to its writer.

A "tensor" is one recorded series: a tensor's value, or its gradient, or (for NeuralDbg) a parameter's
update. A "statistic" is one number kept of that series at one recorded step. ``statistics`` is the mean
number per series and step, so ``information = tensors x statistics x steps`` is the count of numbers
recorded:

- NeuralDbg: read back from the closed recording (``recording.h5`` and the parts it names): the summary
  series, the statistic fields of each (``NUM_FIELDS``) and the summarized steps; element snapshots are not
  counted (they are in the bytes);
- Comgra: every aggregate Comgra stores at a recorded step (per (node, role, gradient set): mean, absolute
  mean, std, absolute max, each over the batch as mean, std and absolute max, and, per sample, these and
  every neuron's value), counted as the recorder hands them to its serialization;
- TensorBoard: read back from the event file: per histogram, its count, min, max, sum, sum of squares and
  each bucket's limit and count;
- wandb: per histogram ``watch`` logs, its bin edges and counts, counted as they are handed to ``run._log``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comgra_ndbg.errors import RecordingFormatError
from comgra_ndbg.store import open_recording, schema


@dataclass(frozen=True)
class Recorded:
    """``tensors`` series recorded at ``steps`` steps, ``statistics`` numbers per series and step (mean)."""

    tensors: int
    statistics: float
    steps: int

    @property
    def information(self) -> int:
        """Numbers recorded: tensors x statistics x steps.

        >>> Recorded(tensors=4, statistics=17.0, steps=10).information
        680
        """
        return round(self.tensors * self.statistics * self.steps)


def from_counts(series: set, steps: set, numbers: int) -> Recorded:
    """The mean ``statistics`` that makes ``tensors x statistics x steps`` equal the ``numbers`` counted.

    >>> from_counts({"a", "b"}, {0, 10}, 12)
    Recorded(tensors=2, statistics=3.0, steps=2)
    """
    if not series or not steps:
        return Recorded(tensors=0, statistics=0.0, steps=0)
    return Recorded(tensors=len(series), statistics=numbers / (len(series) * len(steps)), steps=len(steps))


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def recording_summaries(trial: Path) -> Recorded:
    """The summaries in a closed NeuralDbg recording: its summary rows x statistic fields, as series x mean
    statistics per series and step x summarized steps.

    Read through the library's reader (``open_recording``), which opens every file of the trial: a recording
    larger than the writer's ``max_file_bytes`` closes into several files, named by the ``parts`` of its
    ``recording.h5``, and each holds only its own steps. A trial that was not closed and consolidated is
    refused: its count would change as the writer goes on.
    """
    with open_recording(trial) as recording:
        if not recording.is_complete:
            raise RecordingFormatError(f"{trial} is not a closed recording (state {recording.state!r}); count a "
                                       f"recording after NeuralDbg.close()")
        catalog = recording.catalog
        steps: set[int] = set()
        rows = 0
        for tensor, kind in catalog.series:
            summarized, _ = recording.summary_rows(catalog.tensors[tensor].name, kind)
            steps.update(summarized.tolist())
            rows += len(summarized)  # a series with rows at some steps only (tiered updates) counts those
        return from_counts(set(catalog.series), steps, rows * schema.NUM_FIELDS)


def tensorboard_histograms(folder: Path) -> Recorded:
    """The histograms in the event files under ``folder``, read back with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import HISTOGRAMS, EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={HISTOGRAMS: 0})
    events.Reload()
    series, steps, numbers = set(), set(), 0
    for tag in events.Tags()[HISTOGRAMS]:
        for event in events.Histograms(tag):
            series.add(tag)
            steps.add(event.step)
            numbers += 5 + len(event.histogram_value.bucket_limit) + len(event.histogram_value.bucket)
    return from_counts(series, steps, numbers)


class ComgraCounter:
    """Counts the aggregates a ``ComgraRecorder`` stores, at each recorded step, before it serializes them."""

    def __init__(self, recorder: Any) -> None:
        self.series: set = set()
        self.steps: set = set()
        self.numbers = 0
        save = recorder._save_tensor_recordings

        def counted() -> None:
            self.count(recorder.training_step, recorder.mapping_of_tensors_for_extracting_kpis)
            save()

        recorder._save_tensor_recordings = counted

    def count(self, step: int, mapping: Mapping[tuple, tuple]) -> None:
        """``mapping``: Comgra's key (step, gradient set, batching, iteration, node, role, item) to (values, _)."""
        for key, (values, _) in mapping.items():
            self.series.add((key[1], key[4], key[5]))
            self.numbers += values.numel()
        if mapping:
            self.steps.add(step)

    def recorded(self) -> Recorded:
        return from_counts(self.series, self.steps, self.numbers)


class WandbCounter:
    """Counts the histograms a wandb run is given to log (what ``wandb.watch`` records), by wrapping
    ``run._log``."""

    def __init__(self, run: Any) -> None:
        import wandb

        self.series: set = set()
        self.steps: set = set()
        self.numbers = 0
        log = run._log

        def counted(data: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
            histograms = {k: v for k, v in data.items() if isinstance(v, wandb.Histogram)}
            for name, histogram in histograms.items():
                self.series.add(name)
                self.numbers += len(histogram.histogram) + len(histogram.bins)
            if histograms:
                self.steps.add(run.step)
            return log(data, *args, **kwargs)

        run._log = counted

    def recorded(self) -> Recorded:
        return from_counts(self.series, self.steps, self.numbers)
