"""Invariants learned from a healthy reference run: what held there, and the first step where a run breaks it.

A recording of a run known to train well is a specification of a healthy run of the same model: which
parameters change and which never do, the dtype of every node, the range of the inputs, how the layers'
gradient and update norms relate to each other, and whether each ``Dropout`` runs in train or eval mode in
each step type. :func:`compare_runs` learns these from the reference (the rules are in
:mod:`~comgra_ndbg.analysis.reference_rules`), checks the run under test against them and returns, for each
broken invariant, an event and a hypothesis whose sentence names the cause and the remedy with the evidence
of both runs; :func:`with_reference` adds them to a run's own diagnosis, ranked like the loop invariants
(ahead of the statistical hypotheses they explain). Runs that are not comparable (another model) raise
:class:`~comgra_ndbg.errors.ReferenceMismatchError` with what differs.

Confidence is an explicit rule, as for the loop invariants: :data:`CONFIDENCE` by how directly the
invariant is observed — 0.95 for a recorded dtype, 0.9 for parameters that change or not (an update that
is exactly 0 or not), 0.85 for the input range and the Dropout mode, 0.75 for norm ratios between layers.

>>> import numpy as np
>>> from comgra_ndbg.analysis.series import build_series
>>> from comgra_ndbg.store.schema import FIELD, identity_row
>>> def run(update):
...     rows = np.tile(identity_row(), (len(update), 1))
...     rows[:, FIELD["count"]], rows[:, FIELD["sum_sq"]] = 4, np.square(update)
...     s = build_series({("fc.parameters", "update"): (np.arange(len(update)), rows)},
...                      roles={"fc.parameters": "parameter"}, kpis={})
...     return RunFacts(s, ("train",) * len(update))
>>> found = compare_runs(run(np.r_[np.zeros(10)]), run(np.r_[np.zeros(6), np.ones(4)]))
>>> [(h.type, h.node, h.onset) for h in found.hypotheses]
[('frozen_trains', 'fc.parameters', 6)]
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from comgra_ndbg.analysis.events import CausalChain, Diagnosis, Event, Evidence, Hypothesis
from comgra_ndbg.analysis.hypotheses import features
from comgra_ndbg.analysis.invariants import merge_hypotheses
from comgra_ndbg.analysis.reference_rules import (CHECKS, LEARNERS, Finding, Invariant, ReferenceThresholds, RunFacts,
                                                  check_ratios, learn_ratios)
from comgra_ndbg.errors import ReferenceMismatchError

__all__ = ["RunFacts", "Invariant", "Finding", "ReferenceThresholds", "ReferenceComparison", "learn_invariants",
           "compare_runs", "with_reference", "check_comparable", "CONFIDENCE", "FAMILY"]

FAMILY = "reference_invariant"
CONFIDENCE = {"dtype": 0.95, "frozen": 0.9, "trains": 0.9, "input_range": 0.85, "mode": 0.85,
              "grad_ratio": 0.75, "update_ratio": 0.75}
"""Confidence of a hypothesis per rule (see the module docstring)."""
MIN_SHARED = 0.5  # parameter nodes both runs hold, as a share of all parameter nodes, for a comparison

# rule -> (hypothesis type, origin)
_TYPE = {"frozen": ("frozen_trains", "node"), "trains": ("update_stagnation", "node"),
         "dtype": ("wrong_dtype", "node"), "mode": ("wrong_mode", "node"),
         "grad_ratio": ("gradient_ratio", "node"), "update_ratio": ("update_ratio", "node")}


@dataclass(frozen=True)
class ReferenceComparison:
    """What the reference taught (``invariants``) and what the run broke: events and hypotheses by onset."""

    reference: str
    invariants: tuple[Invariant, ...]
    events: tuple[Event, ...]
    hypotheses: tuple[Hypothesis, ...]
    step_types: str = ""  # how the step types were matched, when the two runs name them differently

    def note(self) -> str:
        """One line for the diagnosis' notes: how many invariants held in the reference, how many broke."""
        rules = sorted({inv.rule for inv in self.invariants})
        return (f"compared with the reference run {self.reference!r}: {len(self.invariants)} invariants held there "
                f"({', '.join(rules) or 'none'}); {len(self.hypotheses)} broken here"
                + (f"; {self.step_types}" if self.step_types else ""))


