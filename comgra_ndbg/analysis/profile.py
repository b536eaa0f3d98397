"""Reading a profile: where a step's time and memory go, which layers dominate, and whether memory leaks.

Pure functions over the arrays of ``Recording.profile()`` (``store.profile_reading.ProfileTables``): no I/O,
thresholds as parameters.

- :func:`layer_costs`: each module's typical (median over profiled steps) exclusive forward and backward time,
  saved activation bytes and FLOPs, and its share of the step's time and memory. The first profiled step is
  left out where a later one has the figure: it pays one-off costs (first allocations and kernel launches;
  under ``NeuralDbg`` its structure pass runs the model twice), and the default policy profiles only a
  handful of steps, so a median would often be half made of it.
- hot layers: the fewest layers that together take ``cover`` of the time (or of the saved memory), each at
  least ``min_share``, at most ``max_hot``.
- :func:`memory_trend`: a memory-leak hypothesis — memory that grows linearly over the steps with no plateau.
  A line is fitted to RSS after a warm-up; the run leaks when the line explains the data (R² ≥ ``min_r2``),
  it grew by at least ``min_growth`` bytes, and the growth did not level off: the slope of the last third is
  at least ``plateau_ratio`` of the first third's (a cache filling up, an allocator warming up, flattens).

>>> steps = np.arange(100)
>>> memory_trend(steps, 1e9 + steps * 4e6).leaking
True
>>> memory_trend(steps, 1e9 + 4e8 * (1 - np.exp(-steps / 8.0))).leaking  # grows, then levels off
False
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from comgra_ndbg.analysis.events import CausalChain, Diagnosis, Event, Evidence, Hypothesis

__all__ = ["LayerCost", "MemoryTrend", "ProfileReport", "layer_costs", "memory_trend", "profile_report",
           "with_profile", "LEAK_TYPE"]

LEAK_TYPE = "memory_leak"
_EVIDENCE_POINTS = 64

MIB = 2.0**20


@dataclass(frozen=True)
class LayerCost:
    """One module's typical cost per step (medians over the profiled steps it ran in)."""

    module: str
    forward_time: float  # seconds, exclusive of profiled children
    backward_time: float  # seconds of the autograd nodes its own forward created
    saved_bytes: float  # activation bytes its ops keep for backward
    flops: float  # forward FLOPs, exclusive (NaN when never counted)
    peak_delta: float  # device allocator peak above the start of its call (NaN on CPU)
    time_share: float  # of the sum over modules of forward + backward time
    memory_share: float  # of the sum over modules of saved bytes
    hot_time: bool = False
    hot_memory: bool = False

    @property
    def time(self) -> float:
        return self.forward_time + self.backward_time

    @property
    def hot(self) -> bool:
        return self.hot_time or self.hot_memory


@dataclass(frozen=True)
class MemoryTrend:
    """The memory-leak test of one memory series (bytes over steps)."""

    leaking: bool
    slope: float  # bytes per step of the fitted line
    r2: float  # how much of the variance the line explains
    growth: float  # bytes the fitted line rose over the series (after warm-up)
    first_slope: float  # bytes per step over the first third
    last_slope: float  # bytes per step over the last third
    onset: int  # first step of the fit (-1 when there were too few steps)
    steps: int  # steps the test saw after warm-up

    def sentence(self, what: str = "process memory (RSS)") -> str:
        if self.onset < 0:
            return f"Too few steps to test {what} for a leak ({self.steps})."
        rate = f"{self.slope / MIB:.3g} MiB per step"
        if self.leaking:
            return (f"Memory leak: {what} grows linearly by {rate} from step {self.onset} on (R² {self.r2:.2f}, "
                    f"{self.growth / MIB:.3g} MiB in {self.steps} steps) with no plateau; look for tensors the loop "
                    f"keeps (a list of losses without .item() or .detach(), outputs stored across steps).")
        return f"No memory leak: {what} changes by {rate} (R² {self.r2:.2f}) and levels off or stays flat."


