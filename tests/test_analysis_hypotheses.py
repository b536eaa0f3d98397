"""The reasoner: roots, their reading as type and origin, ranking, and the sentence."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.calibration import calibrated_confidence
from comgra_ndbg.analysis.causal import link_events
from comgra_ndbg.analysis.events import Event, Evidence
from comgra_ndbg.analysis.hypotheses import rank_hypotheses
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.synthetic import summary_rows
from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode

ROLES = {"x": "input", "w1": "parameter", "b1.pre": "intermediate", "b1.out": "intermediate",
         "w2": "parameter", "b2.pre": "intermediate", "b2.out": "intermediate", "logits": "output", "loss": "loss"}
EDGES = [("w1", "b1.pre"), ("b1.pre", "b1.out"), ("b1.out", "b2.pre"), ("w2", "b2.pre"), ("b2.pre", "b2.out"),
         ("b2.out", "logits"), ("logits", "loss")]
GRAPH = DependencyGraph(tuple(GraphNode(n, r, "", (n,), r == "parameter") for n, r in sorted(ROLES.items())),
                        tuple(sorted(GraphEdge(a, b, "forward") for a, b in EDGES)))


def run(worse_from: int | None = 200):
    """Flat summaries; the loss rises 1.5x from step ``worse_from`` on (harm), or stays flat (None)."""
    rows = {(n, "value"): summary_rows(rms=np.ones(300)) for n in ROLES}
    loss = np.ones(300)
    if worse_from is not None:
        loss[worse_from:] = 1.5
    return build_series(rows, roles=ROLES, kpis={"loss": (np.arange(300), loss)}, graph=GRAPH)


def event(family, node, kind, state, onset, magnitude=1.5, at_start=False):
    return Event(family, node, kind, "normal", state, onset, 299, magnitude, 0.75,
                 (Evidence(f"{node}/{kind}/rms", (onset,), (1.0,)),), at_start)


def hypotheses(events, worse_from: int | None = 200):
    series = run(worse_from)
    return rank_hypotheses(events, link_events(events, series), series)


def summary(hs):
    return [(h.type, h.origin, h.node, h.onset) for h in hs]


def test_a_healthy_run_has_no_hypothesis() -> None:
    assert hypotheses([]) == []


def test_pre_activation_jump_with_dead_units_behind_it_reads_as_dead_units_with_its_sentence() -> None:
    jump = event("activation_regime", "b2.pre", "value", "exploding", 200, magnitude=1.3)
    dead = event("activation_regime", "b2.out", "value", "dead", 200, magnitude=1.0)
    grad = event("gradient_health", "b1.out", "grad", "vanishing", 200, magnitude=30.0)
    [h] = hypotheses([grad, dead, jump])
    assert summary([h]) == [("dead_units", "node", "b2.pre", 200)]
    assert [(x.effect.node, x.via) for x in h.chain.links] == [("b2.out", "forward"), ("b1.out", "backward")]
    assert h.confidence == calibrated_confidence(h.features)
    assert h.sentence == (
        "Dead units originated in 'b2.pre' at step 200, after the value rms of 'b2.pre' rose 1.3 decades against "
        "its recent history and 'b2.out' went dead; 2 later events in 2 nodes follow from it (first: activation "
        f"regime dead in 'b2.out' at step 200) (confidence {h.confidence:.2f}).")


def test_scale_collapse_alone_is_vanishing_and_the_earliest_root_ranks_first() -> None:
    collapse = event("activation_regime", "b1.pre", "value", "vanishing", 200, magnitude=3.0)
    later = event("optimizer_stability", "w2", "update", "frozen", 250, magnitude=40)
    hs = hypotheses([later, collapse], worse_from=200)
    assert summary(hs) == [("vanishing", "node", "b1.pre", 200), ("update_stagnation", "node", "w2", 250)]
    assert hs[0].features[3] == 0.0 and hs[1].features[3] == 1.0


def test_gradient_only_roots_point_at_the_most_downstream_node() -> None:
    late = event("gradient_health", "b2.pre", "grad", "exploding", 200, magnitude=4.0)
    early = event("gradient_health", "b1.out", "grad", "exploding", 200, magnitude=4.0)
    assert summary(hypotheses([early, late])) == [("exploding", "node", "b2.pre", 200)]


def test_non_finite_origins_input_loss_and_node() -> None:
    assert summary(hypotheses([event("nonfinite", "x", "value", "non-finite", 200),
                               event("nonfinite", "b1.pre", "value", "non-finite", 200)])) == [
        ("nonfinite_data", "data", "x", 200)]
    assert summary(hypotheses([event("nonfinite", "loss", "value", "non-finite", 200),
                               event("nonfinite", "b2.out", "grad", "non-finite", 200)])) == [
        ("nonfinite_loss", "loss", "loss", 200)]
    assert summary(hypotheses([event("nonfinite", "b2.out", "value", "non-finite", 120)])) == [
        ("exploding", "node", "b2.out", 120)]


def test_optimizer_instability_turns_into_divergence_when_values_go_non_finite() -> None:
    cluster = event("optimizer_stability", "optimizer", "update", "unstable", 200, magnitude=2.0)
    assert summary(hypotheses([cluster])) == [("optimizer_instability", "optimizer", "", 200)]
    nan = event("nonfinite", "b1.pre", "value", "non-finite", 203)
    [h] = hypotheses([cluster, nan])
    assert summary([h]) == [("optimizer_divergence", "optimizer", "", 200)]
    assert [(x.effect.node, x.via) for x in h.chain.links] == [("b1.pre", "optimizer")]


def test_faults_from_step_0_come_first_and_dead_units_explain_vanishing_gradients() -> None:
    dead = event("activation_regime", "b1.out", "value", "dead", 0, magnitude=1.0, at_start=True)
    vanishing = event("gradient_health", "b1.pre", "grad", "vanishing", 0, magnitude=30.0, at_start=True)
    spike = event("optimizer_stability", "loss", "kpi", "spike", 150, magnitude=40.0)
    hs = hypotheses([spike, vanishing, dead])
    assert summary(hs) == [("dead_units", "architecture", "b1.out", 0), ("loss_spike", "data", "x", 150)]
    assert hs[0].sentence.startswith("Dead units originated in the architecture or initialisation (first seen in "
                                     "'b1.out') from the first step, after 100% of the units of 'b1.out' went dead")


def test_a_relative_change_that_harms_nothing_is_no_failure() -> None:
    jump = event("activation_regime", "b2.pre", "value", "exploding", 200, magnitude=2.0)
    assert hypotheses([jump], worse_from=None) == []  # the loss stayed where it was: training at work
    assert summary(hypotheses([jump], worse_from=200)) == [("exploding", "node", "b2.pre", 200)]


def test_hard_evidence_needs_no_loss_to_get_worse() -> None:
    dead = event("activation_regime", "b2.out", "value", "dead", 200, magnitude=1.0)
    assert summary(hypotheses([dead], worse_from=None)) == [("dead_units", "node", "b2.out", 200)]


def test_non_finite_gradients_starting_at_the_output_under_a_finite_loss_blame_the_loss() -> None:
    hs = hypotheses([event("nonfinite", "logits", "grad", "non-finite", 210),
                     event("nonfinite", "b2.out", "grad", "non-finite", 210)])
    assert summary(hs) == [("nonfinite_loss", "loss", "loss", 210)]


def test_every_hypothesis_carries_a_remedy_with_numbers_from_the_run() -> None:
    [h] = hypotheses([event("optimizer_stability", "optimizer", "update", "unstable", 200, magnitude=2.0)])
    assert h.remedy.startswith("lower the learning rate")


def test_a_sudden_shift_is_harm_by_itself_a_drift_is_not() -> None:
    jump = event("activation_regime", "b2.pre", "value", "exploding", 200, magnitude=2.0)
    sudden = Event(**{**jump.__dict__, "sudden": True})
    assert summary(hypotheses([sudden], worse_from=None)) == [("exploding", "node", "b2.pre", 200)]
    assert hypotheses([jump], worse_from=None) == []


def test_a_soft_state_from_the_first_step_is_no_failure_while_the_loss_falls() -> None:
    band = event("optimizer_stability", "w1", "update", "unstable", 0, magnitude=0.2, at_start=True)
    series = run(worse_from=None)
    learning = build_series({k: v for k, v in [((n, "value"), summary_rows(rms=np.ones(300))) for n in ROLES]},
                            roles=ROLES, kpis={"loss": (np.arange(300), np.geomspace(2.0, 0.1, 300))}, graph=GRAPH)
    assert rank_hypotheses([band], [], learning) == []
    assert summary(rank_hypotheses([band], [], series)) == [("optimizer_divergence", "architecture", "w1", 0)]


def test_an_optimizer_event_that_leaves_the_model_worse_than_untrained_is_a_divergence() -> None:
    loss = np.r_[np.geomspace(2.0, 0.05, 200), np.full(100, 5.0)]
    rows = {(n, "value"): summary_rows(rms=np.ones(300)) for n in ROLES}
    series = build_series(rows, roles=ROLES, kpis={"loss": (np.arange(300), loss)}, graph=GRAPH)
    cluster = event("optimizer_stability", "optimizer", "update", "unstable", 200, magnitude=3.0)
    assert summary(rank_hypotheses([cluster], [], series)) == [("optimizer_divergence", "optimizer", "", 200)]


def test_a_jump_with_units_dying_past_a_weight_matrix_leaves_the_type_open() -> None:
    jump = Event("activation_regime", "b1.pre", "value", "normal", "exploding", 200, 299, 1.5, 0.9, sudden=True)
    dead = event("activation_regime", "b2.out", "value", "dead", 200, magnitude=1.0)
    [h] = hypotheses([jump, dead])
    assert (h.type, h.alternatives, h.node, h.onset) == ("unclear", ("exploding", "dead_units"), "b1.pre", 200)
    assert h.sentence.startswith("A failure (exploding signal or dead units: unclear which) originated in 'b1.pre'")
    assert h.remedy.startswith("tell exploding from dead_units apart in the explorer at 'b1.pre', step 200")
    assert h.features[-1] == 1.0


def test_two_unlinked_hard_roots_in_the_same_phase_leave_the_type_open() -> None:
    nan_input = event("nonfinite", "x", "value", "non-finite", 210)
    dead = event("activation_regime", "b2.out", "value", "dead", 210, magnitude=1.0)
    series = run()
    assert [h.type for h in rank_hypotheses([nan_input, dead], [], series)][0] == "unclear"
    assert summary(hypotheses([nan_input, dead]))[0] == ("nonfinite_data", "data", "x", 210)  # linked: clear


def test_a_jump_that_carries_over_to_the_signal_that_dies_further_on_is_the_jump() -> None:
    jump = Event("activation_regime", "b1.pre", "value", "normal", "exploding", 200, 299, 1.5, 0.9, sudden=True)
    carried = event("activation_regime", "b2.pre", "value", "exploding", 200, magnitude=1.4)
    dead = event("activation_regime", "b2.out", "value", "dead", 200, magnitude=1.0)
    [h] = hypotheses([jump, carried, dead])
    assert (h.type, h.alternatives, h.node) == ("exploding", (), "b1.pre")
