"""Loop invariants: real training loops with a mistake in the loop, found within a step or two with the cause
named, and their healthy twins — and the patterns people use on purpose — with no such hypothesis."""
from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg import NeuralDbg, RecorderWarning, analyze, open_recording
from comgra_ndbg.analysis.events import Diagnosis
from comgra_ndbg.instrument import loop_rules

def mlp(dropout: float = 0.1, width: int = 16) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Dropout(dropout), nn.Linear(width, 3))


def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 3))


def batch(g: torch.Generator, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)


def record(tmp_path: Path, model: nn.Module, loop: Callable[[], None], **options) -> tuple[list, Diagnosis]:
    """Run ``loop`` under NeuralDbg(model); the invariant log rows and the diagnosis."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model, tmp_path, trial="t", **options):
            loop()
    assert [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)
            and "no training step" not in str(w.message)] == []
    with open_recording(tmp_path / "t") as recording:
        rows = [r for r in recording.log(loop_rules.CATEGORY)]
    return rows, analyze(tmp_path / "t")


def invariants(rows: list) -> dict[str, int]:
    """invariant -> step of its (first) row."""
    out: dict[str, int] = {}
    for row in rows:
        out.setdefault(row.detail["invariant"], row.step)
    return out


def failures(rows: list) -> set[str]:
    return {r.detail["invariant"] for r in rows if r.detail["severity"] == "failure"}


def loop_hypotheses(diagnosis: Diagnosis) -> list:
    return [h for h in diagnosis.hypotheses if h.chain.root.family == "loop_invariant"]


def sgd_loop(model: nn.Module, steps: int, *, zero: str | None = "none", step: bool = True, lr: float = 0.1,
             size: int = 8) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            x, y = batch(g, size)
            if zero == "none":
                optimizer.zero_grad()
            elif zero == "in_place":
                optimizer.zero_grad(set_to_none=False)
            F.cross_entropy(model(x), y).backward()
            if step:
                optimizer.step()
            else:
                optimizer.zero_grad()

    return loop


# ---- gradients carried over ------------------------------------------------------------------------------------
def test_a_missing_zero_grad_is_found_at_the_first_step_that_reuses_a_gradient(tmp_path: Path) -> None:
    model = mlp()
    rows, diagnosis = record(tmp_path, model, sgd_loop(model, 40, zero=None))
    assert invariants(rows) == {"stale_gradients": 1}  # step 1 is the first whose gradient held step 0's
    [row] = rows
    assert row.detail["confirmed_at"] == 2  # known by step 2's optimizer step
    top = diagnosis.top
    assert (top.type, top.origin, top.onset) == ("stale_gradients", "loop", 1)
    assert "optimizer.zero_grad() is not called" in top.sentence and "before loss.backward()" in top.sentence


@pytest.mark.parametrize("zero", ["none", "in_place"])
def test_gradients_cleared_either_way_are_no_violation(tmp_path: Path, zero: str) -> None:
    model = mlp()
    rows, diagnosis = record(tmp_path, model, sgd_loop(model, 40, zero=zero))
    assert rows == [] and loop_hypotheses(diagnosis) == []


def _dropping_loop(model: nn.Module, stop_at: int, set_to_none: bool, clip: bool = False,
                   steps: int = 100) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for step in range(steps):
            x, y = batch(g)
            if step < stop_at:
                optimizer.zero_grad(set_to_none=set_to_none)
            F.cross_entropy(model(x), y).backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)  # scales every gradient in place
            optimizer.step()

    return loop


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("stop_at", [45, 71])
def test_a_zero_grad_dropped_mid_run_between_measured_steps_is_found_at_that_step(tmp_path: Path, stop_at: int,
                                                                                  set_to_none: bool) -> None:
    """Past the first steps most steps are light and the invariants look at the steps measured in full only
    (40 and 41, 80 and 81 here): the probe's gradient surviving a step boundary it never survived before (or
    moving one in-place change less across it) sends the next steps to the full path, which dates the stale
    gradient from the step that carried it."""
    model = mlp()
    rows, diagnosis = record(tmp_path, model, _dropping_loop(model, stop_at, set_to_none))
    assert invariants(rows) == {"stale_gradients": stop_at}
    assert rows[0].detail["confirmed_at"] <= stop_at + 4
    top = diagnosis.top
    assert (top.type, top.origin, top.onset) == ("stale_gradients", "loop", stop_at)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradients_cleared_and_clipped_in_place_leave_the_light_steps_light(tmp_path: Path, set_to_none: bool) -> None:
    """Clearing and clipping move the probe's gradient alike at every step boundary: no step is sent to the
    full path for it, and no violation is reported."""
    from comgra_ndbg.recorder.sentinel_steps import SENTINEL_REASON

    model = mlp()
    rows, _ = record(tmp_path, model, _dropping_loop(model, 100, set_to_none, clip=True))
    assert rows == []
    with open_recording(tmp_path / "t") as recording:
        reasons = recording.step_reasons()
    assert all(reasons[s].startswith(SENTINEL_REASON) for s in [*range(42, 80), *range(82, 100)])


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("stop_at", [None, 57])
def test_another_models_backward_calls_are_no_step_boundary_of_the_probe(tmp_path: Path, set_to_none: bool,
                                                                          stop_at: int | None) -> None:
    """``backward()`` is patched for every model: a second model's backward calls, inside the recorded model's
    steps (every other one) and between them, neither send its light steps to the full path nor hide a
    ``zero_grad()`` it drops (the second model's optimizer steps between the recorded model's steps: one
    inside them would send them to the full path, as a GAN's do)."""
    from comgra_ndbg.recorder.sentinel_steps import SENTINEL_REASON

    model, other = mlp(), mlp()
    optimizer, other_optimizer = (torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, other))

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for step in range(100):
            x, y = batch(g)
            if stop_at is None or step < stop_at:
                optimizer.zero_grad(set_to_none=set_to_none)
            loss = F.cross_entropy(model(x), y)
            if step % 2 == 0:  # now and then inside the recorded model's step
                other_optimizer.zero_grad(set_to_none=set_to_none)
                F.cross_entropy(other(x), y).backward()
            loss.backward()
            optimizer.step()
            other_optimizer.step()
            other_optimizer.zero_grad(set_to_none=set_to_none)
            F.cross_entropy(other(x), y).backward()  # between two of its steps
            other_optimizer.step()

    rows, _ = record(tmp_path, model, loop, optimizer=optimizer)
    if stop_at is not None:
        assert invariants(rows) == {"stale_gradients": stop_at}
        return
    assert rows == []
    with open_recording(tmp_path / "t") as recording:
        reasons = recording.step_reasons()
    assert all(reasons[s].startswith(SENTINEL_REASON) for s in range(42, 78))


