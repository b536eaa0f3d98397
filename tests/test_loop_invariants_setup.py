"""Loop invariants about the set-up a loop trains with: the model's own train() never run (frozen stages
that train), an optimizer that holds nothing that learns, and the normalisation parameters a freeze by name
leaves out of the optimizer (a note, no failure) — tiny real training runs; and where a loop mistake ranks
against the statistical reading of its harm."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg import NeuralDbg, RecorderWarning, analyze, open_recording
from comgra_ndbg.analysis.events import CausalChain, CausalLink, Diagnosis, Event, Hypothesis
from comgra_ndbg.analysis.invariants import merge_hypotheses
from comgra_ndbg.instrument import loop_rules
from comgra_ndbg.instrument.train_dry_run import pending_train_changes


class Staged(nn.Module):
    """A small CNN whose ``train()`` freezes its first stage and keeps it in eval(), as mmpretrain's VGG does
    with ``frozen_stages``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stages = nn.Sequential(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()),
                                    nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()))
        self.head = nn.Linear(4, 3)

    def train(self, mode: bool = True) -> Staged:
        super().train(mode)
        self.stages[0].eval()
        self.stages[0].requires_grad_(False)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(x).mean((2, 3)))


class ThroughAList(Staged):
    """Its ``train()`` reaches the first stage through a plain list attribute, which a shadow shares."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = [self.stages[0]]

    def train(self, mode: bool = True) -> ThroughAList:
        nn.Module.train(self, mode)
        for stage in self.frozen:
            stage.requires_grad_(False)
        return self


def train(tmp_path: Path, model: nn.Module, loop: Callable[[], None], *, warning: str = "", **options
          ) -> tuple[list, Diagnosis]:
    """Run ``loop`` under NeuralDbg(model): the invariant log rows and the diagnosis; ``warning``: the start of
    the one recorder warning expected."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model, tmp_path, trial="t", **options):
            loop()
    messages = [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]
    assert [m.removeprefix("comgra_ndbg: ")[:len(warning)] for m in messages] == ([warning] if warning else [])
    with open_recording(tmp_path / "t") as recording:
        rows = list(recording.log(loop_rules.CATEGORY))
    return rows, analyze(tmp_path / "t")


