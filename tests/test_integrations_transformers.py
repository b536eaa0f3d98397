"""The Hugging Face Trainer callback on real ``Trainer.train()`` runs (tiny model, CPU, a few steps): steps
are optimizer steps (gradient accumulation included), the Trainer's logs and evaluation metrics become
KPIs, training is unchanged, and the top hypothesis of a broken run reaches the transformers logger."""
from __future__ import annotations

import importlib
import logging
import sys
import warnings

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from comgra_ndbg import open_recording  # noqa: E402
from comgra_ndbg.errors import InvalidArgumentError, MissingDependencyError  # noqa: E402
from comgra_ndbg.integrations.transformers import ComgraCallback  # noqa: E402


class TinyClassifier(nn.Module):
    """What the Trainer needs of a model: keyword inputs and a ``loss`` in the output when labels come."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class Poison(transformers.TrainerCallback):
    """Writes a NaN into the first layer's weight once ``step`` optimizer steps are done (an in-place edit)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, model=None, **kwargs) -> None:
        if state.global_step == self.step:
            with torch.no_grad():
                model.net[0].weight[0, 0] = float("nan")


def _data(n: int = 96) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def _train(root, callbacks: list, *, steps: int = 6, accumulation: int = 2) -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    model = TinyClassifier()
    args = transformers.TrainingArguments(
        output_dir=str(root), per_device_train_batch_size=8, per_device_eval_batch_size=32,
        gradient_accumulation_steps=accumulation, max_steps=steps, learning_rate=0.005,
        lr_scheduler_type="constant", logging_steps=1, eval_strategy="steps", eval_steps=3, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_data(), eval_dataset=_data(32),
                                   callbacks=callbacks)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        trainer.train()
    return model, trainer


def test_steps_are_optimizer_steps_and_logs_are_kpis_of_their_step_type(tmp_path) -> None:
    callback = ComgraCallback(tmp_path / "runs", trial="hf")
    _, trainer = _train(tmp_path / "out", [callback])
    assert trainer.state.global_step == 6
    with open_recording(tmp_path / "runs", "hf") as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3, 4, 5]
        assert recording.step_iterations.tolist() == [2] * 6  # the two accumulated micro-batches of each step
        steps, losses = recording.kpi("trainer/loss", "train")
        logged = [entry for entry in trainer.state.log_history if "loss" in entry and "eval_loss" not in entry]
        assert steps.tolist() == [entry["step"] - 1 for entry in logged] == [0, 1, 2, 3, 4, 5]
        assert losses.tolist() == pytest.approx([entry["loss"] for entry in logged])
        assert recording.kpi("trainer/learning_rate")[1].tolist() == pytest.approx([0.005] * 6)
        assert recording.kpi("trainer/epoch")[0].tolist() == [0, 1, 2, 3, 4, 5]  # once per step, evaluations too
        assert recording.kpi("trainer/train_runtime")[0].tolist() == [5]  # the closing summary, at the last step
        eval_steps, eval_losses = recording.kpi("trainer/eval_loss", "validation")
        evaluated = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
        assert eval_steps.tolist() == [2, 5]
        assert eval_losses.tolist() == pytest.approx([entry["eval_loss"] for entry in evaluated])
        assert recording.kpi("trainer/eval_loss", "train")[0].tolist() == []
        assert {"model.net.0", "model.net.2", "loss"} <= set(recording.nodes)
    assert callback.diagnosis is not None and callback.diagnosis.num_steps == 6
    assert callback.diagnosis.healthy, callback.diagnosis.explain()  # no false alarm on a healthy run
    assert trainer.state.log_history[-1]["comgra/failure_hypotheses"] == len(callback.diagnosis.hypotheses)


def test_evaluation_passes_are_recorded_as_their_own_step_type(tmp_path) -> None:
    callback = ComgraCallback(tmp_path / "runs", trial="hf")
    _train(tmp_path / "out", [callback])
    with open_recording(tmp_path / "runs", "hf") as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3, 4, 5]
        steps, passes = recording.kpi("eval/passes", "validation")
        assert steps.tolist() == [2, 5] and passes.tolist() == [1.0, 1.0]  # 32 samples in one batch of 32
        assert recording.kpi("eval/model.net.0/nonfinite", "validation")[1].tolist() == [0.0, 0.0]
        rms = recording.kpi("eval/model.net.2/rms", "validation")[1]
        assert rms.shape == (2,) and (rms > 0).all() and rms[0] != rms[1]  # the model trained in between
    assert callback.diagnosis.healthy, callback.diagnosis.explain()


