"""Time reading one statistic's timeline of a 10k-step recording: ``open_recording(path).summary(node, "value",
"mean")``. The target is 50 ms.

The recording is made with the store writer directly (the recorder would spend most of a minute on 10k
training steps): 50 series (10 parameters with value, grad and update, 20 activations with value) summarized
at every step, the last 5 of every 10th step in two iterations, so the file has the layout a real run gives
(``summary/data`` of 50 x 17 x 11k float64 rows in 4096-row chunks, gzip level 1 + shuffle). No snapshots: a
timeline read never touches the snapshot pools. Segments are flushed every 100 steps (100 flushes, merged
with fanout 8, as the recorder's time-based flush would do), then ``close()`` consolidates ``recording.h5``.

Measured, each as the median of several runs:
- cold: a fresh process (imports not timed) opens the group folder and reads the timeline, once;
- reopen: ``open_recording`` + ``summary`` again in a process that has read the file before;
- warm: ``summary`` on an open ``Recording`` (the GUI's case);
- live: the same three on the directory of segments before ``close()``.

Run: ``python benchmarks/read_timeline.py [--steps 10000] [--series 50]``.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from comgra_ndbg import open_recording
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog, TensorInfo
from comgra_ndbg.store.writer import RecordingWriter

TARGET_S = 0.050
FLUSH_EVERY = 100
NODE = "act07"

COLD = """
import sys, time
from comgra_ndbg import open_recording
start = time.perf_counter()
with open_recording(sys.argv[1]) as rec:
    steps, values = rec.summary(sys.argv[2], "value", "mean")
print(time.perf_counter() - start, len(steps))
"""


def make_catalog(num_series: int) -> Catalog:
    catalog = Catalog()
    parameters = max(1, num_series // 5)
    for i in range(parameters):
        tid = catalog.add_tensor(TensorInfo(f"layer{i:02d}.weight", f"layer{i:02d}", "parameter", dtype="float32",
                                            shape=(256, 256)))
        for kind in (schema.KIND_VALUE, schema.KIND_GRAD, schema.KIND_UPDATE):
            catalog.series_id(tid, kind)
    for i in range(num_series - len(catalog.series)):
        tid = catalog.add_tensor(TensorInfo(f"act{i:02d}", f"act{i:02d}", "intermediate", dtype="float32",
                                            shape=(64, 256), batched=True, bounds=(-1.0, 1.0)))
        catalog.series_id(tid, schema.KIND_VALUE)
    catalog.step_type_id("train")
    catalog.kpi_id("loss")
    return catalog


def summary_rows(rng: np.random.Generator, num_series: int, step: int) -> np.ndarray:
    """Plausible sufficient statistics of 64 x 256 tensors whose scale drifts slowly."""
    count = 64 * 256
    scale = 1.0 + 0.5 * np.sin(step / 500 + np.arange(num_series))
    mean = rng.normal(0.0, 0.1, num_series) * scale
    std = scale * rng.uniform(0.5, 1.5, num_series)
    rows = np.zeros((num_series, schema.NUM_FIELDS))
    f = schema.FIELD
    rows[:, f["count"]] = count
    rows[:, f["zeros"]] = rng.integers(0, 50, num_series)
    rows[:, f["sum"]] = mean * count
    rows[:, f["sum_sq"]] = (std ** 2 + mean ** 2) * count
    rows[:, f["sum_abs"]] = std * 0.8 * count
    rows[:, f["min"]] = mean - 4 * std
    rows[:, f["max"]] = mean + 4 * std
    rows[:, f["units"]] = 256
    rows[:, f["bounded"]] = count
    rows[:, f["saturated"]] = rng.integers(0, 100, num_series)
    return rows


def make_recording(folder: Path, steps: int, num_series: int) -> tuple[Catalog, RecordingWriter, float]:
    rng = np.random.default_rng(0)
    catalog = make_catalog(num_series)
    writer = RecordingWriter(folder / "trial", "trial")
    series = np.arange(num_series)
    activations = series[-5:]
    start = time.perf_counter()
    for step in range(steps):
        two = step % 10 == 0
        writer.add_step(step, 0, 2 if two else 1, schema.FLAG_SUMMARY, "every step")
        writer.add_summaries(step, 0, series, summary_rows(rng, num_series, step))
        if two:
            writer.add_summaries(step, 1, activations, summary_rows(rng, num_series, step)[-5:])
        writer.add_kpi(step, 0, float(np.exp(-step / 3000)), 0)
        if (step + 1) % FLUSH_EVERY == 0:
            writer.flush(catalog)
    writer.flush(catalog)
    return catalog, writer, time.perf_counter() - start


def cold(path: Path, runs: int) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", COLD, str(path), NODE], capture_output=True, text=True,
                             check=True)
        seconds, rows = out.stdout.split()
        times.append(float(seconds))
    return statistics.median(times), int(rows)


def reopen(path: Path, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        with open_recording(path) as rec:
            rec.summary(NODE, "value", "mean")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def warm(path: Path, runs: int) -> tuple[float, int]:
    with open_recording(path) as rec:
        rec.summary(NODE, "value", "mean")
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            steps, _ = rec.summary(NODE, "value", "mean")
            times.append(time.perf_counter() - start)
        return statistics.median(times), len(rec.files)


def report(label: str, seconds: float) -> None:
    verdict = "ok" if seconds <= TARGET_S else "OVER TARGET"
    print(f"  {label:<34} {seconds * 1000:9.2f} ms   {seconds / TARGET_S:6.3f} x target   {verdict}")


def measure(title: str, path: Path, cold_runs: int, warm_runs: int) -> None:
    cold_s, rows = cold(path, cold_runs)
    warm_s, files = warm(path, warm_runs)
    print(f"{title}: {files} file(s), timeline of {rows} steps")
    report(f"cold (fresh process, median of {cold_runs})", cold_s)
    report(f"reopen (median of {warm_runs})", reopen(path, warm_runs))
    report(f"warm summary() (median of {warm_runs})", warm_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--series", type=int, default=50)
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--warm-runs", type=int, default=25)
    args = parser.parse_args()
    total = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        catalog, writer, write_s = make_recording(folder, args.steps, args.series)
        print(f"recording: {args.steps} steps x {args.series} series, written in {write_s:.1f} s "
              f"(writer, flush every {FLUSH_EVERY} steps, target {TARGET_S * 1000:.0f} ms per timeline read)")
        measure("live, before close()", folder, args.cold_runs, args.warm_runs)
        start = time.perf_counter()
        final = writer.close(catalog)
        print(f"close() consolidated in {time.perf_counter() - start:.2f} s: {final.name} is "
              f"{final.stat().st_size / 2**20:.2f} MiB")
        measure("closed, recording.h5", folder, args.cold_runs, args.warm_runs)
    print(f"total benchmark time {time.perf_counter() - total:.1f} s")


if __name__ == "__main__":
    main()
