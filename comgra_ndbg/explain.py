"""What ``comgra-ndbg explain`` adds to a diagnosis: families to filter by, threshold overrides, a JSON schema.

**Families** (``--only``) group the analysis's event families and hypothesis types by what a person asks:

============  ========================================  ==============================================
family        event families                            hypothesis types
============  ========================================  ==============================================
gradients     gradient_health, path_balance             vanishing, exploding, imbalanced_learning,
                                                        gradient_scaling
dead          activation_regime, representation         dead_units, saturation, mode_collapse
optimizer     optimizer_stability                       optimizer_divergence, optimizer_instability,
                                                        update_stagnation, precision
anomalies     nonfinite, parameter_edit, loop_invariant nonfinite_loss, nonfinite_data, data_shift,
                                                        target_shift, loss_spike and the training-loop
                                                        mistakes
============  ========================================  ==============================================

A hypothesis of type ``unclear`` belongs to every family of its ``alternatives``.

**Overrides** (``--vanishing-threshold``, ``--exploding-threshold``, ``--activation-threshold``) become a
:class:`~comgra_ndbg.analysis.Thresholds`; the analysis then runs again with them and its result is only
printed, never stored over the stored analysis (which the GUI and later runs keep reading).

**JSON** (``--json``), schema ``comgra-ndbg-explain`` version :data:`SCHEMA_VERSION`; fields are only ever
added, a change of meaning bumps the version::

    {"schema": "comgra-ndbg-explain", "schema_version": 1, "path": str,
     "only": str | null,                    # the --only family
     "overrides": {threshold name: value},  # {} when the stored thresholds were used
     "reference": str,                      # only with --reference GOOD
     "trials": [{"trial": str,
                 "source": "stored" | "analysed now" | "re-analysed with overrides (not stored)"
                           | "analysed against a reference run (not stored)",
                 "analysed_now": bool, "num_steps": int, "last_step": int, "healthy": bool,
                 "hypotheses": [{"rank", "type", "origin", "node", "onset", "confidence", "sentence",
                                 "remedy", "alternatives", "family"}],   # after --only, best first
                 "events": [{"family", "node", "kind", "from_state", "to_state", "onset", "end",
                             "magnitude", "strength", "at_start"}],     # after --only, step order
                 "diagnosis": {...}}]}   # the full diagnosis (analysis.to_dict), filtered by --only

Non-finite numbers are written as the strings ``"nan"``, ``"inf"``, ``"-inf"``.

>>> family_of_event("gradient_health"), family_of_type("dead_units")
('gradients', 'dead')
>>> overrides(vanishing=2.0, activation=0.6)
{'vanishing_decades': 2.0, 'dead_enter': 0.6, 'dead_exit': 0.4667, 'saturated_enter': 0.6, 'saturated_exit': 0.36}
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Diagnosis, Event, Hypothesis, to_dict
from comgra_ndbg.errors import InvalidArgumentError

__all__ = ["SCHEMA", "SCHEMA_VERSION", "EXPLAIN_FAMILIES", "EVENT_FAMILIES", "HYPOTHESIS_TYPES", "family_of_event",
           "family_of_type", "hypothesis_families", "only", "overrides", "thresholds_with", "trial_record", "explain_text",
           "OVERRIDDEN"]

SCHEMA = "comgra-ndbg-explain"
SCHEMA_VERSION = 1
EXPLAIN_FAMILIES = ("gradients", "dead", "anomalies", "optimizer")
EVENT_FAMILIES = {"gradients": ("gradient_health", "path_balance"),
                  "dead": ("activation_regime", "representation", "output_range"),
                  "anomalies": ("nonfinite", "parameter_edit", "loop_invariant", "reference_invariant",
                                "rank_consistency", "memory"),
                  "optimizer": ("optimizer_stability",)}
HYPOTHESIS_TYPES = {"gradients": ("vanishing", "exploding", "imbalanced_learning", "gradient_ratio",
                                  "gradient_scaling"),
                    "dead": ("dead_units", "saturation", "mode_collapse", "output_range"),
                    "anomalies": ("nonfinite_loss", "nonfinite_data", "data_shift", "target_shift", "loss_spike",
                                  "stale_gradients",
                                  "wrong_mode", "batch_statistics", "unused_parameters", "repeated_batch",
                                  "unnormalised_input", "constant_target", "single_value_batches", "target_shape",
                                  "weights_reset", "frozen_trains", "wrong_dtype",
                                  "partial_ddp", "rank_desync", "rank_divergence", "rank_stalled", "memory_leak",
                                  "nonfinite_evaluation"),
                    "optimizer": ("optimizer_divergence", "optimizer_instability", "update_stagnation", "precision",
                                  "update_ratio")}
_DEFAULT = Thresholds()
_DEAD_EXIT = _DEFAULT.dead_exit / _DEFAULT.dead_enter  # an override keeps the default exit/enter ratio
_SATURATED_EXIT = _DEFAULT.saturated_exit / _DEFAULT.saturated_enter


def family_of_event(family: str) -> str:
    """The ``--only`` family of an event family (``""`` when it has none)."""
    return next((name for name, members in EVENT_FAMILIES.items() if family in members), "")


def family_of_type(type_: str) -> str:
    """The ``--only`` family of a hypothesis type (``""`` for ``unclear`` and unknown types)."""
    return next((name for name, members in HYPOTHESIS_TYPES.items() if type_ in members), "")


def hypothesis_families(hypothesis: Hypothesis) -> tuple[str, ...]:
    """The families a hypothesis belongs to: its type's, or for ``unclear`` those of its alternatives (its
    root event's family when none of them has one)."""
    types = hypothesis.alternatives if hypothesis.type == "unclear" else (hypothesis.type,)
    found = tuple(dict.fromkeys(f for f in map(family_of_type, types) if f))
    return found or tuple(f for f in (family_of_event(hypothesis.chain.root.family),) if f)


