"""The reader API on a real recording: a tiny two-layer model, 30 steps of two step types (``long`` steps run
two iterations), two gradient sets, KPIs given as floats and as tensors, notes, and NaN/Inf in one tensor.

Every tensor the recorder sees is captured by the test too (cloned at registration, gradients through hooks of
our own), so each statistic the reader returns is compared with numpy on the same numbers.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from comgra_ndbg import (Recorder, RecordingFormatError, RecordingNotFoundError, UnknownSeriesError,
                        open_recording)
from comgra_ndbg.stats.statistics import STATISTICS
from comgra_ndbg.store import schema
from comgra_ndbg.store.segment import concat, read_segment

BATCH, FEATURES, HIDDEN, OUTPUTS = 6, 4, 8, 3
NUM_STEPS = 30
NUM_SAMPLES, MAX_ELEMENTS = 3, 16
SNAPSHOT_EVERY = 10
LR = 0.05
MARGIN = 0.005  # the recorder's default saturation margin, as a fraction of the bounded range
TENSOR_BOUNDS = {"x": None, "h": (-1.0, 1.0), "r": None, "z": None}
PARAMETERS = ("model.lin1.weight", "model.lin1.bias", "model.lin2.weight", "model.lin2.bias")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin1 = torch.nn.Linear(FEATURES, HIDDEN)
        self.lin2 = torch.nn.Linear(HIDDEN, OUTPUTS)


def step_type_of(step: int) -> str:
    return "long" if step % 3 == 2 else "short"


@dataclass
class Made:
    """The recording and every array the recorder saw, keyed by (tensor, kind, step, iteration)."""

    group: Path
    arrays: dict[tuple[str, str, int, int], np.ndarray] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)

    def of_step(self, name: str, kind: str, step: int, iteration: int | None) -> list[np.ndarray]:
        """The arrays of one series at one step: every iteration's (``iteration=None``) or one iteration's."""
        return [self.arrays[(name, kind, step, it)] for it in (0, 1)
                if (name, kind, step, it) in self.arrays and iteration in (None, it)]


def _record(group: Path, made: Made) -> None:
    torch.manual_seed(3)
    model = Net()
    with torch.no_grad():
        model.lin2.bias[0] = -50.0  # output unit 0 is dead (ReLU of a large negative number)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    kind = ["grad"]

    def keep_grad(name: str, step: int, iteration: int):
        def hook(grad: torch.Tensor) -> None:
            made.arrays[(name, kind[0], step, iteration)] = grad.detach().numpy().copy()
        return hook

    rec = Recorder(group, trial="main", snapshots=SNAPSHOT_EVERY, num_samples=NUM_SAMPLES,
                   max_elements=MAX_ELEMENTS, flush_every_steps=7, flush_every_seconds=1e9)
    rec.track_module("model", model)
    rec.add_note("before the first step")
    for step in range(NUM_STEPS):
        before = {f"model.{n}": p.detach().clone() for n, p in model.named_parameters()}
        for name, value in before.items():
            made.arrays[(name, "value", step, 0)] = value.numpy().copy()
        iterations = 2 if step_type_of(step) == "long" else 1
        if step == 20:
            for group_settings in opt.param_groups:
                group_settings["lr"] = LR / 10
        with rec.step(step, step_type_of(step)):
            loss_a = loss_b = 0.0
            for iteration in range(iterations):
                if iterations > 1:
                    assert rec.start_iteration() == iteration
                generator = torch.Generator().manual_seed(100 * step + iteration)
                x = torch.randn(BATCH, FEATURES, generator=generator) * (1 + step % 4)
                h = torch.tanh(model.lin1(x) * 3)
                r = torch.relu(model.lin2(h))
                z = r.detach().clone()
                if step % 4 == 1:
                    z[0, 0], z[1, 1], z[2, 2] = float("nan"), float("inf"), float("-inf")
                if step == 11:
                    z[:] = float("nan")
                for name, tensor, role in (("x", x, "input"), ("h", h, "intermediate"), ("r", r, "output"),
                                           ("z", z, "intermediate")):
                    rec.register_tensor(name, tensor, role=role)
                    made.arrays[(name, "value", step, iteration)] = tensor.detach().numpy().copy()
                    if tensor.requires_grad:
                        tensor.register_hook(keep_grad(name, step, iteration))
                loss_a = loss_a + r.pow(2).mean()
                loss_b = loss_b + (r - 1).abs().mean()
                if iterations > 1:
                    rec.finish_iteration()
            for gradient_set, loss in (("a", loss_a), ("b", loss_b)):
                kind[0] = schema.grad_kind(gradient_set)
                model.zero_grad()
                loss.backward(retain_graph=gradient_set == "a")
                rec.record_gradients(gradient_set)
                for n, p in model.named_parameters():
                    made.arrays[(f"model.{n}", kind[0], step, 0)] = p.grad.numpy().copy()
            opt.step()
            for n, p in model.named_parameters():
                delta = p.detach() - before[f"model.{n}"]
                made.arrays[(f"model.{n}", "update", step, 0)] = delta.numpy().copy()
            total = loss_a + loss_b
            made.losses[step] = float(total.detach().to(torch.float64))
            rec.record_kpi("loss", total)
            rec.record_kpi("lr", opt.param_groups[0]["lr"])
            if step == 20:
                rec.add_note("lr lowered")
    rec.close()


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Made:
    group = tmp_path_factory.mktemp("group")
    result = Made(group)
    _record(group, result)
    with Recorder(group, trial="second") as rec:
        for step in range(3):
            with rec.step(step):
                rec.register_tensor("only_here", torch.full((2, 2), float(step)), role="input")
            rec.add_note(f"second {step}")
    return result


@pytest.fixture()
def rec(made):
    with open_recording(made.group, "main") as recording:
        yield recording


# ---- reference statistics, straight from the definitions ---------------------------------------------------
def reference(arrays: list[np.ndarray], *, batched: bool, bounds: tuple[float, float] | None) -> dict[str, float]:
    """Every statistic of ``STATISTICS`` for the elements of ``arrays`` (the iterations of one step) together."""
    flat = np.concatenate([a.astype(np.float64).ravel() for a in arrays])
    finite = flat[np.isfinite(flat)]
    nan, inf, n = int(np.isnan(flat).sum()), int(np.isinf(flat).sum()), flat.size
    has = finite.size > 0
    out = {
        "count": n, "nan": nan, "inf": inf, "nonfinite": nan + inf, "nonfinite_fraction": (nan + inf) / n,
        "zero_fraction": float((flat == 0).sum()) / n,
        "mean": finite.mean() if has else np.nan,
        "std": finite.std() if has else np.nan,
        "abs_mean": np.abs(finite).mean() if has else np.nan,
        "abs_max": np.abs(finite).max() if has else np.nan,
        "min": finite.min() if has else np.nan,
        "max": finite.max() if has else np.nan,
        "l2": np.sqrt((finite ** 2).sum()) if has else np.nan,
        "rms": np.sqrt((finite ** 2).mean()) if has else np.nan,
    }
    units = dead = saturated_units = saturated = bounded = 0
    spread_count = spread_sum_sq = spread_dev_sq = 0.0  # pooled over the iterations' batches
    for a in arrays:
        per_unit = a.reshape(a.shape[0], -1).astype(np.float64) if batched else None
        if batched:
            units += per_unit.shape[1]
            dead += int((per_unit == 0).all(axis=0).sum())
            kept = per_unit[:, np.isfinite(per_unit).all(axis=0)]  # units without NaN or Inf in any sample
            spread_count += kept.size
            spread_sum_sq += (kept ** 2).sum()
            spread_dev_sq += ((kept - kept.mean(axis=0)) ** 2).sum() if kept.size else 0.0
        if bounds is not None:
            lo, hi = bounds
            margin = MARGIN * (hi - lo)
            mask = (a <= lo + margin) | (a >= hi - margin)
            bounded += a.size
            saturated += int(mask.sum())
            if batched:
                saturated_units += int(mask.reshape(a.shape[0], -1).all(axis=0).sum())
    out["dead_fraction"] = dead / units if units else np.nan
    out["saturated_fraction"] = saturated / bounded if bounded else np.nan
    out["saturated_unit_fraction"] = saturated_units / units if units else np.nan
    out["sample_spread"] = spread_dev_sq / spread_sum_sq if spread_sum_sq else np.nan
    out["sample_spread_rms"] = np.sqrt(spread_dev_sq / spread_count) if spread_count else np.nan
    return out


def _expected(made: Made, name: str, kind: str, iteration: int | None) -> tuple[list[int], dict[str, np.ndarray]]:
    """Steps where the series has data, and every statistic of it per step."""
    batched = name in TENSOR_BOUNDS
    bounds = TENSOR_BOUNDS.get(name) if kind == "value" else None
    steps, rows = [], []
    for step in range(NUM_STEPS):
        arrays = made.of_step(name, kind, step, iteration)
        if arrays:
            steps.append(step)
            rows.append(reference(arrays, batched=batched, bounds=bounds))
    return steps, {stat: np.array([row[stat] for row in rows], dtype=np.float64) for stat in STATISTICS}


def _tolerance(made: Made, name: str, kind: str) -> float:
    """Absolute tolerance for moments: float32 sums of a few hundred elements, relative to the data's scale."""
    scale = max(np.abs(a[np.isfinite(a)]).max(initial=0.0) for (n, k, _, _), a in made.arrays.items()
                if n == name and k == kind)
    return 1e-6 * scale


