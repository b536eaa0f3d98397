"""Hand-written models of the kinds people train, small enough for a test: the block structure of
torchvision's ResNet (torchvision's wheels do not match the pinned torch, so it is copied, not imported), a
Transformer encoder language model with tied embeddings, recurrent models, a U-Net, a GAN, a VAE and a
frozen-backbone classifier."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


# ---- ResNet (torchvision.models.resnet's BasicBlock and stem, two stages) ----------------------------------
class BasicBlock(nn.Module):
    """torchvision's BasicBlock: ``self.relu`` is used twice and the skip is added in place."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    """torchvision's ResNet layout with two stages of one BasicBlock each (widths 8, 16), for 3×16×16 images."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.inplanes = 8
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(8, 1)
        self.layer2 = self._make_layer(16, 1, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


# ---- Transformer encoder language model ------------------------------------------------------------------------
class TinyTransformerLM(nn.Module):
    """Token embedding plus learned positions, a post-norm ``nn.TransformerEncoder`` with a key padding
    mask, and an output projection tied to the embedding."""

    def __init__(self, vocab: int = 20, width: int = 16, heads: int = 2, layers: int = 1, length: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(length, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=32, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) * math.sqrt(self.embed.embedding_dim) + self.position[:tokens.shape[1]]
        return self.head(self.encoder(h, src_key_padding_mask=padding))


# ---- recurrent models -------------------------------------------------------------------------------------------
class LSTMClassifier(nn.Module):
    def __init__(self, vocab: int = 12, width: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, batch_first=True)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, (h, _) = self.lstm(self.embed(tokens))
        return self.head(h[-1])


class GRUCellLoop(nn.Module):
    """A ``GRUCell`` stepped over the sequence in ``forward``: one call of the cell per time step."""

    def __init__(self, features: int = 4, width: int = 8, steps: int = 3) -> None:
        super().__init__()
        self.cell = nn.GRUCell(features, width)
        self.head = nn.Linear(width, 1)
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], self.cell.hidden_size)
        for t in range(self.steps):
            h = self.cell(x[:, t], h)
        return self.head(h)


# ---- U-Net -----------------------------------------------------------------------------------------------------
class UNet(nn.Module):
    """Two levels: the encoder's features are concatenated into the decoder (skip connections)."""

    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU())
        self.down = nn.MaxPool2d(2)
        self.enc2 = nn.Sequential(nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(2 * channels, channels, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(2 * channels, channels, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(channels, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.down(e1))
        return self.out(self.dec(torch.cat([self.up(e2), e1], dim=1)))


# ---- GAN ---------------------------------------------------------------------------------------------------------
class Generator(nn.Module):
    def __init__(self, noise: int = 4, width: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(noise, width), nn.ReLU(), nn.Linear(width, 2))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, width), nn.LeakyReLU(0.2), nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# ---- VAE ----------------------------------------------------------------------------------------------------------
class VAE(nn.Module):
    """Encoder to mean and log-variance, reparameterised sample (noise from the global RNG), decoder."""

    def __init__(self, features: int = 8, latent: int = 2, width: int = 16) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(features, width), nn.ReLU())
        self.mu = nn.Linear(width, latent)
        self.logvar = nn.Linear(width, latent)
        self.decoder = nn.Sequential(nn.Linear(latent, width), nn.ReLU(), nn.Linear(width, features))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.encoder(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.decoder(z), mu, logvar


def vae_loss(recon: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """Reconstruction plus KL divergence to the standard normal: the two-term loss of a VAE."""
    kl = -0.5 * torch.mean(torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=1))
    return F.mse_loss(recon, x) + 0.1 * kl


# ---- frozen backbone ----------------------------------------------------------------------------------------------
class FineTune(nn.Module):
    """A convolutional backbone (frozen by the training script) and a new classification head."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                      nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten())
        self.head = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


# ---- activation checkpointing ----------------------------------------------------------------------------------
class Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class CheckpointedMLP(nn.Module):
    """A stem, two residual blocks run under ``torch.utils.checkpoint`` (``reentrant``: True, False, or None
    for no checkpointing) and a head."""

    def __init__(self, reentrant: bool | None, width: int = 8) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.stem = nn.Linear(6, width)
        self.blocks = nn.ModuleList([Residual(width), Residual(width)])
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h) if self.reentrant is None else checkpoint(block, h, use_reentrant=self.reentrant)
        return self.head(h)


# ---- a model returning a hidden tensor that it also goes on computing with ------------------------------------
class HiddenAndLogits(nn.Module):
    """Returns ``(h, logits)`` where ``logits`` are computed from ``h``: the output is also used inside."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(6, 8)
        self.l2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.l1(x))
        return h, self.l2(h)
