"""Fixtures shared by several test modules."""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from hypothesis import settings

from comgra_ndbg.recorder import native
from comgra_ndbg.stats import kernels

# Fuzz tests (tests/test_fuzz_recorder.py): no deadline (a recording's first numba compilation takes seconds);
# on CI a fixed set of cases, so that a red build is reproducible.
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True, max_examples=60)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev")

# The recorder's C++ gradient taps: built before the first recording and used from its first step (by default a
# missing module is built in the background and taken up when ready), so that every test runs one known path;
# tests/test_native_taps.py compares it with the Python hooks.
os.environ.setdefault("COMGRA_NDBG_NATIVE", "wait")


@pytest.fixture
def taps_module():
    """The recorder's built C++ part: where a C++ compiler exists it must build (a failure fails the test, so the
    suite never passes on the Python hooks alone by accident)."""
    if native.mode() == "off":
        pytest.skip("COMGRA_NDBG_NATIVE=off")
    module = native.warm_up()
    if module is None and (shutil.which("c++") or shutil.which("g++")) is None:
        pytest.skip(f"no C++ compiler: {native.build_error()}")
    assert module is not None, native.build_error()
    return module


@pytest.fixture(params=["kernels", "numpy"])
def host_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on both host paths: the compiled kernels and the numpy/torch code used without numba.
    Modules opt in with ``pytestmark = pytest.mark.usefixtures("host_path")``."""
    if request.param == "numpy":
        monkeypatch.setattr(kernels, "AVAILABLE", False)
        for name in ("moments", "moments_many", "per_sample", "summarize", "units"):  # as if numba were missing
            monkeypatch.setattr(kernels, name, _missing(name))
    elif not kernels.AVAILABLE:
        pytest.skip("numba is not installed")
    return request.param


def _missing(name: str):
    def kernel(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"kernels.{name} was called although kernels.AVAILABLE is False")

    return kernel


@pytest.fixture
def overhead_models(monkeypatch: pytest.MonkeyPatch) -> list:
    """The MLPs that ``benchmarks/overhead.py``'s loops build from now on, in order (each loop builds one)."""
    from benchmarks import overhead

    models: list = []
    real_mlp = overhead.MLP

    def mlp():
        models.append(real_mlp())
        return models[-1]

    monkeypatch.setattr(overhead, "MLP", mlp)
    return models


@pytest.fixture(autouse=True)
def empty_comgra_slot() -> Iterator[None]:
    """Every test leaves ``comgra_ndbg.compat.comgra.my_recorder`` empty, as a fresh process has it: a Comgra
    script assigns its recorder there, and a stale one must not reach the next test."""
    yield
    import comgra_ndbg.compat.comgra as comgra

    comgra.my_recorder = None


# Scripts that tests run in processes of their own (python or torchrun); collecting their doctests would import
# the frameworks they train with, which the tests using them skip without.
collect_ignore = ["lightning_ddp_run.py", "transformers_ddp_run.py"]