# ---- opening -----------------------------------------------------------------------------------------------
def _everything(recording) -> dict:
    return {
        "steps": recording.steps.tolist(),
        "types": [recording.step_type_of(int(s)) for s in recording.steps],
        "nodes": recording.nodes,
        "h": recording.summary("h", "grad:b", "std")[1].tolist(),
        "w": recording.summary("model.lin1", "update", "l2", tensor="weight")[1].tolist(),
        "loss": recording.kpi("loss")[1].tolist(),
        "notes": [(n.step, n.text) for n in recording.notes],
        "snapshot": recording.snapshot(10, "r").values.tolist(),
    }


def test_group_folder_trial_directory_and_file_give_the_same_recording(made):
    paths = [made.group, made.group / "main", made.group / "main" / schema.FINAL_NAME]
    opened = [open_recording(p, "main") if p == made.group else open_recording(p) for p in paths]
    try:
        reference_view = _everything(opened[0])
        assert len(reference_view["steps"]) == NUM_STEPS
        for recording in opened[1:]:
            assert _everything(recording) == reference_view
        assert all(r.is_complete for r in opened)
        assert [p.name for p in opened[1].files] == [schema.FINAL_NAME]
    finally:
        for recording in opened:
            recording.close()


def test_a_group_lists_its_trials_and_opens_another(made):
    with open_recording(made.group) as first:
        assert first.trials == ["main", "second"]
        assert first.trial == "main"
        with first.with_trial("second") as second:
            assert second.trial == "second"
            assert second.steps.tolist() == [0, 1, 2]
            assert second.nodes == ["only_here"]
            assert second.summary("only_here", "value", "mean")[1].tolist() == [0.0, 1.0, 2.0]
            assert [n.text for n in second.notes] == ["second 0", "second 1", "second 2"]
    with pytest.raises(UnknownSeriesError, match=r"no trial 'third'.*\['main', 'second'\]"):
        open_recording(made.group, "third")


