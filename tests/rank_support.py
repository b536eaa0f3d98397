"""A distributed trial without processes: ranks 0 and 1 of trial ``run`` recorded one after the other, the
rank read from the environment as under ``torchrun`` (input ``x`` is ``10 * rank + step``), for the GUI's
rank tests."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from comgra_ndbg import Recorder


def record_two_ranks(folder: Path, steps: int = 4) -> None:
    """Ranks 0 and 1 of trial ``run`` in ``folder``, ``steps`` steps each."""
    patch = pytest.MonkeyPatch()
    try:
        for rank in (0, 1):
            patch.setenv("RANK", str(rank))
            patch.setenv("WORLD_SIZE", "2")
            with Recorder(folder, "run") as rec:
                for step in range(steps):
                    with rec.step(step):
                        rec.register_tensor("x", torch.full((2, 3), float(10 * rank + step)), role="input")
    finally:
        patch.undo()
