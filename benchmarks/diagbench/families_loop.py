"""The ``loop`` family of diagbench: mistakes in the training loop itself, one per loop invariant, each with a
fixed twin, and the patterns people use on purpose that a naive check would flag.

Every case is a short, ordinary training loop over the bench's own models (``MLP``, ``ResidualMLP``,
``SmallResNet``) and data (``clusters``, ``prototype_images``), recorded by ``NeuralDbg`` at its defaults.
A *fault* case contains the mistake (from step ``t0`` half-way through the run, or from step 0 where the
mistake lives in the set-up; three of them in :mod:`~benchmarks.diagbench.families_loop_extra`); its
*fixed* twin runs the same loop with the mistake corrected; an *intentional* case is healthy code that
looks unusual (gradient accumulation, a GAN's alternating optimizers, a frozen backbone, evaluation passes
under ``torch.no_grad()``, a warm-up schedule, an EMA copy of the weights; in
:mod:`~benchmarks.diagbench.families_loop_healthy`).

The loop measures its ground truth itself, never through the recorder: the loss of every step, whether
the defining symptom of the mistake showed (``symptom``) and the step of its first effect (``effect``).
:mod:`benchmarks.diagbench.loop_bench` runs, validates and scores the cases.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.diagbench.data import clusters, prototype_images
from benchmarks.diagbench.models_dense import MLP, ResidualMLP
from benchmarks.diagbench.models_seq import SmallResNet

STEPS = 60
BATCH = 16
FAULT, FIXED, INTENTIONAL = "fault", "fixed", "intentional"
Record = Callable[..., AbstractContextManager]
"""``record(model, **options)``: the ``NeuralDbg`` recording a case trains under."""


@dataclass
class LoopRun:
    """What a case's loop hands back: the model(s) it recorded and its ground truth."""

    seed: int
    t0: int
    losses: list[float] = field(default_factory=list)
    symptom: bool = False
    effect: int = -1
    note: str = ""


@dataclass(frozen=True)
class LoopCase:
    """One case. ``kind``: fault, fixed or intentional; ``invariant``: the loop invariant it is about;
    ``type`` / ``origin`` / ``nodes``: what a right hypothesis of a fault says (``nodes``: module-path
    prefixes for origin ``node``); ``mid_run``: the mistake starts at ``t0`` (else at step 0);
    ``run(record, run, fixed)`` trains under ``record(model, **options)`` (a ``NeuralDbg`` factory)."""

    name: str
    kind: str
    invariant: str
    run: Callable[..., None]
    type: str = ""
    origin: str = ""
    nodes: tuple[str, ...] = ()
    mid_run: bool = False
    description: str = ""


def _features(seed: int) -> DataLoader:
    x, y = clusters(seed, n=2048, dim=32, classes=10, label_noise=0.0)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                      generator=torch.Generator().manual_seed(seed), drop_last=True)