# ---- catalog and steps -------------------------------------------------------------------------------------------
def test_steps_and_step_types(rec):
    long_steps = [s for s in range(NUM_STEPS) if step_type_of(s) == "long"]
    assert rec.steps.tolist() == list(range(NUM_STEPS))
    assert rec.step_types == ["short", "long"]
    assert rec.steps_of_type("long").tolist() == long_steps
    assert rec.steps_of_type("short").tolist() == [s for s in range(NUM_STEPS) if s not in long_steps]
    assert [rec.step_type_of(s) for s in (0, 1, 2, 29)] == ["short", "short", "long", "long"]
    with pytest.raises(UnknownSeriesError, match=r"step 30 was not recorded.*from 0 to 29"):
        rec.step_type_of(30)
    with pytest.raises(UnknownSeriesError, match=r"no step type 'medium'.*\['short', 'long'\]"):
        rec.steps_of_type("medium")


def test_nodes_roles_kinds_and_modules(rec):
    assert rec.nodes == ["model.lin1", "model.lin2", "x", "h", "r", "z"]
    assert rec.roles == {**{p: "parameter" for p in PARAMETERS}, "x": "input", "h": "intermediate",
                         "r": "output", "z": "intermediate"}
    assert rec.kinds() == ["value", "grad:a", "grad:b", "update"]
    assert rec.kinds("model.lin1") == ["value", "grad:a", "grad:b", "update"]
    assert rec.kinds("h") == ["value", "grad:a", "grad:b"]
    assert rec.kinds("x") == rec.kinds("z") == ["value"]
    assert [(m.path, m.class_name, m.parameters) for m in rec.modules] == [
        ("model", "Net", 0), ("model.lin1", "Linear", HIDDEN * FEATURES + HIDDEN),
        ("model.lin2", "Linear", OUTPUTS * HIDDEN + OUTPUTS)]
    h = next(t for t in rec.tensors if t.name == "h")
    assert (h.batched, h.bounds, h.shape, h.dtype) == (True, (-1.0, 1.0), (BATCH, HIDDEN), "float32")
    weight = next(t for t in rec.tensors if t.name == "model.lin2.weight")
    assert (weight.node, weight.label, weight.batched, weight.bounds) == ("model.lin2", "weight", False, None)


