"""Invariants learned from a healthy reference run: each one broken in a real tiny recording is found at its
step with the evidence of both runs, a run that differs from the reference only in its seed gives nothing,
runs of another model raise ReferenceMismatchError, and ``explain --reference`` prints the findings."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg import NeuralDbg, Recorder, analyze, open_recording
from comgra_ndbg.analysis.api import stored_diagnosis
from comgra_ndbg.analysis.loading import load_run_facts, node_info
from comgra_ndbg.analysis.reference import RunFacts, compare_runs
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.cli import main
from comgra_ndbg.errors import ComgraError, ReferenceMismatchError
from comgra_ndbg.store.schema import FIELD, identity_row

STEPS = 30
Hook = Callable[[int, nn.Module, torch.optim.Optimizer], None]


def model(width: int = 16) -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Dropout(0.25), nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, 3))


def train(folder: Path, trial: str, seed: int, *, before: Hook | None = None, freeze_first: bool = False,
          dtype: torch.dtype = torch.float32, scale: Callable[[int], float] = lambda step: 1.0,
          width: int = 16, steps: int = STEPS, step_type: Callable[[int], str] | None = None) -> Path:
    """A tiny classifier trained with Adam (one param group per Linear), recorded by NeuralDbg."""
    torch.manual_seed(seed)
    net = model(width).to(dtype)
    if freeze_first:
        net[0].requires_grad_(False)
    groups = [{"params": [p for p in net[i].parameters() if p.requires_grad]} for i in (0, 3, 5)]
    optimizer = torch.optim.Adam([g for g in groups if g["params"]], lr=1e-2)
    g = torch.Generator().manual_seed(100 + seed)
    centres = torch.randn(3, 6, generator=torch.Generator().manual_seed(7)) * 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with NeuralDbg(net, folder, trial=trial) as dbg:
            for step in range(steps):
                net.train()
                if step_type is not None:
                    dbg.step_type = step_type(step)
                if before is not None:
                    before(step, net, optimizer)
                y = torch.randint(0, 3, (16,), generator=g)
                x = (centres[y] + torch.randn(16, 6, generator=g)).to(dtype) * scale(step)
                optimizer.zero_grad()
                F.cross_entropy(net(x), y).backward()
                optimizer.step()
    return folder / trial


def trained(folder: Path, trial: str, seed: int, **options: object) -> Path:
    """The run ``trial`` (recorded by :func:`train` unless an earlier test did)."""
    return folder / trial if (folder / trial / "recording.h5").exists() else train(folder, trial, seed, **options)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reference")


@pytest.fixture(scope="module")
def reference(runs: Path) -> Path:
    return train(runs, "good", 0)


@pytest.fixture(scope="module")
def frozen_reference(runs: Path) -> Path:
    return train(runs, "good-frozen", 0, freeze_first=True)


def found(reference: Path, run: Path) -> list:
    with open_recording(reference) as ref, open_recording(run) as rec:
        return list(compare_runs(load_run_facts(ref), load_run_facts(rec)).hypotheses)


def only(hypotheses: list, kind: str):
    matching = [h for h in hypotheses if h.type == kind]
    assert matching, f"no {kind} among {[(h.type, h.node, h.onset) for h in hypotheses]}"
    return matching[0]


# ---- no false alarm ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_run_differing_only_in_its_seed_breaks_no_invariant(runs: Path, reference: Path, seed: int) -> None:
    assert found(reference, trained(runs, f"seed{seed}", seed)) == []


def test_the_reference_against_itself_learns_every_rule_and_breaks_none(reference: Path) -> None:
    with open_recording(reference) as ref:
        facts = load_run_facts(ref)
    comparison = compare_runs(facts, facts)
    assert comparison.hypotheses == ()
    assert {inv.rule for inv in comparison.invariants} == {"trains", "dtype", "input_range", "mode", "grad_ratio",
                                                          "update_ratio"}
    trains = {inv.node for inv in comparison.invariants if inv.rule == "trains"}
    assert trains == {"model.0.parameters", "model.3.parameters", "model.5.parameters"}


# ---- which parameters change ------------------------------------------------------------------------------------
def test_a_stage_meant_to_be_frozen_that_trains_from_the_start(runs: Path, frozen_reference: Path) -> None:
    hypotheses = found(frozen_reference, train(runs, "unfrozen", 1))
    h = only(hypotheses, "frozen_trains")
    assert (h.node, h.onset, h.origin) == ("model.0.parameters", 0, "node")
    assert "never changed in the reference run" in h.sentence and "requires_grad_(False)" in h.remedy
    series = [e.series for e in h.chain.root.evidence]
    assert series[0].startswith("reference:model.0.parameters") and series[1] == "model.0.parameters/update/l2"


def test_a_frozen_stage_unfrozen_mid_run_is_found_at_that_step(runs: Path, frozen_reference: Path) -> None:
    def unfreeze(step: int, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if step == 12:
            net[0].requires_grad_(True)
            optimizer.add_param_group({"params": list(net[0].parameters())})
    h = only(found(frozen_reference, train(runs, "unfrozen-later", 1, freeze_first=True, before=unfreeze)),
             "frozen_trains")
    assert (h.node, h.onset) == ("model.0.parameters", 12)


def test_a_layer_that_trained_in_the_reference_stops_changing(runs: Path, reference: Path) -> None:
    def freeze(step: int, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if step == 15:
            net[3].requires_grad_(False)
    h = only(found(reference, train(runs, "stopped", 1, before=freeze)), "update_stagnation")
    assert (h.node, h.onset) == ("model.3.parameters", 15)
    assert "stays unchanged here from step" in h.sentence


# ---- dtype, input range, mode ----------------------------------------------------------------------------------
def test_computation_in_another_dtype_names_both_dtypes(runs: Path, reference: Path) -> None:
    run = train(runs, "double", 1, dtype=torch.float64)
    with open_recording(run) as rec:
        assert node_info(rec)["model.3.parameters"].dtype == "float64"
    with open_recording(reference) as ref:
        assert node_info(ref)["model.3.parameters"].dtype == "float32"
    h = only(found(reference, run), "wrong_dtype")
    assert h.onset == 0 and "float64 here but float32 in the reference" in h.sentence
    assert "more node(s)" in h.sentence  # one hypothesis for the whole model, not one per node


def test_raw_0_255_inputs_are_far_outside_the_reference_range(runs: Path, reference: Path) -> None:
    h = only(found(reference, train(runs, "raw", 1, scale=lambda step: 255.0)), "unnormalised_input")
    assert (h.origin, h.node, h.onset) == ("data", "input", 0)
    assert "/ 255" in h.remedy


def test_an_input_scale_changed_mid_run_is_found_at_its_step(runs: Path, reference: Path) -> None:
    h = only(found(reference, train(runs, "raw-later", 1, scale=lambda step: 1.0 if step < 18 else 255.0)),
             "unnormalised_input")
    assert h.onset == 18


def eval_dropout(step: int, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    net[2].eval()


def test_a_dropout_left_in_eval_mode_in_training_steps(runs: Path, reference: Path) -> None:
    h = only(found(reference, trained(runs, "dropout-eval", 1, before=eval_dropout)), "wrong_mode")
    assert (h.node, h.onset) == ("model.2", 0)
    assert "eval() mode where the reference ran it in train() mode" in h.sentence


def test_the_mode_is_learnt_per_step_type(runs: Path) -> None:
    def kind(step: int) -> str:
        return "plain" if step % 2 else "noisy"

    def eval_in_plain_steps(step: int, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if kind(step) == "plain":
            net[2].eval()  # on purpose: these steps train without dropout

    good = train(runs, "typed-good", 0, before=eval_in_plain_steps, step_type=kind)
    assert found(good, train(runs, "typed-seed", 1, before=eval_in_plain_steps, step_type=kind)) == []
    hypotheses = found(good, train(runs, "typed-bad", 1, before=eval_dropout, step_type=kind))
    h = only(hypotheses, "wrong_mode")
    assert (h.node, h.onset) == ("model.2", 0) and "in 'noisy' steps" in h.sentence
    assert [x.type for x in hypotheses].count("wrong_mode") == 1  # the 'plain' steps ran in eval() there too


# ---- norm ratios between layers ---------------------------------------------------------------------------------
def test_a_backward_hook_scaling_a_gradient_breaks_the_gradient_ratio(runs: Path, reference: Path) -> None:
    def hook(step: int, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if step == 15:
            net[3].register_full_backward_hook(lambda _m, grad_in, _out: tuple(g * 1e3 for g in grad_in))
    hypotheses = found(reference, train(runs, "grad-hook", 1, before=hook))
    h = only(hypotheses, "gradient_ratio")
    assert (h.node, h.onset) == ("model.0.parameters", 15)
    assert not any(x.type == "update_ratio" for x in hypotheses)  # Adam's updates do not see a gradient's scale


def test_one_param_group_learning_rate_breaks_the_update_ratio(runs: Path, reference: Path) -> None:
    def edit(step: int, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if step == 15:
            optimizer.param_groups[1]["lr"] *= 300
    h = only(found(reference, train(runs, "group-lr", 1, before=edit)), "update_ratio")
    assert (h.node, h.onset) == ("model.3.parameters", 15)
    assert "param groups" in h.remedy


def _ratio_facts(loss: np.ndarray, second: np.ndarray) -> RunFacts:
    """Two parameter nodes whose gradient l2 norms are 1 and ``second``, with the loss ``loss``."""
    steps = np.arange(len(loss))

    def rows(l2: np.ndarray) -> np.ndarray:
        r = np.tile(identity_row(), (len(l2), 1))
        r[:, FIELD["count"]], r[:, FIELD["sum_sq"]] = 4, np.square(l2)
        return r
    series = build_series({("a", "grad"): (steps, rows(np.ones(len(loss)))), ("b", "grad"): (steps, rows(second))},
                          roles={"a": "parameter", "b": "parameter"}, kpis={"loss": (steps, loss)})
    return RunFacts(series, ("train",) * len(loss))


def test_ratios_are_compared_only_while_the_loss_is_above_a_thousandth_of_the_first() -> None:
    reference = _ratio_facts(np.linspace(2.0, 1.0, 20), np.full(20, 1.0))
    moved = np.r_[np.full(10, 1.0), np.full(10, 1e-4)]
    converged = compare_runs(reference, _ratio_facts(np.r_[np.linspace(2, 1, 10), np.full(10, 1e-4)], moved))
    assert converged.hypotheses == ()
    training = compare_runs(reference, _ratio_facts(np.linspace(2.0, 1.0, 20), moved))
    assert [(h.type, h.onset) for h in training.hypotheses] == [("gradient_ratio", 10)]


# ---- not comparable ---------------------------------------------------------------------------------------------
def test_another_model_structure_raises_reference_mismatch(runs: Path, reference: Path) -> None:
    wide = trained(runs, "wide", 1, width=24, steps=4)
    expected = (r"3 node\(s\) have other shapes .*'model.0.parameters': \[\[16\], \[16, 6\]\] in the reference, "
                r"\[\[24\], \[24, 6\]\] here")
    with pytest.raises(ReferenceMismatchError, match=expected):
        analyze(wide, reference=reference)


def test_no_common_node_raises_reference_mismatch(runs: Path, reference: Path) -> None:
    with Recorder(runs, trial="other") as rec:
        for step in range(3):
            with rec.step(step):
                rec.register_tensor("pixels", torch.rand(4, 2), role="input")
                rec.record_kpi("loss", 1.0)
    with pytest.raises(ReferenceMismatchError, match="no node in common") as error:
        analyze(runs / "other", reference=reference)
    assert isinstance(error.value, ValueError) and "reference_trial=" in str(error.value)


def test_a_group_folder_as_reference_needs_a_trial(runs: Path, reference: Path) -> None:
    run = trained(runs, "seed1", 1)
    with pytest.raises(ReferenceMismatchError, match="say which one ran healthy"):
        analyze(run, reference=runs)
    assert analyze(run, reference=runs, reference_trial="good").healthy


# ---- wiring: analyze and the command line ---------------------------------------------------------------------
def test_analyze_ranks_the_broken_invariant_first_and_does_not_store(tmp_path: Path, reference: Path) -> None:
    run = train(tmp_path, "double", 1, dtype=torch.float64)
    diagnosis = analyze(run, reference=reference)
    assert diagnosis.hypotheses[0].type == "wrong_dtype"
    assert any(e.family == "reference_invariant" and e.to_state == "dtype" for e in diagnosis.events)
    assert "compared with the reference run" in diagnosis.notes[-1]
    assert stored_diagnosis(run) is None
    assert not any(h.type == "wrong_dtype" for h in analyze(run).hypotheses)  # without the reference: unseen


def test_cli_explain_with_reference_prints_the_finding(runs: Path, reference: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = trained(runs, "dropout-eval", 1, before=eval_dropout)  # its mode is seen only against a reference
    assert main(["explain", str(run), "--reference", str(runs), "--reference-trial", "good"]) == 0
    out = capsys.readouterr().out
    assert "1. [wrong_mode, origin node, node 'model.2', step 0, confidence 0.85]" in out
    assert "A train/eval mode mistake: the Dropout 'model.2'" in out and "Remedy: call model.train()" in out
    assert "note: compared with the reference run" in out and "1 broken here" in out
    assert main(["explain", str(run)]) == 0
    assert "wrong_mode" not in capsys.readouterr().out


def test_cli_explain_with_a_mismatched_reference_exits_2_with_one_line(runs: Path, reference: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    wide = trained(runs, "wide", 1, width=24, steps=4)
    assert main(["explain", str(wide), "--reference", str(reference)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other shapes" in err[0]
    assert issubclass(ReferenceMismatchError, ComgraError)


def record_explicitly(folder: Path, trial: str, seed: int, *, scale: float = 1.0) -> Path:
    """The README's explicit-registration loop: a tracked model, input, hidden, output and loss registered."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(200 + seed)
    with Recorder(folder, trial=trial) as rec:
        rec.track_module("model", net)
        for step in range(20):
            x, y = torch.randn(16, 8, generator=g) * scale, torch.randint(0, 3, (16,), generator=g)
            rec.start_step(step, step_type="train")
            rec.register_tensor("input", x, role="input")
            h = rec.register_tensor("hidden", net[1](net[0](x)))
            out = rec.register_tensor("output", net[2](h), role="output")
            loss = rec.register_tensor("loss", F.cross_entropy(out, y), role="loss")
            optimizer.zero_grad()
            loss.backward()
            rec.record_gradients()
            optimizer.step()
            rec.record_kpi("loss", loss)
            rec.finish_step()
    return folder / trial


def test_recordings_made_with_the_recorder_compare_too(tmp_path: Path) -> None:
    good = record_explicitly(tmp_path, "good", 0)
    assert found(good, record_explicitly(tmp_path, "other-seed", 1)) == []
    h = only(found(good, record_explicitly(tmp_path, "raw", 1, scale=300.0)), "unnormalised_input")
    assert (h.node, h.onset) == ("input", 0)
    with open_recording(good) as ref:
        rules = {inv.rule for inv in compare_runs(load_run_facts(ref), load_run_facts(ref)).invariants}
    assert {"trains", "dtype", "input_range", "grad_ratio", "update_ratio"} <= rules
