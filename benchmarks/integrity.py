"""Integrity figures for the README: crash trials, fuzz cases and byte flips, each with its outcome counted.

1. **Crash trials**: a recording process (forked from this one, so torch is imported once) trains a tiny MLP
   with a flush every 5 steps and reports each finished step; it is killed with SIGKILL after a random delay
   (in a step, a flush, a merge every 40 steps, or ``close()``). Then the recording must open, pass
   ``check`` (every chunk against its checksum), hold steps 0..n exactly once, and lose at most one flush
   interval (5 steps) of the steps the process had finished. The flushes here wait for their write, as
   ``Recorder.flush()`` does; the periodic ones (``flush_every_seconds``) write in the background, where a
   kill during that write (milliseconds, against a 5 s interval) also loses the rows it was writing.
2. **Fuzz cases**: call sequences from ``tests/fuzz_calls.py`` (every public call, any argument, any order),
   each played against a real recorder: calls made, typed errors, crashes of the training loop, silent
   losses, documented skips (rows of the problems log).
3. **Byte flips**: one byte inverted at evenly spread places of a recording file; every read must return
   the original data or raise a typed error.

Run: ``python benchmarks/integrity.py [--trials 50] [--fuzz 2000] [--flips 400]``.
"""
from __future__ import annotations

import argparse
import os
import random
import select
import shutil
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

FLUSH_EVERY = 5


def _child(folder: Path, write_fd: int, steps: int) -> None:
    from comgra_ndbg import Recorder

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(folder, trial="run", summaries=1, snapshots=7, flush_every_seconds=1e9)
    rec.track_module("model", model)
    for step in range(steps):
        with rec.step(step):
            x = rec.register_tensor("x", torch.full((4, 3), float(step)), role="input")
            loss = rec.register_tensor("loss", model(x).pow(2).mean(), role="loss")
            optimizer.zero_grad()
            loss.backward()
            rec.record_gradients()
            optimizer.step()
            rec.record_kpi("loss", loss)
        if (step + 1) % FLUSH_EVERY == 0:
            rec.flush()  # on disk when it returns (periodic flushes write in the background: see the docstring)
        os.write(write_fd, f"{step}\n".encode())
    rec.close()
    os.write(write_fd, b"closed\n")


def crash_trials(count: int, seed: int) -> dict:
    """Kill ``count`` recording processes at random moments; returns the counts the README reports."""
    from comgra_ndbg import ComgraError, RecordingNotFoundError, check, open_recording

    rng = random.Random(seed)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as warm_up:  # numba and torch set up once, before the forks
        sink = os.open(os.devnull, os.O_WRONLY)
        _child(Path(warm_up), sink, 12)
        os.close(sink)
    result = {"trials": 0, "unreadable": 0, "damaged": 0, "max_lost_steps": 0, "killed_in_close": 0}
    with tempfile.TemporaryDirectory() as root:
        for trial in range(count):
            folder = Path(root) / str(trial)
            steps = rng.choice([40, 60, 200])  # 40 and 60: a kill may land in close()
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:  # the recording process
                os.close(read_fd)
                code = 0
                try:
                    _child(folder, write_fd, steps)
                except BaseException:  # noqa: BLE001 - reported through the exit code
                    code = 1
                os._exit(code)
            os.close(write_fd)
            deadline = time.monotonic() + rng.uniform(0.05, 1.5)
            seen = b""
            while time.monotonic() < deadline:
                ready, _, _ = select.select([read_fd], [], [], max(deadline - time.monotonic(), 0))
                if ready:
                    chunk = os.read(read_fd, 65536)
                    if not chunk:
                        break
                    seen += chunk
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            while chunk := os.read(read_fd, 65536):
                seen += chunk
            os.close(read_fd)
            lines = seen.decode().split()
            finished = [int(line) for line in lines if line.isdigit()]
            if not finished:  # killed before the first step: nothing to lose
                continue
            result["trials"] += 1
            result["killed_in_close"] += finished[-1] == steps - 1 and "closed" not in lines
            try:
                with open_recording(folder) as rec:
                    readable = rec.steps.tolist()
                ok = check(folder).ok
            except RecordingNotFoundError:  # killed before its first flush finished: nothing was on disk yet
                readable, ok = [], True
            except ComgraError as error:
                result["unreadable"] += 1
                print(f"  ! trial {trial}: {error}")
                continue
            result["damaged"] += not ok
            assert readable == list(range(len(readable))), readable
            result["max_lost_steps"] = max(result["max_lost_steps"], finished[-1] + 1 - len(readable))
    return result


