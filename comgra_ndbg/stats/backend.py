"""Which compiled kernels this process runs, decided without importing numba.

Three backends offer the same entry points (``compiled.entries``):

- **ahead of time**: the extension module ``compiled.build`` makes for this machine's CPU, these kernel
  sources and these numba, llvmlite, numpy and Python versions, kept in the cache folder. Loading it maps
  about 1 MB and never imports numba or llvmlite.
- **JIT**: numba's dispatchers, compiled on first call or loaded from numba's disk cache. The same machine
  code, but numba, llvmlite and LLVM's code generator stay in the process: about 110 MiB of resident memory
  on a training process that uses 300.
- **none**: numba is not installed; the numpy paths of ``host``, ``drift`` and ``parallel`` run instead.

When numba is installed and the module for this key is missing, the first process that needs the kernels
builds it, in a process of its own (tens of seconds, once per machine and version; other processes that
need it meanwhile wait for that build rather than start their own) and loads it. A build that fails (no C
compiler, a cache folder that cannot be written) is remembered in the cache folder beside the module's
name, so that no process tries it again, and warned about; those processes run the JIT instead. Delete the
``.failed`` file to try again. A module that does not load (a damaged file) is removed, and the next process
builds it afresh.

Every change of the kernels' sources, of numba or numpy, or of the CPU makes a new key and so a new folder.
Loading a module marks its folder as used (its modification time); a build removes the other keys' folders
(and their lock and failure records) that no process has loaded for :data:`UNUSED_DAYS` days, so the cache
keeps what some installed version still uses and does not grow by a module per upgrade.

Environment:

- ``COMGRA_NDBG_KERNELS``: ``auto`` (the default: the module, built when missing, else the JIT), ``jit``
  (never the module) or ``numpy`` (no compiled kernels at all).
- ``COMGRA_NDBG_CACHE_DIR``: where modules are kept (default ``$XDG_CACHE_HOME/comgra_ndbg``, else
  ``~/.cache/comgra_ndbg``).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np

__all__ = ["AHEAD_OF_TIME", "JIT", "BuildError", "available", "entries", "exclusive", "failed_marker", "folder", "key",
           "kind", "load_ahead_of_time", "load_jit", "lock_file", "mode", "prune", "remove_folder"]

AHEAD_OF_TIME, JIT = "ahead of time", "jit"
MODULE_NAME = "comgra_ndbg_kernels"  # the name compiled.build gives the module (kept in step by a test)
BUILD_TIMEOUT = 900.0
"""Seconds a build may take before the JIT is used instead (a build takes well under a minute)."""
UNUSED_DAYS = 30
"""Days after which a build removes another key's module folder that no process loaded meanwhile."""
_PREFIX = "kernels-"
_STATS = Path(__file__).resolve().parent
_SOURCES = ("kernels.py", "fields.py", "drift.py", "parallel.py")  # the constants the compiled code reads
_LOCK = threading.Lock()
_ENTRIES: ModuleType | SimpleNamespace | None = None
_KIND: str | None = None


class BuildError(RuntimeError):
    """The module could not be built ahead of time; the message holds the build's own error output."""


def mode() -> str:
    """``COMGRA_NDBG_KERNELS``: "auto", "jit" or "numpy" (anything else is an error)."""
    value = os.environ.get("COMGRA_NDBG_KERNELS", "auto").strip().lower() or "auto"
    if value not in ("auto", "jit", "numpy"):
        raise ValueError(f"COMGRA_NDBG_KERNELS={value!r} is not a kernel mode: use auto, jit or numpy")
    return value


def available() -> bool:
    """Whether compiled kernels can run here (the module is built, or numba is installed to build or JIT it),
    found without loading either."""
    chosen = mode()
    if chosen == "numpy":
        return False
    if chosen == "auto" and _module_file(folder()) is not None:
        return True
    return importlib.util.find_spec("numba") is not None


