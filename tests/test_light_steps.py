"""Light steps: a step the recording skips runs almost untouched, and the recording is the same as before.

Each loop below runs twice on the same data: once as it runs now (light steps after the first
``LIGHT_AFTER`` steps) and once with light steps switched off (``LIGHT_AFTER`` out of reach), and the two
recordings must hold the same steps, KPIs, statistics and log. The loop invariants are checked in full only
on some steps of a sparse recording; the tests show what they still catch there and that they raise no false
alarm across the steps they did not see.
"""
from __future__ import annotations

import time
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg import NeuralDbg, open_recording
from comgra_ndbg.errors import RecorderStateError, RecordingNotFoundError
from comgra_ndbg.instrument import light_steps
from comgra_ndbg.recorder import Recorder

STEPS = 80


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.act = nn.Tanh()
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(8, 3)
        self.skip_out = False  # leave the last layer out of the forward pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.drop(self.act(self.fc(x)))
        return hidden[:, :3] if self.skip_out else self.out(hidden)


def _data(steps: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(steps)]


def _plain(model, tmp_path, trial, *, named: bool = True, **options):
    """loss=, a learning rate that changes at every step; optimizer= given or not (``named``: without it a step
    ends at the next pass after the optimizer stepped)."""
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    with NeuralDbg(model, tmp_path, trial=trial, loss=criterion, optimizer=optimizer if named else None,
                   **options) as dbg:
        for x, y in _data():
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            schedule.step()
    return dbg


def _accumulated(model, tmp_path, trial, **options):
    """No loss= (the loss is the tensor backward() is called on), two passes per step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = _data()
    with NeuralDbg(model, tmp_path, trial=trial, optimizer=optimizer, **options) as dbg:
        for i in range(0, len(data), 2):
            optimizer.zero_grad()
            for x, y in data[i:i + 2]:
                (F.cross_entropy(model(x), y) / 2).backward()
            optimizer.step()
    return dbg


def _evaluated(model, tmp_path, trial, **options):
    """An evaluation pass in eval() mode without gradients after every step."""
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    probe = torch.randn(5, 6)
    with NeuralDbg(model, tmp_path, trial=trial, loss=criterion, optimizer=optimizer, **options) as dbg:
        for x, y in _data():
            model.train()
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            model.eval()
            with torch.no_grad():
                model(probe)
    return dbg


def _two_optimizers(model, tmp_path, trial, **options):
    """optimizer= holds the first layer; another optimizer, stepped first, the last one."""
    criterion = nn.CrossEntropyLoss()
    first = torch.optim.SGD(model.fc.parameters(), lr=0.1)
    last = torch.optim.SGD(model.out.parameters(), lr=0.1)
    with NeuralDbg(model, tmp_path, trial=trial, loss=criterion, optimizer=first, **options) as dbg:
        for x, y in _data():
            first.zero_grad()
            last.zero_grad()
            criterion(model(x), y).backward()
            last.step()
            first.step()
    return dbg


def _unfinished(model, tmp_path, trial, **options):
    """The loop's last step ends without an optimizer step: close() ends it."""
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = _data()
    with NeuralDbg(model, tmp_path, trial=trial, loss=criterion, optimizer=optimizer, **options) as dbg:
        for i, (x, y) in enumerate(data):
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            if i < len(data) - 1:
                optimizer.step()
    return dbg


def _two_optimizers_without_optimizer(model, tmp_path, trial, **options):
    """Two optimizers holding the model's parameters, neither named: both step in each step."""
    first = torch.optim.SGD(model.fc.parameters(), lr=0.1)
    last = torch.optim.Adam(model.out.parameters(), lr=1e-2)
    with NeuralDbg(model, tmp_path, trial=trial, **options) as dbg:
        for x, y in _data():
            first.zero_grad()
            last.zero_grad()
            F.cross_entropy(model(x), y).backward()
            first.step()
            last.step()
    return dbg


