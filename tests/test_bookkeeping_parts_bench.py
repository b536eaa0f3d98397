"""``benchmarks/bookkeeping_parts.py`` splits a step's cost into a fixed part and a part per layer from runs at
two depths, and projects them onto the 8x256 MLP: the split must recover known costs, and the projection's
premise (the MLP is ``MLP_LAYERS`` such layers) must hold."""
from __future__ import annotations

import pytest
from torch import nn

from benchmarks import bookkeeping_parts
from comgra_ndbg import open_recording
from benchmarks.neuraldbg_overhead import TanhMLP

COSTS = {"bare": (100e-6, 20e-6), "floor": (180e-6, 35e-6), "NeuralDbg, everything every step": (500e-6, 55e-6),
         "Recorder, summaries every step": (400e-6, 50e-6), "NeuralDbg, nothing recorded": (150e-6, 21e-6),
         "hook entries alone": (120e-6, 20e-6)}


def test_the_line_through_two_depths_recovers_the_fixed_and_per_layer_costs(monkeypatch) -> None:
    seen = []

    def seconds(variant, make_model, data, folder, trial):
        depth = len(make_model().layers)
        seen.append((variant, depth, len(data)))
        fixed, per_layer = COSTS[variant]
        return fixed + depth * per_layer

    monkeypatch.setattr(bookkeeping_parts, "_seconds", seconds)
    lines = bookkeeping_parts.parts((2, 7), steps=4, rounds=2)
    assert set(lines) == set(COSTS)
    for variant, (fixed, per_layer) in COSTS.items():
        assert lines[variant] == (pytest.approx(fixed), pytest.approx(per_layer))
    assert sorted(seen) == sorted((v, d, 4) for v in COSTS for d in (2, 7) for _ in range(2))


def test_the_chain_is_one_output_and_two_parameters_per_layer_and_the_mlp_is_mlp_layers_of_them() -> None:
    chain = bookkeeping_parts.Chain(5, width=3)
    leaves = [m for m in chain.modules() if not list(m.children())]
    assert len(leaves) == 5 and all(isinstance(m, nn.Linear) for m in leaves)
    assert len(list(chain.parameters())) == 10
    mlp_leaves = [m for m in TanhMLP().modules() if not list(m.children())]
    assert len(mlp_leaves) == bookkeeping_parts.MLP_LAYERS and all(isinstance(m, nn.Linear) for m in mlp_leaves)
    inputs, targets = bookkeeping_parts.chain_data(2, width=3, batch=4)[0]
    assert inputs.shape == (4, 3) and targets.shape == (4,) and int(targets.max()) < 3


def test_the_recorder_variant_records_every_layer_value_gradient_and_update_at_every_step(tmp_path) -> None:
    """The explicit-Recorder loop measured here records what its docstring says (else its line would measure
    less bookkeeping than the figure names)."""
    data = bookkeeping_parts.chain_data(6)
    seconds = bookkeeping_parts.recorder_seconds(lambda: bookkeeping_parts.Chain(2), data, str(tmp_path), "r", warmup=2)
    assert 0 < seconds < 1
    with open_recording(tmp_path, "r") as rec:
        for node in ("input", "target", "layer0", "layer1", "loss"):
            assert rec.summary(node)[0].tolist() == list(range(6)), node
        for node in ("layer0", "layer1"):
            assert rec.summary(node, kind="grad")[0].tolist() == list(range(6)), node
        assert rec.summary("model.layers.0.weight", kind="update")[0].tolist() == list(range(6))
