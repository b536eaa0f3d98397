"""Loop invariants as hypotheses: mistakes of the training loop, named by their cause, ranked before their effects.

Two sources, both read by :func:`loop_diagnosis`:

- the recording's log rows of category ``invariant``, written by ``NeuralDbg`` while the loop ran
  (:mod:`comgra_ndbg.instrument.invariants`): gradients carried over without ``zero_grad()``, parameters
  outside the optimizer, steps that change nothing or never end, the model's train/eval mode, BatchNorm on one sample,
  unused parameters, half-precision ``eps``, the trainable share;
- rules over what every recording holds (:class:`LoopFacts`, and the KPIs ``lr/<group>``): a learning
  rate that collapses early and never recovers, or drops to 0 with much of the run to go; the same input
  batch every step; inputs far outside the unit scale the first layer was initialised for; a constant
  target.

Each failure becomes a :class:`~comgra_ndbg.analysis.events.Hypothesis` whose sentence names the cause and
the remedy; each piece of information (a part frozen on purpose) a note. A loop error is the cause of the
statistical effects it produces, so :func:`merge_hypotheses` ranks it ahead of the statistical hypotheses
when the top one, or the first effect in its chain, starts no earlier than it (``slack`` steps of
reporting delay allowed) — except one param group's rate
stopping while other groups train (``lr_group_stopped``): that failure is where the group's parameters are,
which the statistical stagnation hypothesis names, so the loop hypothesis follows it as the mechanism.

Confidence is a small explicit rule, not a fitted one: :data:`CONFIDENCE` gives each invariant the
probability that a violation means a real mistake, by how directly it is observed — 0.95 for facts the
hooks see (the gradient tensor the optimizer consumed was added to; a parameter with a gradient in no param
group), 0.9 for facts over many steps or passes (unused parameters, a collapsed learning rate, a step that
never ends), 0.85 for equality of
summaries (the same batch, a constant target), 0.7 for a scale read from summaries (unnormalised inputs).

>>> import numpy as np
>>> from comgra_ndbg.analysis.series import build_series
>>> lr = np.r_[np.full(20, 0.1), np.full(80, 1e-5)]
>>> s = build_series({}, roles={}, kpis={"lr/0": (np.arange(100), lr), "loss": (np.arange(100), np.ones(100))})
>>> [(h.type, h.origin, h.onset) for h in loop_diagnosis(s).hypotheses]
[('update_stagnation', 'optimizer', 20)]
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import CausalChain, Event, Evidence, Hypothesis
from comgra_ndbg.analysis.harm import optimizer_blew_up_at_start
from comgra_ndbg.analysis.hypotheses import features
from comgra_ndbg.analysis.lost_updates import lost_updates
from comgra_ndbg.analysis.sentences import TYPE_TEXT
from comgra_ndbg.analysis.series import RunSeries
from comgra_ndbg.stats.statistics import derive, derive_one
from comgra_ndbg.store.schema import FIELD

__all__ = ["LoopRow", "TensorRows", "LoopFacts", "LoopDiagnosis", "loop_diagnosis", "merge_hypotheses",
           "CONFIDENCE", "FAMILY"]

FAMILY = "loop_invariant"
CONFIDENCE = {
    "stale_gradients": 0.95, "not_in_optimizer": 0.95, "foreign_parameters": 0.9, "no_optimizer_step": 0.95,
    "no_step_end": 0.9,
    "no_update": 0.95, "trainable_share": 0.9, "eval_mode_training": 0.95, "train_mode_evaluation": 0.9,
    "train_not_called": 0.9, "batchnorm_batch_one": 0.95, "unused_parameters": 0.9,
    "half_precision_eps": 0.95,
    "nonfinite_evaluation": 0.9, "nonfinite_evaluation_data": 0.9,
    "lr_collapse": 0.9, "lr_group_stopped": 0.85, "repeated_batch": 0.85, "unnormalised_input": 0.7,
    "constant_target": 0.85,
    "single_value_batches": 0.85, "lost_updates": 0.85, "sum_reduction": 0.9,
    "unregistered_parameters": 0.9, "identical_samples": 0.85, "betas_unstable": 0.85, "eps_too_large": 0.85,
    "outlier_batch": 0.85,
    "target_shape": 0.9, "lr_growth": 0.9, "activation_before_loss": 0.9, "negative_lr": 0.9,
    "decay_not_below_one": 0.9, "negative_weight_decay": 0.9,
    "average_without_memory": 0.85, "lr_below_base": 0.85, "batchnorm_frozen_statistics": 0.85, "loss_zeroed": 0.9,
    "weight_decay_dominant": 0.85,
}
"""Confidence of a hypothesis per invariant (see the module docstring for the rule)."""

# invariant -> (type, origin, remedy); a remedy may use {node} and {onset}
_READING = {
    "stale_gradients": ("stale_gradients", "loop",
                        "call optimizer.zero_grad() once per optimizer step, before loss.backward() (with gradient "
                        "accumulation: right after optimizer.step())"),
    "not_in_optimizer": ("update_stagnation", "optimizer",
                         "build the optimizer after the model is complete (after replacing or adding layers), or add "
                         "the missing parameters with optimizer.add_param_group({{'params': ...}})"),
    "foreign_parameters": ("update_stagnation", "optimizer",
                           "build the optimizer from the parameters of the model that is trained, after every layer "
                           "was replaced or moved and after load_state_dict(..., assign=True)"),
    "no_optimizer_step": ("update_stagnation", "loop",
                          "call optimizer.step() after loss.backward() in every training step"),
    "no_step_end": ("update_stagnation", "loop",
                    "call optimizer.step() and then optimizer.zero_grad() in every training step (with gradient "
                    "accumulation: after the last micro-batch of each step), and check the condition that guards "
                    "optimizer.step() (it is never true)"),
    "no_update": ("update_stagnation", "optimizer",
                  "check the learning rate of every param group and the scheduler that sets it (a learning rate of 0 "
                  "leaves every parameter where it is)"),
    "trainable_share": ("update_stagnation", "architecture",
                        "check which code sets requires_grad_(False) at step {onset}; freeze only the part meant to "
                        "stay fixed"),
    "eval_mode_training": ("wrong_mode", "loop",
                           "call model.train() at the start of every training epoch (after each evaluation)"),
    "train_mode_evaluation": ("wrong_mode", "loop",
                              "call model.eval() before evaluating, and model.train() again before training"),
    "train_not_called": ("wrong_mode", "loop",
                         "call model.train() before the first training step and at the start of every epoch: the "
                         "model's own train() applies its frozen stages and normalisation settings there"),
    "batchnorm_batch_one": ("batch_statistics", "node",
                            "train with batches of more than one sample per replica (drop_last=True for a last "
                            "batch of one; BatchNorm1d needs several samples per micro-batch), or use "
                            "GroupNorm/LayerNorm, or put '{node}' in eval() mode"),
    "unused_parameters": ("unused_parameters", "node",
                          "check that the output of '{node}' reaches the loss (a tensor detached, a branch not "
                          "used, a layer replaced by another); freeze it with requires_grad_(False) if it is meant "
                          "to stay unused"),
    "half_precision_eps": ("precision", "optimizer",
                           "keep the weights in float32 and use torch.autocast with a GradScaler for half-precision "
                           "compute, or raise the optimizer's eps to at least 1e-4"),
    "nonfinite_evaluation": ("nonfinite_evaluation", "node",
                             "check what '{node}' computes only in eval() mode or without gradients: its BatchNorm "
                             "running statistics (finite after training?), an eval-only branch, a calibration "
                             "constant (a temperature) left at 0"),
    "nonfinite_evaluation_data": ("nonfinite_evaluation", "data",
                                  "check the evaluation data for NaN or Inf (a missing value, a division by zero in "
                                  "its preprocessing) and clean or drop those samples; the training data is read by "
                                  "another path"),
    "lr_growth": ("optimizer_divergence", "optimizer",
                  "stop the schedule's growth: a warm-up ends at its target rate (check its length and that the "
                  "scheduler after it takes over), and a factor applied every step must stay at or below 1"),
    "negative_lr": ("optimizer_divergence", "optimizer",
                    "check the scheduler: a decay that runs past its last step (a linear decay given too few "
                    "steps) turns negative; clamp its factor at 0 or give it the run's real length"),
    "decay_not_below_one": ("optimizer_divergence", "optimizer",
                            "keep momentum, betas, alpha and rho below 1 (0.9; (0.9, 0.999); 0.99 are the usual "
                            "values), and check the code that edits the param groups"),
    "betas_unstable": ("optimizer_instability", "optimizer",
                       "use betas=(beta1, beta2) with beta1 below beta2, e.g. the default (0.9, 0.999); check that the "
                       "two were not swapped"),
    "eps_too_large": ("update_stagnation", "optimizer",
                      "set eps to a small number (the default 1e-8; 1e-6 or 1e-4 for half precision)"),
    "average_without_memory": ("optimizer_instability", "optimizer",
                               "give the squared-gradient average a factor between 0 and 1 (RMSprop alpha=0.99, Adam "
                               "betas=(0.9, 0.999)), and check the code that builds or edits the param groups"),
    "lr_below_base": ("update_stagnation", "optimizer",
                      "check the schedule's length and unit: a warm-up counts optimizer steps when the scheduler is "
                      "stepped per batch (10^6 typed for 10^2? epochs given where steps are counted?), and its factor "
                      "must reach 1"),
    "batchnorm_frozen_statistics": ("batch_statistics", "node",
                                    "build BatchNorm with momentum=0.1 (the default) or momentum=None (a cumulative "
                                    "average); momentum=0 is for freezing statistics a pre-trained model already has"),
    "loss_zeroed": ("update_stagnation", "loss",
                    "check the factor the loss is multiplied by: an integer division (step // n) or a weight that "
                    "decays to exactly 0 switches training off from step {onset}"),
    "negative_weight_decay": ("optimizer_divergence", "optimizer",
                              "give weight_decay a value of 0 or more (1e-4 to 1e-1 is usual), and check the code "
                              "that edits the param groups"),
    "weight_decay_dominant": ("vanishing", "optimizer",
                              "give weight_decay a usual value (5e-4 to 5e-3 with SGD, 0.01 to 0.1 with AdamW): a "
                              "typo of 0.5 for 5e-4 pulls every weight to 0 faster than the gradients can move it"),
    "lr_collapse": ("update_stagnation", "optimizer",
                    "check the scheduler: step it once per epoch if its step_size / T_max / milestones count "
                    "epochs (or give it the number of batches), and check the steps it was told the run has"),
    "lr_group_stopped": ("update_stagnation", "optimizer",
                         "if that group is meant to train, restore its learning rate (a param_groups edit, or a "
                         "scheduler lambda returning 0 for it); to freeze it on purpose, use requires_grad_(False)"),
    "repeated_batch": ("repeated_batch", "data",
                       "create the DataLoader (with shuffle=True) once, outside the training loop, and draw every "
                       "batch from the same iterator; if you train on the whole data set as one batch on purpose, "
                       "this is expected"),
    "unnormalised_input": ("unnormalised_input", "data",
                           "normalise the inputs (e.g. images / 255, or subtract the mean and divide by the standard "
                           "deviation of the training set) before the first layer"),
    "target_shape": ("target_shape", "loss",
                     "give the loss a prediction and a target of one shape: squeeze the output's last dimension "
                     "(output.squeeze(-1)) or unsqueeze the target (target.unsqueeze(-1))"),
    "activation_before_loss": ("output_range", "node",
                               "pass the loss the model's raw outputs (logits): BCEWithLogitsLoss and CrossEntropyLoss "
                               "apply the sigmoid or softmax themselves, so remove the model's last sigmoid/softmax "
                               "(apply it only to predictions at inference); NLLLoss takes log_softmax's output, not "
                               "softmax's"),
    "outlier_batch": ("loss_spike", "data",
                      "find that batch in the data (its step) and fix or drop it; guard the loop against such batches "
                      "(check the targets' and inputs' range before the step, or clip the gradient norm)"),
    "identical_samples": ("mode_collapse", "data",
                          "draw each row of the batch on its own (torch.randn(B, d), not "
                          "torch.randn(1, d).expand(B, d), a repeat of one item, or noise times a scale of 0), and "
                          "check the collate step and the configuration that scales the input"),
    "unregistered_parameters": ("update_stagnation", "architecture",
                                "keep sub-modules in nn.ModuleList / nn.ModuleDict (a plain list or dict hides their "
                                "parameters from model.parameters(), the optimizer, .to() and the state dict), then "
                                "build the optimizer from model.parameters()"),
    "sum_reduction": ("optimizer_divergence", "loss",
                      "average the loss (reduction='mean', the default), or divide the learning rate by the number of "
                      "terms the sum adds up"),
    "lost_updates": ("precision", "architecture",
                     "keep the weights in float32 and run the forward pass under torch.autocast(dtype=torch.bfloat16) "
                     "(float32 master weights), instead of model.to(torch.bfloat16) / .half()"),
    "single_value_batches": ("single_value_batches", "data",
                             "shuffle the training data (DataLoader(..., shuffle=True), or a random sampler): a data "
                             "set sorted by its labels gives batches of one class each"),
    "constant_target": ("constant_target", "data",
                        "check how the targets are built (a label column read wrongly, a target overwritten, an "
                        "index that never changes)"),
}
_POINTS_AT_NODE = ("not_in_optimizer", "unused_parameters", "batchnorm_batch_one", "nonfinite_evaluation",
                   "nonfinite_evaluation_data", "activation_before_loss", "batchnorm_frozen_statistics")
_BEHIND = ("lr_group_stopped",)
"""Invariants that explain how, not where: one param group stopped while the others train is a failure of
the nodes that group holds, which the statistical stagnation hypothesis names; the loop hypothesis follows it."""
COLLAPSE_DECADES = 3.0  # a learning rate at or below 10^-3 of its maximum so far has collapsed
RECOVERED = 0.1  # ... unless it comes back to a tenth of that maximum (warm restarts, cyclic schedules)
EARLY = 0.5  # a collapse before this share of the run is no schedule's intended end
ZERO_LEFT = 0.1  # a rate of exactly 0 with at least this share of the run (and 10 steps) left
REPEAT_SHARE = 0.9  # share of consecutive recorded steps with the same batch
REPEAT_RUN = 20  # ... or this many in a row up to the last step, after different batches (stuck from a step on)
MIN_STEPS = 3
UNIT_SCALE = 20.0  # input rms over this, from the first steps: far outside a unit-scale initialisation
_MIN, _MAX, _COUNT = FIELD["min"], FIELD["max"], FIELD["count"]
_SPREAD_COUNT, _SPREAD_DEV = FIELD["spread_count"], FIELD["spread_dev_sq"]
_SCALE_FREE = ("Embedding", "EmbeddingBag", "BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "RMSNorm")


@dataclass(frozen=True)
class LoopRow:
    """A log row of category ``invariant``: its step, subject, sentence and evidence."""

    step: int
    subject: str
    message: str
    detail: Mapping = field(default_factory=dict)

    @property
    def invariant(self) -> str:
        return str(self.detail.get("invariant", ""))

    @property
    def severity(self) -> str:
        return str(self.detail.get("severity", "failure"))


@dataclass(frozen=True)
class TensorRows:
    """Summary rows of one input or target tensor: ``steps`` and ``rows`` (``schema.FIELD`` columns)."""

    name: str
    dtype: str
    steps: np.ndarray
    rows: np.ndarray


@dataclass(frozen=True)
class LoopFacts:
    """What the loop-invariant analysis reads besides the series: the invariant log, input and target rows."""

    rows: tuple[LoopRow, ...] = ()
    inputs: tuple[TensorRows, ...] = ()
    targets: tuple[TensorRows, ...] = ()

    def outside_optimizer(self) -> frozenset[str]:
        """Parameter nodes the loop saw getting gradients while in no param group of the optimizers that
        stepped (``not_in_optimizer``, failure or information): nothing trains them, whatever their gradient."""
        return frozenset(node for r in self.rows if r.invariant == "not_in_optimizer"
                         for node in (r.detail.get("nodes") or [r.subject]))

    @staticmethod
    def row(step: int, subject: str, message: str, detail: str | Mapping) -> LoopRow:
        """A :class:`LoopRow` from a log entry (its detail as stored: a JSON object, or already parsed)."""
        if isinstance(detail, str):
            try:
                detail = json.loads(detail) if detail else {}
            except ValueError:
                detail = {}
        return LoopRow(int(step), str(subject), str(message), dict(detail) if isinstance(detail, Mapping) else {})


@dataclass(frozen=True)
class LoopDiagnosis:
    """Failure hypotheses (by onset), their events, and notes (information, no failure)."""

    hypotheses: tuple[Hypothesis, ...] = ()
    events: tuple[Event, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Finding:
    invariant: str
    onset: int
    node: str
    message: str
    evidence: tuple[Evidence, ...] = ()
    magnitude: float = 1.0


def loop_diagnosis(series: RunSeries, facts: LoopFacts | None = None) -> LoopDiagnosis:
    """Every loop-invariant failure of a run as a hypothesis, and its information as notes (see the module
    docstring); ``facts`` defaults to ``series.loop``."""
    facts = facts if facts is not None else (getattr(series, "loop", None) or LoopFacts())
    findings: list[_Finding] = []
    notes: list[str] = []
    for row in facts.rows:
        if row.invariant in _EXPLAINS_ONLY:
            findings += _EXPLAINS_ONLY[row.invariant](row, series)
            continue
        if row.severity != "failure":
            notes.append(f"{row.message} (step {row.step}).")
            continue
        if row.invariant not in _READING:
            continue
        nodes = row.detail.get("nodes") or [row.subject]
        node = nodes[0] if row.invariant in _POINTS_AT_NODE else ""
        findings.append(_Finding(row.invariant, row.step, node, row.message,
                                 (Evidence(f"log/{row.invariant}", (row.step,), (1.0,)),)))
    if any(f.invariant == "not_in_optimizer" for f in findings):  # the replaced layer's old parameters: one mistake
        findings = [f for f in findings if f.invariant != "foreign_parameters"]
    findings += _lr_findings(series)
    findings += _lr_growth_findings(series)
    findings += _batch_findings(series, facts)
    findings += _target_findings(facts)
    findings += _precision_findings(series)
    findings += _zeroed_loss_findings(series)
    findings.sort(key=lambda f: f.onset)
    hypotheses, events, seen = [], [], set()
    last = int(series.steps[-1]) if len(series.steps) else 0
    for f in findings:
        kind, origin, advice = _READING[f.invariant]
        if (kind, origin, f.node) in seen:
            continue
        seen.add((kind, origin, f.node))
        event = Event(FAMILY, f.node or origin, "loop", "held", f.invariant, f.onset, max(last, f.onset),
                      f.magnitude, 1.0, f.evidence)
        chain = CausalChain(event)
        confidence = CONFIDENCE[f.invariant]
        advice = advice.format(node=f.node, onset=f.onset)
        text = f"{_title(kind)}: {f.message}; {advice} (confidence {confidence:.2f})."
        hypotheses.append(Hypothesis(kind, origin, f.node, f.onset, confidence, text, chain,
                                     features(event, chain, len(hypotheses), len(findings), series), advice))
        events.append(event)
    return LoopDiagnosis(tuple(hypotheses), tuple(events), tuple(notes))


def merge_hypotheses(statistical: Sequence[Hypothesis], loop: Sequence[Hypothesis], *, slack: int = 2
                     ) -> list[Hypothesis]:
    """One ranking: a loop hypothesis that explains the top statistical hypothesis goes ahead of the
    statistical ones, the others after; each part keeps its own order. A loop mistake explains it when it
    starts no later than ``slack`` steps after it (it is its cause, or came first), or no later than ``slack``
    steps after the first effect in its chain: a violation seen right where the harm begins explains that
    harm better than a reading dated many steps before it (an early, weak "divergence" whose non-finite
    values only follow the mistake). A statistical hypothesis that a loop error explains keeps its
    confidence; one that says what a loop hypothesis ahead of it says (the same type, origin and node, an
    onset within ``slack`` steps: a learning rate at 0 and no parameter changing from that step) is one
    finding read twice, so it is folded into the loop hypothesis, which names the cause, and lends it its
    confidence where that is higher.

    >>> from comgra_ndbg.analysis.events import CausalChain, CausalLink, Event
    >>> e = Event("f", "n", "value", "a", "b", 0, 0, 1.0, 1.0)
    >>> h = lambda kind, onset: Hypothesis(kind, "node", "n", onset, 0.9, kind, CausalChain(e))
    >>> [x.type for x in merge_hypotheses([h("exploding", 30)], [h("stale_gradients", 12), h("precision", 80)])]
    ['stale_gradients', 'exploding', 'precision']
    >>> late = Event("f", "n", "grad", "finite", "non-finite", 32, 32, 1.0, 1.0)
    >>> early = Hypothesis("optimizer_divergence", "architecture", "n", 6, 0.4, "", CausalChain(
    ...     e, (CausalLink(e, late, 26, "same-node"),)))
    >>> [x.type for x in merge_hypotheses([early], [h("wrong_mode", 33)])]
    ['wrong_mode', 'optimizer_divergence']
    >>> stalled = Hypothesis("update_stagnation", "optimizer", "", 145, 0.95, "", CausalChain(e))
    >>> lr_at_zero = Hypothesis("update_stagnation", "optimizer", "", 145, 0.9, "The rate fell to 0 (confidence 0.90).",
    ...                         CausalChain(e))
    >>> [(x.confidence, x.sentence) for x in merge_hypotheses([stalled], [lr_at_zero])]
    [(0.95, 'The rate fell to 0 (confidence 0.95).')]
    """
    if not statistical:
        return list(loop)
    top = statistical[0]
    effects = [link.effect.onset for link in top.chain.links]
    first = max(top.onset, min(effects, default=top.onset)) + slack
    ahead = [h for h in loop if h.onset <= first and h.chain.root.to_state not in _BEHIND]
    behind = [h for h in loop if h not in ahead]
    kept = []
    for h in statistical:
        same = next((i for i, l in enumerate(ahead) if ((l.type, l.origin, l.node) == (h.type, h.origin, h.node)
                                                         or h.type in _SEEN_AS.get(l.type, ())
                                                         or h.type in _SEEN_AS.get(l.chain.root.to_state, ()))
                     and abs(l.onset - h.onset) <= slack), None)
        if same is None:
            kept.append(h)
        elif h.confidence > ahead[same].confidence:
            ahead[same] = _with_confidence(ahead[same], h.confidence)
    return ahead + kept + behind


_SEEN_AS = {"target_shape": ("output_range",), "activation_before_loss": ("output_range", "saturation"),
            "sum_reduction": ("optimizer_divergence", "optimizer_instability"),
            "outlier_batch": ("optimizer_divergence", "optimizer_instability", "loss_spike", "nonfinite_loss",
                              "exploding")}
"""Loop mistakes and the statistical reading of their effect, folded into them as one finding: a prediction
broadcast against a target of another shape learns the batch mean, which reads as an output that cannot
reach its targets; so does a sigmoid or softmax the loss applies a second time, whose first application
saturates as the model pushes against the cap."""


def _with_confidence(h: Hypothesis, confidence: float) -> Hypothesis:
    """``h`` with ``confidence``, its sentence's closing "(confidence x)" rewritten to match."""
    said = f"(confidence {h.confidence:.2f})."
    sentence = h.sentence
    if sentence.endswith(said):
        sentence = sentence[:-len(said)] + f"(confidence {confidence:.2f})."
    return replace(h, confidence=confidence, sentence=sentence)