def test_kpis_with_float_and_tensor_values_and_by_step_type(made, rec):
    assert rec.kpi_names == ["loss", "lr"]
    steps, losses = rec.kpi("loss")
    assert steps.tolist() == list(range(NUM_STEPS))
    assert losses.tolist() == [made.losses[s] for s in range(NUM_STEPS)]
    steps, rates = rec.kpi("lr", step_type="long")
    assert steps.tolist() == [s for s in range(NUM_STEPS) if step_type_of(s) == "long"]
    assert rates.tolist() == [LR if s < 20 else LR / 10 for s in steps]
    assert rec.kpi("lr", step_type="short")[0].tolist() == [s for s in range(NUM_STEPS) if step_type_of(s) == "short"]
    with pytest.raises(UnknownSeriesError, match=r"no KPI 'accuracy'.*\['loss', 'lr'\]"):
        rec.kpi("accuracy")
    with pytest.raises(UnknownSeriesError, match=r"no step type 'medium'"):
        rec.kpi("loss", step_type="medium")


def test_notes_keep_their_step_and_order(rec):
    notes = rec.notes
    assert [(n.step, n.text) for n in notes] == [(-1, "before the first step"), (20, "lr lowered")]
    assert notes[0].time <= notes[1].time


# ---- summaries --------------------------------------------------------------------------------------------
SERIES = [("x", "value"), ("h", "value"), ("r", "value"), ("z", "value"), ("h", "grad:a"), ("h", "grad:b"),
          ("r", "grad:a"), ("r", "grad:b")] + [(p, k) for p in PARAMETERS for k in ("value", "grad:a", "grad:b",
                                                                                     "update")]


@pytest.mark.parametrize("name,kind", SERIES)
def test_every_statistic_equals_numpy_on_the_same_tensors(made, rec, name, kind):
    tolerance = _tolerance(made, name, kind)
    for iteration in (None, 0, 1):
        want_steps, want = _expected(made, name, kind, iteration)
        for stat in STATISTICS:
            got_steps, got = rec.summary(name, kind, stat, iteration=iteration)
            assert got_steps.tolist() == want_steps, (stat, iteration)
            np.testing.assert_allclose(got, want[stat], rtol=1e-5, atol=tolerance,
                                       err_msg=f"{name} {kind} {stat} iteration={iteration}")


def test_iterations_merge_into_one_row_per_step(made, rec):
    long_steps = [s for s in range(NUM_STEPS) if step_type_of(s) == "long"]
    assert rec.summary("h", "value", "count")[1].tolist() == [
        BATCH * HIDDEN * (2 if step_type_of(s) == "long" else 1) for s in range(NUM_STEPS)]
    assert rec.summary("h", "value", "count", iteration=1)[0].tolist() == long_steps

    def at_step_2(**iteration):
        steps, values = rec.summary("x", "value", "max", **iteration)
        return values[steps.tolist().index(2)]

    assert at_step_2() == max(at_step_2(iteration=0), at_step_2(iteration=1))
    assert at_step_2(iteration=0) != at_step_2(iteration=1)
    steps, rows = rec.summary_rows("x", "value", iteration=1)
    assert steps.tolist() == long_steps and rows.shape == (len(long_steps), schema.NUM_FIELDS)


def test_the_crafted_tensor_has_its_nan_inf_dead_and_saturated_parts(rec):
    steps, nan = rec.summary("z", "value", "nan")
    assert steps.tolist() == list(range(NUM_STEPS))
    assert (nan[0], nan[1], nan[5], nan[13]) == (0, 1, 2, 1)  # step 5 is a long step: two iterations
    assert rec.summary("z", "value", "inf")[1][1] == 2
    assert nan[11] == 2 * BATCH * OUTPUTS
    assert np.isnan(rec.summary("z", "value", "mean")[1][11])
    assert np.isnan(rec.summary("z", "value", "min")[1][11])
    dead = rec.summary("r", "value", "dead_fraction")[1]
    assert (dead >= 1 / OUTPUTS).all()  # unit 0 is dead at every step
    assert np.isnan(rec.summary("x", "value", "saturated_fraction")[1]).all()
    assert (rec.summary("h", "value", "saturated_fraction")[1] > 0).any()
    assert np.isnan(rec.summary("model.lin1", "value", "dead_fraction", tensor="weight")[1]).all()