def fuzz_cases(count: int, seed: int) -> dict:
    """Play ``count`` fuzzed call sequences; returns calls, typed errors, crashes, silent losses, skips."""
    from hypothesis import HealthCheck, given, settings

    from fuzz_calls import calls, run_case

    totals = {"cases": 0, "calls": 0, "typed_errors": 0, "unhelpful": 0, "crashes": 0, "silent_losses": 0,
              "skips": 0}
    examples: list[str] = []

    @settings(max_examples=count, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(calls())
    def play(ops: list[tuple]) -> None:
        outcome = run_case(ops)
        totals["cases"] += 1
        totals["calls"] += outcome.calls
        totals["typed_errors"] += outcome.typed_errors
        totals["crashes"] += len(outcome.crashes)
        totals["unhelpful"] += len(outcome.unhelpful)
        totals["silent_losses"] += len(outcome.silent_losses)
        totals["skips"] += outcome.skips
        examples.extend(outcome.crashes + outcome.unhelpful + outcome.silent_losses)

    random.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        play()
    for example in examples[:10]:
        print(f"  ! {example}")
    return totals


def byte_flips(count: int) -> dict:
    """Flip one byte at ``count`` evenly spread places of a finished recording and of a merged segment."""
    from comgra_ndbg import ComgraError
    from recording_faults import flip_byte, read_everything, record

    outcomes = {"flips": 0, "caught": 0, "harmless": 0, "silent": 0, "raw": 0}
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record(Path(root) / "final", steps=12)
        rec = record(Path(root) / "live", steps=16, flush_every=2, close=False, fanout=4)
        sources = [Path(root) / "final" / "t" / "recording.h5",
                   max((Path(root) / "live" / "t").glob("seg-*-L1.h5"))]
        for source in sources:
            expected = read_everything(source.parent)
            size = source.stat().st_size
            for k in range(count // len(sources)):
                target = Path(root) / "flip" / source.parent.name / source.name
                target.parent.mkdir(parents=True)
                for sibling in source.parent.iterdir():
                    if sibling.suffix == ".h5" and sibling != source:
                        shutil.copyfile(sibling, target.parent / sibling.name)
                shutil.copyfile(source, target)
                flip_byte(target, (k * size) // (count // len(sources)) + k % 7)
                outcomes["flips"] += 1
                try:
                    outcomes["harmless" if read_everything(target.parent) == expected else "silent"] += 1
                except ComgraError:
                    outcomes["caught"] += 1
                except Exception:  # noqa: BLE001 - counted: a raw exception is a defect
                    outcomes["raw"] += 1
                shutil.rmtree(Path(root) / "flip")
        rec._writer._lock.release(False)
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--fuzz", type=int, default=2000)
    parser.add_argument("--flips", type=int, default=400)
    parser.add_argument("--seed", type=int, default=20240611)
    args = parser.parse_args()
    started = time.perf_counter()
    crash = crash_trials(args.trials, args.seed)
    print(f"crash trials (SIGKILL at random moments, flush every {FLUSH_EVERY} steps): {crash['trials']} run "
          f"({crash['killed_in_close']} during close()), {crash['unreadable']} unreadable, {crash['damaged']} "
          f"failing check, max data lost {crash['max_lost_steps']} steps (<= 1 flush interval: "
          f"{crash['max_lost_steps'] <= FLUSH_EVERY})", flush=True)
    flips = byte_flips(args.flips)
    print(f"byte flips: {flips['flips']} ({flips['caught']} caught with a typed error, {flips['harmless']} in "
          f"unused bytes: data unchanged), {flips['silent']} silent, {flips['raw']} raw exceptions", flush=True)
    fuzz = fuzz_cases(args.fuzz, args.seed)
    print(f"fuzz: {fuzz['cases']} cases, {fuzz['calls']} calls, {fuzz['typed_errors']} typed errors "
          f"({fuzz['unhelpful']} not saying what to do), {fuzz['skips']} documented skips, {fuzz['crashes']} crashes "
          f"of the training loop, {fuzz['silent_losses']} silent losses", flush=True)
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
