"""``stats.backend``: the kernels run from a module built ahead of time for this machine, which computes what
numba's JIT computes (to the last bits of float32 sums) and leaves numba out of the process; a build that cannot be made falls back to the
JIT once and is not retried; the entry points refuse arrays they would misread."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from comgra_ndbg.stats import backend, kernels, openmp, parallel
from comgra_ndbg.stats.compiled import build
from comgra_ndbg.stats.drift import DriftState, gradients_moved
from comgra_ndbg.stats.fields import FIELD, NUM_FIELDS

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not installed")
COMPILER = shutil.which("cc") or shutil.which("gcc")


@pytest.fixture(scope="module")
def both():
    """The module built ahead of time (built now if this machine has none yet) and the JIT's dispatchers."""
    if COMPILER is None:
        pytest.skip("no C compiler: the module cannot be built here")
    return backend.load_ahead_of_time(), backend.load_jit()


def _arrays(rng: np.random.Generator, dtype: type) -> list[np.ndarray]:
    """Arrays that take every path of the kernels: one element, block edges, a mean that dwarfs the
    spread (the shifted sums), zeros, NaN and Inf (the exact recompute), and a large array."""
    block = kernels.BLOCK
    out = [rng.normal(size=n).astype(dtype) for n in (1, 7, block - 1, block + 1, 3 * block + 5, 60_000)]
    out.append((1.0 + 1e-4 * rng.normal(size=5000)).astype(dtype))
    out.append(np.where(rng.random(3000) < 0.3, 0.0, rng.normal(size=3000)).astype(dtype))
    spoiled = rng.normal(size=2000).astype(dtype)
    spoiled[[5, 900]] = [np.nan, np.inf]
    out.append(spoiled)
    out.append(np.full(100, np.finfo(dtype).max / 4, dtype=dtype))  # float32 sums overflow
    return out


_SUMS = [FIELD[f] for f in ("sum", "sum_sq", "sum_abs", "spread_sum_sq", "spread_dev_sq")]
_EXACT = [i for i in range(NUM_FIELDS) if i not in _SUMS]


def _same(a: object, b: object) -> bool:
    """Equal, except that the sums of statistics rows may differ in their last bits: the loops are the same
    machine code, but LLVM's runtime alias check sends a loop whose scratch arrays happen to be allocated
    next to each other to its scalar version, which adds in another order (as two calls of one backend
    can). Counts, extremes, flags and copies must be equal."""
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))
    if not isinstance(a, np.ndarray):
        return a == b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype != np.float64 or a.shape[-1] != NUM_FIELDS:
        return np.array_equal(a, b, equal_nan=True)
    rows_a, rows_b = a.reshape(-1, NUM_FIELDS), b.reshape(-1, NUM_FIELDS)
    if not np.array_equal(rows_a[:, _EXACT], rows_b[:, _EXACT], equal_nan=True):
        return False
    sums_a, sums_b = rows_a[:, _SUMS], rows_b[:, _SUMS]
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf: equal below
        scale = np.maximum(np.nan_to_num(np.abs(sums_a), posinf=0.0).max(axis=1, keepdims=True), 1.0)
        close = np.abs(sums_a - sums_b) <= 1e-6 * scale
    return bool((close | (sums_a == sums_b) | (np.isnan(sums_a) & np.isnan(sums_b))).all())


