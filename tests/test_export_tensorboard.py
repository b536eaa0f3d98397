"""``comgra-ndbg export PATH --to tensorboard DIR``: the event files, read back with TensorBoard's own reader,
hold every chosen summary statistic and KPI as scalars equal to the recording's, and the snapshots' finite
element values as histograms."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from comgra_ndbg import Recorder, open_recording  # noqa: E402
from comgra_ndbg.cli import main  # noqa: E402
from comgra_ndbg.errors import InvalidArgumentError, MissingDependencyError  # noqa: E402
from comgra_ndbg.export_tensorboard import DEFAULT_STATISTICS, export_tensorboard  # noqa: E402


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two trials of a 2-layer net, 12 steps, snapshots every 5th step; trial 'nan' turns its hidden layer's
    first element non-finite from step 8 on; KPIs of the steps' own type and of step type 'validation'."""
    folder = tmp_path_factory.mktemp("tb") / "runs"
    for trial in ("ok", "nan"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        with Recorder(folder, trial, summaries=1, snapshots=5) as rec:
            rec.track_module("model", model)
            for step in range(12):
                with rec.step(step, "train"):
                    x = torch.randn(16, 4)
                    rec.register_tensor("input", x, role="input")
                    hidden = model[1](model[0](x))
                    if trial == "nan" and step >= 8:
                        hidden = hidden.clone()
                        hidden[0, 0] = float("nan")
                    rec.register_tensor("hidden", hidden)
                    loss = model[2](hidden).pow(2).mean()
                    rec.register_tensor("loss", loss, role="loss")
                    loss.backward()
                    rec.record_gradients()
                    rec.record_kpi("loss", loss)
                if step % 4 == 3:
                    rec.record_kpi("val_loss", 0.5 / (step + 1), step_type="validation")
    return folder


def _accumulator(run: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(run), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def test_the_cli_writes_one_run_per_trial_readable_by_tensorboard(group: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tb"
    assert main(["export", str(group), "--to", "tensorboard", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [str(out / "nan"), str(out / "ok"), f"view with: tensorboard --logdir {out}"] or \
        printed == [str(out / "ok"), str(out / "nan"), f"view with: tensorboard --logdir {out}"]
    for trial in ("ok", "nan"):
        accumulator = _accumulator(out / trial)
        tags = accumulator.Tags()
        with open_recording(group, trial) as recording:
            expected = {f"{t.name}/{kind}/{stat}" for t in recording.tensors for kind in recording.kinds(t.name)
                        for stat in DEFAULT_STATISTICS}
            expected |= {"kpi/train/loss", "kpi/validation/val_loss"}
            assert set(tags["scalars"]) == expected
            for tag, (node, kind, stat) in {"hidden/value/rms": ("hidden", "value", "rms"),
                                            "model.0.weight/grad/mean": ("model.0.weight", "grad", "mean"),
                                            "hidden/value/nonfinite_fraction": ("hidden", "value",
                                                                                "nonfinite_fraction")}.items():
                events = accumulator.Scalars(tag)
                steps, values = recording.summary(node, kind, stat)
                assert [e.step for e in events] == steps.tolist()
                np.testing.assert_allclose([e.value for e in events], values.astype(np.float32), rtol=1e-6)
            validation = accumulator.Scalars("kpi/validation/val_loss")
            assert [(e.step, round(e.value, 6)) for e in validation] == [(3, 0.125), (7, 0.0625), (11, 0.041667)]
            assert len(accumulator.Scalars("kpi/train/loss")) == 12
            histogram = accumulator.Histograms("hidden/value")
            assert [h.step for h in histogram] == recording.snapshot_steps("hidden").tolist() == [0, 5, 10]
            for h in histogram:
                values = recording.snapshot(h.step, "hidden").values
                finite = values[np.isfinite(values)]
                assert h.histogram_value.num == finite.size
                assert h.histogram_value.min == pytest.approx(finite.min())
                assert h.histogram_value.max == pytest.approx(finite.max())
        assert tags["tensors"] == ["comgra/diagnosis/text_summary"]
    nan_fraction = [e.value for e in _accumulator(out / "nan").Scalars("hidden/value/nonfinite_fraction")]
    assert nan_fraction[:8] == [0.0] * 8 and all(v == pytest.approx(1 / 128) for v in nan_fraction[8:])
    histogram = _accumulator(out / "nan").Histograms("hidden/value")
    # 8 samples of 8 units at step 10, the NaN left out
    assert histogram[-1].step == 10 and histogram[-1].histogram_value.num == 8 * 8 - 1


def test_values_beyond_tensorboards_buckets_keep_their_histogram(tmp_path: Path) -> None:
    with Recorder(tmp_path / "runs", "diverged", summaries=1, snapshots=1) as rec:
        for step, scale in enumerate((1.0, 1e24)):  # a diverging run's activations before they turn non-finite
            with rec.step(step):
                rec.register_tensor("hidden", torch.linspace(-1.0, 2.0, 32).reshape(4, 8) * scale)
                rec.register_tensor("loss", torch.tensor(7.7 * scale), role="loss")  # one value
    written = export_tensorboard(tmp_path / "runs", tmp_path / "tb")
    accumulator = _accumulator(written["diverged"])
    histograms = accumulator.Histograms("hidden/value")
    assert [h.step for h in histograms] == [0, 1]
    assert [h.histogram_value.num for h in histograms] == [32, 32]  # no value dropped
    assert histograms[1].histogram_value.max == pytest.approx(2e24, rel=1e-6)
    assert sum(histograms[1].histogram_value.bucket) == 32
    loss = accumulator.Histograms("loss/value")[1].histogram_value
    assert (loss.num, sum(loss.bucket)) == (1, 1) and loss.max == pytest.approx(7.7e24, rel=1e-6)


def test_chosen_statistics_one_trial_and_the_default_folder(group: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    written = export_tensorboard(group, tmp_path / "one", trial="ok", statistics=["max"], histograms=False)
    assert list(written) == ["ok"]
    tags = _accumulator(written["ok"]).Tags()
    assert "hidden/value/max" in tags["scalars"] and "hidden/value/rms" not in tags["scalars"]
    assert tags["histograms"] == []
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(group, copy)
    assert main(["export", str(copy), "--to", "tensorboard", "--trial", "ok", "--stat", "l2"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == str(copy / "tensorboard" / "ok")


def test_bad_input_is_a_typed_error_or_one_line(group: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown statistic"):
        export_tensorboard(group, tmp_path / "x", statistics=["median"])
    assert main(["export", str(group), "--to", "parquet"]) == 2
    assert "unknown export format 'parquet'; choose one of csv, json, tensorboard" in capsys.readouterr().err
    assert main(["export", str(group), "--to", "tensorboard", str(tmp_path / "a"), "--out", str(tmp_path / "b")]) == 2
    assert "give it once" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'comgra-ndbg\[tensorboard\]'"):
        export_tensorboard(group, tmp_path / "y")