def _gan(model, tmp_path, trial, **options):
    """A GAN's generator under NeuralDbg: the discriminator's optimizer steps in every step too."""
    critic = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    g_optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    d_optimizer = torch.optim.Adam(critic.parameters(), lr=1e-3)
    with NeuralDbg(model, tmp_path, trial=trial, **options) as dbg:
        for x, _ in _data():
            fake = model(x)
            d_optimizer.zero_grad()
            (critic(fake.detach()).mean() - critic(x[:, :3]).mean()).backward()
            d_optimizer.step()
            g_optimizer.zero_grad()
            (-critic(fake).mean()).backward()
            g_optimizer.step()
    return dbg


LOOPS = {"plain": _plain, "accumulated": _accumulated, "evaluated": _evaluated,
         "two optimizers": _two_optimizers, "unfinished": _unfinished,
         "plain, no optimizer=": partial(_plain, named=False),
         "two optimizers, no optimizer=": _two_optimizers_without_optimizer, "gan": _gan}


def _fingerprint(path, trial: str) -> dict:
    """What a recording holds: steps and their types, every KPI, every summary row, the log."""
    with open_recording(path, trial) as r:
        found = {"steps": r.steps.tolist(), "types": {t: r.steps_of_type(t).tolist() for t in r.step_types},
                 "kpis": {name: tuple(np.asarray(a).tolist() for a in r.kpi(name)) for name in r.kpi_names},
                 "log": [(e.step, e.category, e.subject, e.message) for e in r.log()]}
        for tensor in (t.name for t in r.tensors):
            for kind in r.kinds(tensor):
                steps, rows = r.summary_rows(tensor, kind)
                found[(tensor, kind)] = (steps.tolist(), np.round(rows, 6).tolist())
    return found


def _both(loop, tmp_path, monkeypatch, **options) -> tuple[NeuralDbg, dict, dict, dict]:
    """The loop with light steps and without; returns the first's NeuralDbg, both recordings' fingerprints and
    the parameters each run trained (the same initial model)."""
    found, params, dbgs = {}, {}, {}
    for light in (True, False):
        monkeypatch.setattr(light_steps, "LIGHT_AFTER", 32 if light else 10 ** 9)
        torch.manual_seed(0)
        model = Net()
        dbgs[light] = loop(model, tmp_path, f"light-{light}", **options)
        found[light] = _fingerprint(tmp_path, f"light-{light}")
        params[light] = [p.detach().clone() for p in model.parameters()]
    assert dbgs[False]._light_steps == 0
    return dbgs[True], found[True], found[False], params


@pytest.mark.parametrize("name", LOOPS)
def test_a_recording_with_light_steps_is_the_recording_without(name, tmp_path, monkeypatch) -> None:
    dbg, light, full, params = _both(LOOPS[name], tmp_path, monkeypatch, summaries=10, snapshots=25)
    if name == "gan":  # the discriminator's steps keep every step full: the full path tells them apart
        assert dbg._light_steps == 0
    else:
        assert dbg._light_steps > 0
    assert light.keys() == full.keys()
    for key in full:
        assert light[key] == full[key], key
    assert all(torch.equal(a, b) for a, b in zip(params[True], params[False]))
    steps = STEPS // 2 if name == "accumulated" else STEPS
    if name != "gan":  # its loss: two backward calls through the generator
        loss_steps, losses = light["kpis"]["loss"]
        assert loss_steps == list(range(steps)) and np.isfinite(losses).all()  # a loss at every step
    if name.startswith("plain"):
        lr_steps, lrs = light["kpis"]["lr/0"]
        assert lr_steps == list(range(STEPS))
        assert lrs == pytest.approx([0.1 / (1 + step) for step in range(STEPS)])
    assert light["types"]["train"] == sorted(set(range(0, steps, 10)) | set(range(0, steps, 25)))