def test_the_comparison_allows_only_the_last_bits_of_sums_to_differ() -> None:
    row = np.zeros(NUM_FIELDS)
    row[FIELD["count"]], row[FIELD["sum"]], row[FIELD["sum_sq"]], row[FIELD["max"]] = 10, 3.0, 250.0, 7.0
    for field, delta, same in (("sum", 1e-9, True), ("sum", 1e-3, False), ("count", 1.0, False),
                               ("max", 1e-12, False), ("spread_dev_sq", 1e-7, True)):
        other = row.copy()
        other[FIELD[field]] += delta
        assert _same(row, other) is same, field


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_module_built_ahead_of_time_computes_what_the_jit_computes(both, dtype) -> None:
    aot, jit = both
    rng = np.random.default_rng(7)
    suffix = "_f32" if dtype == np.float32 else "_f64"
    compared = 0
    for a in _arrays(rng, dtype):
        start = (a * 0.5).astype(dtype)
        thresholds = np.array([-0.9, 0.9], dtype=dtype)
        batched = a[: a.size - a.size % 4].reshape(4, -1) if a.size >= 4 else a.reshape(1, -1)
        calls = [("moments", (a,)), ("moments_start", (a, start)), ("moments_copy", None), ("moments_start_copy", None),
                 ("units", (batched, True)), ("units_bounded", (batched, thresholds, True)),
                 ("summarize", (batched, False)), ("summarize_bounded", (batched, thresholds, True))]
        for name, arguments in calls:
            results = []
            copy = np.empty_like(a)  # one buffer for both: where it lies decides the loop LLVM's alias check takes
            for module in (aot, jit):
                row = np.zeros(NUM_FIELDS)
                if name == "moments_copy":
                    results.append((getattr(module, name + suffix)(a, copy, row), row, copy.copy()))
                elif name == "moments_start_copy":
                    results.append((getattr(module, name + suffix)(a, start, copy, row), row, copy.copy()))
                else:
                    results.append((getattr(module, name + suffix)(*arguments, row), row))
            assert _same(*results), f"{name}{suffix} on {a.size} elements"
            compared += 1
        for name, arguments in (("per_sample", (batched,)), ("per_sample_bounded", (batched, np.array([-0.9, 0.9])))):
            assert _same(getattr(aot, name + suffix)(*arguments), getattr(jit, name + suffix)(*arguments)), name
    arrays = _arrays(rng, dtype)
    halves = [(x * 0.5).astype(dtype) for x in arrays]
    copies = [np.empty_like(x) for x in arrays]
    addresses = np.array([x.ctypes.data for x in arrays], dtype=np.int64)
    sizes = np.array([x.size for x in arrays], dtype=np.int64)
    batches = np.array([2 if x.size % 2 == 0 else 0 for x in arrays], dtype=np.int64)
    none = np.zeros(len(arrays), dtype=np.int64)
    starts = np.array([h.ctypes.data if j % 3 == 1 else 0 for j, h in enumerate(halves)], dtype=np.int64)
    targets = np.array([c.ctypes.data if j % 3 == 2 else 0 for j, c in enumerate(copies)], dtype=np.int64)
    like = np.empty(0, dtype)
    for begin, copy in ((none, none), (starts, targets)):
        results = []
        for module in (aot, jit):
            rows, exact = np.zeros((len(arrays), NUM_FIELDS)), np.zeros(len(arrays), dtype=np.bool_)
            assert getattr(module, "moments_many" + suffix)(like, addresses, begin, copy, sizes, batches, rows,
                                                           exact) == -1
            results.append((rows, exact, [c.copy() for c in copies]))
        assert _same(results[0][:2], results[1][:2]) and results[0][1].any() and not results[0][1].all()
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(results[0][2], results[1][2]))
    assert compared > 0


def test_the_drift_passes_and_the_team_plan_agree_between_the_backends(both) -> None:
    aot, jit = both
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 6))
        rows = rng.normal(size=(n, NUM_FIELDS)) * rng.choice([1e-3, 1.0, 1e200], size=(n, 1))
        rows[:, FIELD["nan"]] = rng.random(n) < 0.1
        facts, moving = rng.normal(size=(n, 5)), rng.random(n) < 0.5
        limits = np.abs(rng.normal(size=(n, 2)))
        flags = [bool(b) for b in rng.random(3) < 0.5]
        found = []
        for module in (aot, jit):
            f, m = facts.copy(), moving.copy()
            found.append((module.observe(rows, f, m, limits, 0.01, *flags), f, m))
        assert _same(*found)
        norms = np.abs(rng.normal(size=n))
        found = [(module.gradients(rows, kept, flags[0], 100.0), kept) for module, kept in
                 ((aot, norms.copy()), (jit, norms.copy()))]
        assert _same(*found)
    sizes = np.array([10, 70_000, 3, 9000], dtype=np.int64)
    batches = np.array([0, 7, 0, 3], dtype=np.int64)
    assert _same(aot.team_plan(sizes, batches, 8192), jit.team_plan(sizes, batches, 8192))


@pytest.mark.skipif(not openmp.entry(), reason="no OpenMP team to share here")
def test_the_team_pass_of_the_module_matches_the_jit(both) -> None:
    aot, jit = both
    rng = np.random.default_rng(5)
    arrays = [rng.normal(size=n).astype(np.float32) for n in (50_000, 3, 120_000)]
    addresses = np.array([x.ctypes.data for x in arrays], dtype=np.int64)
    sizes = np.array([x.size for x in arrays], dtype=np.int64)
    none = np.zeros(3, dtype=np.int64)
    results = []
    for module in (aot, jit):
        rows, exact = np.zeros((3, NUM_FIELDS)), np.zeros(3, dtype=np.bool_)
        module.team_run(openmp.entry(), 16_384, 4, addresses, none, none, sizes, none, rows, exact)
        results.append((rows, exact))
    assert _same(*results)
    assert np.isclose(results[0][0][2, FIELD["sum"]], arrays[2].astype(np.float64).sum(), rtol=1e-5)


