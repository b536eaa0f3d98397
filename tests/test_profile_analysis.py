"""The profile's analysis: the memory-leak hypothesis on real runs (a loop that keeps appending tensors to a
list, in a subprocess so its RSS is its own) and on synthetic series, and hot layers from exact arrays."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from comgra_ndbg.analysis.profile import LEAK_TYPE, layer_costs, memory_trend
from comgra_ndbg.store import schema

RUN = textwrap.dedent("""
    import json, sys, torch
    from torch import nn
    from comgra_ndbg import NeuralDbg
    from comgra_ndbg.analysis import analyze
    from comgra_ndbg.recorder.profile_config import ProfileConfig

    folder, trial, leak = sys.argv[1], sys.argv[2], sys.argv[3] == "leak"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    with NeuralDbg(model, folder, trial=trial, profile=ProfileConfig(steps=[0, 1], flops=False),
                   snapshots=None) as dbg:
        for step in range(80):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(torch.randn(64, 16)), torch.randint(0, 2, (64,)))
            loss.backward()
            optimizer.step()
            if leak:
                kept.append(torch.randn(512, 1024))  # 2 MiB a step the loop never lets go of
    diagnosis = analyze(folder, trial=trial, store=False)
    print(json.dumps({"types": [h.type for h in diagnosis.hypotheses], "notes": list(diagnosis.notes)}))
""")


def run(tmp_path: Path, trial: str, mode: str) -> dict:
    script = tmp_path / "run.py"
    script.write_text(RUN)
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, str(script), str(tmp_path), trial, mode], capture_output=True, text=True,
                          timeout=300, cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_loop_that_keeps_tensors_is_a_memory_leak_and_a_healthy_loop_is_not(tmp_path: Path) -> None:
    leaking = run(tmp_path, "leak", "leak")
    assert LEAK_TYPE in leaking["types"], leaking
    assert any(n.startswith("Memory leak: process memory (RSS) grows linearly") for n in leaking["notes"])
    healthy = run(tmp_path, "healthy", "healthy")
    assert LEAK_TYPE not in healthy["types"], healthy
    assert any(n.startswith("No memory leak") for n in healthy["notes"]), healthy


def test_growth_that_levels_off_is_no_leak_however_steep_it_starts() -> None:
    steps = np.arange(200)
    assert not memory_trend(steps, 1e9 + 3e8 * np.minimum(steps, 90) / 90).leaking  # a cache filling up
    assert memory_trend(steps, 1e9 + 2e6 * steps).leaking
    noise = np.random.default_rng(0).normal(0, 4e6, len(steps))
    assert not memory_trend(steps, 1e9 + noise).leaking  # flat, noisy
    assert memory_trend(steps, 1e9 + 1e6 * steps + noise).leaking  # 1 MiB a step under 4 MiB of noise
    short = memory_trend(steps[:8], 1e9 + 1e8 * steps[:8])
    assert not short.leaking and short.onset == -1 and "Too few steps" in short.sentence()


def test_the_slope_and_growth_of_a_leak_are_those_of_the_line() -> None:
    steps = np.arange(0, 300, 3)
    trend = memory_trend(steps, 5e8 + 1e5 * steps, min_growth=1e6)
    assert trend.leaking and abs(trend.slope - 1e5) < 1e-3 and trend.r2 > 0.999999
    assert trend.onset == 30 and abs(trend.growth - 1e5 * (297 - 30)) < 1.0


def test_hot_layers_take_the_fewest_layers_that_cover_half_of_the_time() -> None:
    modules = ("model", "model.a", "model.b", "model.c", "model.d")
    data = np.zeros((3, 5, len(schema.PROFILE_FIELDS)))
    data[:, :, schema.PROFILE_FIELD["forward_time"]] = [0.0, 0.30, 0.25, 0.25, 0.20]
    data[:, :, schema.PROFILE_FIELD["saved_bytes"]] = [0, 10, 10, 10, 970]
    data[0, 1, schema.PROFILE_FIELD["forward_time"]] = 9.0  # one slow step: the median ignores it
    costs = {c.module: c for c in layer_costs(modules, data, schema.PROFILE_FIELDS)}
    assert [m for m, c in costs.items() if c.hot_time] == ["model.a", "model.b"]
    assert [m for m, c in costs.items() if c.hot_memory] == ["model.d"]
    assert abs(costs["model.a"].time_share - 0.30) < 1e-12 and abs(costs["model.d"].memory_share - 0.97) < 1e-12
    assert list(costs) == ["model.a", "model.b", "model.c", "model.d", "model"]


def test_the_first_profiled_step_counts_only_where_no_later_step_has_the_figure() -> None:
    modules = ("model", "model.a")
    f = schema.PROFILE_FIELD
    data = np.full((3, 2, len(schema.PROFILE_FIELDS)), np.nan)
    data[:, :, f["forward_time"]] = [[0.5, 0.4], [np.nan, np.nan], [0.05, 0.04]]  # step 1 counted FLOPs
    data[:, :, f["backward_time"]] = [[0.0, 0.3], [np.nan, np.nan], [0.0, 0.03]]
    data[:, :, f["saved_bytes"]] = [[0, 2048], [0, 1024], [0, 1024]]  # the structure pass ran the model twice
    data[:, :, f["flops"]] = [[np.nan, np.nan], [0, 640], [np.nan, np.nan]]
    costs = {c.module: c for c in layer_costs(modules, data, schema.PROFILE_FIELDS)}
    assert (costs["model.a"].forward_time, costs["model.a"].backward_time) == (0.04, 0.03)
    assert (costs["model.a"].saved_bytes, costs["model.a"].flops) == (1024, 640)
    assert abs(costs["model.a"].time_share - 0.07 / 0.12) < 1e-12
    only_first = {c.module: c for c in layer_costs(modules, data[:2], schema.PROFILE_FIELDS)}
    assert only_first["model.a"].forward_time == 0.4  # no later step timed it: the first one stands
    every = {c.module: c for c in layer_costs(modules, data, schema.PROFILE_FIELDS, warmup=0)}
    assert every["model.a"].forward_time == (0.4 + 0.04) / 2


def test_a_leak_found_in_a_diagnosis_is_a_failure_type_neuraldbg_can_trace() -> None:
    from comgra_ndbg.analysis.events import Diagnosis
    from comgra_ndbg.analysis.profile import profile_report, with_profile
    from comgra_ndbg.analysis.sentences import TYPE_TEXT
    from comgra_ndbg.explain import only

    steps = np.arange(60)
    rss = 1e9 + 3e6 * steps
    report = profile_report((), np.zeros((0, 0, len(schema.PROFILE_FIELDS))), schema.PROFILE_FIELDS, steps, rss,
                            np.full(60, 0.01))
    diagnosis = with_profile(Diagnosis("t", 60, 59, (), (), ()), report, steps, rss)
    [hypothesis] = diagnosis.hypotheses
    assert hypothesis.type == LEAK_TYPE in TYPE_TEXT and hypothesis.node == "process" and hypothesis.onset == 6
    assert diagnosis.events[0].evidence[0].steps[-1] == 59 and len(diagnosis.events[0].evidence[0].steps) == 60
    assert not diagnosis.healthy and "2.86 MiB per step" in hypothesis.sentence
    anomalies = only(diagnosis, "anomalies")  # explain --only anomalies keeps the leak and its event
    assert anomalies.hypotheses == diagnosis.hypotheses and anomalies.events == diagnosis.events
    assert only(diagnosis, "gradients").events == ()