def _check_family(family: str) -> None:
    if family not in EXPLAIN_FAMILIES:
        raise InvalidArgumentError(f"unknown family {family!r}; choose one of {', '.join(EXPLAIN_FAMILIES)}")


def only(diagnosis: Diagnosis, family: str | None) -> Diagnosis:
    """``diagnosis`` with only the hypotheses and events of ``family`` (None: unchanged); coupled failures
    are kept where cause or effect belongs to it."""
    if family is None:
        return diagnosis
    _check_family(family)
    members = EVENT_FAMILIES[family]
    return replace(diagnosis, hypotheses=tuple(h for h in diagnosis.hypotheses if family in hypothesis_families(h)),
                   events=tuple(e for e in diagnosis.events if e.family in members),
                   coupled=tuple(c for c in diagnosis.coupled
                                 if c.cause.family in members or c.effect.family in members))


def overrides(*, vanishing: float | None = None, exploding: float | None = None,
              activation: float | None = None) -> dict[str, float]:
    """The :class:`Thresholds` fields the command-line overrides set: ``vanishing``/``exploding`` decades a
    gradient's ratio to the output's gradient must fall/rise against its recent history; ``activation``
    the share of units dead (or elements saturated) that enters that state, each exit kept at the default
    ratio below it so the hysteresis stays."""
    chosen: dict[str, float] = {}
    for name, value in (("vanishing_decades", vanishing), ("exploding_decades", exploding)):
        if value is not None:
            if not value > 0:
                raise InvalidArgumentError(f"{name.split('_')[0]} threshold must be a positive number of decades "
                                           f"(1 = 10×), got {value}")
            chosen[name] = float(value)
    if activation is not None:
        if not 0 < activation <= 1:
            raise InvalidArgumentError(f"activation threshold must be a share of units in (0, 1], got {activation}; "
                                       f"the default is {Thresholds().dead_enter} for dead units")
        chosen.update(dead_enter=float(activation), dead_exit=round(activation * _DEAD_EXIT, 4),
                      saturated_enter=float(activation), saturated_exit=round(activation * _SATURATED_EXIT, 4))
    return chosen