def test_a_node_with_several_tensors_needs_the_tensor_argument(rec):
    with pytest.raises(UnknownSeriesError, match=r"node 'model.lin1' holds several tensors.*pass tensor="):
        rec.summary("model.lin1", "value", "mean")
    by_label = rec.summary("model.lin1", "value", "mean", tensor="bias")[1]
    by_name = rec.summary("model.lin1.bias", "value", "mean")[1]
    np.testing.assert_array_equal(by_label, by_name)
    with pytest.raises(UnknownSeriesError, match=r"no tensor 'gamma'.*\['weight', 'bias'\]"):
        rec.summary("model.lin1", "value", "mean", tensor="gamma")


def test_unknown_names_raise_errors_that_list_the_valid_ones(rec):
    with pytest.raises(UnknownSeriesError, match=r"no node or tensor named 'nope'.*'model.lin1'.*'z'"):
        rec.summary("nope")
    with pytest.raises(UnknownSeriesError, match=r"tensor 'x' has no kind 'grad'.*\['value'\]"):
        rec.summary("x", "grad")
    with pytest.raises(UnknownSeriesError, match=r"unknown statistic 'median'.*'abs_max'"):
        rec.summary("x", "value", "median")
    with pytest.raises(UnknownSeriesError, match=r"no snapshot of 'x' \(value\) at step 3.*\[0, 10, 20\]"):
        rec.snapshot(3, "x")
    with pytest.raises(KeyError):  # UnknownSeriesError is a KeyError, so `except KeyError` works too
        rec.summary("nope")


# ---- snapshots ------------------------------------------------------------------------------------------
def test_snapshot_of_a_batched_tensor_keeps_the_first_samples_in_dense_layout(made, rec):
    assert rec.snapshot_steps("x").tolist() == [0, 10, 20]
    for step in (0, 10, 20):
        snap = rec.snapshot(step, "x")
        want = made.arrays[("x", "value", step, 0)][:NUM_SAMPLES]
        assert snap.shape == (BATCH, FEATURES) and snap.value_index is None  # 3 x 4 values fit in 16
        assert snap.sample_index.tolist() == [0, 1, 2]
        np.testing.assert_array_equal(snap.dense(), want)
        np.testing.assert_allclose(snap.sample_stats["mean"], want.astype(np.float64).mean(axis=1), rtol=1e-12)
        np.testing.assert_array_equal(snap.sample_stats["max"], want.max(axis=1))


def test_snapshot_over_max_elements_is_subsampled_evenly(made, rec):
    snap = rec.snapshot(10, "h")  # 3 samples x 8 units > 16 values: 5 evenly spaced units per sample
    want = made.arrays[("h", "value", 10, 0)][:NUM_SAMPLES]
    units = [0, 2, 4, 5, 7]
    assert snap.value_index.tolist() == [s * HIDDEN + u for s in range(NUM_SAMPLES) for u in units]
    dense = snap.dense()
    assert dense.shape == (NUM_SAMPLES, HIDDEN)
    np.testing.assert_array_equal(dense[:, units], want[:, units])
    assert np.isnan(np.delete(dense, units, axis=1)).all()
    np.testing.assert_array_equal(snap.values, want[:, units].ravel())
    np.testing.assert_allclose(snap.sample_stats["saturated_fraction"],
                               ((np.abs(want.astype(np.float64)) >= 0.99).sum(axis=1)) / HIDDEN)