def test_training_with_the_callback_is_bit_identical(tmp_path) -> None:
    bare, _ = _train(tmp_path / "bare", [])
    recorded, _ = _train(tmp_path / "recorded", [ComgraCallback(tmp_path / "runs", trial="same")])
    assert all(torch.equal(a, b) for a, b in zip(bare.parameters(), recorded.parameters()))
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in recorded.modules())


def test_a_broken_run_logs_its_top_hypothesis(tmp_path) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers.integrations.comgra")
    logger.addHandler(handler)
    try:
        callback = ComgraCallback(tmp_path / "runs", trial="nan")
        _, trainer = _train(tmp_path / "out", [Poison(3), callback], steps=8, accumulation=1)
    finally:
        logger.removeHandler(handler)
    top = callback.diagnosis.top
    assert top is not None and top.node.startswith("model.net.0") and top.onset == 3
    warned = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and top.sentence in warned[0]
    assert trainer.state.log_history[-1]["comgra/top_hypothesis"] == top.sentence


@pytest.mark.slow  # two processes of their own, each importing torch and the framework afresh
def test_every_rank_under_torchrun_records_and_process_zero_checks_them_across(tmp_path) -> None:
    import json
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           str(root / "tests" / "transformers_ddp_run.py"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        with open_recording(tmp_path / "runs", "hf-ddp", rank=rank) as recording:
            assert (recording.rank, recording.world_size, recording.ddp_wrapped) == (rank, 2, True)
            assert recording.steps.tolist() == [0, 1, 2, 3] and recording.step_iterations.tolist() == [1] * 4
            assert recording.kpi("trainer/loss")[0].tolist() == [0, 1, 2, 3]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["steps"] == 4
    assert [h[:3] for h in result["hypotheses"]] == [["rank_desync", "model.net.0", 2]]  # rank 1's edit, only
    assert "'model.net.0.weight' differs between ranks from step 2" in result["hypotheses"][0][3]


def test_bad_arguments_and_a_missing_framework_raise_typed_errors(monkeypatch) -> None:
    with pytest.raises(InvalidArgumentError, match="model="):
        ComgraCallback(model=None)
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "comgra_ndbg.integrations.transformers")
    with pytest.raises(MissingDependencyError, match=r"pip install 'comgra-ndbg\[transformers\]'"):
        importlib.import_module("comgra_ndbg.integrations.transformers")


def test_light_steps_record_a_trainer_run_as_full_steps_do(tmp_path, monkeypatch) -> None:
    """A sparse recording of ``Trainer.train`` (gradient accumulation, evaluation every 3 steps): with light
    steps (the steps after the first 32 that record nothing) the recording holds the same steps, KPIs and
    summary rows as with every step taken in full."""
    from comgra_ndbg.instrument import light_steps

    found, light = {}, {}
    for on in (True, False):
        monkeypatch.setattr(light_steps, "LIGHT_AFTER", 32 if on else 10 ** 9)
        callback = ComgraCallback(tmp_path / f"runs-{on}", trial="hf", summaries=10, snapshots=None)
        _train(tmp_path / f"root-{on}", [callback], steps=80)
        light[on] = callback.recording.dbg._light_steps
        with open_recording(tmp_path / f"runs-{on}", "hf") as r:
            found[on] = ({name: [a.tolist() for a in r.kpi(name)] for name in r.kpi_names  # not the clock's
                          if not name.endswith(("_runtime", "_per_second"))}, r.steps.tolist(),
                         {(t.name, kind): [a.tolist() for a in r.summary_rows(t.name, kind)]
                          for t in r.tensors for kind in r.kinds(t.name)})
    assert light[True] > 20 and light[False] == 0
    assert found[True] == found[False]
    assert found[True][0]["loss"][0] == list(range(80))
