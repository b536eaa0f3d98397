"""Property-based fuzzing of the recording path: strategies for every public call, and the oracle.

A case is a sequence of calls a new user might make, in any order, with any arguments: steps started and
finished or not, tensors of every dtype, rank, layout and device (int, bool, complex, half, 0-d, empty,
non-contiguous, sparse, meta, nested, NaN/Inf, huge and tiny values), names with unicode, NUL characters or
lone surrogates, wrong types for every argument, calls after ``close()``. :func:`run_case` plays it against
a real ``Recorder`` and a real file and checks, for every call:

- it returns, or raises a typed ``ComgraError`` whose message says what to do: nothing else may reach the
  training loop (a *crash*);
- it never changes a tensor it was handed (training under the recorder stays bit-identical);

and, after ``close()``, that the recording opens, passes ``check``, and holds every step that was started
and every tensor, KPI and note the recorder accepted, unless the problems log names that step and tensor
(a *documented skip*); anything else is a *silent loss*. ``tests/test_fuzz_recorder.py`` runs it under
hypothesis; ``benchmarks/integrity.py`` runs more cases for the README's figures.
"""
from __future__ import annotations

import math
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from comgra_ndbg import ComgraError, Recorder, check, open_recording
from comgra_ndbg.store import schema

__all__ = ["Outcome", "calls", "run_case", "constructor_arguments", "GUIDANCE", "says_what_to_do"]

GUIDANCE = ("must", "call", "pass", "use", "register", "choose", "give", "needs", "remove", "record", "convert",
            "decode", "count", "create", "keep", "reduce", "wait", "delete", "e.g.", "is for", "instead", "first")
"""Words of a message that says what to do (every typed error of the recorder names the fix)."""


def says_what_to_do(text: str) -> bool:
    """A typed error's message names what was wrong and the fix: long enough, with a word of the fix."""
    return len(text) >= 25 and any(word in text for word in GUIDANCE)

# ---- values --------------------------------------------------------------------------------------------------
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.uint8,
           torch.bool, torch.complex64, torch.complex128]
_SPECIAL = [0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 1e38, -3e38, 1e-45, 1e300, 5e-324]


@st.composite
def tensors(draw: st.DrawFn) -> Any:
    """A tensor (of any dtype, rank, layout, device, with special values) or, rarely, something else."""
    kind = draw(st.sampled_from(["plain"] * 8 + ["noncontig", "sparse", "expanded", "meta", "nested", "rank9",
                                                 "not a tensor"]))
    if kind == "not a tensor":
        return draw(st.sampled_from([None, [1.0, 2.0], np.ones(3), 3, "x"]))
    if kind == "nested":
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    dtype = draw(st.sampled_from(_DTYPES))
    shape = draw(st.sampled_from([(), (0,), (3,), (4, 2), (4, 0), (2, 3, 2), (1, 1, 1, 1)]))
    if kind == "rank9":
        shape = (2,) + (1,) * 7 + (2,)
    if kind == "meta":
        return torch.empty(shape or (2,), dtype=dtype, device="meta")
    values = draw(st.lists(st.sampled_from(_SPECIAL) | st.floats(-1e6, 1e6, allow_nan=False), min_size=1,
                           max_size=4))
    base = torch.tensor(values, dtype=torch.float64).repeat(int(np.prod(shape)) // len(values) + 1)
    base = base[:int(np.prod(shape))].reshape(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # casting inf or nan to an integer dtype
        tensor = base.to(torch.complex128).to(dtype) if dtype.is_complex else base.to(dtype)
    if kind == "noncontig" and tensor.dim() >= 2:
        tensor = tensor.transpose(0, 1)
    elif kind == "sparse" and tensor.dim() >= 1 and dtype not in (torch.bfloat16, torch.float16):
        tensor = tensor.to_sparse()
    elif kind == "expanded" and tensor.dim() >= 1:
        tensor = tensor[:1].expand(3, *tensor.shape[1:]) if tensor.shape[0] else tensor
    if draw(st.booleans()) and (tensor.is_floating_point() or tensor.is_complex()) and tensor.layout == torch.strided:
        tensor = tensor.detach().requires_grad_(True) * 1  # a non-leaf that requires grad, as activations are
    return tensor


def names() -> st.SearchStrategy:
    """Mostly good names (a few, so that they repeat), some odd unicode, NUL, surrogates, wrong types."""
    good = st.sampled_from(["x", "h", "loss", "ü-name", "数据", "a.b", "a b"])
    odd = st.text(min_size=0, max_size=6)  # includes NUL and lone surrogates
    wrong = st.sampled_from([None, 3, b"x", ["x"], 2.5])
    return st.one_of(good, good, good, odd, wrong)


def steps() -> st.SearchStrategy:
    return st.one_of(st.integers(0, 40), st.integers(0, 40), st.sampled_from([-1, 2**63, 2**63 - 1, 2.0, True,
                                                                              "3", None, np.int64(7)]))


def kpi_values() -> st.SearchStrategy:
    return st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**400, 10**400),
                     st.sampled_from([None, "1.0", True, [1.0]]), tensors())


