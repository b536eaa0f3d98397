"""The Lightning callback on real ``Trainer.fit`` runs (tiny model, CPU, a few steps): steps are optimizer
steps (gradient accumulation included), logged and validation metrics become KPIs, training is unchanged,
the top hypothesis of a broken run reaches Lightning's log and the trainer's logger."""
from __future__ import annotations

import csv
import importlib
import logging
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

pl = pytest.importorskip("lightning.pytorch")

from comgra_ndbg import RecorderWarning, open_recording  # noqa: E402
from comgra_ndbg.errors import InvalidArgumentError, MissingDependencyError  # noqa: E402
from comgra_ndbg.integrations.lightning import ComgraCallback  # noqa: E402


class TinyModule(pl.LightningModule):
    """A 2-layer classifier whose training_step calls ``self(x)``; ``poison_at`` writes a NaN into the first
    layer's weight before that optimizer step, the way an in-place edit would."""

    def __init__(self, poison_at: int | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        self.poison_at = poison_at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        if self.poison_at is not None and self.trainer.global_step >= self.poison_at:
            with torch.no_grad():
                self.net[0].weight[0, 0] = float("nan")
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: tuple, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loaders(seed: int = 0) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(96, 6, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    data = torch.utils.data.TensorDataset(x, y)
    return (torch.utils.data.DataLoader(data, batch_size=8), torch.utils.data.DataLoader(data, batch_size=32))


def _fit(module: pl.LightningModule, root, callbacks: list, *, epochs: int = 2, accumulate: int = 2,
         trainer_cls: type | None = None, loggers: bool | list = True, **options) -> pl.Trainer:
    lightning = importlib.import_module(trainer_cls.__module__.split(".")[0]) if trainer_cls else None
    csv_logger = (lightning.loggers.CSVLogger if lightning and lightning.__name__ == "pytorch_lightning"
                  else pl.loggers.CSVLogger)
    trainer = (trainer_cls or pl.Trainer)(
        max_epochs=epochs, accelerator="cpu", devices=1, limit_train_batches=6, limit_val_batches=2,
        accumulate_grad_batches=accumulate, log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(root), callbacks=callbacks,
        logger=loggers if isinstance(loggers, list) else csv_logger(str(root), name="logs") if loggers else False,
        num_sanity_val_steps=1, **options)
    train, val = _loaders()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|LeafSpec).*")
        trainer.fit(module, train, val)
    return trainer


def test_steps_are_optimizer_steps_and_metrics_are_kpis_of_their_step_type(tmp_path) -> None:
    torch.manual_seed(0)
    module = TinyModule()
    callback = ComgraCallback(tmp_path / "runs", trial="lit")
    trainer = _fit(module, tmp_path, [callback])
    assert trainer.global_step == 6  # 2 epochs x 6 batches / accumulation 2
    with open_recording(tmp_path / "runs", "lit") as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3, 4, 5]
        assert recording.steps_of_type("train").tolist() == [0, 1, 2, 3, 4, 5]
        assert recording.step_iterations.tolist() == [2] * 6  # the two accumulated micro-batches of each step
        steps, losses = recording.kpi("lightning/train_loss", "train")
        assert steps.tolist() == [0, 1, 2, 3, 4, 5]  # one value per optimizer step, not per micro-batch
        assert torch.isfinite(torch.tensor(losses)).all()
        val_steps, val_losses = recording.kpi("lightning/val_loss", "validation")
        assert val_steps.tolist() == [2, 5]  # after each epoch's last step; the sanity check is not recorded
        assert val_losses[-1] == pytest.approx(float(trainer.callback_metrics["val_loss"]))
        assert recording.kpi("lightning/val_loss", "train")[0].tolist() == []
        assert "loss" in recording.kpi_names and "model.net.0" in recording.nodes
    assert callback.diagnosis is not None and callback.diagnosis.num_steps == 6
    assert callback.diagnosis.healthy, callback.diagnosis.explain()  # no false alarm on a healthy run
    assert (callback.path / "analysis.json").exists()
    rows = list(csv.DictReader(open(next((tmp_path / "logs").rglob("metrics.csv")))))
    assert [r["comgra/failure_hypotheses"] for r in rows if r.get("comgra/failure_hypotheses")] == [
        str(float(len(callback.diagnosis.hypotheses)))]


def test_validation_inside_an_epoch_leaves_one_value_per_metric_and_step(tmp_path) -> None:
    torch.manual_seed(0)
    callback = ComgraCallback(tmp_path / "runs", trial="mid")
    trainer = _fit(TinyModule(), tmp_path, [callback], accumulate=3, loggers=False, val_check_interval=0.5)
    assert trainer.global_step == 4  # 2 epochs x 6 batches / accumulation 3; validation after every step
    with open_recording(tmp_path / "runs", "mid") as recording:
        assert recording.kpi("lightning/train_loss", "train")[0].tolist() == [0, 1, 2, 3]  # no step twice
        steps, values = recording.kpi("lightning/val_loss", "validation")
        assert steps.tolist() == [0, 1, 2, 3] and len(set(values.tolist())) == 4
        assert recording.kpi("lightning/val_loss", "train")[0].tolist() == []  # published again, not a training metric


