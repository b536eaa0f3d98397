"""Benchmarks in lockstep: ``benchmarks/overhead.py``'s (the variants run one step each in turn, every order
of them in rotation, each step timed on its own, and every variant's loop run to its end, where a recorder
is closed; the recorded loop in it trains exactly as the bare one does) and ``benchmarks/lockstep.py``'s
processes (each variant in its own, all run to their end, a failure reported with the variant's name)."""
from __future__ import annotations

import multiprocessing
from collections import Counter

import pytest
import torch

from benchmarks import lockstep, overhead
from comgra_ndbg import Recorder, open_recording


def test_lockstep_takes_every_order_and_runs_every_loop_to_its_end() -> None:
    order, ended = [], []

    def loop(name: str, steps: int):
        def steps_of():
            for i in range(steps):
                order.append((name, i))
                yield
            ended.append(name)
        return steps_of

    times = overhead.lockstep(list(range(12)), {name: loop(name, 12) for name in "abc"})
    turns = ["".join(name for name, _ in order[3 * i:3 * i + 3]) for i in range(12)]
    assert turns == ["abc", "acb", "bac", "bca", "cab", "cba"] * 2  # every order, in rotation
    assert all(i == k // 3 for k, (_, i) in enumerate(order))  # one step of each per turn
    follows = Counter((before[0], after[0]) for before, after in zip(order, order[1:]) if before[0] != after[0])
    assert max(follows.values()) - min(follows.values()) <= 2 and len(follows) == 6  # each after each, alike
    assert sorted(ended) == ["a", "b", "c"]
    assert {name: len(t) for name, t in times.items()} == {"a": 12, "b": 12, "c": 12}
    assert all(wall >= 0 and cpu >= 0 for t in times.values() for wall, cpu in t)


def test_the_loops_in_lockstep_train_alike_and_the_recording_is_closed(tmp_path, overhead_models) -> None:
    data = overhead.make_data(12)
    models = overhead_models
    overhead.lockstep(data, {
        "bare": lambda: overhead.training_steps(data, None),
        "recorded": lambda: overhead.training_steps(data, Recorder(tmp_path, "t", summaries=1, snapshots=10)),
        "floor": lambda: overhead.floor_steps(data)})
    assert len(models) == 3
    for other in models[1:]:  # same seed, same data, same updates: recording and the floor change nothing
        for p, q in zip(models[0].parameters(), other.parameters()):
            assert torch.equal(p, q)
    with open_recording(tmp_path / "t") as recording:
        assert recording.steps.tolist() == list(range(12))


def test_each_variant_runs_in_its_own_process_to_its_end(tmp_path) -> None:
    source = "benchmarks.neuraldbg_overhead"
    times = lockstep.run_processes({
        "bare": (source, "lockstep_steps", ("mlp", 12, "bare")),
        "on": (source, "lockstep_steps", ("mlp", 12, "summaries", str(tmp_path), "t")),
        "floor": (source, "lockstep_steps", ("mlp", 12, "floor"))}, 12, 1)
    assert {name: len(t) for name, t in times.items()} == {"bare": 12, "on": 12, "floor": 12}
    rows = lockstep.per_step(times, skip=4)
    assert len(rows) == 8 and all(set(row) == {"bare", "on", "floor"} for row in rows)
    assert all(wall > 0 and cpu > 0 for t in times.values() for wall, cpu in t)
    with open_recording(tmp_path / "t") as recording:  # NeuralDbg was closed in its process
        assert recording.steps.tolist() == list(range(12))
    assert not any(p.name.startswith("lockstep-") for p in multiprocessing.active_children())


def test_a_variant_that_fails_stops_the_others_with_its_name_and_error() -> None:
    source = "benchmarks.neuraldbg_overhead"
    with pytest.raises(RuntimeError, match="'broken' failed: KeyError: 'no-such-workload'"):
        lockstep.run_processes({"bare": (source, "lockstep_steps", ("mlp", 6, "bare")),
                           "broken": (source, "lockstep_steps", ("no-such-workload", 6, "bare"))}, 6, 1)
    with pytest.raises(RuntimeError, match="'missing' failed to start: ModuleNotFoundError"):
        lockstep.run_processes({"missing": ("benchmarks.no_such_module", "f", ())}, 3, 1)
    with pytest.raises(RuntimeError, match="'dies' failed to start: the process ended with exit code 3"):
        lockstep.run_processes({"dies": ("os", "_exit", (3,))}, 3, 1)  # a process that ends without a word
