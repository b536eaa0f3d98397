"""``analyze`` on real recordings of real (small) training runs: a fault is found, localized and stored;
a healthy run stays quiet."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import comgra_ndbg
from comgra_ndbg import Recorder, open_recording
from comgra_ndbg.analysis import diagnosis_from_dict, query, stored_diagnosis

STEPS, FAULT_STEP, BLOCK = 110, 80, 2


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16 if i == 0 else 32, 32) for i in range(4))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, rec: Recorder) -> torch.Tensor:
        for i, linear in enumerate(self.blocks):
            pre = rec.register_tensor(f"blocks.{i}.pre", linear(x))
            x = rec.register_tensor(f"blocks.{i}.out", torch.relu(pre))
        return rec.register_tensor("logits", self.head(x), role="output")


def train(folder: Path, trial: str, fault: bool) -> None:
    torch.manual_seed(0)
    net = Net()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    centers = torch.randn(4, 16) * 2
    with Recorder(folder, trial=trial, snapshots=False) as rec:
        rec.track_module("model", net)
        for step in range(STEPS):
            if fault and step == FAULT_STEP:
                with torch.no_grad():
                    net.blocks[BLOCK].bias.fill_(-20.0)  # every unit of block 2 dies
            y = torch.randint(0, 4, (32,))
            x = centers[y] + torch.randn(32, 16)
            with rec.step(step):
                optimizer.zero_grad()
                rec.register_tensor("input", x, role="input")
                loss = rec.register_tensor("loss", nn.functional.cross_entropy(net(x, rec), y), role="loss")
                loss.backward()
                rec.record_gradients()
                optimizer.step()
                rec.record_kpi("loss", loss)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("runs")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny layers: extra threads only add contention on a busy machine
    try:
        train(folder, "faulty", fault=True)
        train(folder, "healthy", fault=False)
    finally:
        torch.set_num_threads(threads)
    return folder


def test_dead_block_is_found_localized_and_stored(recordings: Path) -> None:
    diagnosis = comgra_ndbg.analyze(recordings, trial="faulty")
    top = diagnosis.top
    assert (top.type, top.origin, top.onset) == ("dead_units", "node", FAULT_STEP)
    assert top.node == f"model.blocks.{BLOCK}"  # the parameters written outside the optimizer
    assert f"'blocks.{BLOCK}.out' went dead" in top.sentence and f"at step {FAULT_STEP}" in top.sentence
    assert "outside the optimizer" in top.remedy and f"step {FAULT_STEP}" in top.remedy
    assert 0.0 < top.confidence < 1.0
    labels = {link.effect.label for link in top.chain.links}
    assert "gradient_health:vanishing" in labels  # earlier layers lose their gradient: a coupled failure
    assert any(link.via == "backward" for link in top.chain.links)
    assert diagnosis.num_steps == STEPS and diagnosis.last_step == STEPS - 1
    with open_recording(recordings, "faulty") as rec:
        stored = rec.analysis()
        assert stored is not None and not stored.stale and stored.num_steps == STEPS
        again = diagnosis_from_dict(stored.diagnosis)
    assert again.hypotheses == diagnosis.hypotheses and again.events == diagnosis.events
    assert stored_diagnosis(recordings, trial="faulty").explain() == diagnosis.explain()


def test_healthy_run_has_no_hypothesis_and_queries_work(recordings: Path) -> None:
    diagnosis = comgra_ndbg.analyze(recordings, trial="healthy", store=False)
    assert diagnosis.healthy and diagnosis.explain() == f"No failure found in {STEPS} recorded steps."
    with open_recording(recordings, "healthy") as rec:
        assert rec.analysis() is None
    q = query(recordings, trial="faulty")
    assert q.first_step(f"blocks.{BLOCK}.out", "value", "dead_fraction", above=0.99) == FAULT_STEP
    assert q.change(f"blocks.{BLOCK}.out", "value", "rms", at=FAULT_STEP) < -10
    assert [e.onset for e in q.events(node=f"blocks.{BLOCK}.out", state="dead")] == [FAULT_STEP]