def sgd_loop(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, *, call_train: bool = False
             ) -> Callable[[], None]:
    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        if call_train:
            model.train()
        for _ in range(steps):
            x, y = torch.randn(8, 3, 6, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    return loop


def by_invariant(rows: list) -> dict[str, tuple[int, str]]:
    return {r.detail["invariant"]: (r.step, r.detail["severity"]) for r in rows}


# ---- the model's own train() -----------------------------------------------------------------------------
def test_a_loop_that_never_calls_train_is_found_at_the_first_step_with_what_train_would_freeze(tmp_path: Path
                                                                                               ) -> None:
    model = Staged()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    before = model.stages[0][0].weight.detach().clone()
    rows, diagnosis = train(tmp_path, model, sgd_loop(model, optimizer, 6))
    assert by_invariant(rows) == {"train_not_called": (0, "failure")}
    [row] = rows
    assert row.detail["frozen"] == ["stages.0.0.weight", "stages.0.0.bias", "stages.0.1.weight", "stages.0.1.bias"]
    assert row.detail["to_eval"] == ["stages.0"] and row.detail["owners"] == ["Staged"]
    top = diagnosis.top
    assert (top.type, top.origin, top.onset, top.confidence) == ("wrong_mode", "loop", 0, 0.9)
    assert "model.train() was not called before training: Staged defines its own train()" in top.sentence
    assert "call model.train() before the first training step" in top.sentence
    # the dry run changed nothing: the stage meant to be frozen trained, in training mode
    assert model.stages[0][0].weight.requires_grad and model.stages[0].training
    assert not torch.equal(before, model.stages[0][0].weight.detach())


def test_train_called_in_the_loop_or_before_recording_is_no_violation(tmp_path: Path) -> None:
    model = Staged()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rows, diagnosis = train(tmp_path / "in_loop", model, sgd_loop(model, optimizer, 6, call_train=True))
    assert "train_not_called" not in by_invariant(rows) and loop_rules.FAILURE not in {
        r.detail["severity"] for r in rows}
    assert diagnosis.healthy

    model = Staged().train()  # called once before the recorder was made: the state holds
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    rows, diagnosis = train(tmp_path / "before", model, sgd_loop(model, optimizer, 6))
    assert "train_not_called" not in by_invariant(rows) and diagnosis.healthy


def test_the_dry_run_touches_no_flag_of_the_model_and_gives_up_when_train_reaches_it() -> None:
    model = ThroughAList()
    assert pending_train_changes(model) is None  # its train() froze the real stage through the list ...
    assert all(p.requires_grad for p in model.parameters())  # ... and the flags were put back
    plain = nn.Sequential(nn.Linear(2, 2), nn.Dropout())
    assert pending_train_changes(plain).empty and pending_train_changes(plain).owners == []
    staged = Staged()
    staged.stages[1].eval()
    changes = pending_train_changes(staged)
    assert changes.to_train == ["stages.1", "stages.1.0", "stages.1.1", "stages.1.2"]
    assert changes.to_eval == ["stages.0", "stages.0.0", "stages.0.1", "stages.0.2"]
    assert not staged.stages[1].training and staged.stages[0].training


# ---- what the optimizer holds ------------------------------------------------------------------------------
class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def freeze_all_but_bn(model: nn.Module) -> None:
    for name, parameter in model.named_parameters():
        if "bn" not in name:
            parameter.requires_grad = False


def test_an_optimizer_holding_only_frozen_parameters_is_a_failure_at_the_first_step(tmp_path: Path) -> None:
    model = Backbone()
    optimizer = torch.optim.Adam(model.fc.parameters(), lr=1e-3)
    freeze_all_but_bn(model)  # the head too: the optimizer's parameters get no gradient, BatchNorm's get one
    rows, diagnosis = train(tmp_path, model, sgd_loop(model, optimizer, 12))
    assert by_invariant(rows)["not_in_optimizer"] == (0, "failure")
    top = diagnosis.top
    assert (top.type, top.origin, top.onset) == ("update_stagnation", "optimizer", 0)
    assert "none of the parameters that get gradients is in a param group" in top.sentence


def test_normalisation_parameters_a_freeze_by_name_left_out_of_the_optimizer_are_a_note(tmp_path: Path) -> None:
    model = Backbone()
    freeze_all_but_bn(model)
    model.fc.requires_grad_(True)  # the head trains; BatchNorm's parameters get gradients, no optimizer holds them
    optimizer = torch.optim.Adam(model.fc.parameters(), lr=1e-2)
    bn_before = model.bn.weight.detach().clone()
    rows, diagnosis = train(tmp_path, model, sgd_loop(model, optimizer, 60))
    assert by_invariant(rows)["not_in_optimizer"] == (0, "info")
    assert diagnosis.hypotheses == ()  # neither a loop failure nor a stagnation of the nodes it explains
    assert any("normalisation parameter(s) get gradients but are in no param group" in n for n in diagnosis.notes)
    assert torch.equal(bn_before, model.bn.weight.detach())


class WithProjection(Backbone):
    """A projection between the features and a wider head (a layer added after the optimizer was built)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 12)
        self.projection = nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.projection(torch.relu(self.bn(self.conv(x))).mean((2, 3))))


def test_a_linear_layer_left_out_of_the_optimizer_in_a_partly_frozen_model_stays_a_failure(tmp_path: Path) -> None:
    model = WithProjection()
    model.conv.requires_grad_(False)
    model.bn.requires_grad_(False)
    optimizer = torch.optim.Adam(model.fc.parameters(), lr=1e-2)  # the projection was forgotten
    rows, diagnosis = train(tmp_path, model, sgd_loop(model, optimizer, 12))
    assert by_invariant(rows)["not_in_optimizer"] == (0, "failure")
    top = diagnosis.top
    assert (top.type, top.origin, top.node) == ("update_stagnation", "optimizer", "model.projection.parameters")


def test_an_optimizer_built_before_load_state_dict_with_assign_is_found_and_loading_by_copy_is_not(tmp_path: Path
                                                                                                  ) -> None:
    for assign in (True, False):
        model = Backbone()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        checkpoint = {name: tensor.clone() for name, tensor in Backbone().state_dict().items()}
        model.load_state_dict(checkpoint, assign=assign)  # assign: new parameter objects the optimizer lacks
        rows, diagnosis = train(tmp_path / str(assign), model, sgd_loop(model, optimizer, 6), warning=(
            "NeuralDbg recorded no training step: the model's backward passes were followed by 6 step(s) of "
            "optimizers that hold none of its parameters" if assign else ""))
        if not assign:
            assert rows == [] and diagnosis.healthy
            continue
        assert by_invariant(rows) == {"foreign_parameters": (0, "failure")}
        top = diagnosis.top
        assert (top.type, top.origin, top.onset) == ("update_stagnation", "optimizer", 0)
        assert "holds none of the model's parameters but 6 of the same shapes" in top.sentence


# ---- ranking ----------------------------------------------------------------------------------------------
def _hypothesis(kind: str, onset: int, *effects: int, family: str = "optimizer_stability") -> Hypothesis:
    root = Event(family, "model.head.parameters", "update", "stable", kind, onset, onset, 1.0, 1.0)
    links = tuple(CausalLink(root, Event("nonfinite", "model.head.parameters", "grad", "finite", "non-finite", e, e,
                                         1.0, 1.0), e - onset, "same-node") for e in effects)
    return Hypothesis(kind, "node", "model.head.parameters", onset, 0.5, kind, CausalChain(root, links))


def test_a_loop_mistake_right_where_the_harm_begins_outranks_an_early_reading_of_that_harm() -> None:
    mistake = _hypothesis("wrong_mode", 33, family="loop_invariant")
    early = _hypothesis("optimizer_divergence", 6, 32)  # a weak reading at 6, its non-finite effect at 32
    assert [h.type for h in merge_hypotheses([early], [mistake])] == ["wrong_mode", "optimizer_divergence"]
    caused = _hypothesis("optimizer_divergence", 6, 12)  # the harm began long before the loop mistake
    assert [h.type for h in merge_hypotheses([caused], [mistake])] == ["optimizer_divergence", "wrong_mode"]
    alone = _hypothesis("optimizer_divergence", 6)
    assert [h.type for h in merge_hypotheses([alone], [mistake])] == ["optimizer_divergence", "wrong_mode"]
