"""Crash safety and live reading, with real processes.

A small script written to ``tmp_path`` runs as a subprocess; it imports torch and comgra_ndbg once and then
forks one recording process per request (forking saves the second and a half that importing torch costs each
process, which keeps this file fast). Each recording process drives the real ``Recorder`` on a tiny MLP and
prints ``flushed <step>`` after every flush. The test kills such processes with SIGKILL (right after a line,
after a random delay, during ``close()``) and checks that every step reported as flushed is readable, exactly
once, with the right values. The live test reads a recording from this process while another one writes it.
"""
from __future__ import annotations

import itertools
import json
import contextlib
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from comgra_ndbg import Recorder, RecordingNotFoundError, check, open_recording
from comgra_ndbg.stats.statistics import STATISTICS
from comgra_ndbg.store import schema

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs POSIX fork and signals")

BATCH, FEATURES = 4, 3
SNAPSHOT_EVERY = 7
LINE_TIMEOUT = 20.0

# The input at step s is exactly representable in float32, so its statistics are known exactly.
SCRIPT = r"""
import json, os, sys, tempfile, time, traceback
import torch
from comgra_ndbg import Recorder


def record(ident, folder, close_at, total, sleep, flush_every, quiet=False):
    def say(text):  # one write(2) per line, so lines of concurrent processes never interleave
        if not quiet:
            os.write(1, f"{ident} {text}\n".encode())

    say(f"pid {os.getpid()}")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(folder, trial="run", summaries=1, snapshots=7, flush_every_steps=flush_every,
                   flush_every_seconds=1e9)
    rec.track_module("model", model)
    step = 0
    while total < 0 or step < total:
        with rec.step(step, "odd" if step % 2 else "even"):
            x = (torch.arange(12, dtype=torch.float32).reshape(4, 3) - 3.0) * (1 + step % 13) / 8
            x = rec.register_tensor("x", x, role="input")
            y = rec.register_tensor("y", model(x), role="output")
            loss = rec.register_tensor("loss", y.pow(2).mean(), role="loss")
            opt.zero_grad()
            loss.backward()
            rec.record_gradients()
            opt.step()
            rec.record_kpi("step", float(step))
            rec.record_kpi("loss", loss)
        if (step + 1) % flush_every == 0:
            rec.flush()
            say(f"flushed {step}")
        if step == close_at:
            say("closing")
            rec.close()
            say("closed")
            time.sleep(60)
        time.sleep(sleep)
        step += 1
    rec.close()
    say("done")


# Torch initialises its operators lazily (about a second): do it once here, not in every forked process.
torch.set_num_threads(1)
with tempfile.TemporaryDirectory() as warm_up:
    record(-1, warm_up, close_at=-1, total=10, sleep=0.0, flush_every=5, quiet=True)
children = {}
for line in sys.stdin:
    request = json.loads(line)
    if request["do"] == "start":
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                record(request["id"], **request["args"])
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        children[request["id"]] = pid
    else:
        _, status = os.waitpid(children.pop(request["id"]), 0)
        os.write(1, f"{request['id']} status {os.waitstatus_to_exitcode(status)}\n".encode())
"""


def expected_input(step: int) -> np.ndarray:
    return (np.arange(12, dtype=np.float64).reshape(BATCH, FEATURES) - 3.0) * (1 + step % 13) / 8


class Child:
    """One recording process: its pid and the lines it printed, in order."""

    def __init__(self, forker: Forker, ident: int, lines: queue.Queue) -> None:
        self.forker, self.ident, self._lines = forker, ident, lines
        self.seen: list[str] = []
        self.pid = int(self.next_line().split()[1])
        forker.unreaped.add(self.pid)

    def next_line(self, timeout: float = LINE_TIMEOUT) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"recording process {self.ident} printed nothing for {timeout} s; stderr: "
                        f"{self.forker.stderr_tail()}")
        self.seen.append(line)
        return line

    def drain(self) -> list[str]:
        while True:
            try:
                self.seen.append(self._lines.get_nowait())
            except queue.Empty:
                return self.seen

    def exit_code(self) -> int:
        self.forker.send({"do": "wait", "id": self.ident})
        while not (line := self.next_line()).startswith("status "):
            pass
        self.forker.unreaped.discard(self.pid)
        return int(line.split()[1])

    def last_flushed(self) -> int:
        flushed = [int(line.split()[1]) for line in self.seen if line.startswith("flushed")]
        assert flushed, self.seen
        return max(flushed)