def test_gradient_accumulation_is_no_violation(tmp_path: Path) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for _ in range(20):
            for _ in range(4):
                x, y = batch(g)
                (F.cross_entropy(model(x), y) / 4).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)

    rows, diagnosis = record(tmp_path, model, loop)
    assert rows == [] and loop_hypotheses(diagnosis) == []


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_gan_with_alternating_optimizers_is_no_violation(tmp_path: Path, set_to_none: bool) -> None:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Dropout(0.1), nn.Linear(16, 1))
    opt_g, opt_d = torch.optim.Adam(G.parameters(), lr=1e-3), torch.optim.Adam(D.parameters(), lr=1e-3)
    real_label, fake_label = torch.ones(8, 1), torch.zeros(8, 1)
    with NeuralDbg(G, tmp_path, trial="g"), NeuralDbg(D, tmp_path, trial="d"):
        for _ in range(20):
            real, noise = torch.randn(8, 2) + 2, torch.randn(8, 4)
            D.zero_grad(set_to_none=set_to_none)
            F.binary_cross_entropy_with_logits(D(real), real_label).backward()
            with torch.no_grad():  # a sample for D's step, in train mode: one pass, not a validation loop
                sample = G(noise)
            F.binary_cross_entropy_with_logits(D(sample), fake_label).backward()
            opt_d.step()
            G.zero_grad(set_to_none=set_to_none)
            F.binary_cross_entropy_with_logits(D(G(noise)), real_label).backward()
            opt_g.step()
    for trial in ("g", "d"):
        with open_recording(tmp_path / trial) as recording:
            assert recording.log(loop_rules.CATEGORY) == [], trial
        assert loop_hypotheses(analyze(tmp_path / trial)) == []