def entries() -> ModuleType | SimpleNamespace:
    """The entry points of the backend this process runs (resolved once, on first use: see the module's
    docstring). Raises RuntimeError where no compiled kernels are available (``available()`` is False)."""
    global _ENTRIES, _KIND
    if _ENTRIES is None:
        with _LOCK:
            if _ENTRIES is None:
                _ENTRIES, _KIND = _resolve()
    return _ENTRIES


def kind() -> str | None:
    """:data:`AHEAD_OF_TIME` or :data:`JIT` once ``entries()`` has resolved, else None."""
    return _KIND


def load_ahead_of_time(build: bool = True) -> ModuleType:
    """The module built ahead of time for this key, building it first when missing and ``build`` is set.
    Raises :class:`BuildError` when it is missing and cannot be built."""
    where = folder()
    path = _module_file(where)
    if path is None:
        if not build:
            raise BuildError(f"no kernel module has been built in {where}")
        _build(where)
        path = _module_file(where)
        if path is None:
            raise BuildError(f"the build left no kernel module in {where}")
    try:
        spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError) as error:  # a damaged file: removed, so that a retry builds it afresh
        remove_folder(where)
        raise BuildError(f"the kernel module {path} does not load ({error})") from error
    with suppress(OSError):  # marks the folder as used (``prune``); a read-only cache keeps its old time
        os.utime(where)
    return module


def load_jit() -> SimpleNamespace:
    """The entry points as numba's JIT dispatchers (this imports numba)."""
    from comgra_ndbg.stats.compiled.entries import jit_namespace

    return jit_namespace()


def folder() -> Path:
    """Where the module for this key is (or will be) kept."""
    configured = os.environ.get("COMGRA_NDBG_CACHE_DIR")
    if configured:
        root = Path(configured)
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "comgra_ndbg"
    return root / f"{_PREFIX}{key()[:24]}"


_KEY: str | None = None


