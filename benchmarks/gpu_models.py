"""The models ``benchmarks/gpu_overhead.py`` trains on a GPU, each with the explicit Recorder loop a user writes.

- ``mlp``: 8 blocks of Linear(width, width) + tanh between a 32-wide input and 10 classes, Adam.
- ``gpt2``: a GPT-2-small-shaped decoder written out by hand (12 pre-norm blocks, d_model 768, 12 heads, MLP
  4 × 768 with tanh-GELU, learned positions, the output head tied to the token embedding, vocabulary 50 304)
  over sequences of 512 tokens, batch 8, under bf16 autocast, AdamW; random tokens made on the device.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from comgra_ndbg import Recorder

__all__ = ["GPT", "Workload", "gpt2", "mlp"]

DEPTH, IN, OUT = 8, 32, 10
VOCAB, CONTEXT, D_MODEL, HEADS, LAYERS, GPT_BATCH = 50304, 512, 768, 12, 12, 8


@dataclass
class Workload:
    """A model, its optimizer, one batch maker and the forward pass with and without a Recorder."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor, Recorder | None], torch.Tensor]
    autocast: bool


def _mlp_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rec: Recorder | None) -> torch.Tensor:
    if rec is None:
        return F.cross_entropy(model(x), y)
    rec.register_tensor("input", x, role="input")
    out = x
    for i, layer in enumerate(model):
        out = layer(out)
        if isinstance(layer, nn.Tanh):
            rec.register_tensor(f"block{i}", out)
    loss = F.cross_entropy(out, y)
    rec.register_tensor("loss", loss, role="loss")
    return loss


def mlp(width: int, batch: int, device: str = "cuda") -> Workload:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(IN, width)]
    for _ in range(DEPTH):
        layers += [nn.Linear(width, width), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(width, OUT)).to(device)
    generator = torch.Generator(device=device).manual_seed(1)

    def make(_: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(batch, IN, device=device, generator=generator),
                torch.randint(0, OUT, (batch,), device=device, generator=generator))

    return Workload(f"mlp {width}/{batch}", model, torch.optim.Adam(model.parameters(), lr=1e-3), make, _mlp_loss,
                    False)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).split(D_MODEL, dim=2)
        q, k, v = (t.view(batch, length, HEADS, D_MODEL // HEADS).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, length, D_MODEL))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D_MODEL, 4 * D_MODEL)
        self.act = nn.GELU(approximate="tanh")
        self.proj = nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(D_MODEL), Attention()
        self.ln2, self.mlp = nn.LayerNorm(D_MODEL), FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D_MODEL), nn.Embedding(CONTEXT, D_MODEL)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * LAYERS))
            elif p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _gpt_loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, rec: Recorder | None) -> torch.Tensor:
    if rec is None:
        logits = model(tokens)
    else:
        inner = getattr(model, "_orig_mod", model)
        x = inner.embed(tokens)
        rec.register_tensor("embedding", x, role="input")
        for i, block in enumerate(inner.blocks):
            x = block(x)
            rec.register_tensor(f"block{i}", x)
        logits = inner.head(inner.ln_f(x))
        rec.register_tensor("logits", logits, role="output")
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))
    if rec is not None:
        rec.register_tensor("loss", loss, role="loss")
    return loss


def gpt2(device: str = "cuda", compiled: bool = False) -> Workload:
    torch.manual_seed(0)
    model = GPT().to(device)
    if compiled:  # each block compiled: the Recorder's loop registers between them, NeuralDbg hooks the whole
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block)
    generator = torch.Generator(device=device).manual_seed(1)

    def make(_: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, VOCAB, (GPT_BATCH, CONTEXT + 1), device=device, generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    return Workload("gpt2-small" + (" compiled" if compiled else ""), model, optimizer, make, _gpt_loss, True)