def _title(kind: str) -> str:
    return TYPE_TEXT.get(kind, kind)


# ---- the learning rate ------------------------------------------------------------------------------------------
def _lr_findings(series: RunSeries) -> list[_Finding]:
    """A param group's learning rate (KPI ``lr/<group>``) that collapsed to ≤ 10^-3 of its maximum before half
    the run and never came back to a tenth of it, or that fell to exactly 0 with ≥ 10 % of the run (and 10
    steps) still to go."""
    out = []
    n = len(series.steps)
    for name in sorted(k for k in series.kpis if k.startswith("lr/")):
        lr = series.kpis[name]
        present = np.flatnonzero(np.isfinite(lr))
        if len(present) < MIN_STEPS:
            continue
        values = lr[present]
        negative = np.flatnonzero(values < 0)
        if len(negative):  # gradient ascent: not a collapse
            i = int(negative[0])
            onset = int(series.steps[present[i]])
            out.append(_Finding(
                "negative_lr", onset, "",
                f"the learning rate of param group {name[3:]} turned negative ({values[i]:.3g}) at step {onset}: every "
                f"update from then on climbs the loss instead of descending it",
                (Evidence(f"kpi/{name}", (int(series.steps[present[max(i - 1, 0)]]), onset),
                          (float(values[max(i - 1, 0)]), float(values[i]))),)))
            continue
        peak = np.maximum.accumulate(values)
        low = (peak > 0) & (values <= peak * 10 ** -COLLAPSE_DECADES * (1 + 1e-9))  # 0.1 · 0.1³ > 1e-4 in floats
        zero = (peak > 0) & (values == 0)
        for i in np.flatnonzero(low):
            later = values[i:]
            if np.any(later >= RECOVERED * peak[i]):
                continue
            position = present[i]
            left = n - position
            early = position < EARLY * n
            stopped = zero[i] and left >= max(10, ZERO_LEFT * n)
            if not (early or stopped):
                break
            onset = int(series.steps[position])
            group = name[3:]
            others = [k for k in series.kpis if k.startswith("lr/") and k != name]
            kind = "lr_group_stopped" if any(_still_training(series.kpis[k], position) for k in others) else \
                "lr_collapse"
            what = ("fell to 0" if values[i] == 0 else
                    f"fell to {values[i]:.3g}, {values[i] / peak[i]:.1g} of its maximum {peak[i]:.3g},")
            out.append(_Finding(
                kind, onset, "",
                f"the learning rate of param group {group} {what} at step {onset} and stayed there for the remaining "
                f"{left} step(s) of the run ({position / max(n, 1):.0%} of the way through): from then on the "
                f"updates are too small to train",
                (Evidence(f"kpi/{name}", (int(series.steps[present[max(i - 1, 0)]]), onset),
                          (float(values[max(i - 1, 0)]), float(values[i])), float(peak[i])),),
                float(np.log10(peak[i] / values[i])) if values[i] > 0 else float("inf")))
            break
    return out