def test_a_missing_zero_grad_keeps_training_bit_identical_and_leaves_no_hook(tmp_path: Path) -> None:
    bare, watched = mlp(dropout=0.0), mlp(dropout=0.0)
    sgd_loop(bare, 6, zero=None)()
    optimizer = torch.optim.SGD(watched.parameters(), lr=0.1)
    with NeuralDbg(watched, tmp_path, trial="t"):
        g = torch.Generator().manual_seed(1)
        for _ in range(6):
            x, y = batch(g)
            F.cross_entropy(watched(x), y).backward()
            optimizer.step()
    for a, b in zip(bare.parameters(), watched.parameters()):
        assert torch.equal(a, b) and torch.equal(a.grad, b.grad)
    assert all(not p._post_accumulate_grad_hooks for p in watched.parameters()
               if getattr(p, "_post_accumulate_grad_hooks", None) is not None)


# ---- the optimizer's parameters -------------------------------------------------------------------------------
@pytest.mark.parametrize("exact", [False, True])
def test_a_layer_replaced_after_the_optimizer_is_found_at_the_first_step(tmp_path: Path, exact: bool) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model[3] = nn.Linear(16, 3)  # a new head, after the optimizer was built

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for _ in range(30):
            x, y = batch(g)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    rows, diagnosis = record(tmp_path, model, loop, **({"optimizer": optimizer} if exact else {}))
    assert invariants(rows) == {"not_in_optimizer": 0, "foreign_parameters": 0}
    assert failures(rows) == {"not_in_optimizer", "foreign_parameters"}
    top = diagnosis.top
    assert (top.type, top.origin, top.node, top.onset) == ("update_stagnation", "optimizer", "model.3.parameters", 0)
    assert "'3.weight', '3.bias' get gradients but are in no param group" in top.sentence
    assert "add_param_group" in top.sentence


def test_the_optimizer_built_after_the_change_and_a_head_trained_on_purpose_are_no_failure(tmp_path: Path) -> None:
    model = mlp()
    model[3] = nn.Linear(16, 3)
    rows, diagnosis = record(tmp_path / "fixed", model, sgd_loop(model, 20))
    assert rows == [] and diagnosis.healthy

    model = mlp(width=64)  # fine-tuning the head only: the body still requires grad, out of the optimizer
    optimizer = torch.optim.SGD(model[3].parameters(), lr=0.1)

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for _ in range(20):
            x, y = batch(g)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    rows, diagnosis = record(tmp_path / "head", model, loop)
    assert invariants(rows) == {"not_in_optimizer": 0} and failures(rows) == set()
    assert loop_hypotheses(diagnosis) == [] and len(diagnosis.notes) == 1
    assert "of the parameters that get gradients are in the optimizer's param groups" in diagnosis.notes[0]


def test_a_missing_optimizer_step_is_found_within_three_steps(tmp_path: Path) -> None:
    model = mlp()
    rows, diagnosis = record(tmp_path, model, sgd_loop(model, 30, step=False))
    assert invariants(rows) == {"no_optimizer_step": 0}
    top = diagnosis.top
    assert (top.type, top.origin, top.onset) == ("update_stagnation", "loop", 0)
    assert "optimizer.step() is not called" in top.sentence


def test_a_step_skipped_by_a_grad_scaler_is_no_violation(tmp_path: Path) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 100)

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for step in range(20):
            x, y = batch(g)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y) * (1e30 if step < 5 else 1.0)  # overflows: 5 steps skipped
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    rows, _ = record(tmp_path, model, loop)
    assert scaler.get_scale() == 2.0 ** 95  # five steps in a row were skipped
    assert "no_optimizer_step" not in invariants(rows)


