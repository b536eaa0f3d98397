"""Helpers shared by the integrity tests: record a small real run, read all of it back, damage its files.

``record`` trains a tiny MLP with the real ``Recorder`` (summaries every step, snapshots every third, a flush
every ``flush_every`` steps), ``read_everything`` reads back every table of a trial through the public
reader, and ``flip_byte`` / ``chunk_offset`` damage exactly the bytes a test names.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import h5py
import torch

from comgra_ndbg import Recorder, open_recording
from comgra_ndbg.store import schema
from comgra_ndbg.store.writer import DEFAULT_MAX_FILE_BYTES

REPO = Path(__file__).resolve().parent.parent


def record(folder: Path, trial: str = "t", steps: int = 24, *, flush_every: int = 4, close: bool = True,
           fanout: int | None = None, mode: str = "w-", first: int = 0,
           max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES) -> Recorder:
    """A seeded run of ``steps`` steps from step ``first``; returns the recorder (closed unless ``close=False``,
    in which case everything is flushed and merged, and the recorder left open)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = Recorder(folder, trial, summaries=1, snapshots=3, flush_every_steps=flush_every, flush_every_seconds=1e9,
                   mode=mode, num_samples=2, max_file_bytes=max_file_bytes)
    if fanout is not None:
        rec._writer.fanout = rec._writer._merger.fanout = fanout
    rec.track_module("model", model)
    for step in range(first, first + steps):
        with rec.step(step, "even" if step % 2 == 0 else None):  # odd steps: typed at their end, by category
            x = rec.register_tensor("x", torch.arange(10.0).reshape(2, 5) * (step + 1) / 10, role="input")
            y = rec.register_tensor("y", model(x), role="output")
            loss = rec.register_tensor("loss", y.pow(2).mean(), role="loss")
            optimizer.zero_grad()
            loss.backward()
            rec.record_gradients()
            optimizer.step()
            rec.record_kpi("loss", loss)
            if step % 7 == 0:
                rec.add_note(f"note at {step}")
            if step % 5 == 0:
                with warnings.catch_warnings():  # a problem for the log table: a tensor without values
                    warnings.simplefilter("ignore")
                    rec.register_tensor("meta", torch.ones(2, device="meta"))
            if step % 2:
                rec.decide_step("odd", sample_categories=["cat", "dog"])
    if close:
        with warnings.catch_warnings():  # the count of the meta tensor's planted problems
            warnings.simplefilter("ignore")
            rec.close()
    else:
        rec.flush()
        rec._writer.wait_for_merges()
    return rec


def record_and_die(folder: Path, trial: str = "t", steps: int = 23, flush_every: int = 5) -> None:
    """Record in another process that exits without closing (like a kill after its last flush)."""
    code = textwrap.dedent(f"""
        import os, torch
        from comgra_ndbg import Recorder
        rec = Recorder({str(folder)!r}, {trial!r}, flush_every_steps={flush_every}, flush_every_seconds=1e9)
        for step in range({steps}):
            with rec.step(step):
                rec.register_tensor("x", torch.full((2, 3), float(step)))
                rec.record_kpi("loss", float(step))
        rec.flush()
        rec._writer.wait_for_merges()
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


def read_everything(path: Path, trial: str | None = None, *, damaged: str = "raise") -> dict:
    """Every table of a trial as plain Python values (for comparing recordings exactly)."""
    out: dict = {}
    with open_recording(path, trial, damaged=damaged) as rec:
        out["steps"] = rec.steps.tolist()
        out["reasons"] = rec.step_reasons()
        for info in rec.tensors:
            for kind in rec.kinds(info.name):
                steps, rows = rec.summary_rows(info.name, kind)
                out[("summary", info.name, kind)] = (steps.tolist(), rows.tolist())
                for step in rec.snapshot_steps(info.name, kind).tolist():
                    snap = rec.snapshot(step, info.name, kind)
                    out[("snapshot", info.name, kind, step)] = (snap.shape, snap.values.tolist(),
                                                                snap.sample_index.tolist(), snap.sample_rows.tolist(),
                                                                snap.sample_categories,
                                                                None if snap.value_index is None
                                                                else snap.value_index.tolist())
        out["kpi"] = {name: [a.tolist() for a in rec.kpi(name)] for name in rec.kpi_names}
        out["notes"] = [(n.step, n.text) for n in rec.notes]
        out["triggers"] = rec.triggers
        out["log"] = [(e.step, e.category, e.subject, e.message, e.detail_json) for e in rec.log()]
        out["graphs"] = {h: rec.catalog.graphs[h] for h in rec.graph_hashes}
        out["catalog"] = rec.catalog.to_dict()
        out["iterations"] = rec.step_iterations.tolist()
    return out


def flip_byte(path: Path, offset: int) -> None:
    """Invert the byte at ``offset`` of ``path`` (a bit rot, a bad sector)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def chunk_offset(path: Path, dataset: str, chunk: int = 0) -> int:
    """The file offset of a chunk of ``dataset`` (where its stored bytes begin)."""
    with h5py.File(path, "r") as f:
        return int(f[dataset].id.get_chunk_info(chunk).byte_offset)


def files_of(trial_dir: Path) -> list[str]:
    return sorted(p.name for p in Path(trial_dir).iterdir())


def only_file(trial_dir: Path) -> Path:
    [name] = [n for n in files_of(trial_dir) if n.endswith(schema.SEGMENT_SUFFIX)]
    return Path(trial_dir) / name