def _images(seed: int, *, scaled: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    images, y = prototype_images(seed, n=512)
    return ((images / 255 - 0.5) / 0.25 if scaled else images), y


def batches(seed: int) -> Iterator[list[torch.Tensor]]:
    """Endless shuffled batches of the cluster data (a fresh epoch when one ends)."""
    loader = _features(seed)
    while True:
        yield from loader


def mlp(seed: int, **options: object) -> MLP:
    """The bench's MLP (32 inputs, two ReLU blocks of 32, 10 classes), seeded."""
    torch.manual_seed(seed)
    return MLP(32, 10, depth=2, width=32, activation=str(options.get("activation", "relu")))


def step_once(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *,
              zero: bool = True) -> float:
    """One ordinary optimizer step on ``(x, y)`` with a cross-entropy loss (``zero_grad`` first unless
    ``zero`` is false); its loss."""
    if zero:
        optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


# ---- faults and their fixed twins -----------------------------------------------------------------------------
def no_zero_grad(record: Record, run: LoopRun, fixed: bool) -> None:
    """From t0 a refactor drops ``optimizer.zero_grad()``: every backward adds to the last step's gradient."""
    model = mlp(run.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    data = batches(run.seed)
    with record(model):
        for step in range(STEPS):
            x, y = next(data)
            carried = step >= run.t0 and not fixed
            if carried and not run.symptom and model.head.weight.grad is not None:
                run.symptom = bool(model.head.weight.grad.abs().sum() > 0)
                run.effect = step
            run.losses.append(step_once(model, optimizer, x, y, zero=not carried))


def layer_replaced(record: Record, run: LoopRun, fixed: bool) -> None:
    """The head is re-created for the task's classes after the optimizer was built: it is never trained."""
    model = mlp(run.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.head = nn.Linear(32, 10)
    if fixed:
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    start = model.head.weight.detach().clone()
    data = batches(run.seed)
    with record(model):
        for _ in range(STEPS):
            run.losses.append(step_once(model, optimizer, *next(data)))
    run.symptom = bool(torch.equal(start, model.head.weight.detach()))
    run.effect = 0


def lr_zeroed(record: Record, run: LoopRun, fixed: bool) -> None:
    """At t0 a "freeze the first block" utility meant to set ``requires_grad_(False)`` on one block sets the
    learning rate of every param group to 0 (the fixed twin leaves the rates alone)."""
    model = mlp(run.seed)
    groups = [{"params": list(model.blocks[0].parameters()), "name": "blocks.0"},
              {"params": [p for n, p in model.named_parameters() if not n.startswith("blocks.0")], "name": "rest"}]
    optimizer = torch.optim.Adam(groups, lr=3e-3)
    data = batches(run.seed)
    with record(model):
        for step in range(STEPS):
            if step == run.t0:
                for group in () if fixed else optimizer.param_groups:
                    group["lr"] = 0.0
                before = model.head.weight.detach().clone()
            run.losses.append(step_once(model, optimizer, *next(data)))
            if step == run.t0:
                run.symptom, run.effect = bool(torch.equal(before, model.head.weight.detach())), step


def share_collapse(record: Record, run: LoopRun, fixed: bool) -> None:
    """At t0 an "unfreeze the backbone" call freezes everything but the LayerNorms (the fixed twin freezes
    nothing)."""
    torch.manual_seed(run.seed)
    model = ResidualMLP(32, 10, depth=2, width=32, activation="gelu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(run.seed)
    with record(model):
        for step in range(STEPS):
            if step == run.t0 and not fixed:
                model.requires_grad_(False)
                for module in model.modules():
                    if isinstance(module, nn.LayerNorm):
                        module.requires_grad_(True)
            run.losses.append(step_once(model, optimizer, *next(data)))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    share = trainable / sum(p.numel() for p in model.parameters())
    run.symptom, run.effect, run.note = share <= 0.05, run.t0, f"trainable share at the end {share:.3f}"


def cnn_loop(record: Record, run: LoopRun, *, size_at: Callable[[int], int], after_eval_train: Callable[[int], bool],
              evaluate_every: int = 0) -> None:
    """``SmallResNet`` on scaled prototype images: ``size_at(step)`` samples per step, an evaluation pass in
    ``eval()`` every ``evaluate_every`` steps, after which ``model.train()`` is called when ``after_eval_train``
    says so; a training pass in eval() mode or on one sample is the symptom."""
    images, labels = _images(run.seed)
    torch.manual_seed(run.seed)
    model = SmallResNet(6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(run.seed)
    with record(model):
        for step in range(STEPS):
            index = torch.randint(0, len(labels), (size_at(step),), generator=g)
            if not model.training and not run.symptom:
                run.symptom, run.effect = True, step
            if len(index) == 1 and model.training and not run.symptom:
                run.symptom, run.effect = True, step
            run.losses.append(step_once(model, optimizer, images[index], labels[index]))
            if evaluate_every and step % evaluate_every == evaluate_every - 1:
                model.eval()
                with torch.no_grad():
                    model(images[:64])
                if after_eval_train(step + 1):
                    model.train()


def eval_left_on(record: Record, run: LoopRun, fixed: bool) -> None:
    """A validation pass calls ``model.eval()``; from the one before t0 on, ``model.train()`` is not called
    again (it sat in a branch that stopped running)."""
    cnn_loop(record, run, size_at=lambda step: BATCH, evaluate_every=run.t0 // 3 or 1,
              after_eval_train=lambda step: fixed or step < run.t0)
    if not run.symptom:
        run.note = "no training step in eval() mode (the evaluation period did not reach t0)"


def batchnorm_one(record: Record, run: LoopRun, fixed: bool) -> None:
    """From t0 the data set size leaves a last batch of one sample every 10 steps (``drop_last=False``); the
    fixed twin drops it (a full batch instead)."""
    cnn_loop(record, run, size_at=lambda step: 1 if step >= run.t0 and (step - run.t0) % 10 == 0 and not fixed
              else BATCH, after_eval_train=lambda step: True)


class _WithAuxiliary(nn.Module):
    """An MLP whose features also pass an auxiliary projection added to the logits while ``use_aux``."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.net = mlp(seed)
        self.aux = nn.Linear(32, 10)
        self.use_aux = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for block in self.net.blocks:
            h = block.act(block.linear(h))
        out = self.net.head(h)
        return out + self.aux(h) if self.use_aux else out


def unused_branch(record: Record, run: LoopRun, fixed: bool) -> None:
    """At t0 a configuration flag read at the wrong place switches the auxiliary projection off: its
    parameters stay trainable but the loss no longer depends on them."""
    model = _WithAuxiliary(run.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = batches(run.seed)
    with record(model):
        for step in range(STEPS):
            model.use_aux = fixed or step < run.t0
            run.losses.append(step_once(model, optimizer, *next(data)))
            if step == run.t0 and model.aux.weight.grad is None:
                run.symptom, run.effect = True, step


def lr_per_batch(record: Record, run: LoopRun, fixed: bool) -> None:
    """``StepLR(step_size=3, gamma=0.1)`` meant for epochs is stepped after every batch (the fixed twin
    steps it once per epoch of 20 batches)."""
    model = mlp(run.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2 + run.seed % 3, gamma=0.1)
    data = batches(run.seed)
    with record(model):
        for step in range(STEPS):
            lr = optimizer.param_groups[0]["lr"]
            if lr <= 1.0001e-3 * 0.05 and not run.symptom:
                run.symptom, run.effect = step < STEPS // 2, step
            run.losses.append(step_once(model, optimizer, *next(data)))
            if not fixed or step % 20 == 19:
                scheduler.step()


def half_eps(record: Record, run: LoopRun, fixed: bool) -> None:
    """float16 weights updated by Adam with its default ``eps=1e-8``, which float16 rounds to 0 (the fixed
    twin uses ``eps=1e-4``): a parameter whose gradient underflows divides 0 by 0."""
    model = mlp(run.seed).half()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-4 if fixed else 1e-8)
    data = batches(run.seed)
    with record(model):
        for step in range(STEPS):
            x, y = next(data)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x.half()).float(), y)
            loss.backward()
            optimizer.step()
            run.losses.append(float(loss.detach()))
            bad = not all(bool(torch.isfinite(p).all()) for p in model.parameters())
            if bad and not run.symptom:
                run.symptom, run.effect = True, step
    if not run.symptom:
        run.note = "no parameter became non-finite"
    run.effect = 0 if run.symptom else -1


def same_batch(record: Record, run: LoopRun, fixed: bool) -> None:
    """The ``DataLoader`` (no shuffling) is created inside the loop, so every step trains on its first batch
    (the fixed twin creates one shuffled loader outside the loop)."""
    x_all, y_all = clusters(run.seed, n=2048, dim=32, classes=10, label_noise=0.0)
    model = mlp(run.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = batches(run.seed)
    previous = None
    with record(model):
        for step in range(STEPS):
            x, y = next(data) if fixed else next(iter(DataLoader(TensorDataset(x_all, y_all), batch_size=BATCH)))
            if previous is not None and torch.equal(previous, x) and not run.symptom:
                run.symptom, run.effect = True, step
            previous = x
            run.losses.append(step_once(model, optimizer, x, y))


def raw_pixels(record: Record, run: LoopRun, fixed: bool) -> None:
    """Grey levels 0–255 go into the MLP as they are (the fixed twin scales them to about unit range)."""
    images, labels = _images(run.seed, scaled=fixed)
    x_all = images.flatten(1)
    torch.manual_seed(run.seed)
    model = MLP(x_all.shape[1], 6, depth=2, width=32, activation="relu")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(run.seed)
    with record(model):
        for _ in range(STEPS):
            index = torch.randint(0, len(labels), (BATCH,), generator=g)
            run.losses.append(step_once(model, optimizer, x_all[index], labels[index]))
    rms = float(x_all.pow(2).mean().sqrt())
    run.symptom, run.effect, run.note = rms >= 20, 0, f"input rms {rms:.1f}"


def constant_target(record: Record, run: LoopRun, fixed: bool) -> None:
    """The target is read from the wrong column of the label table: the same class for every sample (the
    fixed twin reads the right one)."""
    model = mlp(run.seed)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = batches(run.seed)
    with record(model, loss=criterion):
        for _ in range(STEPS):
            x, y = next(data)
            table = torch.stack([torch.zeros_like(y) + 3, y], dim=1)  # (source id, class)
            target = table[:, 1 if fixed else 0]
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), target)
            loss.backward()
            optimizer.step()
            run.losses.append(float(loss.detach()))
            run.symptom = run.symptom or bool((target == target[0]).all())
    run.effect = 0


_FAULTS = (
    ("no_zero_grad", "stale_gradients", no_zero_grad, "stale_gradients", "loop", (), True),
    ("layer_replaced", "not_in_optimizer", layer_replaced, "update_stagnation", "optimizer", (), False),
    ("lr_zeroed", "no_update", lr_zeroed, "update_stagnation", "optimizer", (), True),
    ("share_collapse", "trainable_share", share_collapse, "update_stagnation", "architecture", (), True),
    ("eval_left_on", "eval_mode_training", eval_left_on, "wrong_mode", "loop", (), True),
    ("batchnorm_one", "batchnorm_batch_one", batchnorm_one, "batch_statistics", "node",
     ("stem", "block1", "block2"), True),
    ("unused_branch", "unused_parameters", unused_branch, "unused_parameters", "node", ("aux",), True),
    ("lr_per_batch", "lr_collapse", lr_per_batch, "update_stagnation", "optimizer", (), False),
    ("half_eps", "half_precision_eps", half_eps, "precision", "optimizer", (), False),
    ("same_batch", "repeated_batch", same_batch, "repeated_batch", "data", (), False),
    ("raw_pixels", "unnormalised_input", raw_pixels, "unnormalised_input", "data", (), False),
    ("constant_target", "constant_target", constant_target, "constant_target", "data", (), False),
)
_INTENTIONAL = (("accumulation", "stale_gradients"), ("gan", "stale_gradients"), ("frozen_backbone", "trainable_share"),
                ("eval_passes", "train_mode_evaluation"), ("warmup", "lr_collapse"), ("ema", "unused_parameters"))
"""Each intentional pattern (a function of :mod:`~benchmarks.diagbench.families_loop_healthy`) and the
invariant a naive check of it would break."""


def loop_cases() -> list[LoopCase]:
    """Every case: each fault, its fixed twin, and each intentional pattern."""
    from benchmarks.diagbench import families_loop_extra, families_loop_healthy

    cases = []
    for name, invariant, run, kind, origin, nodes, mid_run in _FAULTS + families_loop_extra.FAULTS:
        doc = (run.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        cases.append(LoopCase(name, FAULT, invariant, run, kind, origin, nodes, mid_run, doc))
        cases.append(LoopCase(f"{name}_fixed", FIXED, invariant, run, mid_run=mid_run, description=doc))
    for name, invariant in _INTENTIONAL:
        run = getattr(families_loop_healthy, name)
        cases.append(LoopCase(name, INTENTIONAL, invariant, run, description=(run.__doc__ or "").replace("\n", " ")))
    return cases
