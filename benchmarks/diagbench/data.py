"""diagbench data sets, made in-process from a seed (no download, no file).

One generator per task, each returning plain tensors; ``pipeline.py`` turns them into batches the way a
data loader does (normalisation included), and that is where the data-pipeline faults live.

- ``clusters``: Gaussian clusters in ``dim`` dimensions, ``classes`` classes, optional label noise.
- ``two_views``: the same classes seen through two feature groups ("modalities") of different size.
- ``prototype_images``: raw 0–255 grey images, each class a smooth random prototype, shifted and noisy.
- ``sequences``: float sequences whose class is the channel with the largest sum over time.
- ``token_sequences``: padded token sequences; each real position is labelled 1 when its token already
  appeared earlier in the sequence (attention is needed), padding positions are ``IGNORE``.
- ``reconstruction``: points on a low-dimensional manifold squashed into (0, 1), for the autoencoder.
"""
from __future__ import annotations

import torch

IGNORE = -100  # the ignore_index of torch's cross-entropy, used for padding positions
PAD = 0


def _generator(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(1_000_003 * salt + seed)


def clusters(seed: int, *, n: int = 4096, dim: int = 32, classes: int = 10, separation: float = 1.2,
             label_noise: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: class centres at distance ~``separation`` × 3, unit noise, a share of random labels."""
    g = _generator(seed, 1)
    centres = torch.randn(classes, dim, generator=g) * separation / dim ** 0.5 * 3
    y = torch.randint(0, classes, (n,), generator=g)
    x = centres[y] + torch.randn(n, dim, generator=g)
    if label_noise > 0:
        noisy = torch.rand(n, generator=g) < label_noise
        y = torch.where(noisy, torch.randint(0, classes, (n,), generator=g), y)
    return x, y


def two_views(seed: int, *, n: int = 4096, dims: tuple[int, int] = (16, 24), classes: int = 6,
              separation: tuple[float, float] = (1.0, 0.8)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(xa, xb, y)``: each view alone is only partly informative, together they are better."""
    g = _generator(seed, 2)
    y = torch.randint(0, classes, (n,), generator=g)
    views = []
    for dim, sep in zip(dims, separation):
        centres = torch.randn(classes, dim, generator=g) * sep / dim ** 0.5 * 3
        views.append(centres[y] + torch.randn(n, dim, generator=g))
    return views[0], views[1], y


def prototype_images(seed: int, *, n: int = 2048, size: int = 12, classes: int = 6) -> tuple[torch.Tensor,
                                                                                          torch.Tensor]:
    """``(images, y)``: ``images`` are raw grey levels in [0, 255], shape ``(n, 1, size, size)``."""
    g = _generator(seed, 3)
    coarse = torch.rand(classes, 1, size // 3, size // 3, generator=g)
    prototypes = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    y = torch.randint(0, classes, (n,), generator=g)
    images = prototypes[y]
    shifts = torch.randint(-1, 2, (n, 2), generator=g)
    images = torch.stack([torch.roll(img, (int(a), int(b)), dims=(1, 2)) for img, (a, b) in zip(images, shifts)])
    images = images + 0.25 * torch.randn(images.shape, generator=g)
    return (images.clamp(0, 1) * 255).round(), y


def sequences(seed: int, *, n: int = 4096, length: int = 16, channels: int = 4) -> tuple[torch.Tensor,
                                                                                         torch.Tensor]:
    """``(x, y)``: ``x`` of shape ``(n, length, channels)``; ``y`` the channel whose sum over time is largest."""
    g = _generator(seed, 4)
    x = torch.randn(n, length, channels, generator=g) + 0.3 * torch.randn(n, 1, channels, generator=g)
    return x, x.sum(dim=1).argmax(dim=1)


def token_sequences(seed: int, *, n: int = 4096, length: int = 16, vocab: int = 24,
                    min_length: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, labels)`` of shape ``(n, length)``: tokens in ``1..vocab-1`` then ``PAD``; a label is 1 when
    the position's token occurred earlier in the sequence, 0 when not, ``IGNORE`` at padding."""
    g = _generator(seed, 5)
    tokens = torch.randint(1, vocab, (n, length), generator=g)
    lengths = torch.randint(min_length, length + 1, (n,), generator=g)
    positions = torch.arange(length)
    real = positions[None, :] < lengths[:, None]
    tokens = torch.where(real, tokens, torch.full_like(tokens, PAD))
    earlier = (tokens[:, :, None] == tokens[:, None, :]) & (positions[None, None, :] < positions[None, :, None])
    labels = earlier.any(dim=2).long()
    return tokens, torch.where(real, labels, torch.full_like(labels, IGNORE))


def reconstruction(seed: int, *, n: int = 4096, dim: int = 32, rank: int = 6,
                   noise: float = 0.05) -> torch.Tensor:
    """Points ``sigmoid(z W + noise)`` with ``z`` of dimension ``rank``: in (0, 1), shape ``(n, dim)``."""
    g = _generator(seed, 6)
    z = torch.randn(n, rank, generator=g)
    w = torch.randn(rank, dim, generator=g) / rank ** 0.5 * 1.5
    return torch.sigmoid(z @ w + noise * torch.randn(n, dim, generator=g))


def sensor_units(x: torch.Tensor, seed: int) -> torch.Tensor:
    """``x`` (roughly standard) expressed in raw "sensor units": per-feature scales of 5–50 and offsets of
    −50–150, which a pipeline's standardisation removes again."""
    g = _generator(seed, 7)
    scale = 5 + 45 * torch.rand(x.shape[1:], generator=g)
    offset = -50 + 200 * torch.rand(x.shape[1:], generator=g)
    return x * scale + offset
