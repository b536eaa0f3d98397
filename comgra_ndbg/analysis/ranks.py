"""Checks across the ranks of a distributed run: what no single rank's recording can show.

Data-parallel training keeps one copy of the model per rank, and every copy must hold the same parameters
after every step. Four things break that, silently:

- **desync**: a parameter differs between ranks at a step although the ranks should agree. The recorded
  value summaries of each parameter (Σx, Σx², Σ|x|, min, max and the counts, float64) are its fingerprint:
  two equal tensors give equal rows on every rank, so rows that differ beyond a relative ``rtol`` (1e-8) mean
  the parameters differ. Causes: an in-place edit on one rank, a buffer or parameter outside DDP's reach,
  a random initialisation that was never broadcast.
- **partial wrapping**: the model is wrapped in ``DistributedDataParallel`` on some ranks only (the
  recorded ``ddp_wrapped`` flag), so those ranks never average their gradients with the others.
- **divergence**: one rank's loss or gradient norm stands a decade (``factor``) or more away from the median
  of the ranks over the last steps (two ranks: from each other, both named), or turns non-finite while the
  others stay finite.
- **stall**: a rank whose recording stops steps before the others' (it hung, crashed or left the loop),
  when that rank's writer is no longer running or the gap exceeds ``stall_steps``.

Arrays in, frozen dataclasses out: :func:`check_ranks` takes one :class:`RankRun` per rank and returns
:class:`RankFinding` s; :func:`rank_diagnosis` turns them into events and hypotheses for ``analyze``.

>>> import numpy as np
>>> rows = np.ones((3, 17))
>>> runs = [RankRun(r, np.arange(3), {"w": (np.arange(3), rows.copy())}, ddp_wrapped=True) for r in (0, 1)]
>>> check_ranks(runs)
()
>>> runs[1].fingerprints["w"][1][2, 4] = 1.5  # rank 1's Σx differs at step 2
>>> [(f.check, f.ranks, f.onset, f.subject) for f in check_ranks(runs)]
[('desync', (0, 1), 2, 'w')]
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from comgra_ndbg.analysis.events import CausalChain, Event, Evidence, Hypothesis
from comgra_ndbg.analysis.sentences import TYPE_TEXT
from comgra_ndbg.store.schema import FIELD

__all__ = ["RankRun", "RankThresholds", "RankFinding", "check_ranks", "rank_diagnosis", "FAMILY", "CHECKS"]

FAMILY = "rank_consistency"
CHECKS = ("partial_ddp", "desync", "diverging_loss", "diverging_gradients", "stalled")

Series = tuple[np.ndarray, np.ndarray]
_COMPARED = tuple(FIELD[name] for name in ("count", "nan", "inf", "sum", "sum_sq", "sum_abs", "min", "max"))


@dataclass(frozen=True)
class RankRun:
    """What one rank recorded: its ``steps``, each parameter's value summary rows ``(steps, rows [n,
    NUM_FIELDS])`` (the fingerprints), whether its model was wrapped in DDP (None: unknown), its loss and
    total gradient norm ``(steps, values)``, and its writer's state (``finished``, ``live``, ``killed``, …)."""

    rank: int
    steps: np.ndarray
    fingerprints: Mapping[str, Series] = field(default_factory=dict)
    ddp_wrapped: bool | None = None
    loss: Series = (np.zeros(0, np.int64), np.zeros(0))
    grad_norm: Series = (np.zeros(0, np.int64), np.zeros(0))
    state: str = "finished"


@dataclass(frozen=True)
class RankThresholds:
    """``rtol``: relative difference of fingerprints that counts as different parameters; ``factor``: how
    far (×) a rank's loss or gradient norm may stand from the others' median; ``window``: the fraction of the
    common steps (at least ``min_window`` steps) that the divergence rule looks at; ``stall_steps``: the gap
    that flags a rank whose writer still runs (a finished or killed one is flagged at any gap)."""

    rtol: float = 1e-8
    factor: float = 10.0
    window: float = 0.2
    min_window: int = 3
    stall_steps: int = 100


@dataclass(frozen=True)
class RankFinding:
    """One cross-rank problem: ``check`` (one of :data:`CHECKS`), the ``ranks`` at fault (every rank when
    the evidence cannot tell which), the first step it shows, the parameter it concerns (``""`` for the
    run), a magnitude (relative difference, ratio or steps missing) and one sentence."""

    check: str
    ranks: tuple[int, ...]
    onset: int
    subject: str
    magnitude: float
    message: str
    evidence: tuple[Evidence, ...] = ()