def bounds() -> st.SearchStrategy:
    """``register_tensor``'s ``bounds``: the valid forms and malformed ones (one of which, accepted, once made
    every later write of the recording fail)."""
    return st.sampled_from(["auto", None, (0.0, 1.0), [-1, 1], (1.0, 0.0), (0.5, 0.5), 5, (1.0,), ("a", "b"),
                            (0.0, float("nan")), (True, 2), "bogus"])


def calls() -> st.SearchStrategy:
    """A list of calls (name, arguments) in any order."""
    call = st.one_of(
        st.tuples(st.just("start_step"), steps(), st.one_of(st.just("train"), st.none(), names())),
        st.tuples(st.just("register_tensor"), names(), tensors(),
                  st.sampled_from(["intermediate", "input", "output", "loss", "target", "parameter", "bogus", None]),
                  st.one_of(st.none(), names()), st.sampled_from([None, True, False, "yes"]), bounds()),
        st.tuples(st.just("register_tensor"), names(), tensors(), st.just("intermediate"), st.none(), st.none(),
                  st.just("auto")),
        st.tuples(st.just("record_kpi"), names(), kpi_values()),
        st.tuples(st.just("add_note"), st.one_of(st.text(max_size=8), st.sampled_from([None, 5, b"b"]))),
        st.tuples(st.just("add_dependency"), names(), names()),
        st.tuples(st.just("decide_step"), st.one_of(st.just("late"), names()),
                  st.sampled_from([None, ["a", "b", "a", "c"], [1, 2], "abc", np.array(["\0"])])),
        st.tuples(st.just("start_iteration")), st.tuples(st.just("finish_iteration")),
        st.tuples(st.just("record_gradients"), st.one_of(st.none(), names())),
        st.tuples(st.just("backward")), st.tuples(st.just("finish_step")), st.tuples(st.just("flush")),
        st.tuples(st.just("track_module"), names(), st.sampled_from(["linear", "not a module", "frozen"])),
        st.tuples(st.just("close")),
    )
    return st.lists(call, min_size=1, max_size=24)


def constructor_arguments() -> st.SearchStrategy:
    """Keyword arguments of ``Recorder`` with wrong types and values mixed in."""
    return st.fixed_dictionaries({}, optional={
        "trial": st.one_of(names(), st.just("." * 3), st.just("a/b"), st.text(min_size=201, max_size=210)),
        "mode": st.sampled_from(["w-", "w", "a", "r", None, 1]),
        "overwrite": st.sampled_from([True, False, "yes", None]),
        "summaries": st.sampled_from([1, 0, -1, 2.5, "10", None, True, [0, 3], range(3)]),
        "snapshots": st.sampled_from([1, 10, -2, "x", None, False]),
        "num_samples": st.sampled_from([0, 8, -1, 2.5, "8", None]),
        "max_elements": st.sampled_from([1, 4096, 0, -5, 1.5, None]),
        "flush_every_seconds": st.sampled_from([5.0, 0, -1, "5", math.nan, math.inf, None, 1e-9]),
        "flush_every_steps": st.sampled_from([None, 1, 0, -3, 2.5, "2"]),
        "saturation_margin": st.sampled_from([0.0, 0.1, 0.5, -0.1, "0.1", None, math.nan]),
        "record_updates": st.sampled_from([True, False, "no", None, 0]),
    })


# ---- the oracle ---------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one case did: typed errors, crashes (anything else that reached the loop), silent losses."""

    calls: int = 0
    typed_errors: int = 0
    crashes: list[str] = field(default_factory=list)
    unhelpful: list[str] = field(default_factory=list)  # typed errors whose message does not say what to do
    silent_losses: list[str] = field(default_factory=list)
    skips: int = 0  # documented skips: entries of the problems log