@dataclass(frozen=True)
class ProfileReport:
    """What a profile says: each layer's cost (most expensive first), the hot ones, and the memory trend."""

    layers: tuple[LayerCost, ...]
    memory: MemoryTrend | None
    profiled_steps: int
    step_time: float  # median wall time of a step while profiling was on (NaN when unknown)

    @property
    def hot(self) -> tuple[LayerCost, ...]:
        return tuple(layer for layer in self.layers if layer.hot)

    def table(self, limit: int = 15) -> str:
        """The layers as aligned text, most expensive first, hot ones marked ``*``; then the notes."""
        lines = [f"{'module':<32} {'fwd ms':>9} {'bwd ms':>9} {'time %':>7} {'saved MiB':>10} {'MFLOP':>10}"]
        for layer in self.layers[:limit]:
            lines.append(f"{('* ' if layer.hot else '  ') + layer.module:<32} {layer.forward_time * 1e3:>9.4g} "
                         f"{layer.backward_time * 1e3:>9.4g} {layer.time_share * 100:>7.1f} "
                         f"{layer.saved_bytes / MIB:>10.4g} {layer.flops / 1e6:>10.4g}")
        if len(self.layers) > limit:
            lines.append(f"  ... {len(self.layers) - limit} more modules")
        return "\n".join(lines + list(self.notes()))

    def notes(self) -> tuple[str, ...]:
        """One sentence per finding, for ``Diagnosis.notes``."""
        out = []
        hot_time = [layer for layer in self.layers if layer.hot_time]
        if hot_time:
            out.append("Hot layers (time): " + ", ".join(
                f"{layer.module} {layer.time_share:.0%} ({layer.time * 1e3:.3g} ms)" for layer in hot_time) + ".")
        hot_memory = sorted((layer for layer in self.layers if layer.hot_memory), key=lambda c: -c.memory_share)
        if hot_memory:
            out.append("Hot layers (activation memory): " + ", ".join(
                f"{layer.module} {layer.memory_share:.0%} ({layer.saved_bytes / MIB:.3g} MiB)"
                for layer in hot_memory) + ".")
        if self.memory is not None:
            out.append(self.memory.sentence())
        return tuple(out)


def _median(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if len(finite) else float("nan")


def _typical(values: np.ndarray, warmup: int) -> float:
    """The median of ``values`` after the first ``warmup`` steps, or of all of them when no later one is finite
    (a run profiled once, or whose later profiled step counted FLOPs and timed nothing)."""
    later = values[warmup:]
    return _median(later if np.isfinite(later).any() else values)


def _hot(shares: np.ndarray, *, cover: float, min_share: float, max_hot: int) -> set[int]:
    """The fewest largest shares that reach ``cover``, each at least ``min_share``, at most ``max_hot``."""
    chosen: set[int] = set()
    total = 0.0
    for i in np.argsort(-shares, kind="stable"):
        if total >= cover or len(chosen) >= max_hot or not shares[i] >= min_share:
            break
        chosen.add(int(i))
        total += float(shares[i])
    return chosen


def layer_costs(modules: tuple[str, ...], data: np.ndarray, fields: tuple[str, ...], *, cover: float = 0.5,
                min_share: float = 0.15, max_hot: int = 3, warmup: int = 1) -> tuple[LayerCost, ...]:
    """Each module's typical cost from ``data[step, module, field]`` (fields named by ``fields``, steps in
    order), most expensive first, the hot layers marked; the first ``warmup`` profiled steps count only for
    a figure no later step has.

    >>> data = np.zeros((2, 3, 8)); f = ("calls", "forward_time", "forward_inclusive", "backward_time",
    ...     "saved_bytes", "allocated_delta", "peak_delta", "flops")
    >>> data[:, :, 1] = [0.01, 0.08, 0.01]; data[:, :, 3] = [0.0, 0.1, 0.0]; data[:, :, 4] = [0, 10, 30]
    >>> [(c.module, c.hot_time, c.hot_memory) for c in layer_costs(("a", "b", "c"), data, f)]
    [('b', True, False), ('c', False, True), ('a', False, False)]
    """
    column = {name: i for i, name in enumerate(fields)}
    if not len(modules) or not len(data):
        return ()
    typical = {name: np.array([_typical(data[:, m, column[name]], warmup) for m in range(len(modules))])
               for name in ("forward_time", "backward_time", "saved_bytes", "flops", "peak_delta")}
    time = np.nan_to_num(typical["forward_time"]) + np.nan_to_num(typical["backward_time"])
    saved = np.nan_to_num(typical["saved_bytes"])
    time_share = time / time.sum() if time.sum() > 0 else np.zeros_like(time)
    memory_share = saved / saved.sum() if saved.sum() > 0 else np.zeros_like(saved)
    hot_time = _hot(time_share, cover=cover, min_share=min_share, max_hot=max_hot)
    hot_memory = _hot(memory_share, cover=cover, min_share=min_share, max_hot=max_hot)
    costs = [LayerCost(module, float(typical["forward_time"][m]), float(typical["backward_time"][m]),
                       float(typical["saved_bytes"][m]), float(typical["flops"][m]), float(typical["peak_delta"][m]),
                       float(time_share[m]), float(memory_share[m]), m in hot_time, m in hot_memory)
             for m, module in enumerate(modules)]
    return tuple(sorted(costs, key=lambda c: (-np.nan_to_num(c.time), -c.saved_bytes)))


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.polyfit(x, y, 1)[0]) if len(x) >= 2 and np.ptp(x) > 0 else 0.0


