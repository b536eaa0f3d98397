"""Export a recording to TensorBoard: summaries and KPIs as scalars, snapshots as histograms, the diagnosis
as text — for teams whose dashboards are TensorBoard's.

One TensorBoard run per trial (``<out>/<trial>/``). Tags group by tensor, as TensorBoard groups by the part
before the first ``/``:

| what | tag | TensorBoard plugin |
|---|---|---|
| a summary statistic | ``<tensor>/<kind>/<statistic>`` (e.g. ``model.0.weight/grad/rms``) | scalars |
| a KPI | ``kpi/<step type>/<name>`` (e.g. ``kpi/train/loss``, ``kpi/validation/trainer/eval_loss``) | scalars |
| a snapshot's finite element values | ``<tensor>/<kind>`` | histograms |
| the diagnosis | ``comgra/diagnosis`` at the last step | text |

Non-finite element values are left out of the histograms (TensorBoard cannot bin them); the scalars count
them. Numbers equal ``Recording.summary(...)`` (as float32, TensorBoard's scalar type). Written with
``torch.utils.tensorboard.SummaryWriter``, which needs the ``tensorboard`` package.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from comgra_ndbg.errors import InvalidArgumentError, MissingDependencyError
from comgra_ndbg.export import current_diagnosis
from comgra_ndbg.stats.statistics import STATISTICS, derive
from comgra_ndbg.store.reader import Recording, list_trials, open_recording

__all__ = ["DEFAULT_STATISTICS", "export_tensorboard", "scalar_tag", "kpi_tag", "histogram_tag"]

DEFAULT_STATISTICS = ("mean", "std", "rms", "abs_max", "nonfinite_fraction", "zero_fraction", "dead_fraction",
                      "saturated_fraction")
"""The statistics exported unless ``statistics=`` names others: the ones the diagnosis reads most."""


def scalar_tag(tensor: str, kind: str, statistic: str) -> str:
    """The scalar tag of one summary statistic of one tensor and kind.

    >>> scalar_tag("model.0.weight", "grad", "rms")
    'model.0.weight/grad/rms'
    """
    return f"{tensor}/{kind}/{statistic}"


def kpi_tag(name: str, step_type: str) -> str:
    """The scalar tag of a KPI's values of one step type.

    >>> kpi_tag("loss", "train")
    'kpi/train/loss'
    """
    return f"kpi/{step_type}/{name}"


def histogram_tag(tensor: str, kind: str) -> str:
    """The histogram tag of a tensor's snapshots of one kind.

    >>> histogram_tag("hidden", "value")
    'hidden/value'
    """
    return f"{tensor}/{kind}"


def _summary_writer() -> type:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise MissingDependencyError("exporting to TensorBoard needs the tensorboard package; install it with "
                                     "`pip install 'comgra-ndbg[tensorboard]'` (or `pip install tensorboard`)") \
            from None
    return SummaryWriter


def export_tensorboard(path: str | Path, out: str | Path, *, trial: str | None = None,
                       statistics: Sequence[str] | None = None, histograms: bool = True) -> dict[str, Path]:
    """Write every trial at ``path`` (or only ``trial``) as a TensorBoard run ``<out>/<trial>``; returns
    trial -> run folder. ``statistics``: which summary statistics become scalars (default
    :data:`DEFAULT_STATISTICS`); ``histograms``: also the snapshots' element values. View with
    ``tensorboard --logdir <out>``."""
    chosen = list(DEFAULT_STATISTICS if statistics is None else statistics)
    unknown = [s for s in chosen if s not in STATISTICS]
    if unknown:
        raise InvalidArgumentError(f"unknown statistic(s) {unknown}; choose from {sorted(STATISTICS)}")
    writer_class = _summary_writer()
    trials = [trial] if trial is not None else list_trials(path)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InvalidArgumentError(f"cannot create the TensorBoard folder {out} ({error.strerror}); pass another "
                                   f"DIR") from None
    written = {}
    for name in trials:
        with open_recording(path, name) as recording:
            diagnosis, _ = current_diagnosis(recording)
            run = out / name
            writer = writer_class(log_dir=str(run))
            try:
                _write_trial(writer, recording, chosen, histograms)
                last = int(recording.steps[-1]) if len(recording.steps) else 0
                writer.add_text("comgra/diagnosis", _markdown(diagnosis.explain()), global_step=last)
            finally:
                writer.close()
        written[name] = run
    return written


def _write_trial(writer: Any, recording: Recording, statistics: list[str], histograms: bool) -> None:
    catalog = recording.catalog
    for tid, kind in catalog.series:
        info = catalog.tensors[tid]
        steps, rows = recording.summary_rows(info.name, kind)
        if len(steps):
            derived = derive(rows)
            for stat in statistics:
                tag = scalar_tag(info.name, kind, stat)
                for step, value in zip(steps.tolist(), derived[stat].tolist()):
                    writer.add_scalar(tag, value, global_step=step)
        if histograms:
            for step in recording.snapshot_steps(info.name, kind).tolist():
                values = np.asarray(recording.snapshot(step, info.name, kind).values, np.float64)
                finite = values[np.isfinite(values)]
                if finite.size:
                    writer.add_histogram(histogram_tag(info.name, kind), finite, global_step=step,
                                         bins=_bins(writer, finite))
    for name in recording.kpi_names:
        for step_type in recording.step_types:
            steps, values = recording.kpi(name, step_type)
            for step, value in zip(steps.tolist(), values.tolist()):
                writer.add_scalar(kpi_tag(name, step_type), value, global_step=step)


def _bins(writer: Any, values: np.ndarray) -> str | np.ndarray:
    """TensorBoard's own buckets (exponential, up to about 1e20 in magnitude) when they hold every value, else
    64 even bins over the values' range (widened a little, so one value or equal values get a bin too): a
    diverging run passes through finite values beyond 1e20, which those buckets would drop (all of them: the
    writer then raises)."""
    if np.abs(values).max() < writer.default_bins[-1]:
        return "tensorflow"
    low, high = float(values.min()), float(values.max())
    pad = (high - low) * 1e-6 or abs(high) * 1e-6
    return np.linspace(low - pad, high + pad, 65)


def _markdown(text: str) -> str:
    """TensorBoard renders text as Markdown: keep the explanation's line breaks."""
    return text.replace("\n", "  \n")