def test_snapshots_of_parameters_gradients_updates_and_iterations(made, rec):
    weight = rec.snapshot(20, "model.lin1", "value", tensor="weight")  # 32 elements > 16: evenly spaced
    want = made.arrays[("model.lin1.weight", "value", 20, 0)].ravel()
    index = np.unique(np.round(np.linspace(0, want.size - 1, MAX_ELEMENTS)).astype(np.int64))
    assert weight.shape == (HIDDEN, FEATURES) and weight.sample_index.size == 0
    np.testing.assert_array_equal(weight.value_index, index)
    np.testing.assert_array_equal(weight.values, want[index])
    bias_update = rec.snapshot(0, "model.lin2.bias", "update")
    np.testing.assert_array_equal(bias_update.dense(), made.arrays[("model.lin2.bias", "update", 0, 0)])
    grad = rec.snapshot(20, "r", "grad:b", iteration=1)  # step 20 is a long step
    np.testing.assert_array_equal(grad.dense(), made.arrays[("r", "grad:b", 20, 1)][:NUM_SAMPLES])
    assert grad.kind == "grad:b" and grad.iteration == 1 and grad.tensor == "r"
    with pytest.raises(UnknownSeriesError, match="iteration 1"):
        rec.snapshot(10, "x", iteration=1)  # step 10 is a short step


# ---- errors on opening ---------------------------------------------------------------------------------------
def test_missing_paths_and_empty_folders_are_not_found(tmp_path):
    with pytest.raises(RecordingNotFoundError, match="does not exist"):
        open_recording(tmp_path / "nowhere")
    with pytest.raises(RecordingNotFoundError, match="holds no recording"):
        open_recording(tmp_path)
    (tmp_path / "trial").mkdir()
    (tmp_path / "trial" / ("seg-00000001-L0.h5" + schema.TEMP_SUFFIX)).write_bytes(b"")
    with pytest.raises(RecordingNotFoundError):
        open_recording(tmp_path)


def test_files_that_are_not_recordings_are_format_errors(tmp_path):
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f["data"] = np.arange(3)
    with pytest.raises(RecordingFormatError, match="not a comgra_ndbg recording"):
        open_recording(plain)
    text = tmp_path / "text.h5"
    text.write_text("this is not HDF5")
    with pytest.raises(RecordingFormatError, match="not a readable HDF5 recording"):
        open_recording(text)
    newer = tmp_path / "newer.h5"
    with h5py.File(newer, "w") as f:
        f.attrs[schema.ATTR_FORMAT] = schema.FORMAT_NAME
        f.attrs[schema.ATTR_FORMAT_VERSION] = schema.FORMAT_VERSION + 1
    with pytest.raises(RecordingFormatError, match="newer than this library"):
        open_recording(newer)


# ---- older format versions -----------------------------------------------------------------------------------
V1_FIELDS = 14  # format version 1: STAT_FIELDS up to saturated_units


def _as_version_1(source: Path, target: Path) -> None:
    """A copy of the recording ``source`` as format version 1 wrote it: summary and per-sample rows of 14
    fields, ``format_version`` 1 (version 2 added the three sample-spread fields at the end and nothing else)."""
    target.write_bytes(source.read_bytes())
    with h5py.File(target, "r+") as f:
        for path in (schema.SUMMARY_DATA, schema.SAMPLE_STATS):
            data = f[path][()]
            del f[path]
            f.create_dataset(path, data=data[:, :V1_FIELDS])
        f.attrs[schema.ATTR_FORMAT_VERSION] = 1


def test_a_version_1_recording_reads_with_the_sample_spread_unknown(made, rec, tmp_path):
    old = tmp_path / "old.h5"
    _as_version_1(made.group / "main" / schema.FINAL_NAME, old)
    with h5py.File(old, "r") as f:
        assert f[schema.SUMMARY_DATA].shape[1] == V1_FIELDS and f[schema.SAMPLE_STATS].shape[1] == V1_FIELDS
    assert np.isfinite(rec.summary("h", "value", "sample_spread")[1]).all()
    with open_recording(old) as recording:
        for name, kind in (("h", "value"), ("z", "value"), ("r", "grad:a"), ("model.lin1.weight", "update")):
            for stat in STATISTICS:
                steps, values = recording.summary(name, kind, stat)
                want_steps, want = rec.summary(name, kind, stat)
                assert steps.tolist() == want_steps.tolist()
                if stat.startswith("sample_spread"):
                    assert np.isnan(values).all(), (name, kind, stat)
                else:
                    np.testing.assert_array_equal(values, want, err_msg=f"{name} {kind} {stat}")
        steps, rows = recording.summary_rows("h", "value")
        assert rows.shape == (len(steps), schema.NUM_FIELDS)
        np.testing.assert_array_equal(rows[:, V1_FIELDS:], 0.0)
        snapshot, new = recording.snapshot(10, "h"), rec.snapshot(10, "h")
        np.testing.assert_array_equal(snapshot.sample_rows[:, :V1_FIELDS], new.sample_rows[:, :V1_FIELDS])
        assert snapshot.sample_rows.shape == new.sample_rows.shape
        assert np.isnan(snapshot.sample_stats["sample_spread"]).all()
        np.testing.assert_array_equal(snapshot.sample_stats["std"], new.sample_stats["std"])


