"""The floor of a step that records nothing: NeuralDbg's hook entry points with empty bodies.

NeuralDbg sees a training step through hooks, and a step its policies skip still enters Python at each of
them: the model's forward pre-hook and forward hook, a pre-hook on the output's autograd node (which queues
a callback for the end of the backward pass), the criterion's forward hook, the patched
``torch.autograd.backward`` (before and after the backward pass), the global optimizer step pre- and post-hooks and the ``optimizer=``'s own
post-hook, each behind ``torch.compiler.disable`` as NeuralDbg installs them. :func:`run_hook_floor` trains
with exactly those entries doing nothing, so a skipped step's ratio to bare splits into what entering the
hooks costs (any recorder built on them pays it) and what NeuralDbg does in them (step detection, the loss
and learning-rate KPIs, the loop invariants).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim import optimizer as optimizer_module

from benchmarks.neuraldbg_overhead import OPTIMIZERS, TanhMLP, TinyTransformer, run, timed_loop, token_data
from benchmarks.overhead import make_data
from comgra_ndbg.instrument.light_steps import LIGHT_AFTER

__all__ = ["run_hook_floor", "skipped_step_rounds"]

WORKLOADS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], list], str]] = {
    "MLP 8x256 tanh, SGD": (TanhMLP, make_data, "sgd"),
    "MLP 8x256 tanh, Adam": (TanhMLP, make_data, "adam"),
    "transformer 2x128, Adam": (TinyTransformer, token_data, "adam"),
}
SKIPPED = ("bare", "nothing recorded", "hook entries alone")


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def run_hook_floor(make_model: Callable[[], nn.Module], data: list, optimizer_name: str = "adam",
                   warmup: int = 10) -> tuple[float, float]:
    """``neuraldbg_overhead.run`` with NeuralDbg's hook entry points installed and empty (see the module
    docstring); returns the median wall-clock and CPU seconds per step after ``warmup`` steps."""
    torch.manual_seed(0)
    model, criterion = make_model(), nn.CrossEntropyLoss()
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    disable = torch.compiler.disable
    engine = torch.autograd.Variable._execution_engine

    def on_output_gradient(grad_outputs: tuple) -> None:
        engine.queue_callback(_nothing)

    def after_forward(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.grad_fn is not None:
            output.grad_fn.register_prehook(on_output_gradient)

    handles = [model.register_forward_pre_hook(disable(_nothing), with_kwargs=True),
               model.register_forward_hook(disable(after_forward), with_kwargs=True),
               criterion.register_forward_hook(disable(_nothing)),
               optimizer.register_step_post_hook(disable(_nothing)),
               optimizer_module.register_optimizer_step_pre_hook(disable(_nothing)),
               optimizer_module.register_optimizer_step_post_hook(disable(_nothing))]
    original = torch.autograd.backward

    def backward(*args: Any, **kwargs: Any) -> Any:
        _nothing(args)
        result = original(*args, **kwargs)
        _nothing()
        return result

    torch.autograd.backward = backward
    try:
        return timed_loop(model, criterion, optimizer, data, warmup)
    finally:
        torch.autograd.backward = original
        for handle in handles:
            handle.remove()


def skipped_step_rounds(make_model: Callable[[], nn.Module], data: list, optimizer_name: str, rounds: int,
                        folder: str) -> dict[str, list[float]]:
    """CPU seconds per step (median of each round) of ``SKIPPED``, the variants of a round run one after the
    other in this process, their order reversed every other round; only the steps after NeuralDbg's first
    ``LIGHT_AFTER`` (checked in full) and 10 more are timed, for every variant alike."""
    warmup = LIGHT_AFTER + 10
    found: dict[str, list[float]] = {v: [] for v in SKIPPED}
    for r in range(rounds):
        for variant in SKIPPED if r % 2 == 0 else SKIPPED[::-1]:
            if variant == "hook entries alone":
                found[variant].append(run_hook_floor(make_model, data, optimizer_name, warmup)[1])
            else:
                options = None if variant == "bare" else dict(summaries=None, snapshots=None)
                found[variant].append(run(make_model, data, options, folder, f"skip-{r}", optimizer_name,
                                          warmup)[1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description="A step that records nothing against the hook entries alone "
                                                 "and bare, in one process, interleaved in rounds")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=200, help=f"steps per run (the first {LIGHT_AFTER + 10} "
                                                               f"are not timed)")
    args = parser.parse_args()
    if args.steps <= LIGHT_AFTER + 20:
        raise SystemExit(f"--steps must be above {LIGHT_AFTER + 20}: the first {LIGHT_AFTER + 10} are not timed")
    torch.set_num_threads(1)
    print(f"1 torch thread, CPU time, {args.rounds} interleaved rounds, load {os.getloadavg()[0]:.2f}")
    for name, (make_model, make_inputs, optimizer_name) in WORKLOADS.items():
        with tempfile.TemporaryDirectory() as folder:
            found = skipped_step_rounds(make_model, make_inputs(args.steps), optimizer_name, args.rounds, folder)
            bare = found["bare"]
            print(f"{name}: bare {statistics.median(bare) * 1e3:.3f} ms/step")
            for variant in SKIPPED[1:]:
                ratios = [t / b for t, b in zip(found[variant], bare)]
                extra = statistics.median(t - b for t, b in zip(found[variant], bare)) * 1e6
                low, _, high = statistics.quantiles(ratios, n=4)
                print(f"  {variant:20s} {statistics.median(ratios):.3f}x (IQR {low:.3f}-{high:.3f})  "
                      f"{extra:+.0f} us/step")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
