"""The recorder's C++ part (``taps.cpp``): built once per machine, loaded when it is ready.

A Python hook on every registered tensor costs a trip through the interpreter per tensor and backward pass,
and a removable handle per registration; the gradient taps of ``taps.cpp`` do the same work in C++ and hand
the pass's gradients over in one call at its end. The module is compiled with ``torch.utils.cpp_extension``
(a C++ compiler and ``ninja``) for this torch, this Python and this source, into the cache folder of the
compiled kernels (``stats.backend.folder``'s parent), in a process of its own, one build at a time per
machine; a build that fails is recorded beside it (delete the ``.failed`` file to try again) and the
recorder keeps its Python hooks, which record the same rows. A build removes the folders of other keys
(another torch or Python) that no process loaded for ``backend.UNUSED_DAYS`` days.

Environment, ``COMGRA_NDBG_NATIVE``:

- ``auto`` (the default): a module built already is loaded on first use; a missing one is built by a
  process of its own, started then, which finishes even if the one that started it ends first, while the
  recorder goes on with its Python hooks and takes the module up once it is there.
- ``wait``: the first use builds a missing module and waits for it (what the test suite runs with).
- ``off``: never; the Python hooks only.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from contextlib import suppress
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from comgra_ndbg.stats import backend

__all__ = ["BUILD_TIMEOUT", "CHECK_SECONDS", "KERNEL_DTYPES", "build_error", "mode", "scalar", "taps_module", "warm_up"]

BUILD_TIMEOUT = 600.0
"""Seconds a build may take before it counts as failed (it takes 15-40 s)."""
CHECK_SECONDS = 2.0
"""While a background build runs, how often ``taps_module`` looks whether it is done."""
KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
"""The kernels' dtype of each dtype code the module's packing returns (``pack``, the packed takes)."""
_SOURCE = Path(__file__).resolve().with_name("taps.cpp")
_PREFIX = "native-"
_LOCK = threading.Lock()
_MODULE: list[ModuleType | None] = [None]
_STARTED: list[bool] = [False]
_ERROR: list[str | None] = [None]
_WAITING: list[float | None] = [None]  # while a background build runs: when to look for its module next


def mode() -> str:
    """``COMGRA_NDBG_NATIVE``: "auto", "wait" or "off" (anything else is an error)."""
    value = os.environ.get("COMGRA_NDBG_NATIVE", "auto").strip().lower() or "auto"
    if value not in ("auto", "wait", "off"):
        raise ValueError(f"COMGRA_NDBG_NATIVE={value!r} is not a mode: use auto, wait or off")
    return value


def taps_module() -> ModuleType | None:
    """The loaded module, or None while it is being built in the background, where it cannot be built, or
    with ``COMGRA_NDBG_NATIVE=off``. Cheap after the first call (the recorder asks at every registration
    until it has the module)."""
    module = _MODULE[0]
    if module is not None:
        return module
    if _STARTED[0]:
        waiting = _WAITING[0]
        if waiting is None or time.monotonic() < waiting:
            return None
        return _look()
    with _LOCK:
        if _STARTED[0]:
            return _MODULE[0]
        _STARTED[0] = True
        chosen = mode()
        if chosen == "off":
            return None
        where = _folder()
        if _module_file(where) is not None or chosen == "wait":
            _load(where)
        elif not backend.failed_marker(where).exists():
            _launch(where)
            _WAITING[0] = time.monotonic() + CHECK_SECONDS
        else:
            _load(where)  # (reports the recorded failure)
    return _MODULE[0]


def scalar(tensor: torch.Tensor) -> float | int | bool:
    """``tensor.item()``; a one-element host tensor of a floating dtype is read from its memory by the C++
    part, with no dispatched op (``item`` costs tens of µs when the dispatcher's tables are out of the
    caches, as they are between a model's passes: the recorder reads the loss at every step). ``item()``
    where the part is not loaded yet or cannot read the tensor.

    >>> scalar(torch.tensor([2.5])), scalar(torch.tensor(3))
    (2.5, 3)
    """
    module = _MODULE[0]
    read = None if module is None else module.scalar(tensor)
    return tensor.item() if read is None else read


def warm_up() -> ModuleType | None:
    """Build (once per machine) and load the module now, whatever ``COMGRA_NDBG_NATIVE`` says but ``off``;
    returns it, or None where it cannot be built (``build_error()`` says why)."""
    if mode() == "off":
        return None
    with _LOCK:
        _STARTED[0] = True
        _WAITING[0] = None
        if _MODULE[0] is None:
            _load(_folder())
    return _MODULE[0]


def _look() -> ModuleType | None:
    """While a background build runs: load its module once it is there, give up once it failed."""
    with _LOCK:
        if _MODULE[0] is not None or _WAITING[0] is None:
            return _MODULE[0]
        where = _folder()
        if _module_file(where) is not None or backend.failed_marker(where).exists():
            _WAITING[0] = None
            _load(where)
        else:
            _WAITING[0] = time.monotonic() + CHECK_SECONDS
    return _MODULE[0]


def _launch(where: Path) -> None:
    """Start the build of ``where`` in a process of its own, which finishes it even if this one ends first
    (``python -m comgra_ndbg.recorder.native.build``; it waits for a build already running)."""
    environment = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (root, environment.get("PYTHONPATH")) if p)
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        subprocess.Popen([sys.executable, "-m", "comgra_ndbg.recorder.native.build"], env=environment,
                         cwd=where.parent, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as error:
        _ERROR[0] = f"{type(error).__name__}: {error}"
        _WAITING[0] = None


def build_error() -> str | None:
    """Why the module could not be built or loaded in this process, if it could not."""
    return _ERROR[0]


def _folder() -> Path:
    digest = hashlib.sha256(_SOURCE.read_bytes())
    for part in (torch.__version__, sys.version, sys.platform, str(torch._C._GLIBCXX_USE_CXX11_ABI)):
        digest.update(b"\0" + part.encode())
    return backend.folder().parent / f"{_PREFIX}{digest.hexdigest()[:24]}"


def _name(where: Path) -> str:
    return "comgra_ndbg_taps_" + where.name.removeprefix(_PREFIX)[:12]


def _module_file(where: Path) -> Path | None:
    return _module_file_in(where, _name(where)) if where.is_dir() else None


def _load(where: Path) -> None:
    """Build the module for ``where`` if it is missing, then import it into ``_MODULE``; a failure leaves
    ``_MODULE`` None, keeps why in ``_ERROR`` and warns once."""
    try:
        if _module_file(where) is None:
            _build(where)
        path = _module_file(where)
        if path is None:
            raise backend.BuildError(f"the build left no module in {where}")
        spec = importlib.util.spec_from_file_location(_name(where), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODULE[0] = module
        with suppress(OSError):  # marks the folder as used (``backend.prune``); a read-only cache keeps its time
            os.utime(where)
    except Exception as error:  # noqa: BLE001 - any failure means: the Python hooks
        _ERROR[0] = f"{type(error).__name__}: {error}"
        warnings.warn(f"the recorder keeps its Python gradient hooks: its C++ taps could not be built or loaded "
                      f"({_ERROR[0]})", RuntimeWarning, stacklevel=2)


def _build(where: Path) -> None:
    """Compile into ``where`` in a process of its own, one builder at a time; a failure is recorded beside
    ``where`` before the lock is let go, so the processes waiting for it do not each try again."""
    where.parent.mkdir(parents=True, exist_ok=True)
    failed = backend.failed_marker(where)
    with backend.exclusive(backend.lock_file(where)):
        if _module_file(where) is not None:
            return
        if failed.exists():
            raise backend.BuildError(f"an earlier build failed ({failed}): {failed.read_text().strip()}")
        for left in where.parent.glob(f".{where.name}-*"):  # a build whose process ended before it did
            backend.remove_folder(left)
        scratch = Path(tempfile.mkdtemp(dir=where.parent, prefix=f".{where.name}-"))
        try:
            _compile(scratch, _name(where))
            scratch.chmod(0o755)
            os.replace(scratch, where)
            backend.prune(where.parent, keep=where, prefix=_PREFIX)
        except backend.BuildError as error:
            with suppress(OSError):
                failed.write_text(f"{error}\n")
            raise
        finally:
            backend.remove_folder(scratch)


def _compile(scratch: Path, name: str) -> None:
    code = ("import sys, warnings; warnings.simplefilter('ignore'); from torch.utils.cpp_extension import load; "
            "load(sys.argv[1], [sys.argv[2]], build_directory=sys.argv[3], extra_cflags=['-O2'], verbose=False)")
    environment = dict(os.environ)
    places = [str(Path(sys.executable).parent)]  # the virtual environment's ``ninja`` (the package's script)
    with suppress(ImportError):
        import ninja

        places.append(ninja.BIN_DIR)
    environment["PATH"] = os.pathsep.join(places + [environment.get("PATH", "")])
    try:
        done = subprocess.run([sys.executable, "-c", code, name, str(_SOURCE), str(scratch)], capture_output=True,
                              text=True, timeout=BUILD_TIMEOUT, env=environment)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise backend.BuildError(f"the build did not finish: {error}") from error
    if done.returncode != 0 or _module_file_in(scratch, name) is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise backend.BuildError(f"the build exited with {done.returncode}: " + " | ".join(tail))


def _module_file_in(folder: Path, name: str) -> Path | None:
    found = sorted(folder.glob(f"{name}*.so")) + sorted(folder.glob(f"{name}*.pyd"))
    return found[0] if found else None
