"""Cost beside a peer recorder, on the peer's own workload: Comgra's tutorial (its ``src/scripts/run.py``).

The workload is the tutorial-shaped script of this project (``comgra_ndbg.compat.comgra.tutorial``): a
recurrent net of three sub-networks (Linear 55→200, LeakyReLU, Linear, three times) trained on sequences of
1 to 10 steps, with 15- and 20-step test batches that take no optimizer step; batch 128, Adam, CPU. Every
step registers the memory with its initial value, each iteration's input, hidden states, outputs and
memory, the helper node's partial sums, per-sample losses, the loss, gradients, three KPIs and notes.

Three variants of the same script, run interleaved in rounds so that machine noise hits all of them alike:

- ``bare``: the script with ``comgra_is_active=False`` on the layer: every recorder call returns at once
  (the same with Comgra 0.11.5 crashes with ``KeyError`` in ``get_name_of_module``);
- ``Comgra 0.11.5``: the same source with its three import lines changed back to Comgra
  (``source_for_comgra()``), Comgra's ``DecisionMakerForRecordingsFrequencyPerType``;
- ``layer``: ``comgra_ndbg.compat.comgra`` with the same decision maker and difference. Its snapshots are
  Comgra's recordings (the same steps); on top, it writes summaries of every tensor at every step (the
  library's default, what the analysis reads), which Comgra does not have;
- ``layer, no summaries``: the same with ``recorder_options={"summaries": None}``: only the steps the
  decision maker picks are recorded, as in Comgra.

Printed per variant: mean seconds per step over the whole run (from the first step to the end of
``finalize()``, everything written), the median step, the mean of the steps the decision maker records,
the bytes written to disk, the number of recorded steps, and the ratio to bare. Comgra is an optional
extra (``pip install comgra==0.11.5``, or ``pip install -e '.[bench]'``); without it the Comgra column is
skipped with a message.

Run: ``python -m benchmarks.peers [--steps 600] [--rounds 3] [--threads N]``.

``--workload mlp|transformer|all`` compares, instead, the peers of ``benchmarks/peer_runners.py`` (bare,
NeuralDbg in three settings, Comgra default and tuned, TensorBoard histograms, ``wandb.watch``) on the MLP
and the small transformer of ``benchmarks/neuraldbg_overhead.py``, each run in a fresh process, in rounds
with the order rotated (``benchmarks/peer_table.py``); ``--markdown FILE`` writes that table as Markdown
(the README's). ``all`` runs the tutorial workload too.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from benchmarks import peer_table
from comgra_ndbg.compat.comgra import tutorial
from comgra_ndbg.compat.comgra.checks import CompatibilityWarning
from comgra_ndbg.recorder import native

COMGRA_VERSION = "0.11.5"
WORKLOADS = ("comgra-tutorial", "mlp", "transformer", "all")


@dataclass
class Run:
    """One run of a variant: seconds per step (mean over the run with ``finalize()``, and per step),
    bytes on disk afterwards, and which steps the decision maker recorded."""

    total_s: float
    step_s: list[float]
    recorded: list[int]
    bytes_written: int

    @property
    def mean_s(self) -> float:
        return self.total_s / len(self.step_s)


@dataclass
class Variant:
    label: str
    demonstration: Callable[[Path], Any]
    runs: list[Run] = field(default_factory=list)


def comgra_tutorial() -> tuple[ModuleType | None, str]:
    """The tutorial on Comgra itself, as a module, or None and why not."""
    try:
        version = importlib.metadata.version("comgra")
    except importlib.metadata.PackageNotFoundError:
        return None, (f"Comgra is not installed: its column is skipped (pip install comgra=={COMGRA_VERSION}, or "
                      f"pip install -e '.[bench]')")
    if version != COMGRA_VERSION:
        return None, (f"Comgra {version} is installed, this workload is written for {COMGRA_VERSION}: its column is "
                      f"skipped (pip install comgra=={COMGRA_VERSION})")
    folder = Path(tempfile.mkdtemp(prefix="comgra-tutorial-"))
    source = folder / "comgra_tutorial_on_comgra.py"
    source.write_text(tutorial.source_for_comgra())
    spec = importlib.util.spec_from_file_location("comgra_tutorial_on_comgra", source)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module, f"Comgra {version}"


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def measure(variant: Variant, root: Path, configuration: str) -> Run:
    """Train ``configuration`` once with ``variant`` into an empty ``root``; the demonstration is built
    (its data generated) before the clock starts."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    demonstration = variant.demonstration(root)
    step_s: list[float] = []
    recorded: list[int] = []
    train_one_step = demonstration.run_one_training_step

    def timed(training_step: int, *args: Any, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        train_one_step(training_step, *args, **kwargs)
        step_s.append(time.perf_counter() - t0)
        recorder = sys.modules[type(demonstration).__module__].comgra.my_recorder
        # after finish_batch() the answer still holds: the decision maker says yes to the step it just marked
        if recorder.comgra_is_active and recorder.recording_is_active():
            recorded.append(training_step)

    demonstration.run_one_training_step = timed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompatibilityWarning)  # the tutorial passes Comgra's SVD argument
        t0 = time.perf_counter()
        demonstration.run_configuration(configuration)
        total = time.perf_counter() - t0
    return Run(total, step_s, recorded, folder_bytes(root))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per run (default: 600 for Comgra's tutorial, as in Comgra's issue; "
                             "200 for the MLP and transformer peers)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configuration", default=tutorial.CONFIGURATIONS[0], choices=tutorial.CONFIGURATIONS)
    parser.add_argument("--min-training-steps-difference", type=int, default=1000,
                        help="the decision maker's difference (the tutorial's: 1000)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--workload", default="comgra-tutorial", choices=WORKLOADS,
                        help="Comgra's tutorial (the default), or the peers on the MLP, the transformer, or all")
    parser.add_argument("--markdown", type=Path, default=None,
                        help="with mlp, transformer or all: write the peers' table as Markdown to this file")
    parser.add_argument("--peer-timeout", type=float, default=900,
                        help="with mlp, transformer or all: seconds after which a peer's run is stopped and dropped")
    args = parser.parse_args(argv)
    native.warm_up()  # the C++ gradient taps: built once per machine, before any measured process
    if args.workload != "comgra-tutorial":
        models = ["mlp", "transformer"] if args.workload == "all" else [args.workload]
        peer_table.compare(models, steps=args.steps or 200, rounds=args.rounds, threads=args.threads,
                           markdown=args.markdown, timeout_s=args.peer_timeout)
        if args.workload != "all":
            return
    args.steps = args.steps or 600
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    options = dict(steps=args.steps, min_training_steps_difference=args.min_training_steps_difference)
    variants = [Variant("bare (recording off)", lambda root: tutorial.Demonstration(
        root, "peers", comgra_is_active=False, **options))]
    on_comgra, comgra_label = comgra_tutorial()
    if on_comgra is None:
        print(comgra_label, flush=True)
    else:
        variants.append(Variant(f"{comgra_label}, its decision maker",
                                lambda root: on_comgra.Demonstration(root, "peers", **options)))
    variants.append(Variant("layer, the same decision maker", lambda root: tutorial.Demonstration(
        root, "peers", **options)))
    variants.append(Variant("layer, no summaries (Comgra's choice)", lambda root: tutorial.Demonstration(
        root, "peers", recorder_options={"summaries": None}, **options)))
    print(f"Comgra's tutorial workload ({args.configuration}), {args.steps} steps x {args.rounds} rounds, CPU "
          f"({torch.get_num_threads()} threads), decision maker difference {args.min_training_steps_difference}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="peers-") as folder:
        warm_up = Variant("warm-up", lambda root: tutorial.Demonstration(
            root, "peers", steps=min(args.steps, 24), min_training_steps_difference=args.min_training_steps_difference))
        measure(warm_up, Path(folder) / "warm-up", args.configuration)  # numba's first compilation, every length
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for variant in order:
                run = measure(variant, Path(folder) / f"round{r}", args.configuration)
                variant.runs.append(run)
                print(f"  round {r}: {variant.label:<38} {run.mean_s * 1e3:8.2f} ms/step  "
                      f"{run.bytes_written / 1e6:8.2f} MB", flush=True)
    report(variants)


def report(variants: list[Variant]) -> None:
    """Medians over the rounds; each ratio is the median of the ratios to bare within the same round."""
    bare = variants[0].runs

    def ratio(runs: list[Run], of: Callable[[Run], float]) -> float:
        return statistics.median(of(run) / of(base) for run, base in zip(runs, bare))

    def median_step(run: Run) -> float:
        return statistics.median(run.step_s)

    print(f"\n{'variant':<38} {'s/step (mean, all written)':>27} {'ratio':>7} {'median step':>12} {'ratio':>7} "
          f"{'recorded step':>14} {'written':>10} {'recorded steps':>15}")
    for variant in variants:
        runs = variant.runs
        mean = statistics.median(run.mean_s for run in runs)
        median = statistics.median(median_step(run) for run in runs)
        recorded = [statistics.mean(run.step_s[s] for s in run.recorded) for run in runs if run.recorded]
        recorded_text = f"{statistics.median(recorded):13.3f}s" if recorded else f"{'-':>14}"
        written = statistics.median(run.bytes_written for run in runs)
        print(f"{variant.label:<38} {mean:26.4f}s {ratio(runs, lambda run: run.mean_s):6.2f}x {median:11.4f}s "
              f"{ratio(runs, median_step):6.2f}x {recorded_text} {written / 1e6:8.1f} MB {len(runs[-1].recorded):15d}")
    print(f"\nmedians over the rounds; each ratio is the median of the ratios to bare in the same round; mean s/step "
          f"runs from the first step to the end of finalize(); 'recorded step' is the mean time of the steps the "
          f"decision maker recorded. Machine: {os.cpu_count()} CPUs, torch {torch.__version__}.")

if __name__ == "__main__":
    main()