def test_light_steps_train_exactly_as_bare(tmp_path) -> None:
    torch.manual_seed(0)
    bare = Net()
    torch.manual_seed(0)
    watched = Net()
    criterion = nn.CrossEntropyLoss()
    rng_state = torch.get_rng_state()
    for model, record in ((bare, False), (watched, True)):
        torch.set_rng_state(rng_state)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        dbg = NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, summaries=None,
                        snapshots=None) if record else None
        for x, y in _data():
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        if dbg is not None:
            assert dbg._light_steps == STEPS - light_steps.LIGHT_AFTER
            dbg.close()
    assert all(torch.equal(a, b) for a, b in zip(bare.parameters(), watched.parameters()))


def _invariant_log(tmp_path, trial: str) -> list:
    with open_recording(tmp_path, trial) as r:
        return [(e.subject, e.step, e.message) for e in r.log("invariant")]


def test_a_zero_grad_dropped_after_the_first_steps_is_caught_at_the_next_recorded_pair(tmp_path) -> None:
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, summaries=10,
                   snapshots=None) as dbg:
        for step, (x, y) in enumerate(_data()):
            if step < 55:
                optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
    assert dbg._light_steps > 0
    log = _invariant_log(tmp_path, "t")
    assert [subject for subject, _, _ in log] == ["optimizer"]
    subject, onset, message = log[0]
    assert 55 <= onset <= 61 and "zero_grad() is not called" in message


def test_healthy_sparse_runs_raise_no_invariant_across_light_steps(tmp_path) -> None:
    """A parameter that gets its gradient only on some steps, evaluation passes in train() mode between
    training steps: the checks after light steps start again and do not count the steps they skipped."""
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, summaries=10,
                   snapshots=None) as dbg:
        for step, (x, y) in enumerate(_data(120)):
            optimizer.zero_grad()
            model.skip_out = step % 8 == 3  # the last layer sits out now and then (no gradient at all)
            criterion(model(x), y).backward()
            optimizer.step()
            with torch.no_grad():
                model(x)  # one evaluation pass per step in train() mode: legal (a run of them is not)
    assert dbg._light_steps > 50
    assert _invariant_log(tmp_path, "t") == []


def test_a_parameter_unused_from_the_start_is_caught_in_the_first_steps(tmp_path) -> None:
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model.skip_out = True
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, summaries=None,
                   snapshots=None) as dbg:
        for x, y in _data():
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
    assert dbg._light_steps > 0
    log = _invariant_log(tmp_path, "t")
    assert len(log) == 1 and log[0][1] == 0 and "got no gradient" in log[0][2]


def test_step_hooks_and_breakpoints_keep_every_step_full(tmp_path) -> None:
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = []
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, summaries=None,
                   snapshots=None) as dbg:
        dbg.on("before_step", seen.append)
        for x, y in _data():
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
    assert dbg._light_steps == 0 and seen == list(range(STEPS))


def test_a_recorder_skips_whole_steps_in_one_call(tmp_path) -> None:
    rec = Recorder(tmp_path, "t", summaries=5, snapshots=None)
    loss = rec.catalog.kpi_id("loss")
    assert rec.would_skip(1, "train") and not rec.would_skip(5, "train")
    rec.skip_step(1, "train", [(loss, 0.5)])
    rec.skip_step(2, "train", [(loss, torch.tensor(0.25))])
    rec.add_note("after step 2")
    assert rec.last_kpis == (2, {"loss": 0.25})
    with pytest.raises(RecorderStateError, match="skip_step"):
        rec.skip_step(2, "train", [])
    rec.start_step(3, "train")
    with pytest.raises(RecorderStateError, match="skip_step"):
        rec.skip_step(4, "train", [])
    rec.finish_step()
    rec.skip_step(4, "train", [(loss, 1.0)])
    rec.close()
    with open_recording(tmp_path, "t") as r:
        steps, values = r.kpi("loss")
        assert steps.tolist() == [1, 2, 4] and values.tolist() == [0.5, 0.25, 1.0]
        assert [(n.step, n.text) for n in r.notes] == [(2, "after step 2")]