def _lr_growth_findings(series: RunSeries) -> list[_Finding]:
    """A param group's learning rate rising at every recorded step to the run's end, ``GROWTH``× or more
    since that rise began and still ``TAIL_GROWTH``× over the last tenth of the run, with the loss worse
    after its start: a schedule that never stops growing (a warm-up without its end, a factor applied every
    step). A warm-up reaches its rate and stays or decays; a learning-rate range test rises like this on
    purpose (the sentence says so)."""
    out = []
    for name in sorted(k for k in series.kpis if k.startswith("lr/")):
        lr = series.kpis[name]
        present = np.flatnonzero(np.isfinite(lr))
        if len(present) < 2 * MIN_GROWTH_STEPS:
            continue
        values = lr[present]
        falls = np.flatnonzero(~(values[1:] > values[:-1]))
        start = int(falls[-1]) + 1 if len(falls) else 0  # the strictly rising run that reaches the last step
        tail = values[-max(MIN_GROWTH_STEPS // 2, len(values) // 10):]
        if (len(values) - start < MIN_GROWTH_STEPS or values[start] <= 0 or values[-1] < GROWTH * values[start]
                or tail[-1] < TAIL_GROWTH * tail[0]):
            continue
        onset = int(series.steps[present[start]])
        if not _worse_at_the_end(series, int(present[start])):
            continue
        out.append(_Finding(
            "lr_growth", onset, "",
            f"the learning rate of param group {name[3:]} rose at every step from step {onset} to the end of the run, "
            f"from {values[start]:.3g} to {values[-1]:.3g} ({values[-1] / values[start]:.3g}×), and the loss got "
            f"worse from then on: a schedule that never stops growing (unless this run is a learning-rate range "
            f"test)", (Evidence(f"kpi/{name}", (onset, int(series.steps[present[-1]])),
                                (float(values[start]), float(values[-1]))),),
            float(np.log10(values[-1] / values[start]))))
        break
    return out


def _worse_at_the_end(series: RunSeries, index: int, t: Thresholds = Thresholds()) -> bool:
    """Whether the loss of the run's last ``window`` steps is worse than that of the ``window`` steps before
    index ``index`` (as ``harm`` reads worse: ``harm_factor`` × and ``harm_fraction`` of the first loss above
    it, or non-finite): a slowly growing rate harms late, not in the steps right after it starts."""
    loss = np.asarray(series.loss, dtype=np.float64)
    before, end = loss[max(0, index - t.window):index], loss[-t.window:]
    finite = before[np.isfinite(before)]
    if not len(finite) or index >= len(loss) - t.window:
        return False
    if not np.isfinite(end).all():
        return True
    first = loss[np.isfinite(loss)][:t.window]
    initial = float(np.median(first)) if len(first) else 0.0
    low, high = float(np.median(finite)), float(np.median(end))
    return high >= t.harm_factor * low and high - low >= t.harm_fraction * initial


GROWTH = 100.0  # a rising learning rate this many times its value where the rise began ...
TAIL_GROWTH = 2.0  # ... and still rising this much over the last tenth of the run
MIN_GROWTH_STEPS = 20


def _still_training(lr: np.ndarray, position: int) -> bool:
    """Whether another group's rate is above 10^-3 of its own maximum at ``position``."""
    seen = lr[:position + 1]
    seen = seen[np.isfinite(seen)]
    return bool(len(seen) and seen[-1] > seen.max() * 10 ** -COLLAPSE_DECADES)


# ---- data: the same batch, unnormalised inputs, a constant target --------------------------------------------
def _batch_findings(series: RunSeries, facts: LoopFacts) -> list[_Finding]:
    inputs = [t for t in facts.inputs if len(t.steps) and np.any(t.rows[:, _MIN] != t.rows[:, _MAX])]
    out = []
    if inputs:
        common = inputs[0].steps
        for t in inputs[1:]:
            common = np.intersect1d(common, t.steps)
        if len(common) >= MIN_STEPS:
            same = np.ones(len(common) - 1, bool)
            for t in inputs:
                rows = t.rows[np.searchsorted(t.steps, common)]
                same &= np.all((rows[1:] == rows[:-1]) | (np.isnan(rows[1:]) & np.isnan(rows[:-1])), axis=1)
            names = ', '.join(repr(t.name) for t in inputs[:3])
            tail = len(same) - int(np.flatnonzero(~same)[-1]) - 1 if (~same).any() else len(same)
            if same.sum() >= MIN_STEPS - 1 and same.mean() >= REPEAT_SHARE:
                onset = int(common[1:][same][0])
                out.append(_Finding(
                    "repeated_batch", onset, "",
                    f"the input batch is the same at {int(same.sum()) + 1} of {len(common)} recorded steps (every "
                    f"summary of {names} identical from step {onset - 1} on): "
                    f"the data loader restarts at its first batch every step",
                    (Evidence(f"{inputs[0].name}/value/mean", tuple(int(s) for s in common[:3]),
                              tuple(float(v) for v in derive(inputs[0].rows[:3])["mean"])),)))
            elif tail >= REPEAT_RUN:  # different batches, then one batch to the end: a loader stuck from a step on
                first = len(common) - 1 - tail  # the index in ``common`` of the batch repeated from then on
                onset = int(common[first + 1])
                at = np.searchsorted(inputs[0].steps, common[first:first + 3])
                out.append(_Finding(
                    "repeated_batch", onset, "",
                    f"the input batch is the same at every recorded step from step {int(common[first])} to the last, "
                    f"{tail + 1} steps (every summary of {names} identical), after different batches before: the "
                    f"data loader is stuck on one batch",
                    (Evidence(f"{inputs[0].name}/value/mean", tuple(int(s) for s in common[first:first + 3]),
                              tuple(float(v) for v in derive(inputs[0].rows[at])["mean"])),)))
    out += _scale_findings(series, facts)
    out += _identical_sample_findings(facts)
    out += _outlier_batch_findings(facts)
    return out


OUTLIER = 100.0
"""An input or target batch whose rms is this many times its recent median is an outlier (a corrupt batch)."""


def _outlier_batch_findings(facts: LoopFacts) -> list[_Finding]:
    """The first input or target batch whose rms is ≥ :data:`OUTLIER` × the median of the (up to 20) recorded
    steps before it, at least 5 of them, while the batches recorded after it are back under a tenth of that
    (their median over up to 3): one corrupt batch (targets in other units, a sensor glitch), whatever the
    model did with it next. A scale that stays is a shift of the data (the statistical rules' ``data_shift``)."""
    found: list[tuple[int, str, str, float, float]] = []
    for node, tensors in (("input", facts.inputs), ("target", facts.targets)):
        for t in tensors:
            if not t.dtype.startswith(("float", "bfloat", "half")) or len(t.steps) < MIN_STEPS + 3:
                continue
            rms = derive_one(t.rows, "rms")
            for i in range(MIN_STEPS + 2, len(rms) - 1):
                before = rms[max(0, i - 20):i]
                before = before[np.isfinite(before) & (before > 0)]
                if len(before) < MIN_STEPS + 2 or not np.isfinite(rms[i]):
                    continue
                usual = float(np.median(before))
                after = rms[i + 1:i + 4]
                after = after[np.isfinite(after)]
                if rms[i] >= OUTLIER * usual and len(after) and np.median(after) < OUTLIER / 10 * usual:
                    found.append((int(t.steps[i]), node, t.name, float(rms[i]), usual))
                    break
    if not found:
        return []
    onset, node, name, value, usual = min(found)
    return [_Finding(
        "outlier_batch", onset, node,
        f"the batch of step {onset} is an outlier: the rms of '{name}' is {value:.3g}, {value / usual:,.0f}× its "
        f"recent median {usual:.3g}, and the batches after it are back to their usual scale (a corrupt batch: "
        f"values in other units, a glitch in the data)",
        (Evidence(f"{name}/value/rms", (onset,), (value,), usual),))]


def _identical_sample_findings(facts: LoopFacts) -> list[_Finding]:
    """Every sample of the batch the same, in every floating input, at ≥ ``REPEAT_SHARE`` of ≥ ``MIN_STEPS``
    + 2 recorded steps while the batch changes from step to step: one noise vector expanded over the batch
    (``torch.randn(1, d).expand(B, d)``), a collate step that repeats one item. An input constant on purpose
    (the same at every step) and a second input shared by the batch beside one that varies (a diffusion
    timestep) are left alone."""
    batched = [t for t in facts.inputs if len(t.steps) >= MIN_STEPS + 2 and (t.rows[:, _SPREAD_COUNT] > 0).any()]
    if not batched:
        return []
    zeros = _all_zero_inputs(facts, batched)
    if zeros:
        return zeros
    shares, firsts = [], []
    for t in batched:
        known = t.rows[:, _SPREAD_COUNT] > 0
        same = known & (t.rows[:, _SPREAD_DEV] == 0)
        varies = np.any(t.rows[known][:, _MIN] != t.rows[known][0, _MIN])
        if not varies or same.sum() < REPEAT_SHARE * known.sum():
            return []
        shares.append(float(same.sum() / known.sum()))
        firsts.append(int(t.steps[np.flatnonzero(same)[0]]))
    onset, names = min(firsts), ", ".join(repr(t.name) for t in batched[:3])
    return [_Finding(
        "identical_samples", onset, "",
        f"every sample of the batch is the same in {names} at {min(shares):.0%} of the recorded steps (the batch "
        f"changes from step to step, its rows never differ): the model sees one sample per step, copied",
        (Evidence(f"{batched[0].name}/value/sample_spread", (onset,), (0.0,)),))]


def _all_zero_inputs(facts: LoopFacts, batched: list) -> list[_Finding]:
    """Every floating input exactly 0 in every element at ≥ ``REPEAT_SHARE`` of its recorded steps: the model's
    output then cannot differ from sample to sample or step to step (a generator's noise multiplied by a scale
    of 0, an input zeroed by a mask). A zero input beside one that varies (an RNN's initial state) is left
    alone, and so is an input that is a constant other than 0 (a dummy of ones)."""
    floating = [t for t in facts.inputs if t.dtype.startswith(("float", "bfloat", "half"))]
    if not floating or any(t not in batched for t in floating):
        return []
    firsts = []
    for t in floating:
        zero = (t.rows[:, _MIN] == 0) & (t.rows[:, _MAX] == 0)
        if zero.sum() < REPEAT_SHARE * len(zero):
            return []
        firsts.append(int(t.steps[np.flatnonzero(zero)[0]]))
    onset, names = min(firsts), ", ".join(repr(t.name) for t in floating[:3])
    return [_Finding(
        "identical_samples", onset, "",
        f"every floating input ({names}) is exactly 0 in every element at the recorded steps: the model computes "
        f"the same output for every sample of every batch (a noise vector multiplied by a scale of 0?)",
        (Evidence(f"{floating[0].name}/value/max", (onset,), (0.0,)),))]


def _scale_findings(series: RunSeries, facts: LoopFacts) -> list[_Finding]:
    """Floating inputs whose rms over the first recorded steps is ≥ :data:`UNIT_SCALE`, when the layers
    they feed are not scale-free (an embedding, a normalisation)."""
    if series.graph is not None:
        consumers = [e.target for e in series.graph.edges if e.source == "input"]
        if consumers and all(any(k in series.node_info(c).module_type for k in _SCALE_FREE) for c in consumers):
            return []
    out = []
    for t in facts.inputs:
        if "float" not in t.dtype and "half" not in t.dtype or not len(t.steps):
            continue
        stats = derive(t.rows[:10])
        rms = float(np.nanmedian(stats["rms"]))
        if rms >= UNIT_SCALE:
            onset = int(t.steps[0])
            out.append(_Finding(
                "unnormalised_input", onset, "",
                f"the input '{t.name}' has an rms of {rms:.3g} from the first recorded step on (values from "
                f"{np.nanmin(stats['min']):.3g} to {np.nanmax(stats['max']):.3g}), far outside the unit scale "
                f"the first layer's default initialisation expects",
                (Evidence(f"{t.name}/value/rms", tuple(int(s) for s in t.steps[:3]),
                          tuple(float(v) for v in stats["rms"][:3])),), rms))
            break
    return out


def _summed_loss(row: LoopRow, series: RunSeries) -> list[_Finding]:
    """A loss summed over many terms (``reduction='sum'``, information by itself) where the optimizer blew up
    from the first step: the sum is what made the updates that large."""
    terms = row.detail.get("terms")
    if not isinstance(terms, int) or terms < SUMMED_TERMS or not optimizer_blew_up_at_start(series):
        return []
    return [_Finding("sum_reduction", row.step, "",
                     f"{row.message}; a learning rate set for a mean takes updates {terms}× too large, and the "
                     f"optimizer blew up from the first step",
                     (Evidence(f"log/{row.invariant}", (row.step,), (float(terms),)),))]


SUMMED_TERMS = 16
"""Terms a summed loss adds up, at least, for its sum to explain an optimizer blown up from the start."""
_EXPLAINS_ONLY = {"sum_reduction": _summed_loss}
"""Information rows that become a finding only where the statistics show the harm they explain (no note)."""


def _precision_findings(series: RunSeries) -> list[_Finding]:
    """Half-precision weights whose updates round away (:mod:`~comgra_ndbg.analysis.lost_updates`)."""
    found = lost_updates(series)
    if found is None:
        return []
    more = len(found.nodes) - 1
    return [_Finding(
        "lost_updates", found.onset, found.node,
        f"'{found.node}'{f' and {more} more parameter node(s)' if more else ''} hold {found.dtype} weights, and "
        f"{found.share:.0%} of their elements with a gradient do not move at a step (median): updates smaller than "
        f"half a unit in the last place of a weight round away, so training crawls while the gradients are there",
        (Evidence(f"{found.node}/update/zero_fraction", (found.onset,), (found.share,)),))]


def _zeroed_loss_findings(series: RunSeries) -> list[_Finding]:
    """A loss that fell to exactly 0 in one step from at least ``ZEROED_FROM`` of its first steps' level and
    stayed exactly 0 to the end (``ZEROED_STEPS`` steps or more): a factor of 0 switched training off (a loss
    that converges to 0, a hinge or a margin loss, approaches it gradually). The same for the gradient that
    reaches the loss node (1 when ``backward()`` is called on the loss itself): a criterion's output
    multiplied by 0 before ``backward()`` keeps its value and loses its gradient."""
    loss = np.asarray(series.loss, dtype=np.float64)
    found = _zero_tail(series.steps, loss, ZEROED_STEPS)
    what = "the loss"
    if found is None:
        node = next((n for n in series.nodes if n.role == "loss" and n.has("grad")), None)
        if node is None:
            return []
        grad = np.asarray(node.stats["grad"]["abs_max"], dtype=np.float64)
        present = np.isfinite(grad)
        found = _zero_tail(series.steps[present], grad[present], ZEROED_RECORDED)
        if found is None or int(series.steps[present][-1]) - found[1] < ZEROED_STEPS:
            return []
        what = f"the gradient reaching '{node.name}' (the loss multiplied by it before backward())"
    before_step, onset, before, left = found
    return [_Finding(
        "loss_zeroed", onset, "",
        f"{what} fell from {before:.3g} to exactly 0 at step {onset} and stayed 0 for the remaining {left} recorded "
        f"step(s): every gradient is 0 from then on, nothing trains",
        (Evidence("kpi/loss" if what == "the loss" else "loss/grad", (before_step, onset), (before, 0.0)),))]


def _zero_tail(steps: np.ndarray, values: np.ndarray, least: int) -> tuple[int, int, float, int] | None:
    """``(step before, first step, value before, length)`` of a tail of ``values`` exactly 0 to the end, at
    least ``least`` long, entered in one step from at least ``ZEROED_FROM`` of the first values' level."""
    nonzero = np.flatnonzero(values != 0)  # NaN is not 0: a NaN ends the tail
    if not len(nonzero) or len(values) - (nonzero[-1] + 1) < least:
        return None
    i = int(nonzero[-1]) + 1
    head = values[:min(ZEROED_STEPS, i)]
    start = float(np.median(np.abs(head))) if np.isfinite(head).all() else 0.0
    if not start > 0 or not abs(values[i - 1]) >= ZEROED_FROM * start:  # NaN before it: no
        return None
    return int(steps[i - 1]), int(steps[i]), float(values[i - 1]), len(values) - i


ZEROED_FROM = 0.1
"""The share of its first steps' level a loss held the step before it fell to exactly 0 (``loss_zeroed``) ..."""
ZEROED_STEPS = 10
"""... and the recorded steps it stayed exactly 0 for, at least (the loss node's gradient: the steps it
spans, over at least ``ZEROED_RECORDED`` recorded ones, since only steps measured in full record it)."""
ZEROED_RECORDED = 3


def _target_findings(facts: LoopFacts) -> list[_Finding]:
    """A target that holds one value for every sample: at nearly every recorded step and always the same value
    (``constant_target``), the same from a step to the last after varying targets before (a label overwritten
    mid-run, also ``constant_target``), or one value per batch that changes from batch to batch (data sorted
    by its label and not shuffled: ``single_value_batches``)."""
    out = []
    for t in facts.targets:
        if len(t.steps) < MIN_STEPS + 2:
            continue
        constant = (t.rows[:, _MIN] == t.rows[:, _MAX]) & (t.rows[:, _COUNT] > 1)
        values = t.rows[:, _MIN]
        if constant.mean() >= REPEAT_SHARE:
            at = np.flatnonzero(constant)
            onset, value = int(t.steps[at[0]]), float(values[at[0]])
            distinct = np.unique(values[at])
            if len(distinct) > 1:
                shown = ", ".join(f"{v:.4g}" for v in distinct[:5]) + (", …" if len(distinct) > 5 else "")
                out.append(_Finding(
                    "single_value_batches", onset, "",
                    f"the target '{t.name}' holds one value for every sample of the batch at {len(at)} of "
                    f"{len(t.steps)} recorded steps, a different one from batch to batch ({len(distinct)} values: "
                    f"{shown}): the data is ordered by its target and not shuffled, so every step pulls the model "
                    f"towards one value and batch statistics see one class at a time",
                    (Evidence(f"{t.name}/value/min", tuple(int(s) for s in t.steps[at[:3]]),
                              tuple(float(v) for v in values[at[:3]])),)))
                continue
            out.append(_Finding(
                "constant_target", onset, "",
                f"the target '{t.name}' holds one value ({value:.4g}) for every sample at {len(at)} of "
                f"{len(t.steps)} recorded steps: the model can only learn to output it",
                (Evidence(f"{t.name}/value/min", (onset,), (value,)),)))
            continue
        tail = _same_value_tail(constant, values)
        first = len(t.steps) - tail
        if (tail >= MIN_STEPS + 2 and first > 0 and t.steps[-1] - t.steps[first] + 1 >= REPEAT_RUN
                and constant[:first].mean() <= 0.5):  # (batches of one class by chance, often before: imbalance)
            onset, value = int(t.steps[first]), float(values[first])
            out.append(_Finding(
                "constant_target", onset, "",
                f"the target '{t.name}' holds one value ({value:.4g}) for every sample at every recorded step from "
                f"step {onset} to the last ({tail} recorded steps), after varying targets before: from then on the "
                f"model can only learn to output it",
                (Evidence(f"{t.name}/value/min", (int(t.steps[first - 1]), onset),
                          (float(values[first - 1]), value)),)))
    return out


def _same_value_tail(constant: np.ndarray, values: np.ndarray) -> int:
    """How many recorded steps at the end hold one value for every sample, the same value at each of them."""
    if not constant[-1]:
        return 0
    same = constant & (values == values[-1])
    breaks = np.flatnonzero(~same)
    return len(same) - int(breaks[-1]) - 1 if len(breaks) else len(same)
