"""Value objects of the analysis: evidence, events, causal links, hypotheses and the diagnosis.

All frozen dataclasses of plain fields (str, int, float, tuples), so results compare, hash and turn into
JSON (:func:`to_dict` / :func:`diagnosis_from_dict`) without loss; the GUI and the store read them as is.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["Evidence", "Event", "CausalLink", "CausalChain", "Hypothesis", "Diagnosis", "to_dict",
           "diagnosis_from_dict", "FAMILIES"]

FAMILIES = ("nonfinite", "activation_regime", "gradient_health", "optimizer_stability", "parameter_edit",
            "representation", "path_balance", "loop_invariant", "rank_consistency", "output_range",
            "reference_invariant", "memory")


@dataclass(frozen=True)
class Evidence:
    """Which series showed what: ``series`` is ``"node/kind/statistic"`` (or ``"kpi/<name>"``); ``baseline`` the
    value the series had before (NaN when the rule is absolute); ``values`` the values at ``steps``."""

    series: str
    steps: tuple[int, ...]
    values: tuple[float, ...]
    baseline: float = float("nan")


@dataclass(frozen=True)
class Event:
    """A semantic transition of one node: ``family`` (see :data:`FAMILIES`), ``from_state`` → ``to_state``
    from step ``onset`` to step ``end`` (the last step in ``to_state``; the last analysed step when it never
    recovered). ``magnitude`` is in decades for scale shifts and in units of the statistic (a fraction, a
    loss ratio) otherwise; ``strength`` in [0, 1] says how far past its threshold the rule fired.
    ``at_start`` marks a state that was already present at the first recorded steps; ``sudden`` a scale shift
    that happened from one step to the next (a step change of the computation, not a drift of training)."""

    family: str
    node: str
    kind: str
    from_state: str
    to_state: str
    onset: int
    end: int
    magnitude: float
    strength: float
    evidence: tuple[Evidence, ...] = ()
    at_start: bool = False
    sudden: bool = False

    @property
    def label(self) -> str:
        """``family:to_state``, the event's type, e.g. ``activation_regime:dead``."""
        return f"{self.family}:{self.to_state}"

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.label, self.node, self.kind, self.onset)


@dataclass(frozen=True)
class CausalLink:
    """``cause`` plausibly led to ``effect``: the effect started ``lag`` steps later in a node reachable
    from the cause's node in the direction the family propagates (``via``: forward, backward, optimizer,
    same-node)."""

    cause: Event
    effect: Event
    lag: int
    via: str


@dataclass(frozen=True)
class CausalChain:
    """The first event and the links that follow from it, in order of onset."""

    root: Event
    links: tuple[CausalLink, ...] = ()

    @property
    def events(self) -> tuple[Event, ...]:
        seen = {self.root.key: self.root}
        for link in self.links:
            seen.setdefault(link.effect.key, link.effect)
        return tuple(seen.values())


@dataclass(frozen=True)
class Hypothesis:
    """A ranked explanation: failure ``type`` (e.g. ``vanishing``; ``unclear`` when the evidence does not
    settle it, with the candidates in ``alternatives``), ``origin`` (``node``, ``optimizer``, ``loss``,
    ``data`` or ``architecture``) with ``node`` (the graph node it points at, ``""`` for the optimizer),
    ``onset`` step, the causal ``chain``, a calibrated ``confidence``, one plain sentence and one concrete
    ``remedy`` drawn from the evidence."""

    type: str
    origin: str
    node: str
    onset: int
    confidence: float
    sentence: str
    chain: CausalChain
    features: tuple[float, ...] = ()
    remedy: str = ""
    alternatives: tuple[str, ...] = ()


@dataclass(frozen=True)
class Diagnosis:
    """Everything the analysis found in one recording; ``hypotheses`` best first (empty: healthy).

    ``num_steps`` and ``last_step`` identify the recording state the analysis saw, so stored results of a
    recording that has grown since are recognisable as stale."""

    trial: str
    num_steps: int
    last_step: int
    events: tuple[Event, ...]
    coupled: tuple[CausalLink, ...]
    hypotheses: tuple[Hypothesis, ...]
    seconds: float = 0.0
    library_version: str = ""
    thresholds: dict = field(default_factory=dict, compare=False, hash=False)
    notes: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.hypotheses

    @property
    def top(self) -> Hypothesis | None:
        return self.hypotheses[0] if self.hypotheses else None

    def explain(self) -> str:
        """One sentence per hypothesis, best first, or a line saying no failure was found; then the notes
        (what the run does that may be meant: a part frozen from the start)."""
        notes = "".join(f"\nNote: {note}" for note in self.notes)
        if not self.hypotheses:
            return f"No failure found in {self.num_steps} recorded steps." + notes
        return "\n".join(f"{i + 1}. {h.sentence}" + (f"\n   Remedy: {h.remedy}" if h.remedy and h.remedy not in
                                                      h.sentence else "")
                         for i, h in enumerate(self.hypotheses)) + notes

    def _repr_html_(self) -> str:
        """The diagnosis as a table in a Jupyter notebook (:func:`comgra_ndbg.notebook.diagnosis_html`)."""
        from comgra_ndbg.notebook import diagnosis_html

        return diagnosis_html(self)


def to_dict(diagnosis: Diagnosis) -> dict:
    """Plain JSON-ready dict of a diagnosis (floats may be NaN; write with ``allow_nan``)."""
    return asdict(diagnosis)


def _evidence(d: dict) -> Evidence:
    return Evidence(d["series"], tuple(int(s) for s in d["steps"]), tuple(float(v) for v in d["values"]),
                    float(d["baseline"]))


def _event(d: dict) -> Event:
    return Event(**{**d, "magnitude": float(d["magnitude"]), "strength": float(d["strength"]),
                    "evidence": tuple(_evidence(e) for e in d["evidence"])})


def _link(d: dict) -> CausalLink:
    return CausalLink(_event(d["cause"]), _event(d["effect"]), d["lag"], d["via"])


def diagnosis_from_dict(d: dict) -> Diagnosis:
    """Inverse of :func:`to_dict` (also of its JSON form, where non-finite floats are strings "nan", "inf")."""
    hypotheses = tuple(
        Hypothesis(**{**h, "chain": CausalChain(_event(h["chain"]["root"]),
                                                tuple(_link(x) for x in h["chain"]["links"])),
                      "confidence": float(h["confidence"]), "features": tuple(float(v) for v in h["features"]),
                      "alternatives": tuple(h.get("alternatives", ()))})
        for h in d["hypotheses"])
    return Diagnosis(trial=d["trial"], num_steps=d["num_steps"], last_step=d["last_step"],
                     events=tuple(_event(e) for e in d["events"]), coupled=tuple(_link(x) for x in d["coupled"]),
                     hypotheses=hypotheses, seconds=d.get("seconds", 0.0),
                     library_version=d.get("library_version", ""), thresholds=d.get("thresholds", {}),
                     notes=tuple(d.get("notes", ())))
