"""Ports of the training-loop mistakes: a missing ``zero_grad()``, a model frozen whole, stages not frozen.

Each function trains one variant of one original script on CPU: the same kind of model, scaled down
(fewer channels, the original's layer order and names), synthetic data of the original's shapes, and the
original's optimizer, learning rate and batch size; the bug is written as the original writes it. The loop
is wrapped with ``NeuralDbg(model, folder, trial=variant, optimizer=optimizer)``, nothing else.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn, optim

from benchmarks.silent_errors.cases import Outcome
from benchmarks.silent_errors.data import image_batches
from comgra_ndbg import NeuralDbg

__all__ = ["MnistNet", "TinyEfficientNet", "StagedVGG", "missing_zero_grad", "frozen_except_bn",
           "frozen_stages_not_applied", "STEPS"]

STEPS = 60
"""Steps per run: past the analysis' settle window (50 steps), a few seconds per variant on one core."""


def _grad_norm(model: nn.Module) -> float:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return float(torch.stack([g.norm() for g in grads]).norm()) if grads else 0.0


def _change(before: list[torch.Tensor], module: nn.Module) -> float:
    return max(float((p.detach() - b).abs().max()) for p, b in zip(module.parameters(), before))


def _copy(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


class MnistNet(nn.Module):
    """The Stack Overflow question's ``Net`` with 8/16 instead of 32/64 channels and 32 hidden units."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.fc1 = nn.Linear(2304, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        return self.fc2(x)


def missing_zero_grad(variant: str, folder: Path, *, steps: int = STEPS) -> Outcome:
    """stackoverflow-60335387: the loop never calls ``optimizer.zero_grad()``, so every backward adds to the
    sum of all earlier gradients (Adam, lr 1e-4, batch 30). Symptom ``carried_grad_norm``: the largest
    gradient norm already present before a step's backward (0 when gradients are cleared)."""
    torch.manual_seed(0)
    model = MnistNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.Adam(model.parameters(), lr=1e-4)
    carried, losses = [], []
    with NeuralDbg(model, folder, trial=variant, optimizer=optimizer) as dbg:
        model.train()
        for data, label in image_batches((1, 28, 28), 10, 30, steps, seed=1):
            if variant == "fixed":
                optimizer.zero_grad()
            carried.append(_grad_norm(model))
            pred_score = model(data)
            loss = criterion(pred_score, label)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return Outcome((dbg.path,), 1 if variant == "buggy" else None,
                   {"carried_grad_norm": max(carried), "loss_first": losses[0], "loss_last": losses[-1]})


class _MBConv(nn.Module):
    """An EfficientNet mobile inverted bottleneck with the library's attribute names (``_bn0`` … ``_bn2``)."""

    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        hidden = 2 * channels_in
        self._expand_conv = nn.Conv2d(channels_in, hidden, 1, bias=False)
        self._bn0 = nn.BatchNorm2d(hidden)
        self._depthwise_conv = nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False)
        self._bn1 = nn.BatchNorm2d(hidden)
        self._project_conv = nn.Conv2d(hidden, channels_out, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(channels_out)
        self._residual = stride == 1 and channels_in == channels_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self._bn0(self._expand_conv(x)))
        h = F.silu(self._bn1(self._depthwise_conv(h)))
        h = self._bn2(self._project_conv(h))
        return x + h if self._residual else h


