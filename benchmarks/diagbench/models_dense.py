"""diagbench models on vectors: plain MLP, residual MLP with LayerNorm, autoencoder, two-branch classifier.

Ordinary ``nn.Module``s as people write them. Only the plain MLP carries an identity module meant for
injection (``GradientMultiplier``, a layer-wise gradient multiplier that is 1 unless a fault changes it),
and only the plain MLP registers its tensors with an explicit ``Recorder`` (``register``), the path of
code that the other families, recorded by ``NeuralDbg``'s hooks, do not take.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Register = Callable[..., torch.Tensor]

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh,
                                           "sigmoid": nn.Sigmoid}


def _no_register(name: str, tensor: torch.Tensor, **_: object) -> torch.Tensor:
    return tensor


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the backward multiplies the incoming gradient by ``factor``."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def scale_gradient(x: torch.Tensor, factor: float) -> torch.Tensor:
    """``x`` unchanged, its gradient multiplied by ``factor`` (a custom autograd function)."""
    return _ScaleGradient.apply(x, factor)


class GradientMultiplier(nn.Module):
    """Layer-wise gradient multiplier (discriminative learning rates by gradient scaling); 1 by default."""

    def __init__(self) -> None:
        super().__init__()
        self.factor = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.factor == 1.0 else scale_gradient(x, self.factor)


class MLPBlock(nn.Module):
    """``Linear → GradientMultiplier → activation``."""

    def __init__(self, in_dim: int, out_dim: int, activation: str) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)
        self.multiplier = GradientMultiplier()
        self.act = ACTIVATIONS[activation]()


class MLP(nn.Module):
    """``depth`` blocks of width ``width`` and a linear head; ``forward(x, register)`` registers each block's
    pre-activation as ``blocks.<i>.pre`` and output as ``blocks.<i>.out``."""

    def __init__(self, in_dim: int, classes: int, *, depth: int, width: int, activation: str,
                 xavier: bool = False) -> None:
        super().__init__()
        dims = [in_dim] + [width] * depth
        self.blocks = nn.ModuleList(MLPBlock(a, b, activation) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(width, classes)
        if xavier:
            for block in self.blocks:
                nn.init.xavier_normal_(block.linear.weight)
                nn.init.zeros_(block.linear.bias)

    def forward(self, x: torch.Tensor, register: Register = _no_register) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            pre = register(f"blocks.{i}.pre", block.multiplier(block.linear(x)))
            x = register(f"blocks.{i}.out", block.act(pre))
        return self.head(x)


class ResidualBlock(nn.Module):
    """Pre-LN residual block: ``x + fc2(act(fc1(norm(x))))``."""

    def __init__(self, width: int, hidden: int, activation: str) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.act = ACTIVATIONS[activation]()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class ResidualMLP(nn.Module):
    """Input projection, ``depth`` pre-LN residual blocks, a final LayerNorm and a linear head."""

    def __init__(self, in_dim: int, classes: int, *, depth: int, width: int, activation: str,
                 probabilities: bool = False) -> None:
        super().__init__()
        self.out = nn.Softmax(dim=1) if probabilities else None
        self.proj = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList(ResidualBlock(width, 2 * width, activation) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.norm(h))
        return logits if self.out is None else self.out(logits)


def _stack(dims: list[int], activation: str, last_activation: str | None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(nn.Linear(a, b))
        name = activation if i < len(dims) - 2 else last_activation
        if name is not None:
            layers.append(ACTIVATIONS[name]())
    return nn.Sequential(*layers)


class Autoencoder(nn.Module):
    """``encoder → dropout on the code → decoder → sigmoid``; ``code_dropout`` is read at every call (a
    schedule may change it), the dropout is functional, as often written."""

    def __init__(self, dim: int, *, hidden: tuple[int, ...], code: int, activation: str,
                 code_activation: str | None, output_activation: str | None = "sigmoid") -> None:
        super().__init__()
        self.encoder = _stack([dim, *hidden, code], activation, code_activation)
        self.decoder = _stack([code, *reversed(hidden), dim], activation, output_activation)
        self.code_dropout = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.dropout(self.encoder(x), p=self.code_dropout, training=self.training)
        return self.decoder(z)


class TwoBranch(nn.Module):
    """Two input views, one branch each (ReLU and tanh), fused by concatenation; each branch also has its
    own auxiliary head (deep supervision). The branches' gradients pass through an OGM-style gradient
    modulation (``coefficients``, 1 unless the loop's balancing rule lowers the dominant branch's)."""

    def __init__(self, dims: tuple[int, int], classes: int, *, width: int = 32) -> None:
        super().__init__()
        self.branch_a = _stack([dims[0], width, width], "relu", "relu")
        self.branch_b = _stack([dims[1], width, width], "tanh", "tanh")
        self.head = nn.Linear(2 * width, classes)
        self.head_a = nn.Linear(width, classes)
        self.head_b = nn.Linear(width, classes)
        self.coefficients = [1.0, 1.0]

    def forward(self, xa: torch.Tensor, xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ha, hb = self.branch_a(xa), self.branch_b(xb)
        if self.coefficients != [1.0, 1.0]:
            ha, hb = scale_gradient(ha, self.coefficients[0]), scale_gradient(hb, self.coefficients[1])
        return self.head(torch.cat([ha, hb], dim=1)), self.head_a(ha), self.head_b(hb)
