"""The runs of the benchmark: ``RunSpec`` (plain, picklable data for worker processes) and the lists of the
full benchmark and of the CI smoke subset.

A faulty run's step ``t0`` (120–180 of 300, i.e. 40–60 % of the run) and its site (the faulty block) are
drawn from a checksum of (family, fault, seed), so they vary across seeds and families but never between
two runs of the benchmark. Faulty runs use seeds 0, 1, …; healthy runs 100, 101, …; ``seed_offset``
shifts both (held-out seeds).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

from benchmarks.diagbench.faults import FAULTS, Fault
from benchmarks.diagbench.families import families
from benchmarks.diagbench.healthy import healthy_configs
from benchmarks.diagbench.setup import STEPS, Config

FAULT_SEEDS = 3
HEALTHY_SEEDS = 14
HEALTHY_SEED_BASE = 100
SMOKE = {  # family: (faults, healthy configurations); together every fault type, one seed each
    "mlp": (("vanish_depth", "grad_bug", "outlier_batch"), ("relu_adam", "easy_loss_to_1e-7")),
    "resmlp": (("dead_bias", "lr_unstable", "freeze_lr0"), ("adamw_weight_decay", "cosine_warmup")),
    "cnn": (("explode_weights", "nan_input", "schedule_ends_early"), ("sgd_step_decay", "eval_passes")),
    "rnn": (("saturate_weights", "zero_std", "lr_kill"), ("gru_clipped", "lstm_accumulate")),
    "transformer": (("embedding_copy", "empty_mask", "freeze_requires_grad"), ("warmup_cosine",
                                                                                "frozen_embeddings")),
    "autoencoder": (("code_dropout", "unnormalised", "vanish_weights"), ("mse_adam", "sigmoid_bottleneck")),
    "twobranch": (("loss_weight", "saturate_weights", "lr_kill"), ("balanced", "unequal_scales")),
}


@dataclass(frozen=True)
class RunSpec:
    """One run: a family's configuration and seed, and for a faulty run the fault, its site and step."""

    name: str
    family: str
    config: Config
    seed: int
    fault: str | None = None
    site: int | None = None
    t0: int = 0
    steps: int = STEPS

    @property
    def healthy(self) -> bool:
        return self.fault is None


def _draw(*key: object) -> int:
    return zlib.crc32("/".join(map(str, key)).encode())


def fault_spec(fault: Fault, family: str, seed: int) -> RunSpec:
    """The run of ``fault`` in ``family`` with ``seed`` (its config: the family's defaults)."""
    draw = _draw(family, fault.name, seed)
    t0 = 0 if fault.at_start else int(STEPS * 0.4) + draw % (int(STEPS * 0.2) + 1)
    site = None
    if fault.site is not None and (not fault.at_start or fault.origin == "node"):
        site = (seed + draw // 1000) % len(families()[family].sites_of(fault.site))
    config = families()[family].config("defaults")
    return RunSpec(f"{family}-{fault.name}-s{seed}", family, config, seed, fault.name, site, t0)


def healthy_spec(config: Config, seed: int) -> RunSpec:
    return RunSpec(f"{config.family}-H-{config.name}-s{seed}", config.family, config, seed)


def faults_of(family: str) -> list[Fault]:
    return [f for f in FAULTS if family in f.families]


def all_specs(chosen: list[str], *, smoke: bool = False, seed_offset: int = 0) -> list[RunSpec]:
    """Every run of the chosen families: each applicable fault × ``FAULT_SEEDS`` seeds and each healthy
    configuration × ``HEALTHY_SEEDS`` seeds; or the smoke subset (``SMOKE``), one seed each."""
    specs: list[RunSpec] = []
    configs = healthy_configs()
    for family in chosen:
        applicable = faults_of(family)
        own = [c for c in configs if c.family == family]
        if smoke:
            faults, healthy = SMOKE[family]
            specs += [fault_spec(f, family, seed_offset) for f in applicable if f.name in faults]
            specs += [healthy_spec(c, HEALTHY_SEED_BASE + seed_offset) for c in own if c.name in healthy]
            continue
        specs += [fault_spec(f, family, seed_offset + s) for f in applicable for s in range(FAULT_SEEDS)]
        specs += [healthy_spec(c, HEALTHY_SEED_BASE + seed_offset + s) for c in own for s in range(HEALTHY_SEEDS)]
    return specs