def test_training_with_the_callback_is_bit_identical_and_leaves_no_hook(tmp_path) -> None:
    weights = []
    for callbacks in ([], [ComgraCallback(tmp_path / "runs", trial="same")]):
        torch.manual_seed(1)
        module = TinyModule()
        _fit(module, tmp_path / str(len(callbacks)), callbacks, loggers=False)
        weights.append([p.detach().clone() for p in module.parameters()])
        assert not module._forward_hooks and not module._forward_pre_hooks
        assert all(not m._forward_hooks for m in module.modules())
    assert all(torch.equal(a, b) for a, b in zip(*weights))


class CalibratedModule(TinyModule):
    """Divides its logits by a temperature outside training only; a temperature left at 0 breaks validation
    alone (training never divides)."""

    def __init__(self, temperature: float) -> None:
        super().__init__()
        self.register_buffer("temperature", torch.tensor(temperature))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.net(x)
        return logits if self.training else logits / self.temperature


def test_validation_passes_are_recorded_as_their_own_step_type(tmp_path) -> None:
    for record_eval in (True, False):
        torch.manual_seed(0)
        callback = ComgraCallback(tmp_path / "runs", trial=f"val-{record_eval}", record_eval=record_eval)
        _fit(TinyModule(), tmp_path, [callback], loggers=False)
        with open_recording(tmp_path / "runs", f"val-{record_eval}") as recording:
            assert recording.steps.tolist() == [0, 1, 2, 3, 4, 5]
            if not record_eval:
                assert not [k for k in recording.kpi_names if k.startswith("eval/")]
                continue
            steps, passes = recording.kpi("eval/passes", "validation")
            assert steps.tolist() == [2, 5] and passes.tolist() == [2.0, 2.0]  # 2 batches; no sanity check
            assert recording.kpi("eval/model.net.0/nonfinite", "validation")[1].tolist() == [0.0, 0.0]
            rms = recording.kpi("eval/model/rms", "validation")[1]
            assert np.isfinite(rms).all() and (rms > 0).all()
            assert "eval" not in recording.step_types
        assert callback.diagnosis.healthy, callback.diagnosis.explain()


def test_an_error_only_validation_shows_is_found_with_a_healthy_twin(tmp_path) -> None:
    diagnoses = {}
    for temperature in (1.0, 0.0):
        torch.manual_seed(0)
        callback = ComgraCallback(tmp_path / "runs", trial=f"t{temperature}")
        _fit(CalibratedModule(temperature), tmp_path, [callback], loggers=False)
        diagnoses[temperature] = callback.diagnosis
    assert diagnoses[1.0].healthy, diagnoses[1.0].explain()
    top = diagnoses[0.0].top
    assert top is not None and (top.type, top.node, top.onset) == ("nonfinite_evaluation", "model", 2)


def test_a_broken_run_logs_its_top_hypothesis(tmp_path) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("lightning.pytorch.callbacks.comgra")
    logger.addHandler(handler)
    try:
        torch.manual_seed(2)
        callback = ComgraCallback(tmp_path / "runs", trial="nan")
        _fit(TinyModule(poison_at=3), tmp_path, [callback], epochs=2, accumulate=1)
    finally:
        logger.removeHandler(handler)
    top = callback.diagnosis.top
    assert top is not None and (top.node, top.onset) == ("model.net.0.parameters", 3)
    warned = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and top.sentence in warned[0] and f"confidence {top.confidence:.2f}" in warned[0]


