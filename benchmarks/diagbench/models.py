"""diagbench models: every block ends in a ``Scale`` module, a fixed and stably named injection point.

Models register what a real user would: the input, each block's pre-activation (``blocks.<i>.pre``, the
``Scale`` output) and output (``blocks.<i>.out``), the logits (role ``output``) and the loss.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Register = Callable[..., torch.Tensor]

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}


def _no_register(name: str, tensor: torch.Tensor, **_: object) -> torch.Tensor:
    return tensor


class Scale(nn.Module):
    """Identity by default: ``factor`` scales the forward value, ``grad_factor`` the gradient flowing back."""

    def __init__(self) -> None:
        super().__init__()
        self.factor = 1.0
        self.grad_factor = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.factor
        if self.grad_factor != 1.0 and y.requires_grad:
            factor = self.grad_factor
            y.register_hook(lambda grad: grad * factor)
        return y


class Block(nn.Module):
    """``layer → Scale → activation``; ``layer`` is a Linear, or a Conv1d in the CNN."""

    def __init__(self, layer: nn.Module, activation: str) -> None:
        super().__init__()
        self.linear = layer
        self.scale = Scale()
        self.activation = activation

    def forward(self, x: torch.Tensor, name: str, register: Register) -> torch.Tensor:
        pre = register(f"{name}.pre", self.scale(self.linear(x)))
        return register(f"{name}.out", ACTIVATIONS[self.activation](pre))


class MLP(nn.Module):
    """``depth`` blocks of width ``width`` and a linear head."""

    def __init__(self, in_dim: int, out_dim: int, *, depth: int, activation: str, width: int = 64,
                 init: str = "default") -> None:
        super().__init__()
        dims = [in_dim] + [width] * depth
        self.blocks = nn.ModuleList(Block(nn.Linear(a, b), activation) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(width, out_dim)
        if init == "xavier":
            for block in self.blocks:
                nn.init.xavier_normal_(block.linear.weight)
                nn.init.zeros_(block.linear.bias)

    def forward(self, x: torch.Tensor, register: Register = _no_register) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x = block(x, f"blocks.{i}", register)
        return self.head(x)


class ResidualLN(nn.Module):
    """Pre-norm residual MLP: ``h = h + Block(LayerNorm(h))``, after an input projection."""

    def __init__(self, in_dim: int, out_dim: int, *, depth: int, activation: str, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Linear(in_dim, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.blocks = nn.ModuleList(Block(nn.Linear(width, width), activation) for _ in range(depth))
        self.head = nn.Linear(width, out_dim)

    def forward(self, x: torch.Tensor, register: Register = _no_register) -> torch.Tensor:
        h = self.embed(x)
        for i, (norm, block) in enumerate(zip(self.norms, self.blocks)):
            h = h + block(norm(h), f"blocks.{i}", register)
        return self.head(h)


class CNN(nn.Module):
    """1-D CNN over the input vector seen as a 1-channel sequence; conv blocks, then a linear head."""

    def __init__(self, in_dim: int, out_dim: int, *, depth: int, activation: str, channels: int = 8) -> None:
        super().__init__()
        dims = [1] + [channels] * depth
        self.blocks = nn.ModuleList(Block(nn.Conv1d(a, b, 3, padding=1), activation)
                                    for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(channels * in_dim, out_dim)

    def forward(self, x: torch.Tensor, register: Register = _no_register) -> torch.Tensor:
        h = x.unsqueeze(1)
        for i, block in enumerate(self.blocks):
            h = block(h, f"blocks.{i}", register)
        return self.head(h.flatten(1))


class LossHead(nn.Module):
    """Cross-entropy (or MSE) as a module, so that a loss fault is a change of module state.

    ``force_zero_probability`` routes the loss through ``log(p)`` with ``p`` forced to 0 (fault F8).
    """

    def __init__(self, task: str) -> None:
        super().__init__()
        self.task = task
        self.force_zero_probability = False

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.task == "regression":
            return F.mse_loss(logits, target)
        if self.force_zero_probability:
            p = torch.softmax(logits, dim=1).gather(1, target[:, None]) * 0.0
            return -torch.log(p).mean()
        return F.cross_entropy(logits, target)


def build_model(architecture: str, in_dim: int, out_dim: int, *, depth: int, activation: str,
                init: str = "default") -> nn.Module:
    if architecture == "mlp":
        return MLP(in_dim, out_dim, depth=depth, activation=activation, init=init)
    if architecture == "residual":
        return ResidualLN(in_dim, out_dim, depth=depth, activation=activation)
    if architecture == "cnn":
        return CNN(in_dim, out_dim, depth=depth, activation=activation)
    raise ValueError(f"unknown architecture {architecture!r}; choose mlp, residual or cnn")
