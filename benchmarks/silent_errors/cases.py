"""The ported cases: what each one is, where it comes from, and what the analysis should name.

A :class:`Case` trains its ``buggy`` or ``fixed`` variant under ``NeuralDbg`` at its defaults and returns an
:class:`Outcome`: the recorded trials, the step where the bug first takes effect, and the measured symptom
that proves the variant behaves as the original (the tests assert it). Reproductions of the collection that
cannot run here, or whose effect lies outside a training run, are listed in :data:`NOT_PORTED` with the
reason.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Case", "Outcome", "VARIANTS", "SOURCE"]

VARIANTS = ("buggy", "fixed")
SOURCE = "OrderLab/TrainCheck-Evaluation-Workloads, silent-issue-detection/bug-reprod-scripts"


@dataclass(frozen=True)
class Outcome:
    """One variant's run: ``trials`` (recording folders, one per rank), ``first_effect`` (the first step the
    bug changes what training computes; None when the variant has no bug), and ``symptom`` (named
    measurements taken inside the loop, e.g. the gradient norm carried into a step)."""

    trials: tuple[Path, ...]
    first_effect: int | None
    symptom: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    """A ported reproduction: ``name`` (the original folder), ``origin`` (project and bug report), ``bug`` (what
    the original code does wrong), ``cause_types`` (hypothesis types that name the bug's class; empty when
    no type of the analysis names it), ``run(variant, folder)`` and whether it runs as several processes."""

    name: str
    origin: str
    bug: str
    cause_types: tuple[str, ...]
    run: Callable[[str, Path], Outcome]
    distributed: bool = False