def check_comparable(run: RunFacts, reference: RunFacts) -> None:
    """Raise :class:`ReferenceMismatchError` unless both runs share nodes and their parameter nodes mostly
    match, with the same tensor shapes."""
    mine, theirs = {n.name for n in run.series.nodes}, {n.name for n in reference.series.nodes}
    fix = ("record the reference with the same model and the same tensor names (NeuralDbg names nodes by module "
           "path), or choose the matching trial with reference_trial= (--reference-trial)")
    if not mine & theirs:
        raise ReferenceMismatchError(
            f"the reference {reference.source!r} has no node in common with the run {run.source!r} (reference: "
            f"{_names(theirs)}; run: {_names(mine)}): {fix}")
    params = {n.name for n in run.series.parameters}, {n.name for n in reference.series.parameters}
    union = params[0] | params[1]
    if union and len(params[0] & params[1]) < MIN_SHARED * len(union):
        raise ReferenceMismatchError(
            f"the reference {reference.source!r} is another model: only {len(params[0] & params[1])} of "
            f"{len(union)} parameter nodes are in both runs (only in the run: {_names(params[0] - params[1])}; "
            f"only in the reference: {_names(params[1] - params[0])}): {fix}")
    shapes, ref_shapes = run.shapes or {}, reference.shapes or {}
    differ = [n for n in sorted(params[0] & params[1])
              if n in shapes and n in ref_shapes and shapes[n] != ref_shapes[n]]
    if differ:
        n = differ[0]
        raise ReferenceMismatchError(
            f"the parameters of {len(differ)} node(s) have other shapes in the reference {reference.source!r} than in "
            f"the run {run.source!r} ('{n}': {list(map(list, ref_shapes[n]))} in the reference, "
            f"{list(map(list, shapes[n]))} here): the model is not the same; {fix}")


def learn_invariants(reference: RunFacts, thresholds: ReferenceThresholds = ReferenceThresholds(),
                     shared: frozenset[str] | None = None) -> tuple[Invariant, ...]:
    """Everything that held in ``reference`` (ratio rules over the parameter nodes in ``shared``, when given)."""
    out = [inv for learn in LEARNERS for inv in learn(reference, thresholds)]
    for kind in ("grad", "update"):
        out += learn_ratios(reference, thresholds, kind, shared)
    return tuple(out)


def compare_runs(reference: RunFacts, run: RunFacts, thresholds: ReferenceThresholds = ReferenceThresholds()
                 ) -> ReferenceComparison:
    """Learn the invariants of ``reference``, check ``run`` against them, and word each broken one (the first
    step it broke, the node, both runs' evidence, the cause and the remedy). Raises
    :class:`ReferenceMismatchError` when the runs are not comparable."""
    check_comparable(run, reference)
    run, matched = _match_step_types(run, reference)
    shared = frozenset(n.name for n in run.series.parameters) & frozenset(n.name for n in reference.series.parameters)
    invariants = learn_invariants(reference, thresholds, shared)
    findings: list[Finding] = []
    by_rule: dict[str, list[Finding]] = {}
    for inv in invariants:
        check = CHECKS.get(inv.rule)
        found = check(inv, run, thresholds) if check is not None else None
        if found is not None:
            by_rule.setdefault(inv.rule, []).append(found)
    for rule, found in by_rule.items():
        if rule in ("dtype", "input_range"):  # one mistake of the whole model or data: one hypothesis
            first = min(found, key=lambda f: (f.onset, run.series.node(f.invariant.node).order))
            findings.append(replace(first, others=tuple(f.invariant.node for f in found if f is not first)))
        else:
            findings += found
    for kind in ("grad", "update"):
        ratio = check_ratios([inv for inv in invariants if inv.rule == f"{kind}_ratio"], run, thresholds, kind)
        if ratio is not None:
            findings.append(ratio)
    findings.sort(key=lambda f: (f.onset, -CONFIDENCE[f.invariant.rule]))
    last = int(run.series.steps[-1]) if len(run.series.steps) else 0
    events, hypotheses = [], []
    for f in findings:
        kind, origin = _type(f)
        event = Event(FAMILY, f.invariant.node, _kind(f), "as in the reference", f.invariant.rule, f.onset,
                      max(last, f.onset), f.magnitude, 1.0, f.evidence)
        chain = CausalChain(event)
        confidence = CONFIDENCE[f.invariant.rule]
        cause, remedy = _words(f)
        text = f"{cause}; {remedy} (confidence {confidence:.2f})."
        hypotheses.append(Hypothesis(kind, origin, f.invariant.node, f.onset, confidence, text, chain,
                                     features(event, chain, len(hypotheses), len(findings), run.series), remedy))
        events.append(event)
    return ReferenceComparison(reference.source, invariants, tuple(events), tuple(hypotheses), matched)


