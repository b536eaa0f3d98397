"""Memory of merging segment files: peak resident-set growth of ``close()`` and of the background merges, with
the size cap of merged files (``max_file_bytes``, default 256 MiB) and without it (``max_file_bytes=None``).

A synthetic recording of ``--megabytes`` of array bytes is written fast through the ``Recorder`` API: one
tensor of ``--elements`` float32 values (a fresh normal sample each step) with a snapshot of every element
at every step and no byte budget, flushed every ``--flush-every`` steps. Each variant runs in a fresh
subprocess, in rounds with the order rotated, and reports:

- ``close``: the peak RSS during ``close()`` minus the RSS just before it (``VmHWM`` reset through
  ``/proc/self/clear_refs`` where the kernel allows it, else a sampling thread), and its wall time;
- ``merges``: the peak RSS while recording (the background merges of full levels) minus the RSS after the
  recorder was set up;
- the files the recording closed into and their bytes on disk.

The recording is written to a temporary folder and deleted afterwards; ``--megabytes`` at most about a
fifth of the free disk. Run: ``python benchmarks/merge_memory.py [--megabytes 600] [--rounds 2]``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MIB = 2**20
VARIANTS = {"cap 256 MiB": "default", "no cap": "none"}


class PeakRss:
    """The peak resident bytes of this process since :meth:`reset`: the kernel's ``VmHWM`` after clearing it,
    or, where clearing is not allowed, the largest ``VmRSS`` a thread samples every millisecond."""

    def __init__(self) -> None:
        self._sampled = 0
        self._running = False
        self._thread: threading.Thread | None = None
        self.kernel = True

    def reset(self) -> None:
        self.stop()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.kernel = True
        except OSError:
            self.kernel = False
            self._sampled = current_rss()
            self._running = True
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        while self._running:
            self._sampled = max(self._sampled, current_rss())
            time.sleep(0.001)

    def stop(self) -> None:
        self._running = False
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def peak(self) -> int:
        if self.kernel:
            return _status("VmHWM")
        self.stop()
        return max(self._sampled, current_rss())


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def current_rss() -> int:
    return _status("VmRSS")


def child(variant: str, megabytes: int, elements: int, flush_every: int) -> None:
    """Record, close, and print one JSON line of what was measured."""
    import torch

    from comgra_ndbg import Recorder

    cap = None if variant == "none" else (256 * MIB if variant == "default" else int(variant))
    steps = max(1, megabytes * MIB // (elements * 4))
    folder = Path(tempfile.mkdtemp(prefix="merge-memory-"))
    try:
        torch.manual_seed(0)
        rec = Recorder(folder, "t", summaries=1, snapshots=1, max_elements=elements, num_samples=16,
                       byte_budget=None, flush_every_steps=flush_every, flush_every_seconds=1e9,
                       max_file_bytes=cap)
        peak = PeakRss()
        setup = current_rss()
        peak.reset()
        started = time.perf_counter()
        for step in range(steps):
            with rec.step(step):
                rec.register_tensor("big", torch.randn(16, elements // 16))
                rec.record_kpi("loss", float(step))
        rec._writer.wait_for_merges()
        merges = peak.peak() - setup
        recorded = time.perf_counter() - started
        before = current_rss()
        peak.reset()
        started = time.perf_counter()
        rec.close()
        closing = time.perf_counter() - started
        growth = peak.peak() - before
        peak.stop()
        files = sorted((folder / "t").iterdir())
        from comgra_ndbg import open_recording

        with open_recording(folder / "t") as recording:
            assert recording.is_complete and len(recording.steps) == steps
        print(json.dumps({"close_growth": growth, "close_s": closing, "merge_growth": merges, "record_s": recorded,
                          "steps": steps, "files": [p.name for p in files],
                          "disk": sum(p.stat().st_size for p in files), "kernel_peak": peak.kernel}))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=600, help="array bytes of the recording, in MiB")
    parser.add_argument("--elements", type=int, default=2**20, help="elements of the recorded tensor")
    parser.add_argument("--flush-every", type=int, default=8, help="steps per flushed segment")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.megabytes, args.elements, args.flush_every)
        return
    free = shutil.disk_usage(tempfile.gettempdir()).free
    if args.megabytes * MIB * 5 > free:
        raise SystemExit(f"{args.megabytes} MiB needs about {5 * args.megabytes} MiB of free disk in "
                         f"{tempfile.gettempdir()}; {free // MIB} MiB are free: pass a smaller --megabytes")
    print(f"recording of {args.megabytes} MiB of array bytes ({args.elements} float32 elements per step, a "
          f"segment every {args.flush_every} steps); load {os.getloadavg()[0]:.2f}")
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for round_index in range(args.rounds):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for name in order:
            out = subprocess.run([sys.executable, __file__, "--child", VARIANTS[name], "--megabytes",
                                  str(args.megabytes), "--elements", str(args.elements), "--flush-every",
                                  str(args.flush_every)], check=True, capture_output=True, text=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            results[name].append(result)
            print(f"  round {round_index + 1} {name:12s} close +{result['close_growth'] / MIB:7.0f} MiB "
                  f"({result['close_s']:.1f} s), merges while recording +{result['merge_growth'] / MIB:6.0f} MiB, "
                  f"{len(result['files'])} file(s), {result['disk'] / MIB:.0f} MiB on disk")
    print(f"median over {args.rounds} round(s); load {os.getloadavg()[0]:.2f}")
    print(f"  {'':12s} {'close() RSS growth':>20s} {'close() time':>13s} {'merges RSS growth':>18s} {'files':>6s}")
    for name in names:
        rows = results[name]
        print(f"  {name:12s} {statistics.median(r['close_growth'] for r in rows) / MIB:16.0f} MiB "
              f"{statistics.median(r['close_s'] for r in rows):11.1f} s "
              f"{statistics.median(r['merge_growth'] for r in rows) / MIB:14.0f} MiB "
              f"{len(rows[0]['files']):6d}")
    capped, uncapped = (statistics.median(r["close_growth"] for r in results[n]) for n in names)
    print(f"  close() peak RSS growth, capped / uncapped: {capped / max(uncapped, 1):.2f}")


if __name__ == "__main__":
    main()