def check_ranks(runs: Sequence[RankRun], thresholds: RankThresholds = RankThresholds()) -> tuple[RankFinding, ...]:
    """Every cross-rank finding of a run with ``runs`` (one per rank), in onset order; () for one rank."""
    runs = sorted(runs, key=lambda r: r.rank)
    if len(runs) < 2:
        return ()
    findings = _partial_wrapping(runs)
    findings += _desync(runs, thresholds)
    findings += _divergence(runs, "loss", "diverging_loss", thresholds)
    findings += _divergence(runs, "grad_norm", "diverging_gradients", thresholds)
    findings += _stalls(runs, thresholds)
    return tuple(sorted(findings, key=lambda f: (f.onset, CHECKS.index(f.check))))


# ---- DDP on some ranks only ---------------------------------------------------------------------------------
def _partial_wrapping(runs: Sequence[RankRun]) -> list[RankFinding]:
    flags = {r.rank: r.ddp_wrapped for r in runs if r.ddp_wrapped is not None}
    bare = tuple(rank for rank, wrapped in flags.items() if not wrapped)
    if not bare or len(bare) == len(flags):
        return []
    onset = min((int(r.steps[0]) for r in runs if len(r.steps)), default=0)
    wrapped = [rank for rank in flags if rank not in bare]
    return [RankFinding("partial_ddp", bare, onset, "", float(len(bare)),
                        f"the model is wrapped in DistributedDataParallel on rank{'s' * (len(wrapped) > 1)} "
                        f"{_list(wrapped)} but not on rank{'s' * (len(bare) > 1)} {_list(bare)}, so "
                        f"{'those ranks train' if len(bare) > 1 else 'that rank trains'} on "
                        f"{'their' if len(bare) > 1 else 'its'} own gradients",
                        (Evidence("config/ddp_wrapped", (onset,), tuple(float(bool(flags[r])) for r in flags)),))]


# ---- parameters that differ between ranks --------------------------------------------------------------------
def _desync(runs: Sequence[RankRun], thresholds: RankThresholds) -> list[RankFinding]:
    """The earliest step at which any parameter's fingerprint differs between ranks (two ranks that differ:
    both are named; three or more: those unlike the majority). When every rank says it does not use DDP,
    parameters that differ from the first common step on are separate models on purpose (an ensemble), not
    a desync."""
    best: tuple[int, str, tuple[int, ...], float] | None = None
    first_common: int | None = None
    for name in runs[0].fingerprints:
        series = [r.fingerprints.get(name) for r in runs]
        if any(s is None for s in series):
            continue
        common = _common_steps([s[0] for s in series])
        if not len(common):
            continue
        first_common = int(common[0]) if first_common is None else min(first_common, int(common[0]))
        rows = np.stack([s[1][np.searchsorted(s[0], common)][:, _COMPARED] for s in series])  # [rank, step, field]
        alike = _close(rows[:1], rows[1:], thresholds.rtol)  # [rank - 1, step]: like the first rank
        hits = np.flatnonzero(~alike.all(axis=0))
        if not len(hits):
            continue
        at = int(hits[0])
        step = int(common[at])
        if best is None or step < best[0]:
            differs = _differs(rows[:, at], thresholds.rtol)  # who is unlike the majority, at that step only
            odd = tuple(runs[i].rank for i in np.flatnonzero(differs))
            best = (step, name, odd, _relative(rows[:, at]))
    if best is None:
        return []
    step, name, odd, size = best
    if step == first_common and all(r.ddp_wrapped is False for r in runs):
        return []
    unwrapped = all(r.ddp_wrapped is False for r in runs)
    others = [r.rank for r in runs if r.rank not in odd]
    versus = f"rank{'s' * (len(odd) > 1)} {_list(odd)} against rank{'s' * (len(others) > 1)} {_list(others)}" \
        if others else f"ranks {_list(odd)} disagree, and no majority tells which is right"
    return [RankFinding("desync", odd, step, name, size,
                        f"parameter '{name}' differs between ranks from step {step} on ({versus}; relative "
                        f"difference {size:.1e})" + (", and no rank wraps the model in DistributedDataParallel, "
                                                     "so nothing keeps them equal" if unwrapped else ""),
                        (Evidence(f"{name}/value/sum", (step,), ()),))]


def _differs(rows: np.ndarray, rtol: float) -> np.ndarray:
    """``[rank]``: whether a rank's row ``[rank, field]`` differs from the majority's (from rank 0's when
    there is no majority, in which case every rank that is not like rank 0 and rank 0 itself differ)."""
    alike = _close(rows[:, None], rows[None, :], rtol)  # [rank, rank]
    majority = alike.sum(axis=1) > len(rows) / 2  # alike with more than half the ranks (itself included)
    if majority.any():
        return ~majority
    unlike_first = ~alike[0]
    unlike_first[0] = unlike_first[1:].any()
    return unlike_first


