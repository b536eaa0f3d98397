"""The output-range rule: a prediction that cannot reach its targets, named at the node that squashes one side
of its signal — on Comgra's tutorial through the compatibility layer (bugged and fixed), on a real NeuralDbg
regression with a ReLU output (and its linear twin), and on synthetic series for each route and guard."""
from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis.api import analyze
from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.output_path import signal_path, squashing_node
from comgra_ndbg.analysis.loading import load_series
from comgra_ndbg.analysis.output_range import contested, output_range_events, prediction_nodes
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.structure import NodeInfo
from comgra_ndbg.analysis.synthetic import summary_rows
from comgra_ndbg.compat.comgra import CompatibilityWarning
from comgra_ndbg.compat.comgra.tutorial import CONFIGURATIONS, Demonstration
from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode
from comgra_ndbg.store.reader import open_recording

BUGGED, FIXED = CONFIGURATIONS
TUTORIAL = dict(steps=120, batch_size=16, hidden_size=16, memory_size=8, dataset_size=256,
                min_training_steps_difference=10_000)


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tutorial")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompatibilityWarning)
        Demonstration(root, "tutorial", **TUTORIAL).run_all_configurations()
    return root / "tutorial"


def test_the_bugged_tutorial_is_explained_at_subnet_out(tutorial: Path) -> None:
    diagnosis = analyze(tutorial, trial=f"trial_{BUGGED}", store=False)
    top = diagnosis.top
    assert top is not None and (top.type, top.origin, top.node) == ("output_range", "node",
                                                                   "root_module.subnet_out__out")
    assert top.onset == 0 and top.confidence > 0.5
    assert "'root_module.subnet_out__out' is compressed: its negative values are about" in top.sentence
    assert "before the bounded output 'output' (range 0 to 1)" in top.sentence
    assert "'output' stays at or above 0.5 where the targets go down to 0" in top.sentence
    assert "the loss keeps pushing it down" in top.sentence
    assert "remove it or move it off the output layer" in top.remedy
    assert "sigmoid" in top.remedy and "cross_entropy" not in top.remedy  # the remedy of this case, not another's
    squash = top.chain.root.evidence[1]
    assert squash.series == "root_module.subnet_out__out/value/compressed:low" and squash.values[0] >= 50


def test_the_fixed_tutorial_gets_no_such_hypothesis(tutorial: Path) -> None:
    diagnosis = analyze(tutorial, trial=f"trial_{FIXED}", store=False)
    assert not [e for e in diagnosis.events if e.family == "output_range"]
    assert all(h.type != "output_range" for h in diagnosis.hypotheses)


