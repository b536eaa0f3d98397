"""What per-layer profiling measures, how often, and the clocks and memory gauges it reads.

Profiling is opt-in: ``Recorder(..., profile=True)`` or ``profile=ProfileConfig(...)`` (``NeuralDbg`` passes
``profile=`` on). Module profiling (times, saved activation bytes, allocator deltas, FLOPs) runs at its own
policy, adaptive by default: the first steps, then each step type at gaps that grow by half after every
profiled step, so a long run pays for a logarithmic number of profiled steps. Process memory (RSS, the
device allocator) is one cheap read per step, so a leak shows as a line over every step.

FLOPs: :class:`ModuleFlops`, ``torch.utils.flop_counter``'s formulas reported op by op.

Clocks: on the host a :class:`HostClock` (``time.perf_counter``); on a GPU a :class:`EventClock` records
CUDA events and reads their elapsed time only once they have completed, at a later step or at ``close()``,
so the training step never waits for the device.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.recorder.policy import FirstN, PerTypeBackoff, Policy, PolicySpec, as_policy

__all__ = ["ProfileConfig", "as_profile_config", "HostClock", "EventClock", "CudaMemory", "NoDeviceMemory",
           "rss_bytes", "default_profile_policy", "ModuleFlops"]


def default_profile_policy() -> Policy:
    """The first three steps, then each step type at gaps of 15, 23, 34, … steps (a gap of 10 grown by 1.5 at each
    profiled step): steps 0, 1, 2, 15, 38, 72, …"""
    return FirstN(3) | PerTypeBackoff(10, factor=1.5)


@dataclass(frozen=True)
class ProfileConfig:
    """Settings of per-layer profiling.

    ``steps``: the policy (or its shorthand: an int k, a list of steps, True) of the steps whose modules are
    profiled; default :func:`default_profile_policy`. ``memory_every``: process memory is sampled every k-th
    step (1: every step). ``flops``: count forward FLOPs per module on the second profiled step of each step
    type (the first pays one-off work; that step runs under ``torch.utils.flop_counter``, whose dispatch
    overhead would distort its times, so its time fields are NaN). ``backward``: time each module's autograd
    nodes. ``saved_tensors``: count the activation bytes each module keeps for backward.

    >>> ProfileConfig(steps=5).memory_every
    1
    """

    steps: PolicySpec = field(default_factory=default_profile_policy)
    memory_every: int = 1
    flops: bool = True
    backward: bool = True
    saved_tensors: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.memory_every, bool) or not isinstance(self.memory_every, int) or self.memory_every < 1:
            raise InvalidArgumentError(f"ProfileConfig(memory_every=...) must be an int >= 1 (1: every step), got "
                                       f"{self.memory_every!r}")
        for name in ("flops", "backward", "saved_tensors"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"ProfileConfig({name}=...) must be True or False, got "
                                           f"{getattr(self, name)!r}")

    def policy(self) -> Policy:
        """A fresh policy object for one recorder (policies keep per-run state)."""
        return as_policy(self.steps, name="ProfileConfig(steps)")


def as_profile_config(spec: Any) -> ProfileConfig | None:
    """``profile=`` as a config: None/False is off, True the defaults, a ``ProfileConfig`` itself."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return ProfileConfig()
    if isinstance(spec, ProfileConfig):
        return spec
    raise InvalidArgumentError(f"profile= takes True, False, None or a ProfileConfig (e.g. ProfileConfig(steps=10)), "
                               f"got {type(spec).__name__}")


class HostClock:
    """Wall time on the host: a mark is a ``perf_counter`` reading, always ready."""

    def mark(self) -> float:
        return time.perf_counter()

    @staticmethod
    def ready(mark: Any) -> bool:
        return True

    @staticmethod
    def seconds(start: Any, end: Any) -> float:
        return float(end - start)

    def wait(self, mark: Any) -> None:
        """Nothing to wait for on the host."""


class EventClock:
    """Device time from CUDA events (``event_factory`` makes one with ``enable_timing=True``; tests pass
    fakes). A mark is a recorded event; it is read once ``query()`` says the device reached it."""

    def __init__(self, event_factory: Callable[[], Any] | None = None) -> None:
        self._factory = event_factory or (lambda: torch.cuda.Event(enable_timing=True))

    def mark(self) -> Any:
        event = self._factory()
        event.record()
        return event

    @staticmethod
    def ready(mark: Any) -> bool:
        return bool(mark.query())

    @staticmethod
    def seconds(start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000.0

    @staticmethod
    def wait(mark: Any) -> None:
        mark.synchronize()


class NoDeviceMemory:
    """The host has no allocator statistics: every reading is NaN."""

    available = False

    @staticmethod
    def allocated() -> float:
        return math.nan

    @staticmethod
    def peak() -> float:
        return math.nan

    def reset_peak(self) -> None:
        """No peak to reset."""


class CudaMemory:
    """The CUDA caching allocator's counters of one device (host-side numbers: reading them never syncs).
    ``reset_peak`` is called at each profiled module call, so profiling resets ``torch.cuda``'s peak memory
    statistics on profiled steps."""

    available = True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def allocated(self) -> float:
        return float(torch.cuda.memory_allocated(self.device))

    def peak(self) -> float:
        return float(torch.cuda.max_memory_allocated(self.device))

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> float:
    """The process's resident set size in bytes (``/proc/self/statm``), NaN where that file does not exist."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * _PAGE)
    except (OSError, ValueError, IndexError):
        return math.nan


class ModuleFlops(FlopCounterMode):
    """``FlopCounterMode`` that hands each op's FLOPs to ``add`` (the profiler attributes them to the innermost
    module running, from its own stack) instead of its module tracker, whose global hooks it does not keep."""

    def __init__(self, add: Callable[[float], None]) -> None:
        super().__init__(display=False)
        self._add = add

    def __enter__(self) -> ModuleFlops:
        super().__enter__()
        self.mod_tracker.__exit__()  # modules come from the profiler's stack
        return self

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        formula = self.flop_registry.get(func_packet)
        if formula is not None:
            self._add(float(formula(*args, **kwargs, out_val=out)))
        return out