def test_a_version_1_segment_merges_with_newer_ones(made, tmp_path):
    old = tmp_path / "old.h5"
    current = made.group / "main" / schema.FINAL_NAME
    _as_version_1(current, old)
    with h5py.File(old, "r") as f:
        before = read_segment(f)
    with h5py.File(current, "r") as f:
        after = read_segment(f)
    assert before.summary_data.shape == after.summary_data.shape
    assert before.sample_stats.shape == after.sample_stats.shape
    np.testing.assert_array_equal(before.summary_data[:, :V1_FIELDS], after.summary_data[:, :V1_FIELDS])
    np.testing.assert_array_equal(before.summary_data[:, V1_FIELDS:], 0.0)
    merged = concat([before, after])
    assert merged.summary_data.shape[1:] == (schema.NUM_FIELDS, 2 * after.summary_data.shape[2])


# ---- plain h5py --------------------------------------------------------------------------------------------
PLAIN_READER = """
import json, sys
import h5py, numpy as np

with h5py.File(sys.argv[1], "r") as f:
    names = [n.decode() for n in f["tensors/name"][()]]
    kinds = [k.decode() for k in f["series/kind"][()]]
    tensor_of = f["series/tensor"][()]
    sid = next(i for i, (t, k) in enumerate(zip(tensor_of, kinds)) if names[t] == "h" and k == "value")
    fields = json.loads(sys.argv[2])
    data = f["summary/data"][sid]  # [fields, rows]
    steps = f["summary/step"][()]
    count, nan, inf = data[fields["count"]], data[fields["nan"]], data[fields["inf"]]
    totals = {}
    for step, s, n in zip(steps, data[fields["sum"]], count - nan - inf):
        if n > 0:
            a, b = totals.get(int(step), (0.0, 0.0))
            totals[int(step)] = (a + s, b + n)
    print(json.dumps({"modules": "comgra_ndbg" in sys.modules, "format": f.attrs["format"],
                      "version": int(f.attrs["format_version"]), "steps": sorted(totals),
                      "mean": [totals[s][0] / totals[s][1] for s in sorted(totals)]}))
"""


def test_a_recording_reads_with_plain_h5py_and_numpy(made, rec):
    out = subprocess.run([sys.executable, "-c", PLAIN_READER, str(made.group / "main" / schema.FINAL_NAME),
                          json.dumps(schema.FIELD)], capture_output=True, text=True, check=True, timeout=60)
    plain = json.loads(out.stdout)
    assert plain["modules"] is False
    assert (plain["format"], plain["version"]) == (schema.FORMAT_NAME, schema.FORMAT_VERSION)
    steps, means = rec.summary("h", "value", "mean")
    assert plain["steps"] == steps.tolist()
    np.testing.assert_allclose(plain["mean"], means, rtol=1e-12)


def test_a_snapshot_defaults_to_the_first_iteration_that_has_one(tmp_path):
    """A tensor registered after the last finish_iteration() belongs to the last iteration: its snapshot
    is found without naming that iteration."""
    with Recorder(tmp_path, "t", snapshots=1) as recorder:
        for step in range(2):
            recorder.start_step(step)
            for _ in range(3):
                recorder.start_iteration()
                recorder.register_tensor("h", torch.full((2, 3), float(step)))
                recorder.finish_iteration()
            recorder.register_tensor("late", torch.full((2, 3), 10.0 + step))
            recorder.finish_step()
    with open_recording(tmp_path, "t") as rec:
        late = rec.snapshot(1, "late")
        assert late.iteration == 2 and (late.dense() == 11.0).all()
        assert rec.snapshot(1, "h").iteration == 0 and rec.snapshot(1, "h", iteration=1).iteration == 1
        with pytest.raises(UnknownSeriesError, match=r"at step 1, iteration 0;"):
            rec.snapshot(1, "late", iteration=0)
        with pytest.raises(UnknownSeriesError, match=r"at step 5;"):
            rec.snapshot(5, "late")
