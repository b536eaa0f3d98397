"""How a prediction reaches its loss, read from the loss's autograd graph (``instrument/loss_graph.py``):
an activation the loss applies again, and a prediction broadcast against its target when a function of
``torch.nn.functional`` computed the loss (no loss module whose arguments could be read)."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis import analyze
from comgra_ndbg.instrument.loss_graph import NODES, loss_mistakes

B, C = 8, 5


def _logits(classes: int = C) -> torch.Tensor:
    return torch.nn.Linear(4, classes)(torch.randn(B, 4))


def _classes() -> torch.Tensor:
    return torch.arange(B) % C


def _kinds(loss: torch.Tensor) -> list[str]:
    return [m.invariant for m in loss_mistakes(loss)]


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own broadcast warning
        return fn(*args)


@pytest.mark.parametrize("make, expected", [
    (lambda: F.binary_cross_entropy_with_logits(torch.sigmoid(_logits(1)), torch.ones(B, 1)),
     ["activation_before_loss"]),
    (lambda: nn.BCEWithLogitsLoss()(nn.Sigmoid()(_logits(1)).squeeze(1), torch.ones(B)), ["activation_before_loss"]),
    (lambda: F.binary_cross_entropy_with_logits(_logits(1), torch.ones(B, 1)), []),
    (lambda: F.binary_cross_entropy(torch.sigmoid(_logits(1)), torch.ones(B, 1)), []),
    (lambda: F.cross_entropy(torch.softmax(_logits(), 1), _classes()), ["activation_before_loss"]),
    (lambda: F.cross_entropy(torch.sigmoid(_logits()), _classes()), ["activation_before_loss"]),
    (lambda: F.cross_entropy(torch.softmax(_logits(), 1), _classes(), label_smoothing=0.1), ["activation_before_loss"]),
    (lambda: nn.CrossEntropyLoss()(torch.softmax(_logits(), 1), torch.softmax(torch.randn(B, C), 1)),
     ["activation_before_loss"]),
    (lambda: F.cross_entropy(_logits(), _classes()), []),
    (lambda: F.cross_entropy(_logits(), _classes(), label_smoothing=0.1), []),
    (lambda: F.nll_loss(torch.softmax(_logits(), 1), _classes()), ["activation_before_loss"]),
    (lambda: F.nll_loss(torch.log_softmax(_logits(), 1), _classes()), []),
    (lambda: F.nll_loss(torch.log(torch.softmax(_logits(), 1)), _classes()), []),
    (lambda: F.mse_loss(torch.sigmoid(_logits(1)), torch.rand(B, 1)), []),
])
def test_an_activation_the_loss_applies_again_is_found_and_right_inputs_are_left_alone(make, expected) -> None:
    assert _kinds(make()) == expected


def test_the_sentence_says_which_activation_and_what_it_costs() -> None:
    [bce] = loss_mistakes(F.binary_cross_entropy_with_logits(torch.sigmoid(_logits(1)), torch.ones(B, 1)))
    assert "sigmoid" in bce.message and "(0.5, 0.73)" in bce.message
    assert bce.evidence == {"activation": "sigmoid", "loss": "binary_cross_entropy_with_logits"}
    [ce] = loss_mistakes(F.cross_entropy(torch.softmax(_logits(), 1), _classes()))
    assert "softmax" in ce.message and "(0.40 for its 5 classes)" in ce.message  # e / (e + 4)


@pytest.mark.parametrize("loss_fn", [F.mse_loss, F.smooth_l1_loss, F.huber_loss, F.l1_loss])
def test_a_prediction_broadcast_against_its_target_by_a_loss_function_is_found(loss_fn) -> None:
    prediction, target = _logits(1), torch.randn(B)
    [mistake] = loss_mistakes(_quiet(loss_fn, prediction, target))
    assert mistake.invariant == "target_shape"
    assert mistake.evidence["prediction"] == [B, 1] and mistake.evidence["broadcast"] == [B, B]
    assert loss_mistakes(loss_fn(prediction.squeeze(1), target)) == []
    assert loss_mistakes(loss_fn(prediction, target.unsqueeze(1))) == []


def test_a_prediction_spread_over_a_longer_target_on_purpose_is_left_alone() -> None:
    """A ``[B, 1]`` prediction against a ``[B, D]`` target is broadcast, but the target keeps its shape: each
    sample's one value against its own D targets, not every sample against every other's."""
    assert loss_mistakes(_quiet(F.mse_loss, _logits(1), torch.randn(B, 3))) == []
    assert loss_mistakes(_quiet(F.l1_loss, _logits(1), torch.randn(B, 3))) == []


def test_a_softmax_inside_the_model_is_not_the_losss() -> None:
    """Attention's softmax feeds a matrix product, not the loss: only views and casts may stand between."""
    x = torch.randn(B, 4, 4, requires_grad=True)
    attended = torch.softmax(x @ x.transpose(1, 2), -1) @ x
    assert loss_mistakes(F.cross_entropy(attended.mean(1), _classes() % 4)) == []
    assert loss_mistakes(F.cross_entropy(torch.softmax(_logits(), 1).clamp(1e-6, 1.0).log(), _classes())) == []