def test_a_learning_rate_of_zero_everywhere_is_found_and_a_warm_up_from_zero_is_not(tmp_path: Path) -> None:
    def scheduled(factor: Callable[[int], float], steps: int = 40) -> tuple[nn.Module, Callable[[], None]]:
        model = mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

        def loop() -> None:
            g = torch.Generator().manual_seed(1)
            for _ in range(steps):
                x, y = batch(g)
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                scheduler.step()

        return model, loop

    # a linear decay told the steps of one epoch (10) in a run of 40: the learning rate is 0 from step 10
    rows, diagnosis = record(tmp_path / "bug", *scheduled(lambda s: max(0.0, 1 - s / 10)))
    assert invariants(rows) == {"no_update": 10}
    top = diagnosis.top
    assert (top.type, top.origin, top.onset) == ("update_stagnation", "optimizer", 10)
    # no parameter changing from step 10 on is the same finding read from the statistics: one hypothesis
    assert [(h.type, h.origin) for h in diagnosis.hypotheses].count(("update_stagnation", "optimizer")) == 1
    assert top.confidence >= 0.9 and top.sentence.endswith(f"(confidence {top.confidence:.2f}).")
    with open_recording(tmp_path / "bug" / "t") as recording:
        steps, lr = recording.kpi("lr/0")
        assert steps.tolist() == list(range(40)) and lr[0] == pytest.approx(0.1) and lr[10] == 0.0

    rows, diagnosis = record(tmp_path / "warmup", *scheduled(lambda s: min(1.0, s / 5)))  # 0 at step 0 only
    assert rows == [] and loop_hypotheses(diagnosis) == []


def test_one_param_group_set_to_zero_while_the_other_trains_follows_the_stagnation_it_explains(tmp_path: Path
                                                                                                ) -> None:
    model = mlp(dropout=0.0)
    optimizer = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[3].parameters()}], lr=0.1)

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for step in range(80):
            if step == 30:
                optimizer.param_groups[0]["lr"] = 0.0  # the first layer frozen through its learning rate
            x, y = batch(g)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    _, diagnosis = record(tmp_path, model, loop)
    [stopped] = loop_hypotheses(diagnosis)
    assert (stopped.type, stopped.onset, stopped.chain.root.to_state) == ("update_stagnation", 30, "lr_group_stopped")
    assert "param group 0 fell to 0" in stopped.sentence and "requires_grad_(False)" in stopped.sentence
    top = diagnosis.top  # the failure is where the group's parameters are; the loop hypothesis says how
    assert (top.type, top.origin, top.node) == ("update_stagnation", "node", "model.0.parameters")
    assert diagnosis.hypotheses.index(stopped) > 0


