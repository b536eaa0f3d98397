"""The demo job behind ``comgra-ndbg demo``: one realistic bug, found without being told where to look.

A small regression network predicts the log-probabilities a fixed "teacher" assigns to 8 classes. Log-
probabilities are never positive, yet the ``buggy`` trial keeps the ReLU of its hidden layers on the
output layer as well (an easy copy-paste slip, and the bug of Comgra's tutorial in spirit): every output
the network should push below zero is clamped to 0 and stops receiving gradient, so the loss plateaus
high while nothing crashes. The ``fixed`` trial is the same network without that ReLU. Both are recorded
with the :class:`~comgra_ndbg.Recorder` (explicit ``register_tensor``) into one group folder, analysed
with :func:`comgra_ndbg.analyze`, and explained in plain sentences; the CLI then serves the explorer.

>>> net = DemoNet(output_relu=True)
>>> [name for name, _ in net.named_children()]
['hidden', 'head']
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
from torch import nn

from comgra_ndbg.analysis import Diagnosis, analyze
from comgra_ndbg.errors import InvalidArgumentError, RecordingExistsError
from comgra_ndbg.recorder import Recorder

__all__ = ["BUGGY", "FIXED", "DEFAULT_STEPS", "DemoNet", "DemoResult", "Progress", "train_trial", "run_demo",
           "describe", "default_path"]

BUGGY, FIXED = "buggy", "fixed"
DEFAULT_STEPS = 300
INPUTS, HIDDEN, CLASSES, BATCH = 16, 32, 8, 64
STORY = ("a small net learns to predict 8 log-probabilities (always <= 0); trial 'buggy' keeps a ReLU on its "
         "output layer, trial 'fixed' does not")


class DemoNet(nn.Module):
    """Two ReLU hidden layers and a linear head; ``output_relu=True`` is the bug (a ReLU on the head)."""

    def __init__(self, *, output_relu: bool) -> None:
        super().__init__()
        self.hidden = nn.ModuleList([nn.Linear(INPUTS, HIDDEN), nn.Linear(HIDDEN, HIDDEN)])
        self.head = nn.Linear(HIDDEN, CLASSES)
        self.output_relu = output_relu

    def forward(self, x: torch.Tensor, rec: Recorder) -> torch.Tensor:
        """The forward pass, registering each layer's output under its own node name."""
        for i, layer in enumerate(self.hidden):
            x = rec.register_tensor(f"hidden.{i}", torch.relu(layer(x)))
        out = self.head(x)
        if self.output_relu:
            out = torch.relu(out)
        return rec.register_tensor("output", out, role="output")


class Progress:
    """A one-line progress bar on ``stream`` (stderr by default); tqdm is not a dependency for one bar.

    On a terminal the line is redrawn at most every ``interval`` seconds; elsewhere (logs, CI) only the
    finished line is written, so captured output stays short.
    """

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, width: int = 30,
                 interval: float = 0.1) -> None:
        self.label, self.total, self.width, self.interval = label, max(int(total), 1), width, interval
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.started = time.perf_counter()
        self._drawn = -float("inf")

    def line(self) -> str:
        """The bar as text, e.g. ``buggy [###############---------------] 150/300 1.2s``."""
        filled = self.width * self.done // self.total
        return (f"{self.label} [{'#' * filled}{'-' * (self.width - filled)}] {self.done}/{self.total} "
                f"{time.perf_counter() - self.started:.1f}s")

    def update(self, steps: int = 1) -> None:
        """Count ``steps`` more finished steps; redraw when due."""
        self.done = min(self.done + steps, self.total)
        now = time.perf_counter()
        if self.live and (now - self._drawn >= self.interval or self.done == self.total):
            self.stream.write("\r" + self.line())
            self.stream.flush()
            self._drawn = now

    def close(self) -> None:
        """End the bar's line (writing it once when not on a terminal)."""
        self.stream.write(("\r" if self.live else "") + self.line() + "\n")
        self.stream.flush()


