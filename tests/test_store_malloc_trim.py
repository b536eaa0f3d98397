"""Trimming the malloc arenas after background writes and merges: the freed memory of a worker thread's arena
goes back to the system, and the writer trims after each background write and each background merge."""
from __future__ import annotations

import ctypes.util
import sys
import threading

import numpy as np
import pytest

from comgra_ndbg.store import merger as merger_module
from comgra_ndbg.store import schema
from comgra_ndbg.store import writer as writer_module
from comgra_ndbg.store.catalog import Catalog, TensorInfo
from comgra_ndbg.store.malloc_trim import trim
from comgra_ndbg.store.writer import RecordingWriter

GLIBC = sys.platform.startswith("linux") and "musl" not in (ctypes.util.find_library("c") or "")


def _rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_what_a_worker_thread_freed_goes_back_to_the_system():
    """64 KiB arrays (below glibc's mmap threshold: on the thread's heap), all freed but the last, which keeps
    the heap from shrinking at its top: their pages stay with the process until trimmed."""
    kept = []

    def allocate() -> None:
        arrays = [np.ones(8192) for _ in range(600)]  # 600 × 64 KiB, every page written
        kept.append(arrays[-1])
        del arrays

    thread = threading.Thread(target=allocate)
    thread.start()
    thread.join()
    before = _rss()
    assert trim()
    assert before - _rss() > 16 * 2**20, (before, _rss())


def test_the_writer_trims_after_each_background_write_and_merge(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(writer_module, "trim", lambda: calls.append(("write", threading.current_thread().name)))
    monkeypatch.setattr(merger_module, "trim", lambda: calls.append(("merge", threading.current_thread().name)))
    catalog = Catalog()
    catalog.series_id(catalog.add_tensor(TensorInfo(name="t", node="t", role="intermediate", dtype="float32",
                                                    shape=(4,), batched=False)), schema.KIND_VALUE)
    writer = RecordingWriter(tmp_path / "trial", "trial", fanout=2)
    for step in range(2):
        writer.add_step(step, 0, 1, 0, "")
        writer.flush(catalog, wait=False)
    writer._settle()
    writer.wait_for_merges()
    writer.close(catalog)
    assert sorted(calls) == [("merge", "comgra-ndbg-merge"), ("write", "comgra-ndbg-write"),
                             ("write", "comgra-ndbg-write")]