# ---- the learning rate schedule ---------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["grows", "warmup_then_constant", "warmup_to_the_end"])
def test_a_rate_that_never_stops_growing_is_found_and_a_warm_up_is_not(tmp_path: Path, schedule: str) -> None:
    """× 1.05 a step from step 60 to the end (a factor applied every step): the loss gets worse from late in
    the run, and the rate had been read as instability at its late effect. A linear warm-up that ends, or that
    is still rising at the end of a short run while the loss falls, is no failure."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    steps = 200

    def lr_at(step: int) -> float:
        if schedule == "grows":
            return 0.02 * 1.05 ** max(0, step - 60)
        if schedule == "warmup_then_constant":
            return 0.02 * min(1.0, (step + 1) / 50)
        return 0.02 * (step + 1) / steps

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for step in range(steps):
            optimizer.param_groups[0]["lr"] = lr_at(step)
            _train_step(model, optimizer, *batch(g))

    _, diagnosis = record(tmp_path, model, loop)
    growth = [h for h in loop_hypotheses(diagnosis) if "never stops growing" in h.sentence]
    if schedule == "grows":
        assert [(h.type, h.origin, h.onset) for h in growth] == [("optimizer_divergence", "optimizer", 60)]
    else:
        assert growth == []


@pytest.mark.parametrize("schedule", ["step_per_batch", "warmup_cosine", "step_decay", "warm_restarts"])
def test_a_schedule_stepped_per_batch_collapses_the_rate_and_healthy_schedules_do_not(tmp_path: Path,
                                                                                       schedule: str) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = 60
    schedulers = {
        "step_per_batch": lambda: torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.1),  # epochs of 4
        "warmup_cosine": lambda: torch.optim.lr_scheduler.SequentialLR(optimizer, [
            torch.optim.lr_scheduler.LinearLR(optimizer, 0.01, 1.0, total_iters=6),
            torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps - 6)], milestones=[6]),
        "step_decay": lambda: torch.optim.lr_scheduler.MultiStepLR(optimizer, [steps // 2, 3 * steps // 4], 0.1),
        "warm_restarts": lambda: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=10),
    }
    scheduler = schedulers[schedule]()

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            x, y = batch(g)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            scheduler.step()

    _, diagnosis = record(tmp_path, model, loop)
    found = [h for h in loop_hypotheses(diagnosis) if "learning rate of param group" in h.sentence]
    if schedule == "step_per_batch":
        [h] = found
        assert (h.type, h.origin, h.onset) == ("update_stagnation", "optimizer", 12)  # 0.1 → 1e-4 by step 12
        assert "scheduler" in h.sentence and "once per epoch" in h.sentence
    else:
        assert found == [] and loop_hypotheses(diagnosis) == []


# ---- trainable share --------------------------------------------------------------------------------------------
def test_a_model_frozen_mid_run_but_for_its_norms_is_a_failure_and_a_frozen_backbone_is_a_note(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 64), nn.LayerNorm(64), nn.Tanh(), nn.Linear(64, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for step in range(30):
            if step == 12:  # a freezing helper meant for the backbone, applied to everything but the norms
                for module in model.children():
                    if not isinstance(module, nn.LayerNorm):
                        module.requires_grad_(False)
            x, y = batch(g)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    rows, diagnosis = record(tmp_path / "bug", model, loop)
    assert invariants(rows) == {"trainable_share": 12} and failures(rows) == {"trainable_share"}
    top = diagnosis.top
    assert (top.type, top.origin, top.onset) == ("update_stagnation", "architecture", 12)
    assert "only normalisation parameters still train" in top.sentence

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 3))
    model[0].requires_grad_(False)  # a backbone frozen on purpose, from the start
    optimizer = torch.optim.Adam(model[2].parameters(), lr=1e-3)
    rows, diagnosis = record(tmp_path / "frozen", model,
                             lambda: [_train_step(model, optimizer, x, y) for x, y in _batches(20)])
    assert invariants(rows) == {"trainable_share": 0} and failures(rows) == set()
    assert loop_hypotheses(diagnosis) == [] and diagnosis.healthy
    assert "of the model's parameter elements are trainable from the first step on" in diagnosis.notes[0]
    assert "Note: " in diagnosis.explain()


def _batches(steps: int, size: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [batch(g, size) for _ in range(steps)]


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


def test_an_ema_copy_inside_the_model_is_no_failure(tmp_path: Path) -> None:
    class WithEma(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()
            self.ema = copy.deepcopy(self.net).requires_grad_(False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    model = WithEma()
    optimizer = torch.optim.Adam(model.net.parameters(), lr=1e-3)

    def loop() -> None:
        for x, y in _batches(20):
            _train_step(model, optimizer, x, y)
            with torch.no_grad():
                for e, p in zip(model.ema.parameters(), model.net.parameters()):
                    e.mul_(0.9).add_(p, alpha=0.1)

    rows, diagnosis = record(tmp_path, model, loop)
    assert failures(rows) == set() and loop_hypotheses(diagnosis) == []


# ---- train / eval mode ------------------------------------------------------------------------------------------
def validation_loop(model: nn.Module, optimizer: torch.optim.Optimizer, *, call_eval: bool, call_train: bool
                    ) -> Callable[[], None]:
    def loop() -> None:
        data = _batches(30)
        for step, (x, y) in enumerate(data):
            _train_step(model, optimizer, x, y)
            if step % 10 == 9:
                if call_eval:
                    model.eval()
                with torch.no_grad():
                    for vx, _ in data[:3]:
                        model(vx)
                if call_train:
                    model.train()

    return loop


def test_training_left_in_eval_mode_after_validation_is_found_at_its_first_step(tmp_path: Path) -> None:
    model = mlp(dropout=0.3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rows, diagnosis = record(tmp_path, model, validation_loop(model, optimizer, call_eval=True, call_train=False))
    assert invariants(rows) == {"eval_mode_training": 10}
    top = diagnosis.top
    assert (top.type, top.origin, top.onset) == ("wrong_mode", "loop", 10)
    assert "model.train() was not called again" in top.sentence and "call model.train()" in top.sentence


def test_validation_in_train_mode_is_found_and_a_proper_validation_is_not(tmp_path: Path) -> None:
    model = mlp(dropout=0.3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rows, diagnosis = record(tmp_path / "bug", model, validation_loop(model, optimizer, call_eval=False,
                                                                       call_train=False))
    assert invariants(rows) == {"train_mode_evaluation": 9}
    top = diagnosis.top
    assert (top.type, top.origin, top.onset) == ("wrong_mode", "loop", 9)
    assert "call model.eval() before evaluating" in top.sentence

    model = mlp(dropout=0.3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rows, diagnosis = record(tmp_path / "ok", model, validation_loop(model, optimizer, call_eval=True,
                                                                      call_train=True))
    assert rows == [] and loop_hypotheses(diagnosis) == []


def test_batchnorm_on_one_sample_is_found_at_its_first_step(tmp_path: Path) -> None:
    def run(folder: Path, size: int) -> tuple[list, Diagnosis]:
        model = cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(size, 3, 6, 6, generator=g), torch.randint(0, 3, (size,), generator=g))
                for _ in range(20)]
        return record(folder, model, lambda: [_train_step(model, optimizer, x, y) for x, y in data])

    rows, diagnosis = run(tmp_path / "bug", 1)
    assert invariants(rows) == {"batchnorm_batch_one": 0}
    top = diagnosis.top
    assert (top.type, top.origin, top.node, top.onset) == ("batch_statistics", "node", "model.1", 0)
    rows, diagnosis = run(tmp_path / "ok", 8)
    assert rows == [] and loop_hypotheses(diagnosis) == []


# ---- unused parameters ------------------------------------------------------------------------------------------
class TwoHeads(nn.Module):
    def __init__(self, use_aux: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head, self.aux = nn.Linear(6, 16), nn.Linear(16, 3), nn.Linear(16, 3)
        self.use_aux = use_aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        aux = self.aux(h.detach())  # the auxiliary head's output is computed but never reaches the loss
        return self.head(h) + (aux if self.use_aux else 0 * aux.detach())


def test_parameters_the_loss_does_not_depend_on_are_found(tmp_path: Path) -> None:
    for use_aux, folder in ((False, "bug"), (True, "ok")):
        model = TwoHeads(use_aux)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        rows, diagnosis = record(tmp_path / folder, model,
                                 lambda: [_train_step(model, optimizer, x, y) for x, y in _batches(30)])
        if use_aux:
            assert rows == [] and loop_hypotheses(diagnosis) == []
        else:
            assert invariants(rows) == {"unused_parameters": 0}
            [h] = loop_hypotheses(diagnosis)
            assert (h.type, h.origin, h.node, h.onset) == ("unused_parameters", "node", "model.aux.parameters", 0)
            assert "'aux.weight', 'aux.bias'" in h.sentence


# ---- precision --------------------------------------------------------------------------------------------------
def test_half_precision_weights_with_adams_default_eps_are_found_at_the_first_step(tmp_path: Path) -> None:
    for eps, folder in ((1e-8, "bug"), (1e-4, "ok")):
        model = mlp(dropout=0.0).half()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=eps)
        data = [(x.half(), y) for x, y in _batches(12)]
        rows, diagnosis = record(tmp_path / folder, model, lambda: [_train_step(model, optimizer, x, y)
                                                                    for x, y in data])
        if eps == 1e-4:
            assert rows == [] and loop_hypotheses(diagnosis) == []
        else:
            assert invariants(rows) == {"half_precision_eps": 0}
            top = diagnosis.top
            assert (top.type, top.origin, top.onset) == ("precision", "optimizer", 0)
            assert "eps=1e-08" in top.sentence and "float16" in top.sentence


# ---- data ------------------------------------------------------------------------------------------------------
def test_the_same_batch_every_step_is_found_and_a_shuffled_loader_is_not(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    dataset = torch.utils.data.TensorDataset(torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g))
    for bug, folder in ((True, "bug"), (False, "ok")):
        model = mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def loop() -> None:
            loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True,
                                                 generator=torch.Generator().manual_seed(0))
            batches = iter(loader)
            for _ in range(30):
                if bug:  # the loader re-created every step, without shuffling: always its first batch
                    x, y = next(iter(torch.utils.data.DataLoader(dataset, batch_size=8)))
                else:
                    try:
                        x, y = next(batches)
                    except StopIteration:
                        batches = iter(loader)
                        x, y = next(batches)
                _train_step(model, optimizer, x, y)

        _, diagnosis = record(tmp_path / folder, model, loop)
        found = loop_hypotheses(diagnosis)
        if bug:
            top = diagnosis.top
            assert (top.type, top.origin, top.onset) == ("repeated_batch", "data", 1)
            assert "shuffle=True" in top.sentence
        else:
            assert found == []


def test_a_loader_stuck_on_one_batch_from_a_step_on_is_found_at_that_step(tmp_path: Path) -> None:
    """Different batches for 30 steps, then the same one to the end (40 more): a share of 57 % of the run,
    under the rule for a loader that restarts every step, and a stuck loader all the same."""
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(30)]
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _, diagnosis = record(tmp_path, model, lambda: [_train_step(model, optimizer, *batches[min(step, 29)])
                                                    for step in range(70)])
    top = diagnosis.top
    assert (top.type, top.origin, top.onset) == ("repeated_batch", "data", 30)
    assert "from step 29 to the last" in top.sentence


def test_raw_pixel_inputs_are_found_and_scaled_ones_are_not(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    images = [torch.randint(0, 256, (8, 3, 6, 6), generator=g).float() for _ in range(20)]
    labels = [torch.randint(0, 3, (8,), generator=g) for _ in range(20)]
    for scale, folder in ((1.0, "bug"), (1 / 255, "ok")):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(128, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        _, diagnosis = record(tmp_path / folder, model, lambda: [_train_step(model, optimizer, x * scale, y)
                                                                 for x, y in zip(images, labels)])
        if scale == 1.0:
            h = next(h for h in loop_hypotheses(diagnosis) if h.type == "unnormalised_input")
            assert (h.origin, h.onset) == ("data", 0) and "/ 255" in h.sentence
            assert diagnosis.hypotheses.index(h) == 0
        else:
            assert loop_hypotheses(diagnosis) == []


def test_a_constant_target_is_found(tmp_path: Path) -> None:
    criterion = nn.CrossEntropyLoss()
    for bug, folder in ((True, "bug"), (False, "ok")):
        model = mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def loop() -> None:
            for x, y in _batches(20):
                target = torch.zeros_like(y) if bug else y  # the label column read as the index column
                optimizer.zero_grad()
                criterion(model(x), target).backward()
                optimizer.step()

        _, diagnosis = record(tmp_path / folder, model, loop, loss=criterion)
        if bug:
            h = next(h for h in loop_hypotheses(diagnosis) if h.type == "constant_target")
            assert (h.origin, h.onset) == ("data", 0)
        else:
            assert loop_hypotheses(diagnosis) == []


def test_invariants_false_records_no_lr_and_checks_nothing(tmp_path: Path) -> None:
    model = mlp()
    rows, diagnosis = record(tmp_path, model, sgd_loop(model, 10, zero=None), invariants=False)
    assert rows == []
    with open_recording(tmp_path / "t") as recording:
        assert recording.kpi_names == ["loss"]