def memory_trend(steps: np.ndarray, memory: np.ndarray, *, warmup: float = 0.1, min_steps: int = 12,
                 min_growth: float = 16 * MIB, min_r2: float = 0.8, plateau_ratio: float = 0.5) -> MemoryTrend:
    """Test ``memory`` (bytes, parallel to ``steps``) for a leak: linear growth with no plateau (see the
    module docstring). The first ``warmup`` fraction of the steps is left out (allocators and caches fill)."""
    finite = np.isfinite(memory)
    x, y = np.asarray(steps, np.float64)[finite], np.asarray(memory, np.float64)[finite]
    start = int(np.ceil(len(x) * warmup))
    x, y = x[start:], y[start:]
    if len(x) < min_steps:
        return MemoryTrend(False, 0.0, 0.0, 0.0, 0.0, 0.0, -1, int(len(x)))
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    spread = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(residual**2)) / spread if spread > 0 else 0.0
    third = max(len(x) // 3, 2)
    first, last = _slope(x[:third], y[:third]), _slope(x[-third:], y[-third:])
    growth = float(slope * (x[-1] - x[0]))
    leaking = bool(slope > 0 and growth >= min_growth and r2 >= min_r2 and last >= plateau_ratio * max(first, 0.0)
                   and last > 0)
    return MemoryTrend(leaking, float(slope), r2, growth, first, last, int(x[0]), int(len(x)))


def profile_report(modules: tuple[str, ...], data: np.ndarray, fields: tuple[str, ...], process_steps: np.ndarray,
                   rss: np.ndarray, step_times: np.ndarray, **thresholds: float) -> ProfileReport:
    """Layer costs with hot layers, and the memory trend of ``rss`` over ``process_steps``.
    ``thresholds`` go to :func:`memory_trend` (``min_growth``, ``min_r2``, ...)."""
    trend = memory_trend(process_steps, rss, **thresholds) if len(process_steps) else None
    return ProfileReport(layer_costs(modules, data, fields), trend, int(len(data)), _median(np.asarray(step_times)))


def with_profile(diagnosis: Diagnosis, report: ProfileReport, process_steps: np.ndarray, rss: np.ndarray
                 ) -> Diagnosis:
    """``diagnosis`` with the profile's findings: its sentences appended to the notes, and a leaking memory
    trend as an event (family ``memory``, node ``process``) and a ``memory_leak`` hypothesis after the others.
    Its confidence is the fit's R², not a calibrated probability (no benchmark family injects leaks yet)."""
    notes = diagnosis.notes + report.notes()
    trend = report.memory
    if trend is None or not trend.leaking:
        return replace(diagnosis, notes=notes)
    pick = np.unique(np.linspace(0, len(process_steps) - 1, min(len(process_steps), _EVIDENCE_POINTS)).astype(int))
    evidence = Evidence("process/rss", tuple(int(s) for s in process_steps[pick]), tuple(float(v) for v in rss[pick]),
                        float(rss[0]))
    event = Event("memory", "process", "rss", "flat", "growing", trend.onset, int(process_steps[-1]), trend.slope,
                  trend.r2, (evidence,))
    hypothesis = Hypothesis(LEAK_TYPE, "data", "process", trend.onset, round(trend.r2, 2), trend.sentence(),
                            CausalChain(event), remedy="Keep no tensor that holds the graph across steps: store "
                            "loss.item() or tensor.detach(), clear lists of outputs, and check caches keyed by step.")
    events = tuple(sorted(diagnosis.events + (event,), key=lambda e: e.onset))
    return replace(diagnosis, notes=notes, events=events, hypotheses=diagnosis.hypotheses + (hypothesis,))