def test_a_recording_with_the_module_built_never_imports_numba(both, tmp_path) -> None:
    script = textwrap.dedent(f"""
        import sys, torch
        from torch import nn
        from comgra_ndbg import NeuralDbg
        from comgra_ndbg.stats import backend
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with NeuralDbg(model, {str(tmp_path)!r}, trial="lean", optimizer=optimizer, loss=nn.CrossEntropyLoss()):
            for step in range(30):
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 2, (16,))).backward()
                optimizer.step()
        print(backend.kind(), sorted(m for m in ("numba", "llvmlite") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"{backend.AHEAD_OF_TIME} []"


def test_a_build_that_fails_falls_back_to_the_jit_once_and_is_not_retried(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("COMGRA_NDBG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COMGRA_NDBG_KERNELS", "auto")
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the build process exits with 1 at once
    with pytest.warns(RuntimeWarning, match="could not be built ahead of time.*exited with 1"):
        entries, kind = backend._resolve()
    assert kind == backend.JIT and hasattr(entries, "moments_f32")
    failed = backend.folder().with_name(backend.folder().name + ".failed")
    assert "the build exited with 1" in failed.read_text()
    assert not list(tmp_path.glob(".kernels-*"))  # the scratch folder of the failed build is gone

    def no_build(where):
        raise AssertionError("a build recorded as failed was tried again")

    monkeypatch.setattr(backend, "_build", no_build)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backend._resolve()[1] == backend.JIT
    failed.unlink()  # deleting the record retries the build
    with pytest.raises(AssertionError, match="tried again"):
        backend._resolve()


def test_a_module_that_does_not_load_is_removed_and_reported(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("COMGRA_NDBG_CACHE_DIR", str(tmp_path))
    where = backend.folder()
    where.mkdir(parents=True)
    (where / f"{backend.MODULE_NAME}.cpython-damaged.so").write_bytes(b"not a shared object")
    with pytest.raises(backend.BuildError, match="does not load"):
        backend.load_ahead_of_time(build=False)
    assert not where.exists()
    with pytest.raises(backend.BuildError, match="no kernel module has been built"):
        backend.load_ahead_of_time(build=False)


def test_processes_waiting_for_a_build_that_failed_do_not_run_it_again(monkeypatch, tmp_path) -> None:
    runs = []

    def failing(scratch):
        runs.append(scratch)
        raise backend.BuildError("the build exited with 1: no compiler")

    monkeypatch.setattr(backend, "_run_build", failing)
    where = tmp_path / "kernels-k"
    with pytest.raises(backend.BuildError, match="no compiler"):
        backend._build(where)
    with pytest.raises(backend.BuildError, match="an earlier build failed: the build exited with 1: no compiler"):
        backend._build(where)  # what a process that waited on the lock meanwhile does
    assert len(runs) == 1 and not runs[0].exists() and not where.exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["kernels-k.failed"]


def test_a_build_removes_the_module_folders_no_process_loaded_for_a_month(monkeypatch, tmp_path) -> None:
    day, now = 86400.0, time.time()

    def made(name: str, age_days: float, *, folder: bool = True) -> Path:
        path = tmp_path / name
        if folder:
            path.mkdir()
            (path / f"{backend.MODULE_NAME}.so").write_bytes(b"")
        else:
            path.write_text("the build exited with 1\n")
        os.utime(path, (now - age_days * day, now - age_days * day))
        return path

    old, recent = made("kernels-old", 45), made("kernels-recent", 5)
    (tmp_path / "kernels-old.lock").write_text("")
    failed_old = made("kernels-gone.failed", 40, folder=False)  # a failure recorded alone ages the same way
    failed_recent = made("kernels-no.failed", 2, folder=False)
    (tmp_path / "kernels-gone.lock").write_text("")
    stranger = made("notes", 400)
    where = tmp_path / "kernels-new"

    def fake_build(scratch: Path) -> None:
        (scratch / f"{backend.MODULE_NAME}.so").write_bytes(b"")

    monkeypatch.setattr(backend, "_run_build", fake_build)
    backend._build(where)
    assert where.is_dir()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["kernels-new", "kernels-new.lock", "kernels-no.failed", "kernels-recent", "notes"]
    assert not old.exists() and not failed_old.exists() and recent.exists() and failed_recent.exists()
    assert stranger.exists()


def test_pruning_keeps_the_folder_named_and_the_records_of_folders_still_there(tmp_path) -> None:
    now = time.time()
    for name in ("kernels-a", "kernels-b"):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (now - 60 * 86400, now - 60 * 86400))
    (tmp_path / "kernels-b.lock").write_text("")
    os.utime(tmp_path / "kernels-b.lock", (now - 60 * 86400, now - 60 * 86400))
    removed = backend.prune(tmp_path, keep=tmp_path / "kernels-a", now=now)
    assert removed == [tmp_path / "kernels-b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels-a"]
    assert backend.prune(tmp_path / "missing", keep=tmp_path / "kernels-a") == []
    (tmp_path / "kernels-c").mkdir()
    assert backend.prune(tmp_path, keep=tmp_path / "kernels-a", days=0.0, now=now + 1) == [tmp_path / "kernels-c"]


def test_pruning_removes_the_lock_of_a_build_that_never_finished_once_it_is_old(tmp_path) -> None:
    now = time.time()
    (tmp_path / "native-a").mkdir()
    for name, age in (("native-b.lock", 60), ("native-c.lock", 1), ("kernels-d.lock", 60)):
        (tmp_path / name).write_text("")
        os.utime(tmp_path / name, (now - age * 86400, now - age * 86400))
    assert backend.prune(tmp_path, keep=tmp_path / "native-a", now=now, prefix="native-") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels-d.lock", "native-a", "native-c.lock"]


def test_loading_a_module_marks_its_folder_as_used(both, monkeypatch) -> None:
    where = backend.folder()
    long_ago = time.time() - 90 * 86400
    os.utime(where, (long_ago, long_ago))
    backend.load_ahead_of_time(build=False)
    assert where.stat().st_mtime > long_ago + 89 * 86400


def test_a_built_module_is_readable_by_the_machine_s_other_users(both) -> None:
    assert backend.folder().stat().st_mode & 0o755 == 0o755


def test_the_kernel_mode_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("COMGRA_NDBG_KERNELS", "numpy")
    assert backend.available() is False
    with pytest.raises(RuntimeError, match="no compiled kernels"):
        backend._resolve()
    monkeypatch.setenv("COMGRA_NDBG_KERNELS", "jit")

    def no_module(build=True):
        raise AssertionError("the JIT mode loaded the module")

    monkeypatch.setattr(backend, "load_ahead_of_time", no_module)
    assert backend._resolve()[1] == backend.JIT
    monkeypatch.setenv("COMGRA_NDBG_KERNELS", "fast")
    with pytest.raises(ValueError, match="'fast' is not a kernel mode: use auto, jit or numpy"):
        backend.mode()


def test_the_cache_folder_follows_the_settings(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("COMGRA_NDBG_CACHE_DIR", str(tmp_path / "mine"))
    assert backend.folder() == tmp_path / "mine" / f"kernels-{backend.key()[:24]}"
    monkeypatch.delenv("COMGRA_NDBG_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert backend.folder().parent == tmp_path / "xdg" / "comgra_ndbg"
    assert build.MODULE_NAME == backend.MODULE_NAME


def test_a_builder_waits_for_the_one_before_and_uses_its_module(monkeypatch, tmp_path) -> None:
    lock = tmp_path / "k.lock"
    order = []

    def second() -> None:
        with backend.exclusive(lock):
            order.append("second")

    with backend.exclusive(lock):
        waiting = threading.Thread(target=second)
        waiting.start()
        time.sleep(0.2)
        order.append("first")
    waiting.join(5)
    assert order == ["first", "second"]

    where = tmp_path / "kernels-x"
    where.mkdir()
    (where / f"{backend.MODULE_NAME}.so").write_bytes(b"")

    def no_run(*args, **kwargs):
        raise AssertionError("built although another process had built the module")

    monkeypatch.setattr(subprocess, "run", no_run)
    backend._build(where)


def test_a_held_lock_looks_fresh_to_pruning(tmp_path) -> None:
    lock = tmp_path / "native-x.lock"
    lock.write_text("")
    long_ago = time.time() - 90 * 86400
    os.utime(lock, (long_ago, long_ago))
    with backend.exclusive(lock):
        assert lock.stat().st_mtime > time.time() - 60
        assert backend.prune(tmp_path, keep=tmp_path / "native-y", prefix="native-") == []
    assert lock.exists()


@pytest.mark.parametrize("call, message", [
    (lambda: kernels.moments(np.zeros(4, np.float16), np.zeros(NUM_FIELDS)), "float32 or float64"),
    (lambda: kernels.moments(np.zeros(8, np.float32)[::2], np.zeros(NUM_FIELDS)), "C-contiguous"),
    (lambda: kernels.moments(np.zeros((2, 2), np.float32), np.zeros(NUM_FIELDS)), "of 1 dimension"),
    (lambda: kernels.moments(np.zeros(0, np.float32), np.zeros(NUM_FIELDS)), "non-empty"),
    (lambda: kernels.moments([1.0, 2.0], np.zeros(NUM_FIELDS)), "got list"),
    (lambda: kernels.moments(np.zeros(4, np.float32), np.zeros(NUM_FIELDS - 1)), "statistics row"),
    (lambda: kernels.moments(np.zeros(4, np.float32), np.zeros(NUM_FIELDS, np.float32)), "float64"),
    (lambda: kernels.moments(np.zeros(4, np.float32), np.zeros(NUM_FIELDS), start=np.zeros(4)), "float32 array"),
    (lambda: kernels.moments(np.zeros(4, np.float32), np.zeros(NUM_FIELDS), copy_to=np.zeros(3, np.float32)),
     r"shape \(4,\)"),
    (lambda: kernels.moments(np.zeros(4, np.float32), np.zeros(NUM_FIELDS), copy_to=_read_only()), "writable"),
    (lambda: kernels.summarize(np.zeros((2, 3)), np.zeros(NUM_FIELDS), np.zeros(2, np.float32), True), "thresholds"),
    (lambda: kernels.per_sample(np.zeros((2, 3), np.float32), np.zeros(1)), "thresholds"),
    (lambda: kernels.moments_many(np.dtype(np.float32), np.zeros(2, np.int64), np.zeros(2, np.int32),
                                  np.zeros((2, NUM_FIELDS))), "sizes must be a C-contiguous int64"),
    (lambda: kernels.moments_many(np.dtype(np.float32), np.zeros(2, np.int64), np.zeros(2, np.int64),
                                  np.zeros((1, NUM_FIELDS))), "statistics row"),
    (lambda: kernels.moments_many(np.dtype(np.int32), np.zeros(2, np.int64), np.zeros(2, np.int64),
                                  np.zeros((2, NUM_FIELDS))), "not int32"),
    (lambda: parallel.plan(np.zeros(2, np.int64), np.zeros(3, np.int64), 8), "batches"),
    (lambda: kernels.moments_many(np.dtype(np.float32), np.zeros((2, 1), np.int64), np.ones(2, np.int64),
                                  np.zeros((2, NUM_FIELDS))), "addresses must be a C-contiguous int64 array of 2"),
    (lambda: kernels.units(np.zeros((2, 3), np.float32), np.zeros(NUM_FIELDS), (0.5,)), "thresholds"),
])
def test_the_entry_points_refuse_arrays_they_would_misread(call, message) -> None:
    with pytest.raises(TypeError, match=message):
        call()


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("size, batch, address", [(0, 0, "real"), (0, 0, "none"), (-3, 0, "real"),
                                                  (7, 3, "real"), (7, -1, "real"), (8, 0, "none")])
def test_arrays_described_wrongly_by_address_are_refused_before_any_is_read(size, batch, address, shared) -> None:
    if shared and not openmp.entry():
        pytest.skip("no OpenMP team to share here")
    good = np.arange(1.0, 9.0, dtype=np.float32)
    a = np.arange(1.0, 8.0, dtype=np.float32)
    addresses = np.array([good.ctypes.data, a.ctypes.data if address == "real" else 0], dtype=np.int64)
    rows = np.zeros((2, NUM_FIELDS))
    with pytest.raises(ValueError, match=rf"array 1 of moments_many cannot be read as described .* size {size}, "
                                         rf"batch {batch}\)"):
        parallel.moments_many(np.dtype(np.float32), addresses, np.array([8, size], dtype=np.int64), rows,
                              batches=np.array([2, batch], dtype=np.int64), shared=shared)
    assert not rows.any()  # the good array before it was not summarised either


def _read_only() -> np.ndarray:
    a = np.zeros(4, np.float32)
    a.setflags(write=False)
    return a


def test_the_drift_checks_refuse_rows_of_another_shape() -> None:
    with pytest.raises(ValueError, match=r"shape \(2, 17\)"):
        gradients_moved(np.zeros((2, 5)), np.zeros(2), True, 100.0)
    with pytest.raises(ValueError, match=r"two limits per parameter"):
        DriftState(2).observe(np.zeros((2, NUM_FIELDS)), compare=True, allowed=np.zeros((2, 3)), fraction=0.1)
    with pytest.raises(ValueError, match=r"shape \(2, 17\)"):
        DriftState(2).observe(np.zeros((3, NUM_FIELDS)), compare=True, allowed=None, fraction=0.1)