def _close(a: np.ndarray, b: np.ndarray, rtol: float) -> np.ndarray:
    """Whether fingerprint rows ``[..., field]`` agree within ``rtol`` (of Σ|x| for Σx, of the larger
    magnitude of min and max for those; counts exactly), broadcast over the leading axes. A field both rows
    lack (NaN: Σx and Σ|x| of a sentinel row, ``stats/sentinels.py``) agrees."""
    a, b = np.broadcast_arrays(a, b)
    scale = np.maximum(np.abs(a), np.abs(b))
    scale[..., 3] = np.maximum(scale[..., 3], scale[..., 5])  # Σ|x| bounds Σx: cancellation hides no change
    scale[..., 6:8] = scale[..., 6:8].max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        same = (a == b) | (np.abs(a - b) <= rtol * scale) | (np.isnan(a) & np.isnan(b))
    same[..., :3] = a[..., :3] == b[..., :3]
    return same.all(axis=-1)


def _relative(rows: np.ndarray) -> float:
    """The largest relative difference of Σx, Σx², Σ|x|, min or max between ranks at one step ``[rank,
    field]`` (Σx relative to Σ|x|)."""
    values = rows[:, 3:8]
    scale = np.abs(values).max(axis=0)
    scale[0] = max(scale[0], scale[2])
    scale = np.maximum(scale, np.finfo(float).tiny)
    with np.errstate(invalid="ignore"):
        spread = (values.max(axis=0) - values.min(axis=0)) / scale
    spread = spread[np.isfinite(spread)]
    return float(spread.max()) if len(spread) else float("inf")


# ---- a rank whose loss or gradients go their own way ----------------------------------------------------------
def _divergence(runs: Sequence[RankRun], attribute: str, check: str, thresholds: RankThresholds) -> list[RankFinding]:
    """A rank whose series turns non-finite while every other stays finite, or stands ``factor`` or more from
    the others over the last steps. The reference is the median of every rank (itself included), which
    belongs to the majority from three ranks on, so only the odd rank is named; the median of the *other*
    ranks would be dragged by the odd one and name the healthy ranks as well. Two ranks have no majority:
    one finding names both."""
    series = [getattr(r, attribute) for r in runs]
    common = _common_steps([s[0] for s in series])
    if len(common) < thresholds.min_window:
        return []
    values = np.stack([s[1][np.searchsorted(s[0], common)] for s in series]).astype(float)  # [rank, step]
    what = "loss" if attribute == "loss" else "gradient norm"
    found = []
    for i, run in enumerate(runs):
        broken = ~np.isfinite(values[i]) & np.isfinite(np.delete(values, i, axis=0)).all(axis=0)
        if broken.any():
            at = int(np.argmax(broken))
            found.append(RankFinding(check, (run.rank,), int(common[at]), "", float("inf"),
                                     f"the {what} of rank {run.rank} turned non-finite at step {int(common[at])} "
                                     f"while the other ranks' stayed finite",
                                     (Evidence(f"kpi/{what}", (int(common[at]),), (float(values[i, at]),)),)))
    if found:
        return found
    width = max(thresholds.min_window, int(np.ceil(thresholds.window * len(common))))
    if len(runs) == 2:
        start, size = _far_from(values[1], values[0], width, thresholds.factor)
        if start is None:
            return []
        high = 1 if size > 1 else 0
        size = max(size, 1 / size)
        return [RankFinding(check, (runs[0].rank, runs[1].rank), int(common[start]), "", size,
                            f"the {what} of rank {runs[high].rank} stands {size:.3g}× rank {runs[1 - high].rank}'s "
                            f"from step {int(common[start])} on (two ranks: either may be the odd one)",
                            _divergence_evidence(what, common, values[high], values[1 - high][-1], width))]
    reference = np.median(values, axis=0)
    for i, run in enumerate(runs):
        start, size = _far_from(values[i], reference, width, thresholds.factor)
        if start is None:
            continue
        found.append(RankFinding(check, (run.rank,), int(common[start]), "", size,
                                 f"the {what} of rank {run.rank} stands {size:.3g}× the median of the ranks "
                                 f"from step {int(common[start])} on",
                                 _divergence_evidence(what, common, values[i], reference[-1], width)))
    return found


