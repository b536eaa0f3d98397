"""The entry points that Python calls into the compiled kernels, each with the argument types it is built for.

numba's JIT compiles a variant per argument type on first call; a module built ahead of time (``build``)
holds exactly one per exported name. So every optional argument of the kernels (``start``, ``copy_to``,
saturation thresholds) gets an entry of its own that passes None or the array, and every entry is exported
once per array dtype under ``<name>_<dtype>`` (``moments_f32``), or once under its plain name when it takes
no float array of the caller's dtype. ``SIGNATURES`` lists them; ``jit_namespace`` gives the same names
bound to numba's dispatchers, so both backends are called the same way (``stats.backend``).

The exported functions check nothing about their arguments (a wrong dtype or layout reads memory as the
wrong type): the Python wrappers of ``kernels``, ``drift`` and ``parallel`` check them first.

numba's JIT disk cache keys each dispatcher here on this file alone, and these call into the other files of
this package: in a source checkout, clear that cache (``*.nbi``, ``*.nbc`` under ``__pycache__`` or
``NUMBA_CACHE_DIR``) after editing them, or the JIT keeps running the old loops (the module built ahead of
time is keyed on every file here and is rebuilt by itself).
"""
from __future__ import annotations

from types import SimpleNamespace

import numba

from comgra_ndbg.stats.compiled import drift, moments, team

__all__ = ["DTYPES", "SIGNATURES", "jit_namespace"]

DTYPES = {"f32": "f4", "f64": "f8"}
"""The array dtypes the kernels are built for, by the suffix of their entries' names."""


@numba.njit(nogil=True, cache=True)
def _moments(a, row):  # pragma: no cover - compiled
    return moments.moments(a, None, None, row)


@numba.njit(nogil=True, cache=True)
def _moments_start(a, start, row):  # pragma: no cover - compiled
    return moments.moments(a, start, None, row)


@numba.njit(nogil=True, cache=True)
def _moments_copy(a, copy_to, row):  # pragma: no cover - compiled
    return moments.moments(a, None, copy_to, row)


@numba.njit(nogil=True, cache=True)
def _moments_start_copy(a, start, copy_to, row):  # pragma: no cover - compiled
    return moments.moments(a, start, copy_to, row)


@numba.njit(nogil=True, cache=True)
def _moments_many(like, addresses, starts, copies, sizes, batches, rows, exact):  # pragma: no cover - compiled
    return moments.moments_many(like, addresses, starts, copies, sizes, batches, rows, exact)


@numba.njit(nogil=True, cache=True)
def _units(a, batched, row):  # pragma: no cover - compiled
    return moments.units(a, None, batched, row)


@numba.njit(nogil=True, cache=True)
def _units_bounded(a, thresholds, batched, row):  # pragma: no cover - compiled
    return moments.units(a, thresholds, batched, row)


@numba.njit(nogil=True, cache=True)
def _summarize(a, batched, row):  # pragma: no cover - compiled
    return moments.summarize(a, None, batched, row)


@numba.njit(nogil=True, cache=True)
def _summarize_bounded(a, thresholds, batched, row):  # pragma: no cover - compiled
    return moments.summarize(a, thresholds, batched, row)


@numba.njit(nogil=True, cache=True)
def _per_sample(a):  # pragma: no cover - compiled
    return moments.per_sample(a, None)


@numba.njit(nogil=True, cache=True)
def _per_sample_bounded(a, thresholds):  # pragma: no cover - compiled
    return moments.per_sample(a, thresholds)


_ROW, _ROWS, _FLAGS, _INTS = "f8[::1]", "f8[:, ::1]", "b1[::1]", "i8[::1]"
_PER_DTYPE = {  # name: (dispatcher, signature with {a} for the array dtype)
    "moments": (_moments, f"b1({{a}}[::1], {_ROW})"),
    "moments_start": (_moments_start, f"b1({{a}}[::1], {{a}}[::1], {_ROW})"),
    "moments_copy": (_moments_copy, f"b1({{a}}[::1], {{a}}[::1], {_ROW})"),
    "moments_start_copy": (_moments_start_copy, f"b1({{a}}[::1], {{a}}[::1], {{a}}[::1], {_ROW})"),
    "moments_many": (_moments_many, f"i8({{a}}[::1], {_INTS}, {_INTS}, {_INTS}, {_INTS}, {_INTS}, {_ROWS}, "
                                    f"{_FLAGS})"),
    "units": (_units, f"b1({{a}}[:, ::1], b1, {_ROW})"),
    "units_bounded": (_units_bounded, f"b1({{a}}[:, ::1], {{a}}[::1], b1, {_ROW})"),
    "summarize": (_summarize, f"b1({{a}}[:, ::1], b1, {_ROW})"),
    "summarize_bounded": (_summarize_bounded, f"b1({{a}}[:, ::1], {{a}}[::1], b1, {_ROW})"),
    "per_sample": (_per_sample, f"Tuple(({_ROWS}, {_FLAGS}))({{a}}[:, ::1])"),
    "per_sample_bounded": (_per_sample_bounded, f"Tuple(({_ROWS}, {_FLAGS}))({{a}}[:, ::1], {_ROW})"),
}
_PLAIN = {
    "observe": (drift.observe, f"i8({_ROWS}, {_ROWS}, {_FLAGS}, {_ROWS}, f8, b1, b1, b1)"),
    "gradients": (drift.gradients, f"i8({_ROWS}, {_ROW}, b1, f8)"),
    "team_plan": (team.plan, f"i8[:, ::1]({_INTS}, {_INTS}, i8)"),
    "team_run": (team.run, f"i8(i8, i8, i8, {_INTS}, {_INTS}, {_INTS}, {_INTS}, {_INTS}, {_ROWS}, {_FLAGS})"),
}

SIGNATURES: dict[str, tuple[object, str]] = {
    **{f"{name}_{suffix}": (function, signature.format(a=code))
       for name, (function, signature) in _PER_DTYPE.items() for suffix, code in DTYPES.items()},
    **_PLAIN,
}
"""Every exported name: the dispatcher it runs and the numba signature it is built for."""


def jit_namespace() -> SimpleNamespace:
    """The entries as numba's dispatchers (compiled on first call, or loaded from numba's disk cache)."""
    return SimpleNamespace(**{name: function for name, (function, _) in SIGNATURES.items()})
