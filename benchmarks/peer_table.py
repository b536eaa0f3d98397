"""Peers side by side on the MLP and transformer workloads: rounds of fresh processes, order rotated.

Each round runs every peer once, each in a fresh ``python -m benchmarks.peer_runners`` process (no warm
caches or hooks carried from one peer to the next), in an order rotated by one peer per round, so that
machine load and position in the round hit every peer alike. The ratio to bare is taken within each round
and reported as the median and the range over the rounds. Information per millisecond of overhead is the
numbers recorded in the run (``benchmarks/peer_accounting.py``) over its overhead: the milliseconds per
timed step beyond bare in the same round (median over the rounds) times the run's steps.
"""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.peer_accounting import Recorded
from benchmarks.peer_runners import OPTIONAL, PEER_LABELS, PEERS, WARM_UP, WORKLOAD_LABELS

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Row:
    """One peer on one workload, over the rounds."""

    peer: str
    mean_ms: list[float]
    ratios: list[float]
    bytes_written: int
    recorded: Recorded
    information_per_ms: float | None

    @property
    def label(self) -> str:
        return PEER_LABELS[self.peer]


def available(peers: Sequence[str]) -> tuple[list[str], list[str]]:
    """The peers whose package is installed, and a line for each one skipped."""
    kept, skipped = [], []
    for peer in peers:
        package = OPTIONAL.get(peer)
        if package is not None and importlib.util.find_spec(package) is None:
            skipped.append(f"{peer}: {package} is not installed (pip install -e '.[bench]'), skipped")
        else:
            kept.append(peer)
    return kept, skipped


def run_once(peer: str, workload: str, steps: int, threads: int | None, timeout_s: float | None = None) -> dict:
    """One run in a fresh process; its JSON result. Raises ``subprocess.TimeoutExpired`` past ``timeout_s``."""
    command = [sys.executable, "-m", "benchmarks.peer_runners", "--peer", peer, "--workload", workload,
               "--steps", str(steps)] + ([] if threads is None else ["--threads", str(threads)])
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                       WANDB_MODE="offline", WANDB_SILENT="true")
    done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{peer} on {workload} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rotated(peers: Sequence[str], round_index: int) -> list[str]:
    """The order of a round: the list rotated by ``round_index``.

    >>> rotated(["a", "b", "c"], 1)
    ['b', 'c', 'a']
    """
    shift = round_index % len(peers)
    return list(peers[shift:]) + list(peers[:shift])


def summarize(runs: dict[str, list[dict]]) -> list[Row]:
    """Rows from ``runs[peer][round]`` (``run_once`` results; ``runs["bare"]`` required)."""
    bare = runs["bare"]
    rows = []
    for peer, results in runs.items():
        mean_ms = [r["total_s"] / r["timed_steps"] * 1e3 for r in results]
        bare_ms = [b["total_s"] / b["timed_steps"] * 1e3 for b in bare]
        ratios = [m / b for m, b in zip(mean_ms, bare_ms)]
        recorded = Recorded(**results[-1]["recorded"])
        overhead_ms = statistics.median(m - b for m, b in zip(mean_ms, bare_ms)) * results[-1]["steps"]
        per_ms = recorded.information / overhead_ms if peer != "bare" and overhead_ms > 0 else None
        rows.append(Row(peer, mean_ms, ratios,
                        int(statistics.median(r["bytes_written"] for r in results)), recorded, per_ms))
    return rows


def table(rows: Sequence[Row], *, markdown: bool) -> list[str]:
    """The rows as aligned text or as a Markdown table."""
    head = ("peer", "ms/step (median)", "x bare (median, min-max)", "written", "tensors x stats x steps",
            "numbers / ms overhead")
    lines = []
    for row in rows:
        ratio = (f"{statistics.median(row.ratios):.2f}x ({min(row.ratios):.2f}-{max(row.ratios):.2f})"
                 if row.peer != "bare" else "1")
        recorded = row.recorded
        info = (f"{recorded.tensors} x {recorded.statistics:.4g} x {recorded.steps} = {recorded.information:,}"
                if recorded.information else "0")
        per_ms = f"{row.information_per_ms:,.0f}" if row.information_per_ms is not None else "-"
        lines.append((row.label, f"{statistics.median(row.mean_ms):.1f}", ratio, f"{row.bytes_written / 1e6:.2f} MB",
                      info, per_ms))
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in lines]
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in [head, *lines]]


def compare(workloads: Sequence[str], *, steps: int, rounds: int, threads: int | None,
            markdown: Path | None, timeout_s: float | None = None) -> None:
    """Run every available peer on ``workloads`` and print (and optionally write as Markdown) the tables. A peer
    whose run takes longer than ``timeout_s`` is dropped from that workload, and the table says so."""
    peers, skipped = available(list(PEERS))
    for line in skipped:
        print(line, flush=True)
    sections = []
    for workload in workloads:
        runs: dict[str, list[dict]] = {peer: [] for peer in peers}
        dropped: list[str] = []
        for r in range(rounds):
            for peer in rotated([p for p in peers if p not in dropped], r):
                try:
                    result = run_once(peer, workload, steps, threads, timeout_s)
                except subprocess.TimeoutExpired:
                    dropped.append(peer)
                    del runs[peer]
                    print(f"  {workload} round {r}: {peer} took longer than {timeout_s:.0f} s: dropped", flush=True)
                    continue
                runs[peer].append(result)
                step_ms = result["total_s"] / result["timed_steps"] * 1e3
                print(f"  {workload} round {r}: {peer:<20} {step_ms:9.1f} ms/step  "
                      f"{result['bytes_written'] / 1e6:8.2f} MB", flush=True)
        title = (f"{WORKLOAD_LABELS[workload]}, {steps} steps x {rounds} rounds, CPU (torch threads: "
                 f"{threads or torch.get_num_threads()}), timed from step {WARM_UP} to the end of close()")
        rows = summarize(runs)
        notes = "".join(f"\n{PEER_LABELS[peer]}: a run took longer than {timeout_s:.0f} s, not measured.\n"
                        for peer in dropped)
        print("\n" + title)
        print("\n".join(table(rows, markdown=False)) + "\n" + notes, flush=True)
        sections.append(f"**{title}**\n\n" + "\n".join(table(rows, markdown=True)) + "\n" + notes)
    if markdown is not None:
        machine = (f"Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end, "
                   f"torch {torch.__version__}.")
        markdown.write_text("\n".join(sections) + f"\n{machine}\n")
        print(f"Markdown table written to {markdown}")