def _far_from(mine: np.ndarray, reference: np.ndarray, width: int, factor: float) -> tuple[int | None, float]:
    """Where ``mine`` starts to stand ``factor`` or more from ``reference`` for good (every one of the last
    ``width`` steps, finite ratios only), as an index into the steps, and the median ratio there; (None, 1)
    when it does not."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.abs(mine) / np.abs(reference)
    tail = ratio[-width:]
    far = (tail > factor) | (tail < 1 / factor)
    if not far.all() or not np.isfinite(tail).all():
        return None, 1.0
    outside = (ratio > factor) | (ratio < 1 / factor)
    start = len(ratio) - int(np.argmin(outside[::-1])) if not outside.all() else 0
    return start, float(np.median(tail))


def _divergence_evidence(what: str, common: np.ndarray, mine: np.ndarray, reference: float,
                         width: int) -> tuple[Evidence, ...]:
    return (Evidence(f"kpi/{what}", tuple(int(s) for s in common[-width:][:3]),
                     tuple(float(v) for v in mine[-width:][:3]), float(reference)),)


# ---- a rank that stopped ---------------------------------------------------------------------------------------
def _stalls(runs: Sequence[RankRun], thresholds: RankThresholds) -> list[RankFinding]:
    last = {r.rank: int(r.steps[-1]) if len(r.steps) else -1 for r in runs}
    furthest = max(last.values())
    found = []
    for run in runs:
        gap = furthest - last[run.rank]
        if gap <= 0 or (run.state == "live" and gap <= thresholds.stall_steps):
            continue
        found.append(RankFinding("stalled", (run.rank,), last[run.rank] + 1, "", float(gap),
                                 f"rank {run.rank} stopped after step {last[run.rank]} while another rank reached "
                                 f"step {furthest} ({gap} steps more; its recording is {run.state})",
                                 (Evidence("steps/step", (last[run.rank], furthest), (float(gap),)),)))
    return found


def _common_steps(steps: Sequence[np.ndarray]) -> np.ndarray:
    """The steps every array holds (each sorted and unique; ranks usually hold the same ones)."""
    common = np.asarray(steps[0], np.int64)
    for s in steps[1:]:
        s = np.asarray(s, np.int64)
        if not np.array_equal(s, common):
            common = np.intersect1d(common, s, assume_unique=True)
    return common


def _list(ranks: Sequence[int]) -> str:
    ranks = [str(r) for r in ranks]
    return ranks[0] if len(ranks) == 1 else ", ".join(ranks[:-1]) + " and " + ranks[-1]


# ---- events and hypotheses ---------------------------------------------------------------------------------------
_READING = {  # check -> (hypothesis type, origin, remedy)
    "partial_ddp": ("partial_ddp", "architecture",
                    "wrap the model in DistributedDataParallel on every rank (the same code path for all ranks), "
                    "or train without DDP on one process"),
    "desync": ("rank_desync", "node",
               "find what changes '{subject}' on some ranks only (an in-place edit under a rank condition, an "
               "unbroadcast initialisation, a parameter DDP does not see); seed and build the model alike on "
               "every rank, and change parameters only through the optimizer"),
    "diverging_loss": ("rank_divergence", "data",
                       "check the data each rank reads (its shard, its preprocessing) and that every rank runs the "
                       "same model code"),
    "diverging_gradients": ("rank_divergence", "data",
                            "check the data each rank reads and that every rank's gradients are averaged (DDP on "
                            "every rank, no no_sync() left on)"),
    "stalled": ("rank_stalled", "data",
                "look at that rank's own log for an exception or a hang (uneven data shards make ranks wait at "
                "the next collective; use a DistributedSampler with drop_last or join())"),
}
CONFIDENCE = {"partial_ddp": 0.95, "desync": 0.9, "diverging_loss": 0.7, "diverging_gradients": 0.7,
              "stalled": 0.8}


def rank_diagnosis(findings: Sequence[RankFinding], last_step: int) -> tuple[tuple[Event, ...], tuple[Hypothesis, ...]]:
    """One event and one hypothesis per finding, in the findings' order; a desync that partial wrapping
    explains becomes part of that hypothesis' chain instead of a hypothesis of its own."""
    events, hypotheses = [], []
    partial = any(f.check == "partial_ddp" for f in findings)
    for f in findings:
        kind, origin, advice = _READING[f.check]
        node = f.subject.rpartition(".")[0] if f.check == "desync" else ""
        event = Event(FAMILY, node or "ranks", "ranks", "in sync", f.check, f.onset, max(last_step, f.onset),
                      f.magnitude, 1.0, f.evidence)
        events.append(event)
        if f.check == "desync" and partial:
            continue
        advice = advice.format(subject=f.subject)
        confidence = CONFIDENCE[f.check]
        text = f"{TYPE_TEXT[kind]}: {f.message}; {advice} (confidence {confidence:.2f})."
        hypotheses.append(Hypothesis(kind, origin, node, f.onset, confidence, text, CausalChain(event),
                                     remedy=advice))
    return tuple(events), tuple(hypotheses)
