"""One training run of a benchmark workload under one recorder ("peer"), timed, with what it wrote counted.

The workloads are those of ``benchmarks/neuraldbg_overhead.py``: the 8-block 256-wide tanh MLP (batch 64)
and the small transformer (2 layers of width 128, sequences of 32 tokens, batch 16), Adam, CPU. Every peer
trains the same data with the same plain loop; what differs is what is attached to it:

- ``bare``: nothing;
- ``ndbg-defaults``: ``NeuralDbg(model, ...)`` with its defaults (tiered, ``docs/recording.md`` "Statistic
  tiers": everything at the steps the tiers measure, sentinel steps with the parameters' values and
  gradients, the input and the KPIs between; snapshots every 40th);
- ``ndbg-all-every-step``: summaries of everything (``detail="full"``) and snapshots every step;
- ``ndbg-all-every-10th``: summaries of everything (``detail="full"``) and snapshots every 10th step;
- ``comgra-default``: Comgra 0.11.5's ``ComgraRecorder`` with its defaults (every sample of the batch per
  tensor, singular values of parameters), every 10th step (``DecisionMakerForRecordingsFrequencyPerType(10)``),
  every leaf module's output registered from a forward hook, parameters tracked, gradients recorded;
- ``comgra-tuned``: the same with the cheap settings: no per-sample records, no singular values;
- ``tensorboard``: ``SummaryWriter.add_histogram`` of every leaf module's output, every parameter and its
  gradient, every 10th step;
- ``wandb``: ``wandb.watch(model, log="all", log_freq=10)`` offline (``WANDB_MODE=offline``), the loss
  logged every step (``watch`` logs its histograms with it).

The clock runs from step 10 (``WARM_UP``: one-time costs such as loading compiled kernels or a first
recording of step 0 fall before it) to the end of the peer's ``close()`` (files written); setting the peer
up (building the recorder, ``wandb.init``) is not timed. Runs of 20 steps or fewer are timed from the first.
Run as a module, one run per process, it prints the result as one JSON line:
``python -m benchmarks.peer_runners --peer ndbg-defaults --workload mlp``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import peer_accounting as accounting
from benchmarks.neuraldbg_overhead import TanhMLP, TinyTransformer, token_data
from benchmarks.overhead import make_data

EVERY = 10  # the sparse peers' interval, in steps
WARM_UP = 10  # steps before the clock starts

WORKLOADS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], list]]] = {
    "mlp": (TanhMLP, make_data),
    "transformer": (TinyTransformer, token_data),
}
WORKLOAD_LABELS = {"mlp": "8-block 256-wide tanh MLP, batch 64",
                   "transformer": "transformer 2x128, 4 heads, seq 32, batch 16"}


@dataclass(frozen=True)
class PeerRun:
    """A run's cost and output: seconds of the timed steps (with ``close()``), the median step, bytes left on
    disk and what was recorded (in all ``steps``)."""

    peer: str
    workload: str
    steps: int
    timed_steps: int
    total_s: float
    median_step_s: float
    bytes_written: int
    recorded: accounting.Recorded

    @property
    def mean_ms(self) -> float:
        return self.total_s / self.timed_steps * 1e3


def leaf_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, module) for name, module in model.named_modules() if name and not list(module.children())]


class Peer:
    """No recorder: the bare loop. Subclasses attach one; ``folder`` is where it writes."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, criterion: nn.Module,
                 folder: Path) -> None:
        self.model, self.optimizer, self.criterion, self.folder = model, optimizer, criterion, folder

    def begin(self, step: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Before the forward pass."""

    def after_backward(self, step: int, loss: torch.Tensor) -> None:
        """After ``loss.backward()``, before the optimizer's step."""

    def end(self, step: int) -> None:
        """After the optimizer's step."""

    def close(self) -> None:
        """Write what is left and release the files."""

    def recorded(self) -> accounting.Recorded:
        return accounting.Recorded(tensors=0, statistics=0.0, steps=0)


class NeuralDbgPeer(Peer):
    """``NeuralDbg`` around the unchanged loop, with ``options`` (none: its defaults)."""

    options: dict[str, Any] = {}

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from comgra_ndbg import NeuralDbg

        self.dbg = NeuralDbg(self.model, self.folder, trial="run", loss=self.criterion, optimizer=self.optimizer,
                             **self.options)

    def close(self) -> None:
        self.dbg.close()

    def recorded(self) -> accounting.Recorded:
        return accounting.recording_summaries(self.folder / "run")


class NeuralDbgEveryStep(NeuralDbgPeer):
    options = dict(summaries=1, snapshots=1, detail="full")


class NeuralDbgEvery10th(NeuralDbgPeer):
    options = dict(summaries=EVERY, snapshots=EVERY, detail="full")


class ComgraPeer(Peer):
    """Comgra 0.11.5 with its default recorder settings, every 10th step; leaf outputs registered by hooks."""

    settings: dict[str, Any] = {}
    per_sample = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
        from comgra.recorder import ComgraRecorder

        self.recorder = ComgraRecorder(self.folder, "peers", "run",
                                       DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=EVERY),
                                       **self.settings)
        self.recorder.track_module("model", self.model)
        self.counter = accounting.ComgraCounter(self.recorder)
        self.handles = [module.register_forward_hook(self._register(name))
                        for name, module in leaf_modules(self.model)]

    def _register(self, name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            if isinstance(output, torch.Tensor) and output.requires_grad:
                self.recorder.register_tensor(name.replace(".", "_"), output)
        return hook

    def begin(self, step: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.recorder.start_batch(step, inputs.shape[0], type_of_execution="train",
                                  record_all_tensors_per_batch_index_by_default=self.per_sample)
        self.recorder.start_iteration()
        if inputs.is_floating_point():  # Comgra makes a registered tensor require a gradient
            self.recorder.register_tensor("input", inputs, is_input=True)

    def after_backward(self, step: int, loss: torch.Tensor) -> None:
        self.recorder.register_tensor("loss", loss, is_loss=True)
        self.recorder.record_current_gradients("gradients")

    def end(self, step: int) -> None:
        self.recorder.finish_iteration()
        self.recorder.finish_batch()

    def close(self) -> None:
        self.recorder.finalize()
        for handle in self.handles:
            handle.remove()

    def recorded(self) -> accounting.Recorded:
        return self.counter.recorded()


class ComgraTuned(ComgraPeer):
    settings = dict(calculate_svd_and_other_expensive_operations_of_parameters=False)
    per_sample = False


class TensorBoardPeer(Peer):
    """Histograms of leaf outputs, parameters and parameter gradients every 10th step."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.folder))
        self.outputs: dict[str, torch.Tensor] = {}
        self.recording = False
        self.handles = [module.register_forward_hook(self._keep(name)) for name, module in leaf_modules(self.model)]

    def _keep(self, name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            if self.recording and isinstance(output, torch.Tensor):
                self.outputs[name] = output.detach()
        return hook

    def begin(self, step: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.recording = step % EVERY == 0
        self.outputs.clear()

    def after_backward(self, step: int, loss: torch.Tensor) -> None:
        if not self.recording:
            return
        for name, output in self.outputs.items():
            self.writer.add_histogram(f"activation/{name}", output, step)
        for name, parameter in self.model.named_parameters():
            self.writer.add_histogram(f"parameter/{name}", parameter.detach(), step)
            if parameter.grad is not None:
                self.writer.add_histogram(f"gradient/{name}", parameter.grad, step)

    def close(self) -> None:
        self.writer.close()
        for handle in self.handles:
            handle.remove()

    def recorded(self) -> accounting.Recorded:
        return accounting.tensorboard_histograms(self.folder)


class WandbPeer(Peer):
    """``wandb.watch(model, log="all", log_freq=10)``, offline, the loss logged every step."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        import wandb

        os.environ["WANDB_MODE"] = "offline"
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(project="peers", dir=str(self.folder), mode="offline",
                              settings=wandb.Settings(console="off", x_disable_stats=True))
        self.counter = accounting.WandbCounter(self.run)
        self.run.watch(self.model, log="all", log_freq=EVERY)

    def after_backward(self, step: int, loss: torch.Tensor) -> None:
        self.run.log({"loss": loss.item()}, step=step)

    def close(self) -> None:
        self.run.unwatch(self.model)
        self.run.finish()

    def recorded(self) -> accounting.Recorded:
        return self.counter.recorded()


PEERS: dict[str, type[Peer]] = {
    "bare": Peer,
    "ndbg-defaults": NeuralDbgPeer,
    "ndbg-all-every-step": NeuralDbgEveryStep,
    "ndbg-all-every-10th": NeuralDbgEvery10th,
    "comgra-default": ComgraPeer,
    "comgra-tuned": ComgraTuned,
    "tensorboard": TensorBoardPeer,
    "wandb": WandbPeer,
}
PEER_LABELS = {
    "bare": "bare",
    "ndbg-defaults": "NeuralDbg defaults (tiered, sentinel steps between measured ones; snapshots every 40th)",
    "ndbg-all-every-step": "NeuralDbg, everything every step",
    "ndbg-all-every-10th": "NeuralDbg, everything every 10th step",
    "comgra-default": "Comgra 0.11.5 defaults, every 10th step",
    "comgra-tuned": "Comgra 0.11.5 tuned (no per-sample, no SVD), every 10th step",
    "tensorboard": "TensorBoard add_histogram, every 10th step",
    "wandb": "wandb.watch(log='all', log_freq=10), offline",
}
OPTIONAL = {"comgra-default": "comgra", "comgra-tuned": "comgra", "wandb": "wandb", "tensorboard": "tensorboard"}


def train(peer_name: str, workload: str, steps: int, folder: Path) -> PeerRun:
    """Train ``workload`` for ``steps`` steps with ``peer_name`` attached, writing into ``folder``."""
    make_model, make_batches = WORKLOADS[workload]
    data = make_batches(steps)
    torch.manual_seed(0)
    model, criterion = make_model(), nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    folder.mkdir(parents=True, exist_ok=True)
    peer = PEERS[peer_name](model, optimizer, criterion, folder)
    step_s = []
    timed_from = WARM_UP if steps > 2 * WARM_UP else 0
    started = time.perf_counter()
    for step, (inputs, targets) in enumerate(data):
        t0 = time.perf_counter()
        if step == timed_from:
            started = t0
        peer.begin(step, inputs, targets)
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        peer.after_backward(step, loss)
        optimizer.step()
        peer.end(step)
        step_s.append(time.perf_counter() - t0)
    peer.close()
    total = time.perf_counter() - started
    return PeerRun(peer_name, workload, steps, steps - timed_from, total, statistics.median(step_s[timed_from:]),
                   accounting.folder_bytes(folder), peer.recorded())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="One timed run of a workload under one peer, as a JSON line.")
    parser.add_argument("--peer", required=True, choices=list(PEERS))
    parser.add_argument("--workload", required=True, choices=list(WORKLOADS))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--folder", default=None, help="where the peer writes (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="peer-") as scratch:
        run = train(args.peer, args.workload, args.steps, Path(args.folder or scratch))
    sys.stdout.write(json.dumps(asdict(run)) + "\n")


if __name__ == "__main__":
    main()
