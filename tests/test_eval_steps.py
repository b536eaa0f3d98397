"""Evaluation passes recorded as cheap summaries of their own step type (``instrument/evaluation.py``), on
real tiny training runs: filed at the training step they follow without touching the training steps,
bit-identical training, and silent errors that only evaluation shows found, with healthy twins that raise
nothing."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, RecorderWarning, open_recording
from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.instrument import evaluation


class Calibrated(nn.Module):
    """A classifier that divides its logits by a temperature in evaluation only (temperature scaling)."""

    def __init__(self, temperature: float = 1.0, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(8, 2)
        self.register_buffer("temperature", torch.tensor(temperature))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.out(self.drop(self.act(self.fc(x))))
        return logits if self.training else logits / self.temperature


def _run(model: nn.Module, folder, *, steps: int = 6, every: int = 2, passes: int = 3, switch: bool = True,
         grad_context=torch.no_grad, dbg: bool = True, **options) -> tuple[list[torch.Tensor], object]:
    """Train ``steps`` SGD steps; after every ``every``-th, ``passes`` evaluation passes (with ``model.eval()``
    when ``switch``). Returns the evaluation outputs and the NeuralDbg (or None)."""
    torch.manual_seed(0)
    data = torch.randn(steps, 16, 4)
    targets = torch.randint(0, 2, (steps, 16))
    held_out = torch.randn(passes, 8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    outputs = []
    recorder = NeuralDbg(model, folder, trial="t", **options) if dbg else None
    try:
        for step in range(steps):
            model.train()
            optimizer.zero_grad()
            criterion(model(data[step]), targets[step]).backward()
            optimizer.step()
            if step % every == every - 1:
                if switch:
                    model.eval()
                with grad_context():
                    outputs += [model(x).clone() for x in held_out]
    finally:
        if recorder is not None:
            recorder.close()
    return outputs, recorder


def test_evaluation_runs_are_kpis_of_their_step_type_at_the_step_they_follow(tmp_path) -> None:
    torch.manual_seed(0)
    model = Calibrated()
    outputs, dbg = _run(model, tmp_path)
    assert dbg.steps == 6 and dbg.eval_runs == 3
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3, 4, 5]  # numbering untouched by 9 evaluation passes
        assert recording.steps_of_type("train").tolist() == [0, 1, 2, 3, 4, 5]
        assert set(recording.step_types) == {"train", "eval"}
        steps, passes = recording.kpi("eval/passes", "eval")
        assert steps.tolist() == [1, 3, 5] and passes.tolist() == [3.0, 3.0, 3.0]
        assert recording.kpi("eval/passes", "train")[0].tolist() == []
        last = torch.cat(outputs[-3:]).double().numpy()  # the last run: its three passes merged
        _, abs_mean = recording.kpi("eval/model/abs_mean", "eval")
        _, rms = recording.kpi("eval/model/rms", "eval")
        _, nonfinite = recording.kpi("eval/model/nonfinite", "eval")
        assert abs_mean[-1] == pytest.approx(np.abs(last).mean(), rel=1e-6)
        assert rms[-1] == pytest.approx(math.sqrt((last ** 2).mean()), rel=1e-6)
        assert nonfinite.tolist() == [0.0, 0.0, 0.0]
        assert {"eval/model.fc/rms", "eval/model.act/rms", "eval/model.out/rms"} <= set(recording.kpi_names)
        assert not [e for e in recording.log("invariant")]  # evaluation is no step without optimizer.step()
    diagnosis = dbg.diagnose()
    assert diagnosis.healthy, diagnosis.explain()


def test_training_and_evaluation_are_bit_identical_with_and_without_recording(tmp_path) -> None:
    results = []
    for case, options in enumerate(({"dbg": False}, {"record_eval": False}, {})):
        torch.manual_seed(3)
        model = Calibrated(dropout=0.2)
        outputs, _ = _run(model, tmp_path / str(case), **options)
        results.append(([p.detach().clone() for p in model.parameters()], outputs))
    for weights, outputs in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(weights, results[0][0]))
        assert all(torch.equal(a, b) for a, b in zip(outputs, results[0][1]))
    with open_recording(tmp_path / "1", "t") as recording:
        assert not [k for k in recording.kpi_names if k.startswith("eval/")]  # record_eval=False: none
        assert recording.steps.tolist() == [0, 1, 2, 3, 4, 5]


def test_nan_only_in_evaluation_is_found_and_its_healthy_twin_raises_nothing(tmp_path) -> None:
    found = {}
    for temperature in (1.0, 0.0):  # 0.0: the calibration never set the temperature; training never divides
        torch.manual_seed(0)
        _, dbg = _run(Calibrated(temperature), tmp_path / str(temperature))
        found[temperature] = dbg.diagnose()
        with open_recording(tmp_path / str(temperature), "t") as recording:
            nonfinite = recording.kpi("eval/model/nonfinite", "eval")[1]
            steps, means = recording.summary("model", "value", "mean")  # the training steps' outputs: finite
            assert steps.tolist() == [0, 1, 2, 3, 4, 5] and np.isfinite(means).all()
            assert nonfinite.tolist() == ([1.0] * 3 if temperature == 0.0 else [0.0] * 3)
            assert recording.kpi("eval/model.out/nonfinite", "eval")[1].tolist() == [0.0] * 3  # before the division
    assert found[1.0].healthy, found[1.0].explain()
    broken = found[0.0]
    assert broken.top is not None and broken.top.type == "nonfinite_evaluation"
    assert (broken.top.node, broken.top.onset) == ("model", 1)
    assert "non-finite" in broken.top.sentence and "eval" in broken.explain()


@pytest.mark.parametrize("layer", ["dropout", "batchnorm"])
def test_evaluation_in_train_mode_is_found_and_its_healthy_twin_raises_nothing(tmp_path, layer) -> None:
    """Dropout active in evaluation, or BatchNorm updating its running statistics from the evaluation data:
    the model was never switched to eval(). The evaluation runs are recorded either way."""
    statistics = {}
    for switch in (True, False):
        torch.manual_seed(0)
        model = (Calibrated(dropout=0.5) if layer == "dropout" else
                 nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)))
        folder = tmp_path / f"{layer}-{switch}"
        _, dbg = _run(model, folder, switch=switch)
        if layer == "batchnorm":
            statistics[switch] = model[1].running_mean.clone()
        diagnosis = dbg.diagnose()
        with open_recording(folder, "t") as recording:
            assert recording.kpi("eval/passes", "eval")[0].tolist() == [1, 3, 5]
            invariants = [e.detail["invariant"] for e in recording.log("invariant")]
        if switch:
            assert invariants == [] and diagnosis.healthy, diagnosis.explain()
        else:
            assert invariants == ["train_mode_evaluation"]
            assert diagnosis.top.type == "wrong_mode" and "model.eval()" in diagnosis.explain()
    if layer == "batchnorm":  # the unswitched run moved its running statistics towards the held-out data
        assert not torch.equal(statistics[True], statistics[False])


def test_eval_mode_passes_followed_by_an_optimizer_step_are_training_not_evaluation(tmp_path) -> None:
    torch.manual_seed(0)
    model = Calibrated(dropout=0.5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecorderWarning)
        with NeuralDbg(model, tmp_path, trial="t") as dbg:
            for step in range(4):
                model.train(step < 2)  # from step 2 on, training in eval() mode
                optimizer.zero_grad()
                model(torch.randn(16, 4)).pow(2).mean().backward()
                optimizer.step()
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [0, 1]
        assert "eval/passes" not in recording.kpi_names  # dropped: they were training steps
        assert [e.detail["invariant"] for e in recording.log("invariant")] == ["eval_mode_training"]
    assert dbg.eval_runs == 0


def test_inference_mode_and_evaluation_before_the_first_step(tmp_path) -> None:
    torch.manual_seed(0)
    model = Calibrated()
    with NeuralDbg(model, tmp_path, trial="t") as dbg:
        model.eval()
        with torch.inference_mode():
            model(torch.randn(8, 4))  # a sanity check: no training step to file it at
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(16, 4)).pow(2).mean().backward()
        optimizer.step()
        model.eval()
        with torch.inference_mode():
            model(torch.randn(8, 4))
            model(torch.randn(8, 4))
    with open_recording(tmp_path, "t") as recording:
        steps, passes = recording.kpi("eval/passes", "eval")
        assert steps.tolist() == [0] and passes.tolist() == [2.0]
    assert dbg.eval_runs == 1


def test_a_failing_evaluation_summary_never_breaks_training(tmp_path, monkeypatch) -> None:
    def broken(tensor: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("device lost")

    monkeypatch.setattr(evaluation, "_sums", broken)
    torch.manual_seed(0)
    model = Calibrated()
    with pytest.warns(RecorderWarning, match="evaluation"):
        outputs, dbg = _run(model, tmp_path)
    assert len(outputs) == 9 and dbg.steps == 6
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3, 4, 5]
        assert any("device lost" in p.message or "device lost" in p.detail for p in recording.problems())


@pytest.mark.parametrize("options, wrong", [({"record_eval": 1}, "record_eval"),
                                            ({"eval_step_type": ""}, "eval_step_type"),
                                            ({"eval_step_type": "train"}, "eval_step_type")])
def test_bad_evaluation_options_raise_typed_errors(tmp_path, options, wrong) -> None:
    with pytest.raises(InvalidArgumentError, match=wrong):
        NeuralDbg(Calibrated(), tmp_path, trial="t", **options)


def test_a_compiled_model_evaluation_runs_match_its_eager_outputs(tmp_path) -> None:
    """Inside a torch.compile region the module hooks stash outputs instead of recording them; an evaluation
    pass drains the stash like a training pass does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    compiled = torch.compile(model, backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = []
    with NeuralDbg(compiled, tmp_path, trial="t"):
        for _ in range(2):
            compiled.train()
            optimizer.zero_grad()
            compiled(torch.randn(16, 4)).pow(2).mean().backward()
            optimizer.step()
            compiled.eval()
            with torch.no_grad():
                compiled(torch.ones(8, 4))
                expected.append(float(model(torch.ones(8, 4)).double().pow(2).mean().sqrt()))
    with open_recording(tmp_path, "t") as recording:
        assert recording.kpi("eval/passes", "eval")[0].tolist() == [0, 1]
        assert recording.kpi("eval/model.2/rms", "eval")[1].tolist() == pytest.approx(expected, rel=1e-6)
        assert recording.problems() == []


def test_an_evaluation_pass_that_raises_leaves_the_next_training_step_intact(tmp_path) -> None:
    torch.manual_seed(0)
    model = Calibrated()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, tmp_path, trial="t") as dbg:
        for step in range(2):
            model.train()
            optimizer.zero_grad()
            model(torch.randn(16, 4)).pow(2).mean().backward()
            optimizer.step()
            model.eval()
            with torch.no_grad(), pytest.raises(RuntimeError):
                model(torch.randn(8, 5))  # a wrong shape: the pass raises inside its first layer
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [0, 1]
        assert recording.summary("model.out", "value", "mean")[0].tolist() == [0, 1]  # training outputs recorded
        assert recording.kpi("eval/passes", "eval")[1].tolist() == [1.0, 1.0]
        assert "eval/model.out/rms" not in recording.kpi_names  # no layer finished in those passes
    assert dbg.eval_runs == 2
