"""``record_kpi(..., step_type=)``: a KPI filed under another step type than its step's (validation metrics
at a training step), inside a step and between steps, read back per step type."""
from __future__ import annotations

import pytest
import torch

from comgra_ndbg import Recorder, open_recording
from comgra_ndbg.errors import InvalidArgumentError


def test_kpis_of_another_step_type_are_read_back_apart(tmp_path) -> None:
    with Recorder(tmp_path, "t") as rec:
        for step in range(4):
            with rec.step(step, "train"):
                rec.register_tensor("x", torch.ones(2, 2), role="input")
                rec.record_kpi("loss", torch.tensor(1.0 + step))
                if step == 1:
                    rec.record_kpi("val_loss", torch.tensor(0.5), step_type="validation")  # inside the step
            if step % 2 == 1:
                rec.record_kpi("val_loss", 0.25 * step, step_type="validation")  # between steps: the last one
        rec.record_kpi("loss_after", 9.0)  # between steps, no step type: the last step's own
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps_of_type("train").tolist() == [0, 1, 2, 3]
        assert recording.steps_of_type("validation").tolist() == []  # KPIs only: no recorded step of that type
        assert recording.kpi("loss", "train")[1].tolist() == [1.0, 2.0, 3.0, 4.0]
        assert recording.kpi("loss", "validation")[0].tolist() == []
        steps, values = recording.kpi("val_loss", "validation")
        assert list(zip(steps.tolist(), values.tolist())) == [(1, 0.5), (1, 0.25), (3, 0.75)]
        assert recording.kpi("val_loss", "train")[0].tolist() == []
        assert recording.kpi("loss_after", "train")[0].tolist() == [3]


@pytest.mark.parametrize("step_type", ["", 3, "a\0b"])
def test_a_bad_step_type_is_refused_at_the_call(tmp_path, step_type) -> None:
    with Recorder(tmp_path, "t") as rec:
        with rec.step(0):
            with pytest.raises(InvalidArgumentError):
                rec.record_kpi("val_loss", 1.0, step_type=step_type)
            rec.record_kpi("loss", 1.0)
    with open_recording(tmp_path, "t") as recording:
        assert recording.kpi_names == ["loss"]  # the refused call left nothing behind


def test_the_explorer_draws_validation_kpis_as_a_curve_of_their_own(tmp_path) -> None:
    from comgra_ndbg.gui import callbacks, tabs
    from comgra_ndbg.gui.state import ReaderCache, Selection, ViewOptions

    with Recorder(tmp_path, "t") as rec:
        for step in range(6):
            with rec.step(step, "train"):
                rec.register_tensor("x", torch.ones(2, 2), role="input")
                rec.record_kpi("loss", 1.0 / (step + 1))
            if step % 3 == 2:
                rec.record_kpi("loss", 2.0 + step, step_type="validation")
    cache = ReaderCache(tmp_path)
    try:
        first = callbacks.update_view(cache, "url", "", None, None)
        selection = Selection.from_dict(first["store"]["selection"])
        assert selection.step_type == "train"  # a step type with KPIs only is no choice of the step selector
        (plot,) = tabs.kpis_tab(cache, selection, ViewOptions())
        (figure,) = [child.figure for child in plot.children if hasattr(child, "figure")]
        curves = {trace["name"]: (list(trace["x"]), list(trace["y"])) for trace in figure["data"]
                  if trace.get("name") in ("train", "validation")}
        assert curves["validation"] == ([2, 5], [4.0, 7.0])
        assert curves["train"][0] == [0, 1, 2, 3, 4, 5]
    finally:
        cache.close()
