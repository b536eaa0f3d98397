"""The training loop of every run, recorded as users record it, and the ground truth stored beside it.

The loop is the ordinary one: ``zero_grad``, forward (``accumulate`` micro-batches), loss, ``backward``,
optional gradient clipping, ``optimizer.step()``, ``scheduler.step()``, optional evaluation passes under
``torch.no_grad()``. Families recorded by ``NeuralDbg`` wrap it in ``with NeuralDbg(model, folder,
trial=name, optimizer=opt)`` at its defaults (``loss=criterion`` only for configs whose loss is
``hooked``); the explicit-``Recorder`` family registers its tensors itself. Like most trainers, the loop
gives up ``STOP_AFTER_NONFINITE`` steps after the loss turned non-finite.

Besides the recording, the loop measures two things as ground truth, independent of the recorder: the loss
of every step, and the per-sample spread (share of the second moment that varies across the samples of the
batch) of the model output and of the family's watched modules. Both go to ``truth.json``.
"""
from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from benchmarks.diagbench.families import RECORDER, Family, Site, families
from benchmarks.diagbench.faults import FAULT_BY_NAME, Fault, at_build, inject, prepare
from benchmarks.diagbench.setup import Config, Setup
from benchmarks.diagbench.specs import RunSpec
from comgra_ndbg import NeuralDbg, Recorder

TRUTH_FILE = "truth.json"
STOP_AFTER_NONFINITE = 20


def sample_spread(output: torch.Tensor) -> float:
    """``Σ‖x_i − x̄‖² / Σ‖x_i‖²`` over the samples ``x_i`` of a batch: 0 when every sample is the same."""
    x = output.detach().float().flatten(1)
    total = float((x * x).sum())
    return float(((x - x.mean(dim=0)) ** 2).sum()) / total if total > 0 else float("nan")


class SpreadProbe:
    """Forward hooks measuring ``sample_spread`` of chosen modules' outputs in training passes."""

    def __init__(self, model: nn.Module, paths: tuple[str, ...]) -> None:
        self.latest: dict[str, float] = {}
        self.series: dict[str, list[float]] = {p: [] for p in paths}
        self.handles = [model.get_submodule(p).register_forward_hook(self._hook(p)) for p in paths]

    def _hook(self, path: str) -> Callable[[nn.Module, object, object], None]:
        def hook(module: nn.Module, _: object, output: object) -> None:
            if module.training and torch.is_grad_enabled():
                tensor = output[0] if isinstance(output, tuple) else output
                self.latest[path] = sample_spread(tensor)
        return hook

    def end_step(self) -> None:
        for path, values in self.series.items():
            values.append(self.latest.pop(path, float("nan")))

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def train_step(setup: Setup, after_backward: Callable[[], object] | None = None) -> float:
    """One optimizer step of the ordinary loop; returns the loss (mean over micro-batches)."""
    config = setup.config
    setup.optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for _ in range(config.accumulate):
        inputs, target = setup.pipeline.next()
        loss, _ = setup.forward_loss(inputs, target)
        (loss if config.accumulate == 1 else loss / config.accumulate).backward()
        total += float(loss.detach())
    if after_backward is not None:
        after_backward()
    if config.clip:
        torch.nn.utils.clip_grad_norm_(setup.model.parameters(), config.clip)
    setup.optimizer.step()
    if setup.scheduler is not None:
        setup.scheduler.step()
    return total / config.accumulate


def _evaluate(setup: Setup, batch: tuple[list[torch.Tensor], torch.Tensor]) -> None:
    setup.model.eval()
    with torch.no_grad():
        setup.forward_loss(*batch)
    setup.model.train()


def _loop(spec: RunSpec, setup: Setup, rec: Recorder | None, probe: SpreadProbe, site: Site | None,
          fault: Fault | None) -> list[float]:
    losses: list[float] = []
    eval_batch = setup.pipeline.next() if setup.config.eval_every else None
    first_nonfinite = None
    for step in range(spec.steps):
        if first_nonfinite is not None and step - first_nonfinite >= STOP_AFTER_NONFINITE:
            break
        if fault is not None and not fault.at_start and step == spec.t0:
            inject(fault, setup, site)
        if rec is not None:
            with rec.step(step):
                loss = train_step(setup, rec.record_gradients)
                rec.record_kpi("loss", loss)
        else:
            loss = train_step(setup)
        if eval_batch is not None and step % setup.config.eval_every == 0:
            _evaluate(setup, eval_batch)
        probe.end_step()
        losses.append(loss)
        if first_nonfinite is None and not math.isfinite(loss):
            first_nonfinite = step
    return losses


DETAIL_VARIABLE = "COMGRA_DIAGBENCH_DETAIL"
"""The environment variable ``--detail`` sets for the worker processes: the recorders' ``detail=``
(``defaults``, the default: each recorder's own, ``"tiered"`` for ``NeuralDbg`` and ``"full"`` for
``Recorder``; ``full`` or ``tiered`` for all of them, ``docs/recording.md``, "Statistic tiers")."""
DEFAULTS = "defaults"


def _recording(family: Family, spec: RunSpec, setup: Setup, folder: Path) -> AbstractContextManager:
    detail = os.environ.get(DETAIL_VARIABLE, DEFAULTS)
    chosen = {} if detail == DEFAULTS else {"detail": detail}
    if family.recording == RECORDER:
        return Recorder(folder, trial=spec.name, **chosen)
    criterion = setup.criterion if setup.config.loss == "hooked" else None
    return NeuralDbg(setup.model, folder, trial=spec.name, optimizer=setup.optimizer, loss=criterion, **chosen)


def train_run(spec: RunSpec, folder: Path) -> Path:
    """Train and record ``spec`` into ``folder/<spec.name>``; the ground truth goes to ``truth.json`` there."""
    family = families()[spec.family]
    fault = FAULT_BY_NAME[spec.fault] if spec.fault else None
    config = prepare(fault, spec.config, spec.t0) if fault else spec.config
    setup = family.build(config, spec.seed)
    site = family.sites_of(fault.site)[spec.site] if fault is not None and spec.site is not None else None
    if fault is not None:
        at_build(fault, setup, family.sites_of(fault.site) if fault.site else ())
    probe = SpreadProbe(setup.model, setup.watch)
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _recording(family, spec, setup, folder) as recording:
            rec = recording if isinstance(recording, Recorder) else None
            if rec is not None:
                rec.track_module("model", setup.model)
                setup.register = rec.register_tensor
            losses = _loop(spec, setup, rec, probe, site, fault)
    probe.close()
    path = folder / spec.name
    ground = truth(spec, config, family, fault, site)
    ground.update(loss=losses, spread=probe.series, train_seconds=time.perf_counter() - started,
                  warnings=sorted({str(w.message).splitlines()[0][:200] for w in caught}))
    (path / TRUTH_FILE).write_text(json.dumps(ground, indent=None, allow_nan=True))
    return path


def truth(spec: RunSpec, config: Config, family: Family, fault: Fault | None, site: Site | None) -> dict:
    """The labels of a run: for a faulty one its type, origin, acceptable node prefixes and onset."""
    out = {"name": spec.name, "family": spec.family, "recording": family.recording, "config": asdict(config),
           "seed": spec.seed, "healthy": spec.healthy, "steps": spec.steps}
    if fault is None:
        return out
    out.update(fault=fault.name, type=fault.type, origin=fault.origin, t0=spec.t0, chain=list(fault.chain),
               nodes=list(site.accept) if site is not None and fault.origin == "node" else [],
               site=asdict(site) if site is not None else None)
    return out
