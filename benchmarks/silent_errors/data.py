"""Synthetic stand-ins for the data sets of the original reproductions, made in-process.

Each generator yields batches of the original's shapes (MNIST 1×28×28, CIFAR 3×32×32, token sequences)
drawn from a seeded generator: images are class prototypes plus noise, so a working model learns them
within a few dozen steps and a broken one visibly does not.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["image_batches", "token_pairs"]


def image_batches(shape: tuple[int, ...], num_classes: int, batch_size: int, steps: int, *,
                  seed: int, noise: float = 0.5) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of ``(images, labels)``: each image its class prototype (unit normal, fixed by
    ``seed``) plus Gaussian ``noise``; labels uniform over ``num_classes``.

    >>> x, y = next(image_batches((1, 28, 28), 10, 30, 1, seed=0))
    >>> tuple(x.shape), tuple(y.shape), y.dtype
    ((30, 1, 28, 28), (30,), torch.int64)
    """
    generator = torch.Generator().manual_seed(seed)
    prototypes = torch.randn((num_classes, *shape), generator=generator)
    for _ in range(steps):
        labels = torch.randint(0, num_classes, (batch_size,), generator=generator)
        images = prototypes[labels] + noise * torch.randn((batch_size, *shape), generator=generator)
        yield images, labels


def token_pairs(vocabulary: int, length: int, batch_size: int, steps: int, *,
                seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of ``(source, target)`` token ids for a toy translation: the target is the source
    reversed and shifted by one in the vocabulary (id 0 is padding and never drawn).

    >>> source, target = next(token_pairs(16, 5, 2, 1, seed=0))
    >>> bool(((target.flip(1) - 2) % 15 + 1 == source).all())
    True
    """
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        source = torch.randint(1, vocabulary, (batch_size, length), generator=generator)
        target = (source.flip(1) % (vocabulary - 1)) + 1
        yield source, target
