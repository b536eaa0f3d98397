"""False alarms and detections of the comparison with a reference run (``analyze(..., reference=...)``).

Records, with ``NeuralDbg``, small runs of several diagbench architecture families: a healthy reference
(seed 0), healthy runs that differ from it only in their seed (every pair must give no finding: a false
alarm otherwise), and runs with one fault injected the way the bug happens — a stage meant to be frozen
left trainable, a layer frozen mid-run, the model converted to another dtype, raw 0–255 inputs, a backward
hook scaling a block's gradient, one param group's learning rate edited, a Dropout left in eval() mode. A
faulty pair counts as detected when the comparison names the expected kind of finding within ±2 steps of
the injection. Prints false alarms / healthy pairs, detections / faulty pairs, and each miss or alarm.

Run from the repository root: ``python -m benchmarks.reference_pairs [--steps 40] [--seeds 3]``.
"""
from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.diagbench import data
from benchmarks.diagbench.models_dense import MLP, Autoencoder, ResidualMLP
from benchmarks.diagbench.models_seq import SequenceClassifier, SmallResNet, TokenTagger
from comgra_ndbg import NeuralDbg, open_recording
from comgra_ndbg.analysis.loading import load_run_facts
from comgra_ndbg.analysis.reference import ReferenceThresholds, compare_runs

BATCH = 32
T0 = 20  # the step where mid-run faults start


@dataclass(frozen=True)
class Family:
    """A model, its batches (``batch(seed, step) -> (input, target)``), its loss, and its stages."""

    name: str
    model: Callable[[], nn.Module]
    batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    first: str  # a child module holding the first stage
    middle: str  # a child module in the middle (gradient hook, frozen mid-run, own learning rate)
    float_input: bool = True
    frozen_first: bool = False  # the healthy runs freeze the first stage (a frozen backbone)
    dropout: str = ""  # a Dropout child module, if any
    hooked: str = ""  # the child module whose input gradient a hook scales (default: ``middle``)
    lr: float = 3e-3


def _batches(make: Callable[[int], tuple[torch.Tensor, ...]]) -> Callable[[int, int], tuple]:
    cache: dict[int, tuple] = {}

    def batch(seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if seed not in cache:
            cache[seed] = make(seed)
        x, y = cache[seed]
        rows = torch.arange(step * BATCH, (step + 1) * BATCH) % len(x)
        return x[rows], y[rows]
    return batch


def _mlp_dropout() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Dropout(0.2), nn.Linear(48, 48), nn.ReLU(),
                         nn.Dropout(0.2), nn.Linear(48, 10))