@contextmanager
def _single_thread() -> Iterator[None]:
    """Run torch on one thread: layers this small only lose time to thread start-up and contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_trial(folder: str | Path, trial: str, *, buggy: bool, steps: int = DEFAULT_STEPS, seed: int = 0,
                progress: Progress | None = None) -> float:
    """Train one trial of the demo task and record it into ``folder/trial``; returns the last loss.

    The data, the initial weights and the batches are the same for both trials (same ``seed``), so the
    output ReLU is the only difference between them.
    """
    torch.manual_seed(seed)
    teacher = torch.randn(INPUTS, CLASSES) / 2
    net = DemoNet(output_relu=buggy)
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    loss = torch.zeros(())
    with Recorder(folder, trial=trial, snapshots=10) as rec:
        rec.track_module("model", net)
        rec.add_note("output layer: ReLU (the bug)" if buggy else "output layer: linear (the fix)")
        for step in range(steps):
            x = torch.randn(BATCH, INPUTS)
            target = torch.log_softmax(x @ teacher, dim=1)
            with rec.step(step):
                optimizer.zero_grad()
                rec.register_tensor("input", x, role="input")
                rec.register_tensor("target", target, role="target")
                prediction = net(x, rec)
                loss = rec.register_tensor("loss", nn.functional.mse_loss(prediction, target), role="loss")
                loss.backward()
                rec.record_gradients()
                optimizer.step()
                rec.record_kpi("loss", loss)
            if progress is not None:
                progress.update()
    return float(loss.detach())


@dataclass(frozen=True)
class DemoResult:
    """What the demo produced: the group folder, each trial's last loss and diagnosis, and the seconds spent."""

    path: Path
    losses: dict[str, float]
    diagnoses: dict[str, Diagnosis]
    seconds: float


def default_path() -> Path:
    """A fresh group folder ``runs/demo-<date>-<time>`` under the current directory."""
    return Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")


def run_demo(path: str | Path | None = None, *, steps: int = DEFAULT_STEPS, seed: int = 0,
             stream: TextIO | None = None, progress_stream: TextIO | None = None) -> DemoResult:
    """Record the buggy and the fixed trial, analyse both (results stored for the GUI), and print the story,
    the progress and each trial's explanation to ``stream`` (stdout by default)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 30:
        raise InvalidArgumentError(f"the demo needs at least 30 steps to show the bug, got steps={steps!r}")
    out = stream if stream is not None else sys.stdout
    folder = Path(path) if path is not None else default_path()
    for trial in (BUGGY, FIXED):
        if (folder / trial).exists():
            raise RecordingExistsError(f"{folder / trial} already exists; give the demo a new folder with "
                                       f"--path, or leave --path out to get a fresh one")
    started = time.perf_counter()
    print(f"comgra-ndbg demo: {STORY}.", file=out)
    print(f"recording {steps} steps per trial to {folder}", file=out, flush=True)
    losses: dict[str, float] = {}
    with _single_thread():
        for trial in (BUGGY, FIXED):
            bar = Progress(f"{trial:>5}", steps, stream=progress_stream)
            losses[trial] = train_trial(folder, trial, buggy=trial == BUGGY, steps=steps, seed=seed, progress=bar)
            bar.close()
    diagnoses = {trial: analyze(folder, trial=trial) for trial in (BUGGY, FIXED)}
    result = DemoResult(folder, losses, diagnoses, time.perf_counter() - started)
    print(describe(result), file=out, flush=True)
    return result


def describe(result: DemoResult) -> str:
    """The demo's report: per trial its last loss and its ranked explanation, best first."""
    lines = []
    for trial, diagnosis in result.diagnoses.items():
        lines.append(f"\ntrial {trial} (last loss {result.losses[trial]:.3g}):")
        if diagnosis.healthy:
            lines.append(f"  no failure found in {diagnosis.num_steps} recorded steps.")
        else:
            lines.extend(f"  {line}" for line in diagnosis.explain().splitlines())
    lines.append(f"\nrecorded and analysed both trials in {result.seconds:.1f} s; explore them with "
                 f"`comgra-ndbg gui {result.path}`, or read `comgra-ndbg explain {result.path}`.")
    return "\n".join(lines)