class TinyEfficientNet(nn.Module):
    """EfficientNet-b0's layout and parameter names (stem, MBConv blocks, head, ``_fc``), two blocks deep."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self._conv_stem = nn.Conv2d(3, 16, 3, 2, 1, bias=False)
        self._bn0 = nn.BatchNorm2d(16)
        self._blocks = nn.ModuleList([_MBConv(16, 16, 1), _MBConv(16, 24, 2)])
        self._conv_head = nn.Conv2d(24, 64, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(64)
        self._fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.silu(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        x = F.silu(self._bn1(self._conv_head(x)))
        return self._fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def frozen_except_bn(variant: str, folder: Path, *, steps: int = STEPS) -> Outcome:
    """pytorch-forum-84911: transfer learning where every parameter without "bn" in its name is frozen and
    then the new ``_fc`` head, the only parameters given to Adam (lr 1e-3, batch 64, 100 classes), is
    frozen too; the fixed script leaves ``_fc`` trainable. Symptom ``fc_change``: how far the optimizer's
    parameters moved (0: nothing trains)."""
    torch.manual_seed(0)
    model_transfer = TinyEfficientNet()
    n_inputs = model_transfer._fc.in_features
    model_transfer._fc = nn.Linear(n_inputs, 100)
    criterion_transfer = nn.CrossEntropyLoss()
    optimizer_transfer = optim.Adam(model_transfer._fc.parameters(), lr=0.001)
    for name, param in model_transfer.named_parameters():
        if "bn" not in name:
            param.requires_grad = False
    for param in model_transfer._fc.parameters():
        param.requires_grad = variant == "fixed"
    before, losses = _copy(model_transfer._fc), []
    with NeuralDbg(model_transfer, folder, trial=variant, optimizer=optimizer_transfer) as dbg:
        model_transfer.train()
        for data, target in image_batches((3, 32, 32), 100, 64, steps, seed=2):
            optimizer_transfer.zero_grad()
            output = model_transfer(data)
            loss = criterion_transfer(output, target)
            loss.backward()
            optimizer_transfer.step()
            losses.append(loss.item())
    return Outcome((dbg.path,), 0 if variant == "buggy" else None,
                   {"fc_change": _change(before, model_transfer._fc), "loss_first": losses[0],
                    "loss_last": losses[-1]})


class StagedVGG(nn.Module):
    """mmpretrain's VGG backbone in small: conv–BN–ReLU stages and a classifier, ``frozen_stages`` applied
    by ``_freeze_stages()``, which (as in mmpretrain's VGG) is called from ``train()`` and not ``__init__``."""

    def __init__(self, frozen_stages: int = -1, num_classes: int = 10) -> None:
        super().__init__()
        self.frozen_stages = frozen_stages
        self.features = nn.Sequential(*(nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU(),
                                                      nn.MaxPool2d(2))
                                        for a, b in ((3, 8), (8, 16), (16, 32))))
        self.classifier = nn.Linear(32 * 4 * 4, num_classes)

    def _freeze_stages(self) -> None:
        for i in range(self.frozen_stages):
            m = self.features[i]
            m.eval()
            for param in m.parameters():
                param.requires_grad = False

    def train(self, mode: bool = True) -> StagedVGG:
        super().train(mode)
        self._freeze_stages()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def frozen_stages_not_applied(variant: str, folder: Path, *, steps: int = STEPS) -> Outcome:
    """mmpretrain-702: fine-tuning with ``frozen_stages=1`` when nothing calls ``model.train()`` before the
    first forward pass, so the stage meant to stay fixed trains (SGD, lr 0.01, momentum 0.9, batch 64);
    the fixed loop calls ``model.train()`` at the start of each epoch. Symptom ``stage0_change``: how far
    the frozen stage's parameters moved (0 when frozen)."""
    torch.manual_seed(0)
    model = StagedVGG(frozen_stages=1)
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss()
    before, losses = _copy(model.features[0]), []
    with NeuralDbg(model, folder, trial=variant, optimizer=optimizer) as dbg:
        if variant == "fixed":
            model.train()
        for img, gt_label in image_batches((3, 32, 32), 10, 64, steps, seed=3):
            optimizer.zero_grad()
            loss = criterion(model(img), gt_label)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return Outcome((dbg.path,), 0 if variant == "buggy" else None,
                   {"stage0_change": _change(before, model.features[0]), "loss_first": losses[0],
                    "loss_last": losses[-1]})