def _regression(folder: Path, trial: str, relu_output: bool, steps: int = 150) -> None:
    """A small regression on standardised targets (half negative), its output layer with or without a ReLU."""
    torch.manual_seed(0)
    layers = [nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2)] + ([nn.ReLU()] if relu_output else [])
    model = nn.Sequential(*layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    weights = torch.randn(4, 2, generator=generator)
    with NeuralDbg(model, folder, trial=trial, optimizer=optimizer, snapshots=None):
        for _ in range(steps):
            x = torch.randn(32, 4, generator=generator)
            y = x @ weights
            y = (y - y.mean(0)) / y.std(0)
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()


def test_a_relu_on_a_regression_output_is_named_and_its_linear_twin_is_not(tmp_path: Path) -> None:
    _regression(tmp_path, "relu", relu_output=True)
    _regression(tmp_path, "linear", relu_output=False)
    top = analyze(tmp_path, trial="relu", store=False).top
    assert top is not None and (top.type, top.node) == ("output_range", "model.3")
    assert "'model.3' has no negative values at all" in top.sentence and "pushing 'model' down" in top.sentence
    assert "remove it or move it off the output layer" in top.remedy and "real-valued targets" in top.remedy
    linear = analyze(tmp_path, trial="linear", store=False)
    assert not [e for e in linear.events if e.family == "output_range"] and linear.healthy


def _gan(folder: Path, seed: int = 0, steps: int = 60) -> None:
    """A small GAN whose discriminator is recorded: one update on a real batch (target 1) and a generated
    one (target 0), then the generator's update through it with its own optimizer."""
    torch.manual_seed(seed)
    generator = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    discriminator = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Dropout(0.1), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    g = torch.Generator().manual_seed(seed)
    ones, zeros = torch.ones(16, 1), torch.zeros(16, 1)
    with NeuralDbg(discriminator, folder, trial="gan", snapshots=None):
        for _ in range(steps):
            real, noise = torch.randn(16, 2, generator=g) * 0.5 + 2, torch.randn(16, 4, generator=g)
            discriminator.zero_grad()
            loss = F.binary_cross_entropy_with_logits(discriminator(real), ones)
            with torch.no_grad():
                sample = generator(noise)
            loss = loss + F.binary_cross_entropy_with_logits(discriminator(sample), zeros)
            loss.backward()
            opt_d.step()
            generator.zero_grad()
            F.binary_cross_entropy_with_logits(discriminator(generator(noise)), ones).backward()
            opt_g.step()


def test_a_discriminator_pulled_to_both_ends_by_its_passes_is_a_game_not_a_range(tmp_path: Path) -> None:
    _gan(tmp_path)
    with open_recording(tmp_path, "gan") as recording:
        series = load_series(recording)
    low, high = series.pass_push["model"]  # real samples: every gradient < 0; generated ones: every one > 0
    assert np.all(low < -0.95) and np.all(high > 0.95)
    window = slice(40, 60)
    assert contested(series, "model", window)
    merged = replace(series, pass_push=None)  # the passes merged: one push down, the logit's negative side rare
    assert [e.node for e in output_range_events(merged)] == ["model.3"]
    assert output_range_events(series) == []
    assert not [h for h in analyze(tmp_path, trial="gan", store=False).hypotheses if h.type == "output_range"]


# ---- synthetic series --------------------------------------------------------------------------------------
def _node(name: str, role: str = "intermediate") -> GraphNode:
    return GraphNode(name, role, "", (name,), role == "parameter")


def _series(rows: dict, edges: list[tuple[str, str]], roles: dict[str, str], loss: np.ndarray):
    graph = DependencyGraph(tuple(_node(n, r) for n, r in roles.items()),
                            tuple(GraphEdge(a, b, "forward") for a, b in edges))
    return build_series(rows, roles=roles, kpis={"loss": (np.arange(len(loss)), loss)}, graph=graph)


ONE = np.ones(60)
SYMMETRIC = summary_rows(rms=ONE)
RELU = summary_rows(rms=ONE, mean=0.4 * ONE, abs_mean=0.4 * ONE, low=0.0)
PUSHED_DOWN = summary_rows(rms=ONE, mean=0.5 * ONE)


def _sigmoid(low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    return summary_rows(rms=ONE, mean=0.5 * ONE, abs_mean=0.5 * ONE, low=low, high=high, saturated=0.1 * ONE)


def test_the_walk_names_the_most_upstream_squashing_node_and_stops_at_a_weight() -> None:
    roles = {"fc": "intermediate", "act": "intermediate", "out": "output", "w": "parameter", "loss": "loss"}
    rows = {("fc", "value"): RELU, ("act", "value"): RELU, ("out", "value"): RELU, ("w", "value"): SYMMETRIC}
    s = _series(rows, [("w", "fc"), ("fc", "act"), ("act", "out"), ("out", "loss")], roles, ONE)
    s = build_series(rows, roles=roles, kpis={"loss": (np.arange(60), ONE)}, graph=s.graph,
                     info={"w": NodeInfo("Linear", (), (2, 1), 2), "fc": NodeInfo("Linear", (), (), 2)})
    assert signal_path(s, "out") == ["out", "act", "fc"]  # fc has weights of its own: the walk ends there
    found = squashing_node(s, "out", "low", slice(0, 60))
    assert (found.node, found.how) == ("fc", "removed")  # fc's own values are one-sided here
    assert squashing_node(s, "out", "high", slice(0, 60)) is None


def test_a_bounded_output_counts_only_when_pinned_at_its_bound() -> None:
    roles = {"pre": "intermediate", "out": "output", "loss": "loss"}
    edges = [("pre", "out"), ("out", "loss")]
    pinned = _series({("pre", "value"): SYMMETRIC, ("out", "value"): _sigmoid(0.001, 0.9)}, edges, roles, ONE)
    assert squashing_node(pinned, "out", "low", slice(0, 60)).how == "pinned"
    free = _series({("pre", "value"): SYMMETRIC, ("out", "value"): _sigmoid(0.3, 0.9)}, edges, roles, ONE)
    assert squashing_node(free, "out", "low", slice(0, 60)) is None  # all positive by design, not squashed


def test_the_gradient_route_and_its_guards() -> None:
    roles = {"act": "intermediate", "out": "output", "loss": "loss"}
    edges = [("act", "out"), ("out", "loss")]
    rows = {("act", "value"): RELU, ("out", "value"): RELU, ("out", "grad"): PUSHED_DOWN}
    [event] = output_range_events(_series(rows, edges, roles, ONE))
    assert (event.node, event.at_start, event.evidence[2].series) == ("act", True, "route/gradient/out")
    balanced = {**rows, ("out", "grad"): summary_rows(rms=ONE)}  # a gradient of mean 0: a free bias' work
    assert output_range_events(_series(balanced, edges, roles, ONE)) == []
    learned = np.r_[np.ones(20), np.full(40, 0.1)]  # the loss fell 10×: the output reaches its targets
    assert output_range_events(_series(rows, edges, roles, learned)) == []
    symmetric = {**rows, ("act", "value"): SYMMETRIC, ("out", "value"): SYMMETRIC}
    assert output_range_events(_series(symmetric, edges, roles, ONE)) == []  # nothing squashes the side


def test_passes_pulling_one_way_keep_the_event_and_opposite_ways_drop_it() -> None:
    roles = {"act": "intermediate", "out": "output", "loss": "loss"}
    edges = [("act", "out"), ("out", "loss")]
    rows = {("act", "value"): RELU, ("out", "value"): RELU, ("out", "grad"): PUSHED_DOWN}
    series = _series(rows, edges, roles, ONE)
    one_way = replace(series, pass_push={"out": (0.4 * ONE, 0.6 * ONE)})  # micro-batches all pushing down
    assert [e.node for e in output_range_events(one_way)] == ["act"]
    game = replace(series, pass_push={"out": (-0.9 * ONE, 0.95 * ONE)})
    assert output_range_events(game) == []
    some_steps = replace(series, pass_push={"out": (np.r_[np.full(50, 0.4), np.full(10, -0.9)], 0.95 * ONE)})
    assert [e.node for e in output_range_events(some_steps)] == ["act"]  # opposed at half the window only
    single = replace(series, pass_push={"out": (np.full(60, np.nan), np.full(60, np.nan))})
    assert [e.node for e in output_range_events(single)] == ["act"]


def test_the_target_route_compares_ranges_of_same_sized_tensors() -> None:
    roles = {"act": "intermediate", "out": "output", "y": "target", "loss": "loss"}
    edges = [("act", "out"), ("out", "loss")]
    target = summary_rows(rms=ONE, low=-1.5, high=1.5)
    rows = {("act", "value"): RELU, ("out", "value"): RELU, ("y", "value"): target}
    [event] = output_range_events(_series(rows, edges, roles, ONE))
    assert event.evidence[0].values == (0.0,) and event.evidence[0].baseline == -1.5
    class_indices = {**rows, ("y", "value"): summary_rows(rms=ONE, low=-1.5, high=1.5, count=8)}
    assert output_range_events(_series(class_indices, edges, roles, ONE)) == []


def test_probabilities_into_a_cross_entropy_stall_at_its_floor() -> None:
    roles = {"head": "intermediate", "probs": "output", "loss": "loss"}
    edges = [("head", "probs"), ("probs", "loss")]
    probs = summary_rows(rms=ONE, mean=0.1 * ONE, abs_mean=0.1 * ONE, low=0.0, high=1.0, saturated=0.9 * ONE)
    rows = {("head", "value"): SYMMETRIC, ("probs", "value"): probs}
    floor = np.log1p(9 / np.e)
    stalled = np.r_[np.full(20, np.log(10)), np.full(40, floor * 1.02)]
    [event] = output_range_events(_series(rows, edges, roles, stalled))
    assert event.node == "probs" and event.evidence[2].series == "route/probabilities/probs"
    assert output_range_events(_series(rows, edges, roles, np.r_[np.full(20, 2.3), np.full(40, 0.5)])) == []


def test_a_per_sample_loss_is_part_of_the_loss_not_the_prediction() -> None:
    roles = {"pred": "intermediate", "per_sample": "intermediate", "loss": "loss"}
    constant = summary_rows(rms=ONE, mean=ONE)  # every element's gradient the same: averaged into the loss
    rows = {("pred", "value"): SYMMETRIC, ("pred", "grad"): SYMMETRIC, ("per_sample", "value"): RELU,
            ("per_sample", "grad"): constant, ("loss", "value"): SYMMETRIC}
    s = _series(rows, [("pred", "per_sample"), ("per_sample", "loss")], roles, ONE)
    assert prediction_nodes(s) == ["pred"]


def test_thresholds_tune_the_compression_needed() -> None:
    roles = {"act": "intermediate", "out": "output", "loss": "loss"}
    leaky = summary_rows(rms=ONE, mean=0.45 * ONE, abs_mean=0.55 * ONE)  # negative side 10× smaller
    rows = {("act", "value"): leaky, ("out", "value"): leaky, ("out", "grad"): PUSHED_DOWN}
    s = _series(rows, [("act", "out"), ("out", "loss")], roles, ONE)
    assert output_range_events(s) == []  # 10× < the default 20×
    assert [e.node for e in output_range_events(s, Thresholds(range_compression=5.0))] == ["act"]


def test_a_gradient_that_is_zero_has_no_direction_and_warns_of_nothing() -> None:
    roles = {"act": "intermediate", "out": "output", "loss": "loss"}
    edges = [("act", "out"), ("out", "loss")]
    zero = summary_rows(rms=np.zeros(60), mean=np.zeros(60))  # a detached output: 0 / 0 at every step
    rows = {("act", "value"): RELU, ("out", "value"): RELU, ("out", "grad"): zero}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert output_range_events(_series(rows, edges, roles, ONE)) == []