def test_the_top_hypothesis_reaches_a_tensorboard_logger_as_text(tmp_path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    torch.manual_seed(2)
    callback = ComgraCallback(tmp_path / "runs", trial="nan")
    logger = pl.loggers.TensorBoardLogger(str(tmp_path), name="tb")
    _fit(TinyModule(poison_at=3), tmp_path, [callback], epochs=1, accumulate=1, loggers=[logger])
    events = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    text = events.Tensors("comgra/diagnosis/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert callback.diagnosis.top.sentence in text and text.startswith("comgra_ndbg: ")
    assert [e.value for e in events.Scalars("comgra/failure_hypotheses")] == [len(callback.diagnosis.hypotheses)]


def test_a_module_called_by_training_step_is_recorded_through_module_argument(tmp_path) -> None:
    class CallsItsNet(TinyModule):
        def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

    torch.manual_seed(3)
    _fit(CallsItsNet(), tmp_path, [ComgraCallback(tmp_path / "runs", trial="net", module="net")], epochs=1,
         accumulate=3, loggers=False)
    with open_recording(tmp_path / "runs", "net") as recording:
        assert recording.steps.tolist() == [0, 1]
        assert {"model.0", "model.2"} <= set(recording.nodes)


def test_a_module_argument_naming_no_submodule_is_a_typed_error(tmp_path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"TinyModule has no submodule 'body'; its submodules are "
                                                   r"\['net'\]"):
        _fit(TinyModule(), tmp_path, [ComgraCallback(tmp_path / "runs", module="body")], epochs=1, loggers=False)


def test_the_pytorch_lightning_trainer_accepts_the_same_callback(tmp_path) -> None:
    legacy = pytest.importorskip("pytorch_lightning")

    class LegacyModule(legacy.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
            loss = nn.functional.cross_entropy(self(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = ComgraCallback(tmp_path / "runs", trial="legacy")
    assert isinstance(callback, legacy.Callback) and isinstance(callback, pl.Callback)
    trainer = legacy.Trainer(max_epochs=1, accelerator="cpu", devices=1, limit_train_batches=4, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=str(tmp_path), callbacks=[callback])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|LeafSpec).*")
        trainer.fit(LegacyModule(), _loaders()[0])
    with open_recording(tmp_path / "runs", "legacy") as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3]
        assert recording.kpi("lightning/train_loss")[0].tolist() == [0, 1, 2, 3]


@pytest.mark.slow  # two processes of their own, each importing torch and the framework afresh
def test_every_rank_of_a_ddp_strategy_records_and_rank_zero_checks_them_across(tmp_path) -> None:
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(root / "tests" / "lightning_ddp_run.py"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    trial = Path(result["path"]).parent
    assert sorted(p.name for p in trial.iterdir() if p.is_dir()) == ["rank0", "rank1"]  # one trial, both ranks
    for rank in (0, 1):
        with open_recording(trial.parent, trial.name, rank=rank) as recording:
            assert (recording.rank, recording.world_size, recording.ddp_wrapped) == (rank, 2, True)
            assert recording.steps.tolist() == [0, 1, 2, 3] and recording.step_iterations.tolist() == [1] * 4
            assert recording.kpi("lightning/train_loss")[0].tolist() == [0, 1, 2, 3]
    assert result["steps"] == 4
    assert [h[:3] for h in result["hypotheses"]] == [["rank_desync", "model.0", 2]]  # rank 1's edit, nothing else
    assert "'model.0.weight' differs between ranks from step 2" in result["hypotheses"][0][3]


def test_a_recorder_problem_warns_and_training_goes_on(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    torch.manual_seed(4)
    module = TinyModule()
    with pytest.warns(RecorderWarning, match="starting the recording failed"):
        trainer = _fit(module, tmp_path, [ComgraCallback(blocker / "runs")], epochs=1, loggers=False)
    assert trainer.global_step == 3


def test_bad_arguments_and_a_missing_framework_raise_typed_errors(monkeypatch) -> None:
    with pytest.raises(InvalidArgumentError, match="optimizer="):
        ComgraCallback(optimizer=None)
    with pytest.raises(InvalidArgumentError, match="attribute path"):
        ComgraCallback(module="")
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "comgra_ndbg.integrations.lightning"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "comgra_ndbg.integrations.lightning")
    with pytest.raises(MissingDependencyError, match=r"pip install 'comgra-ndbg\[lightning\]'"):
        importlib.import_module("comgra_ndbg.integrations.lightning")


def test_light_steps_record_a_lightning_run_as_full_steps_do(tmp_path, monkeypatch) -> None:
    """A sparse recording of ``Trainer.fit`` (gradient accumulation, validation every epoch): with light steps
    (the steps after the first 32 that record nothing) the recording holds the same steps, KPIs and summary
    rows as with every step taken in full."""
    from comgra_ndbg.instrument import light_steps

    found, light = {}, {}
    for on in (True, False):
        monkeypatch.setattr(light_steps, "LIGHT_AFTER", 32 if on else 10 ** 9)
        torch.manual_seed(0)
        callback = ComgraCallback(tmp_path / f"runs-{on}", trial="lit", summaries=10, snapshots=None)
        _fit(TinyModule(), tmp_path / f"root-{on}", [callback], epochs=30, loggers=False)
        light[on] = callback.recording.dbg._light_steps
        with open_recording(tmp_path / f"runs-{on}", "lit") as r:
            found[on] = ({name: [a.tolist() for a in r.kpi(name)] for name in r.kpi_names}, r.steps.tolist(),
                         {(t.name, kind): [a.tolist() for a in r.summary_rows(t.name, kind)]
                          for t in r.tensors for kind in r.kinds(t.name)})
    assert light[True] > 40 and light[False] == 0
    assert found[True] == found[False]
    kpis, steps, _ = found[True]
    assert kpis["loss"][0] == list(range(90)) and steps[:3] == [0, 10, 20]
