"""The architecture families of diagbench and what a fault needs to know about each.

A ``Family`` builds a ``Setup`` from a ``Config`` and a seed, says how its runs are recorded (``NeuralDbg``
at its defaults, or explicit ``Recorder`` registration) and lists its fault *sites*: for each kind of site
(see ``SITE_KINDS``) the places a fault of that kind can hit, one per candidate block; a run picks one by
its seed. A site names module paths only; ``Family.node`` turns a module path into the node name the
recording really has (``model.blocks.2.fc1`` under ``NeuralDbg``, a registered name under ``Recorder``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.diagbench.setup import Config, Setup

SITE_KINDS = {
    "scale": "a layer whose weights a fault rescales; ``observe`` is where its output's scale shows",
    "dead": "a layer whose bias a fault sets far negative, before a ReLU/GELU; ``observe`` is that activation",
    "saturate": "a layer whose weights a fault enlarges, before a tanh/sigmoid; ``observe`` is that activation",
    "freeze": "a block a fault stops training; ``observe`` is one of its parameterised modules",
    "grad": "a module whose output gradient a fault multiplies; ``observe`` is the module before it",
    "collapse": "the place where representations collapse; ``observe`` is the first node showing it",
}
NEURALDBG, RECORDER = "neuraldbg", "recorder"


@dataclass(frozen=True)
class Site:
    """``accept``: module-path prefixes a correct localisation may name; ``target``: the module the fault
    changes; ``observe``: the module whose recorded output (or parameters) shows the symptom."""

    accept: tuple[str, ...]
    target: str
    observe: str


@dataclass(frozen=True)
class Family:
    """One architecture family. ``defaults`` fills the empty fields of its configs; ``build(config, seed)``
    returns the live ``Setup``; ``names`` maps module paths to node names for the explicit-``Recorder``
    family (``NeuralDbg`` names a module's output ``model.<path>`` and its parameters
    ``model.<path>.parameters``)."""

    name: str
    description: str
    recording: str
    defaults: Config
    build: Callable[[Config, int], Setup]
    sites: dict[str, tuple[Site, ...]]
    names: dict[str, str] = field(default_factory=dict)

    def node(self, path: str) -> str:
        """The node holding the output of the module at ``path`` (``""``: the model's output)."""
        if self.recording == RECORDER:
            return self.names.get(path, path)
        return "model" if path == "" else f"model.{path}"

    def sites_of(self, kind: str) -> tuple[Site, ...]:
        """The sites of ``kind``; a family without its own ``explode`` sites uses its ``scale`` sites (an
        ``explode`` list leaves out layers right before a bounded activation, where ×30 is saturation)."""
        if kind in self.sites:
            return self.sites[kind]
        return self.sites["scale"] if kind == "explode" else ()

    def parameter_node(self, path: str) -> str:
        """The node holding the parameters of the module at ``path``."""
        return f"model.{path}" if self.recording == RECORDER else f"model.{path}.parameters"

    def config(self, name: str, **fields: object) -> Config:
        """A config of this family: the family's defaults with ``fields`` replaced."""
        values = {k: v for k, v in vars(self.defaults).items() if k not in ("name", "family")}
        values.update(fields)
        return Config(name=name, family=self.name, **values)


def _registry() -> dict[str, Family]:
    from benchmarks.diagbench.families_dense import AUTOENCODER, MLP, RESMLP, TWOBRANCH
    from benchmarks.diagbench.families_seq import CNN, RNN, TRANSFORMER

    return {f.name: f for f in (MLP, RESMLP, CNN, RNN, TRANSFORMER, AUTOENCODER, TWOBRANCH)}


FAMILIES: dict[str, Family] = {}
HELD_BACK = ("rnn",)
"""Families kept from the engine's developers until the end: left out unless asked for by name."""


def families() -> dict[str, Family]:
    """Every family by name (built on first use: the model modules import torch)."""
    if not FAMILIES:
        FAMILIES.update(_registry())
    return FAMILIES


def select(only: str | None = None, exclude: str | None = None, *, held_back: bool = False) -> list[str]:
    """Family names chosen by ``--families a,b`` / ``--exclude-families c``; the held-back families are
    left out unless named in ``only`` or ``held_back`` is true."""
    known = list(families())
    chosen = known if not only else [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in chosen + (exclude or "").split(",") if n.strip() and n.strip() not in known]
    if unknown:
        raise ValueError(f"unknown families {unknown}; choose from {known}")
    if not only and not held_back:
        chosen = [n for n in chosen if n not in HELD_BACK]
    dropped = {n.strip() for n in (exclude or "").split(",")}
    return [n for n in chosen if n not in dropped]
