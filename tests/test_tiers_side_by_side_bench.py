"""``benchmarks/tiers_side_by_side.py --kinds`` tells the default's sentinel steps, steps measured in full and
snapshot steps apart from what its recording says, so each kind's cost is its own."""
from __future__ import annotations

import torch
from torch import nn

from benchmarks.overhead import make_data
from benchmarks.tiers_side_by_side import step_kind, step_kinds
from comgra_ndbg import NeuralDbg
from comgra_ndbg.store.schema import SENTINEL_REASON


def test_a_step_kind_comes_from_its_reason_and_its_snapshots() -> None:
    assert step_kind(SENTINEL_REASON, False) == "sentinel"
    assert step_kind(f"{SENTINEL_REASON}; tiers: a gradient jumped: the next steps are measured in full",
                     False) == "sentinel"
    assert step_kind("every step", False) == "measured"
    assert step_kind("every step; every 10 steps", True) == "measured, snapshots"
    assert step_kind(None, False) == "unrecorded"


def test_the_kinds_of_a_default_run_follow_the_schedule(tmp_path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 10))
    criterion, steps = nn.CrossEntropyLoss(), 90
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    with NeuralDbg(model, tmp_path, trial="run", loss=criterion, optimizer=optimizer):
        for inputs, targets in make_data(steps):
            optimizer.zero_grad()
            criterion(model(inputs), targets).backward()
            optimizer.step()
    kinds = step_kinds(str(tmp_path), steps)
    snapshot_steps = [s for s in range(steps) if kinds[s] == "measured, snapshots"]
    assert snapshot_steps == [0, 40, 80]  # every 40th step, measured in full with the one after it
    measured = [s for s in range(steps) if kinds[s] == "measured"]
    assert measured == list(range(1, 32)) + [41, 81]  # and the first 32 steps
    assert (kinds[32:40] == "sentinel").all() and (kinds[42:80] == "sentinel").all() and (kinds[82:] == "sentinel").all()