def thresholds_with(changes: dict[str, float], base: Thresholds = Thresholds()) -> Thresholds:
    """``base`` with ``changes`` (from :func:`overrides`) applied."""
    return replace(base, **changes)


def _hypothesis_record(rank: int, h: Hypothesis) -> dict[str, Any]:
    return {"rank": rank, "type": h.type, "origin": h.origin, "node": h.node, "onset": h.onset,
            "confidence": h.confidence, "sentence": h.sentence, "remedy": h.remedy,
            "alternatives": list(h.alternatives), "family": (hypothesis_families(h) or ("",))[0]}


def _event_record(e: Event) -> dict[str, Any]:
    return {"family": e.family, "node": e.node, "kind": e.kind, "from_state": e.from_state, "to_state": e.to_state,
            "onset": e.onset, "end": e.end, "magnitude": e.magnitude, "strength": e.strength,
            "at_start": e.at_start}


def trial_record(diagnosis: Diagnosis, *, source: str) -> dict[str, Any]:
    """One entry of the JSON ``trials`` list for an (already filtered) diagnosis."""
    return {"trial": diagnosis.trial, "source": source, "analysed_now": source != "stored",
            "num_steps": diagnosis.num_steps, "last_step": diagnosis.last_step, "healthy": diagnosis.healthy,
            "hypotheses": [_hypothesis_record(rank, h) for rank, h in enumerate(diagnosis.hypotheses, start=1)],
            "events": [_event_record(e) for e in diagnosis.events], "diagnosis": to_dict(diagnosis)}


OVERRIDDEN = "re-analysed with overrides (not stored)"  # the source of a what-if analysis
AGAINST_REFERENCE = "analysed against a reference run (not stored)"  # the source of ``--reference GOOD``
_SOURCE_TEXT = {"stored": "stored analysis", "analysed now": "analysed now", OVERRIDDEN: OVERRIDDEN,
                AGAINST_REFERENCE: AGAINST_REFERENCE}


def explain_text(trial: str, diagnosis: Diagnosis, *, source: str, max_events: int, family: str | None = None) -> str:
    """A trial's diagnosis for a terminal: hypotheses best first, then the events in step order (at most
    ``max_events``); ``source`` says where it came from (``stored``, ``analysed now`` or :data:`OVERRIDDEN`)."""
    steps = f"{diagnosis.num_steps} recorded step{'' if diagnosis.num_steps == 1 else 's'}"
    lines = [f"trial {trial}: {steps} ({_SOURCE_TEXT[source]})"]
    if diagnosis.healthy:
        lines.append("  no failure found" if family is None else f"  no {family} failure found (--only {family})")
    else:
        lines.append("  hypotheses, best first:")
        for rank, h in enumerate(diagnosis.hypotheses, start=1):
            where = f", node {h.node!r}" if h.node else ""  # no node: the origin (optimizer, data, ...) says it
            lines.append(f"  {rank}. [{h.type}, origin {h.origin}{where}, step {h.onset}, "
                         f"confidence {h.confidence:.2f}]")
            lines.append(f"     {h.sentence}")
            if h.remedy:
                lines.append(f"     Remedy: {h.remedy}")
    if diagnosis.events:
        lines.append(f"  events ({len(diagnosis.events)}, in step order):")
        for e in diagnosis.events[:max_events]:
            span = f"steps {e.onset}-{e.end}" if e.end != e.onset else f"step {e.onset}"
            lines.append(f"    {span}: {e.family} {e.from_state} -> {e.to_state} in {e.node!r} ({e.kind}), "
                         f"magnitude {e.magnitude:.3g}{', from the start' if e.at_start else ''}")
        if len(diagnosis.events) > max_events:
            lines.append(f"    ... {len(diagnosis.events) - max_events} more (--max-events, or --json for all)")
    return "\n".join(lines)
