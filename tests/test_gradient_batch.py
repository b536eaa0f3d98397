"""Gradients kept by hooks and summarised when the backward pass ends (``recorder.gradient_batch``).

Deferring the summaries must not change what is recorded: the rows equal summaries of the gradients the
user's own hooks saw, also where autograd hands one gradient to two places (a residual sum) or sums two
contributions; a gradient changed in place before the pass ends is reported, never recorded wrong.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import Recorder, RecorderWarning, open_recording
from comgra_ndbg.stats.reducer import summarize
from comgra_ndbg.stats.statistics import derive


def grad_row(path: Path, name: str, step: int = 0) -> np.ndarray:
    with open_recording(path, "t") as recording:
        steps, rows = recording.summary_rows(name, "grad")
        return rows[list(steps).index(step)]


def test_deferred_rows_equal_the_gradients_the_hooks_saw(tmp_path: Path) -> None:
    torch.manual_seed(0)
    lin1, lin2 = nn.Linear(6, 8), nn.Linear(8, 8)
    seen: dict[str, torch.Tensor] = {}
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        with rec.step(0):
            x = torch.randn(5, 6)
            h = torch.tanh(lin1(x))
            r = h + lin2(h)  # h feeds two consumers; AddBackward hands r's gradient to both of its inputs
            out = (r * r).sum() + r.mean()
            for name, t in (("h", h), ("r", r)):
                rec.register_tensor(name, t)
                t.register_hook(lambda g, name=name: seen.__setitem__(name, g.clone()))
            out.backward()
            rec.record_gradients()
    for name in ("h", "r"):
        expected = summarize(seen[name], batched=True)
        np.testing.assert_allclose(grad_row(tmp_path, name), expected, rtol=1e-6, atol=1e-9)


class _ScaleBackwardInPlace(torch.autograd.Function):
    """Identity forward; its backward doubles the incoming gradient in place and passes that tensor on."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad.mul_(2)


def test_a_gradient_changed_in_place_after_its_hook_is_dropped_with_a_warning(tmp_path: Path) -> None:
    w = torch.randn(4, 3, requires_grad=True)
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        with rec.step(0):
            h = _ScaleBackwardInPlace.apply(w)
            rec.register_tensor("h", h)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                (h * 3).sum().backward()
            rec.record_gradients()
    messages = [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]
    assert any("changed in place before the backward pass ended" in m for m in messages), messages
    with open_recording(tmp_path, "t") as recording:
        assert "grad" not in recording.kinds("h")
    torch.testing.assert_close(w.grad, torch.full((4, 3), 6.0))  # training saw what it always sees


def test_a_deferred_gradient_given_outside_a_backward_pass_is_summarised_at_once(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        with rec.step(0):
            rec.register_tensor("h", torch.zeros(2, 3))
            given = torch.arange(6.0).reshape(2, 3)
            rec.record_gradient("h", given, deferred=True)
            given.zero_()  # the caller reuses its buffer right away: the summary was taken before
    stats = derive(grad_row(tmp_path, "h")[None])
    assert stats["max"][0] == 5.0 and stats["mean"][0] == 2.5


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return x * 1.0

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        raise RuntimeError("backward failed on purpose")


def test_gradients_kept_before_a_failed_backward_pass_are_still_recorded(tmp_path: Path) -> None:
    w = torch.randn(3, 4, requires_grad=True)
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        with rec.step(0):
            h = _FailingBackward.apply(w)
            rec.register_tensor("h", h)
            with pytest.raises(RuntimeError, match="on purpose"):
                (2 * h).sum().backward()  # h's hook ran, then the engine stopped without its final callbacks
    stats = derive(grad_row(tmp_path, "h")[None])
    assert stats["mean"][0] == 2.0 and stats["count"][0] == 12
