"""benchmarks/healthy_loops: a loop recorded by NeuralDbg trains bit-identically to its bare run and, being
healthy, gets no hypothesis — here for three loops that had one (a second backward call on an auxiliary
head, batches of 2, a transformer gradient that jumps once the task is learned), and the runner's own check
that a difference from the bare run would show."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.healthy_loops.harness import run_case


@pytest.mark.parametrize("name", ["two_backward_calls", "tiny_batches_noisy", "transformer_padding_mask"])
def test_a_healthy_loop_records_bit_identically_and_raises_nothing(tmp_path: Path, name: str) -> None:
    bare = run_case(name, "bare", tmp_path / "bare")
    recorded = run_case(name, "dbg", tmp_path / "dbg")
    assert bare["exception"] is None and recorded["exception"] is None, recorded["exception"]
    assert recorded["losses"] == bare["losses"] and recorded["hash"] == bare["hash"]
    assert recorded["losses"][-1] < recorded["losses"][0]
    assert {trial: a["hypotheses"] for trial, a in recorded["analysis"].items()} == {"t": []}


def test_a_loss_that_reaches_exactly_0_leaves_the_analysis_without_a_warning(tmp_path: Path) -> None:
    """A triplet loss whose margin every triplet of a batch meets is 0, and so is every gradient of that pass:
    the per-pass gradient ratios have nothing to divide (numpy warned "invalid value encountered in divide")."""
    recorded = run_case("triplet_loss", "dbg", tmp_path)
    assert recorded["exception"] is None and 0.0 in recorded["losses"]
    assert recorded["warnings"] == [] and recorded["analysis"]["t"]["hypotheses"] == []


def test_the_state_hash_sees_one_changed_bit() -> None:
    import torch
    from torch import nn

    from benchmarks.healthy_loops.harness import state_hash
    model = nn.Linear(3, 2)
    before = state_hash([model])
    with torch.no_grad():
        model.bias[0] = torch.nextafter(model.bias[0], torch.tensor(1.0))
    assert state_hash([model]) != before
