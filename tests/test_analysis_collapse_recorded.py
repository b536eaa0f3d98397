"""Mode collapse found in a real recording: the sample spread the recorder stores is what the collapse
analysis reads. A data pipeline that starts handing every sample of a batch the same input is found at the
step it starts, in the input, and a healthy run of the same network has no collapse event at all."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import comgra_ndbg
from comgra_ndbg import Recorder, open_recording
from test_analysis_end_to_end import FAULT_STEP, STEPS, Net


def train(folder: Path, trial: str, collapse: bool) -> None:
    torch.manual_seed(0)
    net = Net()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    centers = torch.randn(4, 16) * 2
    with Recorder(folder, trial=trial, snapshots=False) as rec:
        rec.track_module("model", net)
        for step in range(STEPS):
            y = torch.randint(0, 4, (32,))
            x = centers[y] + torch.randn(32, 16)
            if collapse and step >= FAULT_STEP:
                x = x[:1].expand_as(x).contiguous()  # the bug: every sample is the batch's first
            with rec.step(step):
                optimizer.zero_grad()
                rec.register_tensor("input", x, role="input")
                loss = rec.register_tensor("loss", nn.functional.cross_entropy(net(x, rec), y), role="loss")
                loss.backward()
                rec.record_gradients()
                optimizer.step()


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("runs")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(folder, "collapsed", collapse=True)
        train(folder, "healthy", collapse=False)
    finally:
        torch.set_num_threads(threads)
    return folder


def test_inputs_made_alike_are_a_mode_collapse_of_the_data_at_its_step(recordings: Path) -> None:
    with open_recording(recordings, "collapsed") as rec:
        for node in ("input", "blocks.0.pre", "blocks.3.out", "logits"):
            steps, spread = rec.summary(node, stat="sample_spread")
            assert steps.tolist() == list(range(STEPS))
            before = spread[FAULT_STEP - 20:FAULT_STEP]  # (the logits of the untrained network start near 0.02)
            assert (before > 0.1).all() and (spread[FAULT_STEP:] == 0).all(), node
    top = comgra_ndbg.analyze(recordings, trial="collapsed", store=False).top
    assert (top.type, top.origin, top.node, top.onset) == ("mode_collapse", "data", "input", FAULT_STEP)
    assert "Mode collapse" in top.sentence and "'input'" in top.sentence


def test_a_healthy_run_keeps_its_spread_and_has_no_collapse_event(recordings: Path) -> None:
    diagnosis = comgra_ndbg.analyze(recordings, trial="healthy", store=False)
    assert diagnosis.healthy and not [e for e in diagnosis.events if e.to_state == "collapsed"]
    with open_recording(recordings, "healthy") as rec:
        spread = rec.summary("blocks.3.out", stat="sample_spread")[1]
        assert np.isfinite(spread).all() and (spread > 0.05).all()