def key() -> str:
    """A hash of everything the module's machine code depends on: the kernels' sources (and the constants
    they read), the numba, llvmlite, numpy and Python versions, numba's CPU and optimisation settings, and
    this machine's CPU (model and the features it reports, which the build compiles for)."""
    global _KEY
    if _KEY is None:
        digest = hashlib.sha256()
        for path in sorted((_STATS / "compiled").glob("*.py")) + [_STATS / name for name in _SOURCES]:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        versions = []
        for package in ("numba", "llvmlite"):
            try:
                versions.append(importlib.metadata.version(package))
            except importlib.metadata.PackageNotFoundError:
                versions.append("absent")
        settings = [os.environ.get(name, "") for name in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_OPT")]
        for part in (*versions, *settings, np.__version__, sys.version, sys.platform, platform.machine(), _cpu()):
            digest.update(part.encode() + b"\0")
        _KEY = digest.hexdigest()
    return _KEY


def _cpu() -> str:
    """This machine's CPU model and instruction-set flags (what ``target_cpu = "host"`` compiles for)."""
    wanted = ("vendor_id", "model name", "flags", "cpu family", "model", "Features", "CPU part")
    found = []
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:  # the first processor's block is enough
                if not line.strip():
                    break
                if line.split(":")[0].strip() in wanted:
                    found.append(line.strip())
    except OSError:
        return platform.processor()
    return "\n".join(found)


def _module_file(where: Path) -> Path | None:
    if not where.is_dir():
        return None
    found = sorted(where.glob(f"{MODULE_NAME}.*"))
    return found[0] if found else None


def _resolve() -> tuple[ModuleType | SimpleNamespace, str]:
    chosen = mode()
    if chosen == "numpy" or not available():
        raise RuntimeError("no compiled kernels here: numba is not installed (or COMGRA_NDBG_KERNELS=numpy); "
                           "check stats.kernels.AVAILABLE before calling them")
    if chosen == "auto":
        failed = failed_marker(folder())
        if not failed.exists():
            try:
                return load_ahead_of_time(), AHEAD_OF_TIME
            except (BuildError, OSError, ImportError) as error:
                recorded = f"; {failed} records this, delete it to try again" if failed.exists() else ""
                warnings.warn(f"the statistics kernels run through numba's JIT in this process (about 110 MiB more "
                              f"memory): they could not be built ahead of time ({error}){recorded}",
                              RuntimeWarning, stacklevel=4)
    return load_jit(), JIT


def lock_file(where: Path) -> Path:
    """The file a build of the module for ``where`` holds locked while it runs."""
    return where.with_name(where.name + ".lock")


def failed_marker(where: Path) -> Path:
    """The file that records a failed build of the module for ``where``: no process tries that build again."""
    return where.with_name(where.name + ".failed")


def _build(where: Path) -> None:
    """Build the module into ``where`` in a process of its own, one builder at a time per cache folder. A
    failure is recorded (``failed_marker``) before the lock is let go, so the processes waiting for this
    build do not each run it again."""
    import tempfile

    try:
        where.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BuildError(f"cannot create the cache folder {where.parent}: {error}") from error
    failed = failed_marker(where)
    with exclusive(lock_file(where)):
        if _module_file(where) is not None:  # another process built it while this one waited
            return
        if failed.exists():  # or failed to
            raise BuildError(f"an earlier build failed: {failed.read_text().strip()}")
        scratch = Path(tempfile.mkdtemp(dir=where.parent, prefix=f".{where.name}-"))
        try:
            _run_build(scratch)
            scratch.chmod(0o755)  # (mkdtemp's 0700 would hide the module from the machine's other users)
            os.replace(scratch, where)
            prune(where.parent, keep=where)
        except BuildError as error:
            with suppress(OSError):  # a cache that cannot be written cannot keep the record either
                failed.write_text(f"{error}\n")
            raise
        except OSError:
            if _module_file(where) is None:
                raise
        finally:
            remove_folder(scratch)  # (gone already when it was renamed into place)


def _run_build(scratch: Path) -> None:
    """``compiled.build`` into ``scratch``, in a child process that imports this very comgra_ndbg: its working
    directory is the cache (``python -m`` puts the working directory first on ``sys.path``) and
    ``PYTHONPATH`` starts with the folder that holds this package."""
    environment = dict(os.environ, COMGRA_NDBG_KERNELS="jit")
    root = str(_STATS.parent.parent)
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (root, environment.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run([sys.executable, "-m", "comgra_ndbg.stats.compiled.build", str(scratch)],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT, env=environment,
                              cwd=scratch.parent)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BuildError(f"the build did not finish: {error}") from error
    if done.returncode != 0 or _module_file(scratch) is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise BuildError(f"the build exited with {done.returncode}: " + " | ".join(tail))


def prune(root: Path, *, keep: Path, days: float = UNUSED_DAYS, now: float | None = None,
          prefix: str = _PREFIX) -> list[Path]:
    """Remove the module folders in ``root`` other than ``keep`` (those whose name starts with ``prefix``) that
    no process has loaded for ``days`` days (by their modification time), with their lock and failure
    records; returns the folders removed. A failure record or a lock alone (a build that never finished) ages
    the same way. Anything else in ``root`` is left alone, and a folder that cannot be removed is left too (a
    cache shared read-only)."""
    cutoff = (time.time() if now is None else now) - days * 86400.0
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith(prefix) or entry == keep:
            continue
        base = name.removesuffix(".lock").removesuffix(".failed")
        if base != name and (root / base).is_dir():
            continue  # the folder's records go with the folder
        try:
            if entry.stat().st_mtime >= cutoff or base == keep.name:
                continue
        except OSError:
            continue
        if entry.is_dir():
            remove_folder(entry)
            if entry.exists():
                continue
            removed.append(entry)
            records = (lock_file(entry), failed_marker(entry))
        elif name.endswith(".failed"):
            records = (entry, lock_file(entry.with_name(base)))
        elif name.endswith(".lock"):
            records = (entry,)
        else:
            continue
        for record in records:
            with suppress(OSError):
                record.unlink()
    return removed


def remove_folder(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (``fcntl.flock``) while the block runs; no lock where
    there is no ``fcntl``. The lock's modification time is renewed once it is held, so that ``prune`` never
    takes a lock in use for one left by a build that never finished."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with suppress(OSError):
            os.utime(path)
        yield