@pytest.mark.parametrize("named", [True, False], ids=["optimizer=", "no optimizer="])
def test_a_loop_that_stops_stepping_its_optimizer_goes_back_to_full_steps_and_is_caught(named, tmp_path) -> None:
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer if named else None,
                   summaries=None, snapshots=None) as dbg:
        for step, (x, y) in enumerate(_data()):
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            if step < 60:
                optimizer.step()
    assert dbg._light_steps == 60 - light_steps.LIGHT_AFTER + 1  # steps 32..60; 60 ended by its next pass
    assert dbg.steps == STEPS  # one step per pass, as on the full path
    log = _invariant_log(tmp_path, "t")
    assert len(log) == 1 and 60 <= log[0][1] <= 61 and "optimizer.step()" in log[0][2]
    with open_recording(tmp_path, "t") as r:
        assert r.kpi("loss")[0].tolist() == list(range(STEPS))


def _random_loop(seed: int):
    """A healthy loop of a shape drawn from ``seed``: optimizer= and loss= given or not, one to three passes
    per step (changing from step to step), now and then two forward passes under one backward call, an
    evaluation pass after some steps, a sparse policy."""
    import random

    rng = random.Random(seed)
    named, criterion_given = rng.random() < 0.5, rng.random() < 0.5
    summaries = rng.choice([7, 10, None, sorted(rng.sample(range(90), 6))])
    snapshots = rng.choice([None, 25])
    shapes = [(rng.choice([1, 1, 2, 3]), rng.random() < 0.2, rng.random() < 0.3) for _ in range(90)]

    def loop(model, tmp_path, trial, **options):
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        data = _data(3 * len(shapes))
        with NeuralDbg(model, tmp_path, trial=trial, optimizer=optimizer if named else None,
                       loss=criterion if criterion_given else None, summaries=summaries, snapshots=snapshots,
                       **options) as dbg:
            for step, (passes, paired, evaluate) in enumerate(shapes):
                optimizer.zero_grad()
                batches = data[3 * step:3 * step + passes]
                if paired and passes > 1:
                    (criterion(model(batches[0][0]), batches[0][1])
                     + criterion(model(batches[1][0]), batches[1][1])).backward()
                else:
                    for x, y in batches:
                        criterion(model(x), y).backward()
                optimizer.step()
                if evaluate:
                    with torch.no_grad():
                        model(batches[0][0])
        return dbg

    return loop


@pytest.mark.parametrize("seed", range(6))
def test_random_healthy_loops_record_the_same_with_and_without_light_steps(seed, tmp_path, monkeypatch) -> None:
    dbg, light, full, params = _both(_random_loop(seed), tmp_path, monkeypatch)
    assert dbg._light_steps > 0
    assert light.keys() == full.keys()
    for key in full:
        assert light[key] == full[key], key
    assert all(torch.equal(a, b) for a, b in zip(params[True], params[False]))
    assert light["log"] == [] and light["kpis"]["loss"][0] == list(range(90))


def test_skipped_steps_reach_the_disk_with_the_periodic_flush(tmp_path) -> None:
    """A live reader sees a skipped step's KPIs once the flush interval passed, not only every 64 steps."""
    rec = Recorder(tmp_path, "t", summaries=None, snapshots=None, flush_every_seconds=0.05)
    loss = rec.catalog.kpi_id("loss")
    rec.skip_step(0, "train", [(loss, 0.5)])
    time.sleep(0.1)
    rec.skip_step(1, "train", [(loss, 0.25)])
    deadline = time.monotonic() + 10
    steps: list = []
    while time.monotonic() < deadline:
        try:
            with open_recording(tmp_path, "t") as r:
                steps = r.kpi("loss")[0].tolist()
        except RecordingNotFoundError:  # the first segment is being written on the writer's thread
            steps = []
        if steps == [0, 1]:
            break
        time.sleep(0.05)
    assert steps == [0, 1]
    rec.close()