class Forker:
    """The subprocess that forks recording processes; one thread hands each its own lines."""

    def __init__(self, script: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.queues: dict[int, queue.Queue] = {}
        self.ids = itertools.count()
        self.stderr: list[str] = []
        self.unreaped: set[int] = set()
        threading.Thread(target=self._route, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _route(self) -> None:
        for line in self.proc.stdout:
            ident, _, text = line.strip().partition(" ")
            if ident.isdigit() and int(ident) in self.queues:
                self.queues[int(ident)].put(text)
            else:  # a library printing to stdout: keep it for the failure message
                self.stderr.append(line)

    def stderr_tail(self) -> str:
        return "".join(self.stderr[-20:])

    def send(self, request: dict) -> None:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def start(self, folder: Path, *, close_at: int = -1, total: int = -1, sleep: float = 0.0,
              flush_every: int = 5) -> Child:
        ident = next(self.ids)
        self.queues[ident] = queue.Queue()
        self.send({"do": "start", "id": ident, "args": dict(folder=str(folder), close_at=close_at, total=total,
                                                            sleep=sleep, flush_every=flush_every)})
        return Child(self, ident, self.queues[ident])

    def stop(self) -> None:
        for pid in self.unreaped:  # recording processes a failed test left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.stdin.close()
        self.proc.kill()  # it holds nothing worth a clean exit, and unloading torch takes seconds
        self.proc.wait()


@pytest.fixture(scope="module")
def forker(tmp_path_factory):
    script = tmp_path_factory.mktemp("forker") / "forker.py"
    script.write_text(SCRIPT)
    forker = Forker(script)
    yield forker
    forker.stop()


def _kill_after(child: Child, *, flushes: int, delay: float, text: str = "") -> threading.Thread:
    """Kill ``child`` ``delay`` s after its ``flushes``-th flush line (or after the line ``text``)."""

    def run() -> None:
        count = 0
        try:
            while True:
                line = child.next_line()
                count += line.startswith("flushed")
                if line == text or (not text and count >= flushes):
                    break
            time.sleep(delay)
        finally:
            os.kill(child.pid, signal.SIGKILL)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _check_recording(trial_dir: Path, last_flushed: int) -> int:
    """Everything a killed writer must leave behind; returns how many steps are readable."""
    names = sorted(os.listdir(trial_dir))
    for name in names:
        if name.endswith(schema.SEGMENT_SUFFIX):  # every file under a final name is complete and opens
            with h5py.File(trial_dir / name, "r") as f:
                assert f.attrs[schema.ATTR_FORMAT] == schema.FORMAT_NAME, name
                assert f[schema.STEPS_STEP].shape[0] > 0, name
    # a leftover of an interrupted write, made certain here: the reader must not look at it
    (trial_dir / ("seg-99999999-L0.h5" + schema.TEMP_SUFFIX)).write_bytes(b"\x89HDF\r\n\x1a\n cut short")

    with open_recording(trial_dir.parent) as rec:
        steps = rec.steps
        n = len(steps)
        assert n >= last_flushed + 1, (n, last_flushed, names)
        np.testing.assert_array_equal(steps, np.arange(n))  # every flushed step exactly once, in order
        assert rec.step_types == ["even", "odd"]
        np.testing.assert_array_equal(rec.steps_of_type("odd"), np.arange(1, n, 2))
        kpi_steps, kpi_values = rec.kpi("step")
        np.testing.assert_array_equal(kpi_steps, np.arange(n))
        np.testing.assert_array_equal(kpi_values, np.arange(n, dtype=np.float64))
        assert np.isfinite(rec.kpi("loss")[1]).all()

        inputs = np.stack([expected_input(s) for s in range(n)])
        for stat, expected in [("mean", inputs.mean(axis=(1, 2))), ("min", inputs.min(axis=(1, 2))),
                               ("max", inputs.max(axis=(1, 2))), ("std", inputs.std(axis=(1, 2))),
                               ("count", np.full(n, BATCH * FEATURES))]:
            got_steps, got = rec.summary("x", "value", stat)
            np.testing.assert_array_equal(got_steps, np.arange(n))
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-9, err_msg=stat)
        for tensor in rec.tensors:
            for kind in rec.kinds(tensor.name):
                got_steps, rows = rec.summary_rows(tensor.name, kind)
                np.testing.assert_array_equal(got_steps, np.arange(n), err_msg=f"{tensor.name} {kind}")
                for stat in ("mean", "std", "abs_max", "l2", "min", "max"):
                    assert np.isfinite(STATISTICS[stat](rows)).all(), (tensor.name, kind, stat)
        np.testing.assert_array_equal(rec.snapshot_steps("x"), np.arange(0, n, SNAPSHOT_EVERY))
        for step in range(0, n, SNAPSHOT_EVERY):
            np.testing.assert_array_equal(rec.snapshot(step, "x").dense(), expected_input(step).astype(np.float32))
        assert all(p.name.endswith(schema.SEGMENT_SUFFIX) for p in rec.files)
        assert rec.state in ("killed", "finished")  # the kernel dropped the dead writer's lock
    report = check(trial_dir)  # every chunk of every file passes its checksum; nothing is missing
    assert report.ok, str(report)
    return n


def test_sigkill_at_any_moment_leaves_every_flushed_step_readable(forker, tmp_path):
    """Kills after 2 to 15 flushes, right after a line or after a random delay that lands in the next steps,
    flush or merge (every 8th flush merges level 0 into level 1: a delay of 0.03-0.3 s after the 7th line
    interrupts that merge's write about one time in eight, and its deletion of the inputs one time in twenty);
    and once while ``close()`` consolidates. ``test_store_segments`` builds each of those states by hand."""
    rng = random.Random(20240611)
    scenarios = [(2, 0.0), (6, 0.0), (7, rng.uniform(0.0, 0.3)), (7, rng.uniform(0.0, 0.3)),
                 (9, rng.uniform(0.0, 0.3)), (15, rng.uniform(0.0, 0.3))]
    runs = []
    for i, (flushes, delay) in enumerate(scenarios):
        child = forker.start(tmp_path / f"kill{i}")
        runs.append((tmp_path / f"kill{i}", flushes, child, _kill_after(child, flushes=flushes, delay=delay)))
    closing = forker.start(tmp_path / "closing", close_at=44)
    runs.append((tmp_path / "closing", 9, closing, _kill_after(closing, flushes=0, delay=rng.uniform(0, 0.12),
                                                               text="closing")))
    for folder, flushes, child, thread in runs:
        thread.join(LINE_TIMEOUT * 2)
        assert not thread.is_alive()
        assert child.exit_code() == -signal.SIGKILL, forker.stderr_tail()
        last = child.last_flushed()  # lines printed before the kill all follow a completed flush
        assert last >= 5 * flushes - 1, child.seen[-3:]
        n = _check_recording(folder / "run", last)
        if "closed" in child.seen:
            assert n == 45
            with open_recording(folder) as rec:
                assert rec.is_complete
    folder, _, _, _ = runs[0]  # a killed trial is continued after its last flushed step
    with open_recording(folder) as before:
        last = int(before.steps[-1])
    with Recorder(folder, trial="run", mode="a") as rec:
        assert rec.resume_after == last
        for step in range(last - 2, last + 3):
            with rec.step(step, "odd" if step % 2 else "even"):
                rec.register_tensor("x", torch.ones(BATCH, FEATURES), role="input")
    with open_recording(folder) as after:
        assert after.is_complete and after.steps.tolist() == list(range(last + 3))


def test_a_reader_in_another_process_sees_a_growing_recording(forker, tmp_path):
    total = 30  # 15 flushes: the reader also follows the merge at the 8th
    child = forker.start(tmp_path, total=total, sleep=0.01, flush_every=2)
    deadline = time.monotonic() + LINE_TIMEOUT
    rec = None
    while rec is None:
        assert time.monotonic() < deadline, forker.stderr_tail()
        try:
            rec = open_recording(tmp_path)
        except RecordingNotFoundError:
            time.sleep(0.005)
    counts, seen_means = [], {}
    while True:
        finished = "done" in child.drain()
        rec.refresh()
        steps = rec.steps
        np.testing.assert_array_equal(steps, np.arange(len(steps)))
        assert not counts or len(steps) >= counts[-1], (len(steps), counts[-1])
        counts.append(len(steps))
        mean_steps, means = rec.summary("model.0", "value", "mean", tensor="weight")
        seen_means.update(zip(mean_steps.tolist(), means.tolist()))
        if finished:
            break
        assert time.monotonic() < deadline, (forker.stderr_tail(), counts[-5:])
        time.sleep(0.01)
    assert child.exit_code() == 0, forker.stderr_tail()
    assert rec.is_complete and counts[-1] == total
    assert len(set(counts)) >= 5, counts  # the reader saw the recording at several sizes
    rec.close()
    with open_recording(tmp_path) as after:
        final_steps, final_means = after.summary("model.0", "value", "mean", tensor="weight")
        np.testing.assert_array_equal(final_steps, np.arange(total))
        assert seen_means == dict(zip(final_steps.tolist(), final_means.tolist()))
        assert [p.name for p in after.files] == [schema.FINAL_NAME]