def test_the_walk_stops_within_its_budget_on_a_deep_graph() -> None:
    """The loss's own nodes sit next to the root: a mistake further than the budget is not searched for."""
    h = torch.sigmoid(_logits(1))
    deep = h
    for _ in range(3 * NODES):
        deep = deep * 1.0
    assert loss_mistakes(F.binary_cross_entropy_with_logits(h, torch.ones(B, 1))) != []
    assert loss_mistakes(deep.sum()) == []
    assert loss_mistakes(torch.ones(3).sum()) == []  # no graph at all


def _train(folder: Path, trial: str, model: nn.Module, loss_of, steps: int = 80, criterion: nn.Module | None = None):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(16, 4, generator=g)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, snapshots=None):
        for _ in range(steps):
            x = torch.randn(64, 16, generator=g)
            optimizer.zero_grad()
            loss_of(model(x), x @ teacher).backward()
            optimizer.step()
    return analyze(folder / trial, store=False).hypotheses


def _mlp(out: int, *tail: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, out), *tail)


def test_a_sigmoid_before_bce_with_logits_is_the_top_hypothesis(tmp_path: Path) -> None:
    criterion = nn.BCEWithLogitsLoss()
    hypotheses = _train(tmp_path, "double", _mlp(1, nn.Sigmoid()), lambda p, t: criterion(p, (t[:, :1] > 0).float()),
                        criterion=criterion)
    top = hypotheses[0]
    assert (top.type, top.origin, top.node, top.onset) == ("output_range", "node", "model.3", 0)  # the nn.Sigmoid
    assert "already went through a sigmoid" in top.sentence and "logits" in top.remedy
    healthy = _train(tmp_path, "healthy", _mlp(1), lambda p, t: criterion(p, (t[:, :1] > 0).float()),
                     criterion=criterion)
    assert all("already went through" not in h.sentence for h in healthy)


def test_a_softmax_before_functional_cross_entropy_is_one_finding(tmp_path: Path) -> None:
    """The loss found by ``backward()`` alone (no ``loss=``): the statistical reading of the same mistake
    (the softmax pinned, an output that cannot reach its targets) is folded into the loop's finding."""
    hypotheses = _train(tmp_path, "soft", _mlp(4, nn.Softmax(dim=1)), lambda p, t: F.cross_entropy(p, t.argmax(1)))
    top = hypotheses[0]
    assert (top.type, top.origin, top.node) == ("output_range", "node", "model.3") and "softmax" in top.sentence
    assert [h for h in hypotheses if h.type == "output_range"] == [top]


def test_a_softmax_the_loop_applies_outside_the_model_is_named_at_the_loss(tmp_path: Path) -> None:
    """No module computed the activation, so no recorded node holds it: the finding is the loss's."""
    hypotheses = _train(tmp_path, "loop", _mlp(4), lambda p, t: F.cross_entropy(torch.softmax(p, 1), t.argmax(1)))
    top = hypotheses[0]
    assert (top.type, top.origin, top.node, top.onset) == ("output_range", "node", "loss", 0)


def test_a_functional_mse_broadcast_is_named_by_its_shapes(tmp_path: Path) -> None:
    hypotheses = _train(tmp_path, "bcast", _mlp(1), lambda p, t: _quiet(F.mse_loss, p, t[:, 0]))
    top = hypotheses[0]
    assert (top.type, top.origin, top.onset) == ("target_shape", "loss", 0)
    assert "[64, 1]" in top.sentence and "[64, 64]" in top.sentence
    fixed = _train(tmp_path, "fixed", _mlp(1), lambda p, t: F.mse_loss(p.squeeze(1), t[:, 0]))
    assert all(h.type != "target_shape" for h in fixed)


def test_a_summed_loss_is_read_with_its_number_of_terms() -> None:
    [summed] = loss_mistakes(F.cross_entropy(_logits(), _classes(), reduction="sum"))
    assert (summed.invariant, summed.evidence["terms"]) == ("sum_reduction", B)
    [summed] = loss_mistakes(F.mse_loss(_logits(3), torch.randn(B, 3), reduction="sum"))
    assert summed.evidence["terms"] == 3 * B
    assert loss_mistakes(F.cross_entropy(_logits(), _classes())) == []


def _summed_run(folder: Path, trial: str, lr: float):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(16, 4, generator=g)
    model = _mlp(4)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    criterion = nn.CrossEntropyLoss(reduction="sum")
    with NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, snapshots=None):
        for _ in range(80):
            x = torch.randn(256, 16, generator=g)
            optimizer.zero_grad()
            criterion(model(x), (x @ teacher).argmax(1)).backward()
            optimizer.step()
    return analyze(folder / trial, store=False)


def test_a_summed_loss_explains_an_optimizer_blown_up_from_the_first_step(tmp_path: Path) -> None:
    """``reduction='sum'`` over 256 samples with a learning rate meant for the mean: the first update is
    256× too large. With the rate divided by 256 the same sum trains, and the sum is not mentioned."""
    blown = _summed_run(tmp_path, "blown", 0.5)
    top = blown.hypotheses[0]
    assert (top.type, top.origin, top.onset) == ("optimizer_divergence", "loss", 0)
    assert "256 terms" in top.sentence and "reduction='mean'" in top.remedy
    assert [h for h in blown.hypotheses if h.type == "optimizer_divergence"] == [top]
    scaled = _summed_run(tmp_path, "scaled", 0.5 / 256)
    assert not scaled.hypotheses and not any("sums its" in note for note in scaled.notes)
