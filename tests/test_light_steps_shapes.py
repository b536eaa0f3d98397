"""Light steps on the loop shapes users write beyond the plain one: the recording is the one made without them.

Each loop of ``light_shapes_support`` runs three times from the same initial model, data and random state: bare, under NeuralDbg
as it runs now (light steps after the first ``LIGHT_AFTER`` steps) and under NeuralDbg with light steps
switched off. The two recordings must hold the same steps, step types, KPIs, summary rows and log, and the
three runs must train bit-identical parameters. The shapes: updates by hand (with no optimizer, and next to
an optimizer: weight clipping, an EMA copy, SAM's perturbation and an inner step between two passes),
gradients zeroed in place, accumulation over even and uneven numbers of micro-batches, optimizer steps
skipped now and then (by a condition, by a real ``GradScaler`` on inf), two tasks' gradients combined by hand,
a closure optimizer (L-BFGS), two backward calls per step, a metric pass without gradients (in train() and
in eval() mode) in the middle of a step, a scheduler stepping per batch; each with and without
``optimizer=`` where the loop has one.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from light_shapes_support import LR, SHAPES, STEPS, Watch, make_batches
from test_light_steps import Net, _fingerprint

from comgra_ndbg import NeuralDbg
from comgra_ndbg.instrument import light_steps, patches
from comgra_ndbg.errors import RecorderWarning

BY_HAND = {"hand_update", "hand_update_zeroed", "sam", "sam_zeroed", "inner_step", "inner_step_last_layer",
           "inner_step_late", "lbfgs"}
CASES = [(name, named) for name in SHAPES for named in (True, False) if name != "hand_update" or not named]


def _run(shape, named: bool, tmp_path, trial: str | None) -> tuple[Any, list[torch.Tensor]]:
    """One run of ``shape`` from the same start: bare (``trial`` None) or under NeuralDbg."""
    torch.manual_seed(0)
    model = Net()
    dbgs: list[NeuralDbg] = []

    def watch(optimizer=None, loss=None):
        if trial is None:
            return nullcontext()
        dbgs.append(NeuralDbg(model, tmp_path, trial=trial, optimizer=optimizer, loss=loss, summaries=10,
                              snapshots=None))
        return dbgs[-1]

    shape(model, watch, named)
    return (dbgs[0] if dbgs else None), [p.detach().clone() for p in model.parameters()]


def _compare(name: str | Callable, named: bool, tmp_path, monkeypatch) -> tuple[NeuralDbg, dict, dict]:
    """Run the shape (named in ``SHAPES``, or a loop of the same signature) bare, with light steps and
    without; assert the same parameters; return the first NeuralDbg and both recordings' fingerprints."""
    shape = SHAPES[name] if isinstance(name, str) else name
    _, bare = _run(shape, named, tmp_path, None)
    found, dbgs = {}, {}
    for light in (True, False):
        monkeypatch.setattr(light_steps, "LIGHT_AFTER", 32 if light else 10 ** 9)
        dbgs[light], params = _run(shape, named, tmp_path, f"light-{light}")
        found[light] = _fingerprint(tmp_path, f"light-{light}")
        assert all(torch.equal(a, b) for a, b in zip(bare, params)), f"{name}: training changed (light={light})"
    assert dbgs[False]._light_steps == 0
    return dbgs[True], found[True], found[False]


@pytest.mark.parametrize(("name", "named"), CASES,
                         ids=[f"{n}-{'optimizer=' if named else 'no optimizer='}" for n, named in CASES])
def test_each_loop_shape_records_the_same_with_light_steps(name, named, tmp_path, monkeypatch) -> None:
    dbg, light, full = _compare(name, named, tmp_path, monkeypatch)
    assert light.keys() == full.keys()
    different = [key for key in full if light[key] != full[key]]
    assert not different, (dbg._light_steps, different[:3], [(light[k], full[k]) for k in different[:1]])
    assert dbg._light_steps >= 30, dbg._light_steps
    # loops that change parameters where no optimizer of the model's steps compare all of them; others one
    assert dbg._light_hand == (name in BY_HAND)
    loss_steps, losses = light["kpis"]["loss"]
    assert loss_steps == list(range(dbg.steps)) and len(losses) == dbg.steps  # a loss at every step
    assert light["types"]["train"] == list(range(0, dbg.steps, 10))
    assert light["log"] == []


def test_a_step_by_hand_between_passes_splits_the_light_step_where_the_full_path_does(tmp_path, monkeypatch) -> None:
    """The full path ends a step where the parameters changed by hand: two steps per iteration of the loop
    below from step 50 on; light steps see it on their probe parameter and compare every parameter after."""
    dbg, light, full = _compare("inner_step_late", True, tmp_path, monkeypatch)
    assert dbg.steps == 50 + 2 * (STEPS - 50)
    assert light["steps"] == full["steps"] and light["kpis"] == full["kpis"]
    assert dbg._light_hand
    assert not _run(SHAPES["accumulated"], True, tmp_path, "plain")[0]._light_hand


def _stuck(model, watch: Watch, named: bool) -> None:
    """From step 55 on the loop neither steps its optimizer nor clears the gradients: step 55, which a light
    step hands to the full path at its fourth pass, holds 9 passes (``no_step_end``), then each pass is a step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with watch(optimizer=optimizer if named else None):
        for step, (x, y) in enumerate(make_batches(STEPS)):
            if step < 55:
                optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            if step < 55:
                optimizer.step()


@pytest.mark.parametrize("named", [True, False], ids=["optimizer=", "no optimizer="])
def test_a_loop_that_stops_stepping_and_clearing_goes_on_pass_by_pass_as_the_full_path_does(
        named, tmp_path, monkeypatch) -> None:
    dbg, light, full = _compare(_stuck, named, tmp_path, monkeypatch)
    assert dbg.steps == 92 and dbg._light_steps == 55 - 32 - 4  # 32..54 but 40, 50 (recorded) and 41, 51
    assert light == full
    loss_steps, losses = light["kpis"]["loss"]
    assert loss_steps == list(range(92)) and len(losses) == 92  # 0..54, 55 (9 passes), one per pass after
    assert light["types"]["train"] == list(range(0, 92, 10))


def test_a_listener_failing_after_a_backward_call_never_reaches_the_training_loop() -> None:
    class Failing:
        def _on_backward_call(self, roots) -> None:
            self.roots = len(roots)

        def _after_backward_call(self) -> None:
            raise RuntimeError("broken listener")

        def _before_optimizer_step(self, optimizer) -> None:
            return None

        def _after_optimizer_step_anywhere(self, optimizer) -> None:
            return None

    listener, x = Failing(), torch.ones(3, requires_grad=True)
    patches.attach(listener)
    try:
        with pytest.warns(RecorderWarning, match="looking at a backward call failed .*broken listener"):
            (x * 2).sum().backward()
    finally:
        patches.detach(listener)
    assert listener.roots == 1 and x.grad.tolist() == [2.0, 2.0, 2.0]
    assert not patches.installed()