def _match_step_types(run: RunFacts, reference: RunFacts) -> tuple[RunFacts, str]:
    """The rules hold per step type. Two runs of one type each, named differently ('train' and 'training'):
    the run's steps read as the reference's type. Types that share no name otherwise: nothing compares,
    and the note says so (it had said "0 broken here" as if every invariant held)."""
    mine = [t for t in dict.fromkeys(run.types().tolist()) if t]
    theirs = [t for t in dict.fromkeys(reference.types().tolist()) if t]
    if not mine or not theirs or set(mine) & set(theirs):
        return run, ""
    if len(mine) == 1 and len(theirs) == 1:
        renamed = tuple(theirs[0] if t == mine[0] else t for t in run.types().tolist())
        return replace(run, step_types=renamed), (f"this run's step type {mine[0]!r} was compared with the "
                                                  f"reference's {theirs[0]!r}")
    return run, (f"no step type in common (the reference's: {theirs}; this run's: {mine}), so no invariant was "
                 f"checked: record both with the same step types")


def with_reference(diagnosis: Diagnosis, comparison: ReferenceComparison) -> Diagnosis:
    """``diagnosis`` with the comparison's events inserted by onset, its hypotheses ranked like the loop
    invariants' (ahead of statistical hypotheses that start no earlier), and a note saying what was compared.
    A hypothesis the run's own analysis already holds (same type, origin and node) is not repeated."""
    have = {(h.type, h.origin, h.node) for h in diagnosis.hypotheses}
    data = {h.type for h in diagnosis.hypotheses if h.origin == "data"}
    extra = [h for h in comparison.hypotheses if (h.type, h.origin, h.node) not in have
             and not (h.origin == "data" and h.type in data)]
    events = list(diagnosis.events)
    for event in comparison.events:
        at = next((i for i, e in enumerate(events) if e.onset > event.onset), len(events))
        events.insert(at, event)
    return replace(diagnosis, events=tuple(events), hypotheses=tuple(merge_hypotheses(diagnosis.hypotheses, extra)),
                   notes=diagnosis.notes + (comparison.note(),))


def _type(f: Finding) -> tuple[str, str]:
    if f.invariant.rule == "input_range":
        return ("unnormalised_input" if f.measured > f.invariant.high else "data_shift"), "data"
    return _TYPE[f.invariant.rule]


def _kind(f: Finding) -> str:
    return {"grad_ratio": "grad", "update_ratio": "update", "trains": "update", "frozen": "update"}.get(
        f.invariant.rule, "value")


def _names(names: set[str] | frozenset[str], limit: int = 5) -> str:
    ordered = sorted(names)
    return ", ".join(f"'{n}'" for n in ordered[:limit]) + (f" and {len(ordered) - limit} more"
                                                            if len(ordered) > limit else "") if ordered else "none"