def _images(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = data.prototype_images(seed, n=512)
    return x / 255.0, y


def _reconstruction(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = data.reconstruction(seed, n=1024)
    return x, x


def families() -> list[Family]:
    ce = F.cross_entropy
    clusters = _batches(lambda s: data.clusters(s, n=1024))
    return [
        Family("mlp", lambda: MLP(32, 10, depth=3, width=32, activation="relu"), clusters, ce, "blocks", "head"),
        Family("mlp_dropout", _mlp_dropout, clusters, ce, "0", "3", dropout="2"),
        Family("mlp_easy", lambda: MLP(32, 10, depth=3, width=32, activation="tanh"),  # the loss falls toward 0
               _batches(lambda s: data.clusters(s, n=1024, separation=6.0, label_noise=0.0)), ce, "blocks", "head",
               lr=3e-2),
        Family("resmlp_frozen", lambda: ResidualMLP(32, 10, depth=2, width=32, activation="gelu"), clusters, ce,
               "proj", "blocks", frozen_first=True, hooked="norm"),
        Family("cnn", lambda: SmallResNet(6), _batches(_images), ce, "stem", "block1"),
        Family("rnn", lambda: SequenceClassifier(4, 4, hidden=24), _batches(lambda s: data.sequences(s, n=1024)), ce,
               "inp", "rnn"),
        Family("transformer", lambda: TokenTagger(24, 16, 2, width=24, depth=2),
               _batches(lambda s: data.token_sequences(s, n=1024)),
               lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=data.IGNORE),
               "tok", "blocks", float_input=False),
        Family("autoencoder", lambda: Autoencoder(32, hidden=(24,), code=8, activation="tanh", code_activation=None),
               _batches(_reconstruction), F.mse_loss, "encoder", "decoder"),
    ]


# fault -> (expected finding types, onset) ; onset None: the first step
FAULTS = {
    "unfrozen": (("frozen_trains",), 0),
    "frozen_midrun": (("update_stagnation", "gradient_ratio", "update_ratio"), T0),
    "wrong_dtype": (("wrong_dtype",), 0),
    "raw_pixels": (("unnormalised_input",), 0),
    "grad_hook": (("gradient_ratio",), T0),
    "group_lr": (("update_ratio",), T0),
    "dropout_eval": (("wrong_mode",), 0),
}


def applicable(family: Family, fault: str) -> bool:
    if fault == "unfrozen":
        return family.frozen_first
    if fault == "raw_pixels":
        return family.float_input
    if fault == "dropout_eval":
        return bool(family.dropout)
    return True


def record(folder: Path, trial: str, family: Family, seed: int, steps: int, fault: str = "") -> Path:
    """One run of ``family`` with ``seed`` (and ``fault``) recorded into ``folder/trial``."""
    torch.manual_seed(seed)
    model = family.model()
    children = dict(model.named_children())
    dtype = torch.float64 if fault == "wrong_dtype" else torch.float32
    model = model.to(dtype)
    if family.frozen_first and fault != "unfrozen":
        children[family.first].requires_grad_(False)
    groups = [{"params": [p for p in child.parameters() if p.requires_grad]} for child in children.values()]
    groups = [g for g in groups if g["params"]]
    middle = [i for i, (name, child) in enumerate((n, c) for n, c in children.items()
                                                  if any(p.requires_grad for p in c.parameters()))
              if name == family.middle]
    optimizer = torch.optim.Adam(groups, lr=family.lr)
    hook = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with NeuralDbg(model, folder, trial=trial):
            for step in range(steps):
                if step == T0 and fault == "frozen_midrun":
                    children[family.middle].requires_grad_(False)
                if step == T0 and fault == "grad_hook":
                    target = children[family.hooked or family.middle]
                    target = target[0] if isinstance(target, nn.ModuleList) else target
                    hook = target.register_full_backward_hook(  # the gradient it passes back
                        lambda _m, grad_in, _out: tuple(g * 1e3 if g is not None and g.is_floating_point() else g
                                                        for g in grad_in))
                if step == T0 and fault == "group_lr" and middle:
                    optimizer.param_groups[middle[0]]["lr"] *= 100
                model.train()
                if fault == "dropout_eval":
                    children[family.dropout].eval()
                x, y = family.batch(seed, step)
                if x.is_floating_point():
                    x = x.to(dtype) * (255.0 if fault == "raw_pixels" else 1.0)
                if y.is_floating_point():
                    y = y.to(dtype)
                optimizer.zero_grad()
                loss = family.loss(model(x), y)
                loss.backward()
                optimizer.step()
    if hook is not None:
        hook.remove()
    return folder / trial


def findings(reference: Path, run: Path, thresholds: ReferenceThresholds = ReferenceThresholds()) -> list:
    """The comparison's hypotheses of ``run`` against ``reference``."""
    with open_recording(reference) as ref, open_recording(run) as rec:
        return list(compare_runs(load_run_facts(ref), load_run_facts(rec), thresholds).hypotheses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=3, help="healthy seeds per family, the reference included")
    parser.add_argument("--families", nargs="*", help="only these families")
    parser.add_argument("--no-loss-gate", action="store_true",
                        help="compare norm ratios at every step, also once the loss fell below 1e-3 of its first "
                             "(to measure what the gate prevents)")
    parser.add_argument("--ratio-margin", type=float, default=ReferenceThresholds.ratio_margin,
                        help="decades beyond the reference's range of a norm ratio (default %(default)s)")
    args = parser.parse_args()
    thresholds = ReferenceThresholds(converged=0.0 if args.no_loss_gate else ReferenceThresholds.converged,
                                     ratio_margin=args.ratio_margin)
    torch.set_num_threads(1)
    chosen = [f for f in families() if not args.families or f.name in args.families]
    alarms, healthy, detected, faulty, exact = 0, 0, 0, 0, 0
    started = time.perf_counter()
    compare_seconds = []
    lowest = 1.0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for family in chosen:
            reference = record(folder, f"{family.name}-ref", family, 0, args.steps)
            for seed in range(1, args.seeds):
                run = record(folder, f"{family.name}-s{seed}", family, seed, args.steps)
                t = time.perf_counter()
                found = findings(reference, run, thresholds)
                compare_seconds.append(time.perf_counter() - t)
                healthy += 1
                with open_recording(run) as rec:
                    loss = rec.kpi("loss")[1]
                lowest = min(lowest, float(loss[-1] / loss[0]))
                if found:
                    alarms += 1
                    print(f"FALSE ALARM {family.name} seed {seed}: {[(h.type, h.node, h.onset) for h in found]}")
                    for h in found:
                        print("   ", h.sentence)
            for fault, (expected, onset) in FAULTS.items():
                if not applicable(family, fault):
                    continue
                run = record(folder, f"{family.name}-{fault}", family, 1, args.steps, fault)
                found = findings(reference, run, thresholds)
                faulty += 1
                hit = [h for h in found if h.type in expected and abs(h.onset - onset) <= 2]
                if hit:
                    detected += 1
                    exact += hit[0].onset == onset
                    print(f"detected {family.name} {fault}: {hit[0].type} '{hit[0].node}' step {hit[0].onset}")
                else:
                    print(f"MISSED {family.name} {fault} (expected {expected} at step {onset}): "
                          f"{[(h.type, h.node, h.onset) for h in found]}")
    print(f"\nfamilies: {', '.join(f.name for f in chosen)}; {args.steps} steps per run, batch {BATCH}")
    print(f"false alarms: {alarms} / {healthy} healthy pairs (differing only in seed)")
    print(f"detections:   {detected} / {faulty} faulty pairs (expected finding within ±2 steps of the fault; "
          f"{exact} at the fault's step exactly)")
    print(f"lowest last/first loss of a healthy run: {lowest:.2g}")
    if compare_seconds:
        print(f"comparison time per pair (loading both recordings included): mean "
              f"{sum(compare_seconds) / len(compare_seconds):.2f} s, max {max(compare_seconds):.2f} s")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