@dataclass
class _Expected:
    steps: set[int] = field(default_factory=set)
    tensors: list[tuple[int, str]] = field(default_factory=list)  # (step, name) of accepted registrations
    kpis: list[tuple[int, str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run_case(ops: list[tuple], folder: Path | None = None, **recorder_kwargs: Any) -> Outcome:
    """Play ``ops`` against a real recorder and file; see the module docstring for what is checked."""
    with tempfile.TemporaryDirectory() as tmp:
        return _play(ops, Path(folder or tmp), recorder_kwargs)


def _play(ops: list[tuple], folder: Path, recorder_kwargs: dict) -> Outcome:
    outcome, expected = Outcome(), _Expected()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = Recorder(folder, "fuzz", summaries=1, snapshots=2, flush_every_seconds=1e9, **recorder_kwargs)
        loose: list[torch.Tensor] = []  # registered tensors that require grad, for backward()
        for op in ops:
            outcome.calls += 1
            kept = [(t, _copy(t)) for t in op[1:] if isinstance(t, torch.Tensor)]
            try:
                _call(rec, op, expected, loose)
            except ComgraError as error:
                outcome.typed_errors += 1
                text = str(error)
                if not says_what_to_do(text):
                    outcome.unhelpful.append(f"{op[0]}: a typed error that does not say what to do: {text!r}")
            except Exception as error:  # noqa: BLE001 - exactly what the oracle counts
                outcome.crashes.append(f"{op[0]}{_short(op[1:])}: {type(error).__name__}: {error}")
            for tensor, before in kept:
                if before is not None and not _same(tensor, before):
                    outcome.crashes.append(f"{op[0]} changed the tensor it was handed")
        try:
            rec.close()
        except Exception as error:  # noqa: BLE001
            outcome.crashes.append(f"close: {type(error).__name__}: {error}")
    if not outcome.crashes:
        _verify(folder, expected, outcome)
    return outcome


def _call(rec: Recorder, op: tuple, expected: _Expected, loose: list) -> None:
    name, args = op[0], op[1:]
    if name == "start_step":
        rec.start_step(*args)
        expected.steps.add(int(args[0]))
        loose.clear()
    elif name == "register_tensor":
        label, tensor, role, node, batched, bounds_ = args
        out = rec.register_tensor(label, tensor, role=role, node=node, batched=batched, bounds=bounds_)
        assert out is tensor, "register_tensor must hand back the very tensor"
        if rec.is_recording and tensor.numel() > 0:
            expected.tensors.append((rec.current_step, label))
        if tensor.requires_grad:
            loose.append(tensor)
    elif name == "record_kpi":
        rec.record_kpi(*args)
        value = args[1]
        number = float(value.detach().double().reshape(())) if isinstance(value, torch.Tensor) else float(value)
        step = rec.current_step if rec.current_step is not None else rec._last_step
        expected.kpis.append((step, args[0], number))
    elif name == "add_note":
        rec.add_note(*args)
        expected.notes.append(args[0])
    elif name == "add_dependency":
        rec.add_dependency(*args)
    elif name == "decide_step":
        rec.decide_step(args[0], sample_categories=args[1])
    elif name == "backward":
        if loose:
            sum(t.real.sum() if t.is_complex() else t.float().sum() for t in loose).backward()
            loose.clear()
    elif name == "track_module":
        module = {"linear": torch.nn.Linear(2, 2), "frozen": torch.nn.Linear(2, 2).requires_grad_(False),
                  "not a module": {"w": torch.ones(1)}}[args[1]]
        rec.track_module(args[0], module)
    else:
        getattr(rec, name)(*args)


def _verify(folder: Path, expected: _Expected, outcome: Outcome) -> None:
    """After close: the recording is readable and intact, and everything accepted is in it or logged."""
    try:
        report = check(folder)
        with open_recording(folder) as rec:
            problems = rec.problems()
            outcome.skips = len(problems)
            logged = {(p.step, p.subject) for p in problems}
            failed_steps = {p.step for p in problems if p.category == schema.PROBLEM_RECORDER}
            recorded = set(rec.steps.tolist())
            for step in sorted(expected.steps - recorded - failed_steps):
                outcome.silent_losses.append(f"step {step} was started but is not in the recording")
            summarized = {}
            for step, label in expected.tensors:
                if (step, label) in logged or step in failed_steps:
                    continue
                if label not in summarized:
                    summarized[label] = {int(s) for kind in _kinds(rec, label)
                                         for s in rec.summary_rows(label, kind)[0]} if _known(rec, label) else set()
                if step not in summarized[label]:
                    outcome.silent_losses.append(f"tensor {label!r} registered at step {step} is not recorded")
            for step, label, value in expected.kpis:
                steps, values = rec.kpi(label) if label in rec.kpi_names else (np.zeros(0), np.zeros(0))
                hit = values[steps == step]
                if not any(v == value or (math.isnan(v) and math.isnan(value)) for v in hit.tolist()):
                    outcome.silent_losses.append(f"KPI {label!r} = {value} at step {step} is not recorded")
            texts = [n.text for n in rec.notes]
            for note in expected.notes:
                if note not in texts:
                    outcome.silent_losses.append(f"note {note!r} is not recorded")
        if not report.ok:
            outcome.silent_losses.append(f"check found damage in a fresh recording: {report}")
    except ComgraError as error:
        outcome.silent_losses.append(f"the recording cannot be read: {error}")


def _known(rec: Any, label: str) -> bool:
    return any(t.name == label for t in rec.tensors)


def _kinds(rec: Any, label: str) -> list[str]:
    return [k for k in rec.kinds(label) if k == schema.KIND_VALUE]


def _copy(tensor: torch.Tensor) -> torch.Tensor | None:
    if tensor.device.type == "meta" or tensor.is_nested:
        return None
    return tensor.detach().clone()


def _same(tensor: torch.Tensor, before: torch.Tensor) -> bool:
    """Bit for bit the same (NaN payloads and the sign of zero included)."""
    now = tensor.detach()
    if now.layout != torch.strided:
        now, before = now.to_dense(), before.to_dense()
    bits = [t.reshape(-1).contiguous().view(torch.uint8) for t in (now, before)]
    return now.shape == before.shape and now.dtype == before.dtype and bool(torch.equal(*bits))


def _short(args: tuple) -> str:
    return "(" + ", ".join(type(a).__name__ if isinstance(a, torch.Tensor) else repr(a)[:20] for a in args) + ")"
