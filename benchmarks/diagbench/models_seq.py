"""diagbench models on images, sequences and tokens: a 2-D CNN with BatchNorm, pooling and residual
shortcuts; a GRU/LSTM sequence classifier; a small pre-LN Transformer encoder. Ordinary ``nn.Module``s,
with no registration call and no injection module."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.diagbench.data import PAD
from benchmarks.diagbench.models_dense import ACTIVATIONS


class ConvBNReLU(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class BasicBlock(nn.Module):
    """ResNet basic block: ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``; the shortcut is a 1×1
    convolution with BatchNorm when the channel count changes, else the identity."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = (nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, bias=False),
                                       nn.BatchNorm2d(out_channels)) if in_channels != out_channels
                         else nn.Identity())
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu1(self.bn1(self.conv1(x)))
        return self.relu2(self.bn2(self.conv2(h)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """``stem → block1 → max-pool → block2 → global average pool → head``."""

    def __init__(self, classes: int, *, channels: tuple[int, int] = (8, 16), probabilities: bool = False) -> None:
        super().__init__()
        self.out = nn.Softmax(dim=1) if probabilities else None
        self.stem = ConvBNReLU(1, channels[0])
        self.block1 = BasicBlock(channels[0], channels[1])
        self.pool = nn.MaxPool2d(2)
        self.block2 = BasicBlock(channels[1], channels[1])
        self.head = nn.Linear(channels[1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block2(self.pool(self.block1(self.stem(x))))
        logits = self.head(h.mean(dim=(2, 3)))
        return logits if self.out is None else self.out(logits)


class SequenceClassifier(nn.Module):
    """``tanh(Linear)`` input projection, a GRU or LSTM, and a head on the last time step."""

    def __init__(self, channels: int, classes: int, *, hidden: int = 32, cell: str = "gru") -> None:
        super().__init__()
        self.inp = nn.Linear(channels, hidden)
        self.act = nn.Tanh()
        self.rnn = (nn.GRU if cell == "gru" else nn.LSTM)(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.act(self.inp(x)))
        return self.head(out[:, -1])


class SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        return self.out(h.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, width: int, activation: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.act = ACTIVATIONS[activation]()
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class EncoderBlock(nn.Module):
    """Pre-LN: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, width: int, heads: int, activation: str) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = FeedForward(width, activation)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), keep)
        return x + self.mlp(self.ln2(x))


class TokenTagger(nn.Module):
    """Token and learned position embeddings, pre-LN encoder blocks, a final LayerNorm and a per-token head;
    padding keys are masked out of attention."""

    def __init__(self, vocab: int, length: int, classes: int, *, width: int = 32, depth: int = 2,
                 heads: int = 2, activation: str = "gelu") -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(length, width)
        self.blocks = nn.ModuleList(EncoderBlock(width, heads, activation) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        keep = tokens != PAD
        h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            h = block(h, keep)
        return self.head(self.norm(h))