def _reference_values(evidence: tuple[Evidence, ...]) -> str:
    ref = next((e for e in evidence if e.series.startswith("reference:")), None)
    if ref is None or not ref.values:
        return ""
    return f" (reference, steps {list(ref.steps)}: {[float(f'{v:.3g}') for v in ref.values]})"


def _words(f: Finding) -> tuple[str, str]:
    """The sentence's cause (with the evidence of both runs) and the remedy."""
    inv, step_type = f.invariant, f" in '{f.invariant.step_type}' steps" if f.invariant.step_type else ""
    node, onset = inv.node, f.onset
    if inv.rule == "frozen":
        return (f"A stage meant to be frozen trains: '{node}' never changed in the reference run{step_type} "
                f"(every update exactly 0) but changes here from step {onset} on (update l2 {f.measured:.3g})",
                f"freeze it as the reference did: call requires_grad_(False) on '{node}' (or leave its parameters "
                f"out of the optimizer's param groups) before the first step, and check any code that unfreezes it")
    if inv.rule == "trains":
        return (f"Update stagnation: '{node}' changed at {inv.low:.0%} of the reference run's steps{step_type} but "
                f"stays unchanged here from step {onset} on ({int(f.magnitude)} steps in a row, update exactly 0, "
                f"while the loss is still above 1e-3 of its first value)",
                f"check what stops it: requires_grad_(False) on '{node}', a param group with learning rate 0, or "
                f"its parameters missing from the optimizer")
    if inv.rule == "dtype":
        more = f" (and {len(f.others)} more node(s): {_names(set(f.others), 3)})" if f.others else ""
        return (f"Computation in the wrong dtype: '{node}' is {f.measured_text} here but {inv.value} in the reference "
                f"run{more}, from step {onset} on",
                f"compute in the reference's dtype: convert the model and its inputs with .to({inv.value}) (no "
                f"model.half()/.double()), or use torch.autocast for mixed precision and keep the weights in float32")
    if inv.rule == "input_range":
        bigger = f.measured > inv.high
        return (f"Inputs far outside the reference's range: '{node}' has an rms of {f.measured:.3g} "
                f"({f.measured_text}) "
                f"at step {onset}, {10 ** f.magnitude:.3g}× {'above' if bigger else 'below'} the reference's range "
                f"{inv.low:.3g}–{inv.high:.3g} (abs max up to {float(inv.value):.3g})",
                "preprocess the inputs as the reference does (e.g. scale raw 0–255 pixels to 0–1 with / 255, "
                "normalise with the training set's mean and standard deviation)" if bigger else
                "preprocess the inputs as the reference does (a normalisation applied twice, or a wrong constant)")
    if inv.rule == "mode":
        return (f"A train/eval mode mistake: the Dropout '{node}' zeroes {f.measured:.1%} of the elements beyond "
                f"its input's from step {onset} on{step_type}, against {inv.low:.1%} in the reference run: it runs "
                f"in {f.measured_text}() mode where the reference ran it in {inv.value}() mode",
                f"call model.{inv.value}() before these steps and do not set '{node}' (or a module holding it) to "
                f"{f.measured_text}() on its own")
    what = "gradient" if inv.rule == "grad_ratio" else "update"
    cause = ("a gradient scaled in the backward pass (a backward hook, a loss term with a wrong weight, a detached or "
             "rescaled branch)" if what == "gradient" else
             "a learning rate or weight decay of its param group that differs from the others'")
    remedy = ("look for backward hooks, loss weights and detach() calls between the loss and "
              f"'{node}', and compare them with the reference's" if what == "gradient" else
              f"compare the param groups of the optimizer (learning rate, weight decay, edits of param_groups during "
              f"training) with the reference's for '{node}'")
    against = f"'{inv.value}'" if inv.value else "the median layer"
    return (f"The {what} norm of '{node}' relative to {against} is {10 ** f.measured:.3g}× at step {onset} "
            f"against {10 ** inv.low:.3g}×–{10 ** inv.high:.3g}× in the reference run"
            f"{_reference_values(f.evidence)} "
            f"(compared while the loss is above 1e-3 of its first value): {cause}", remedy)
