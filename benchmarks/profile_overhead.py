"""Profiling overhead: the same training loop bare, under NeuralDbg's defaults, and under NeuralDbg with
``profile=True``, measured side by side.

The models and data are ``benchmarks/neuraldbg_overhead.py``'s: the 8-block 256-wide tanh MLP (batch 64,
Adam) and the small transformer (2 pre-norm encoder layers of width 128, sequences of 32 tokens, batch 16).
Variants, run interleaved in rounds so machine noise hits all alike:

- ``bare``: no instrumentation;
- ``NeuralDbg defaults``: ``NeuralDbg(model, loss=..., optimizer=...)``;
- ``profile=True``: the same plus profiling at its default adaptive policy (the first 3 steps, then steps
  15, 38, 72, …: what a user pays over a run), process memory every step;
- ``profile every step``: ``ProfileConfig(steps=True, flops=False)``, the cost of one profiled step (hooks,
  autograd node timing, saved-tensor hooks), an upper bound.

Printed: the median wall-clock and CPU time per step after 10 warm-up steps and the ratio to bare.

Run: ``python benchmarks/profile_overhead.py [--steps 200] [--rounds 3] [--threads N]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.neuraldbg_overhead import TanhMLP, TinyTransformer, run, token_data  # noqa: E402
from benchmarks.overhead import make_data  # noqa: E402
from comgra_ndbg.recorder.profile_config import ProfileConfig  # noqa: E402

VARIANTS = {
    "bare": None,
    "NeuralDbg defaults": {},
    "NeuralDbg profile=True": {"profile": True},
    "NeuralDbg profile every step (flops off)": {"profile": ProfileConfig(steps=True, flops=False)},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {"MLP (8x256 tanh, batch 64)": (TanhMLP, make_data(args.steps)),
              "transformer (2x128, seq 32, batch 16)": (TinyTransformer, token_data(args.steps))}
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            for m, (make_model, data) in models.items():
                for v, options in VARIANTS.items():
                    trial = f"{abs(hash((m, v))) % 10**8}-{r}"
                    times.setdefault((m, v), []).append(run(make_model, data, options, folder, trial))
    print(f"Profiling overhead, CPU ({torch.get_num_threads()} threads), {args.steps} steps x {args.rounds} rounds, "
          f"median step after 10 warm-up steps")
    for m in models:
        bare_wall = statistics.median(w for w, _ in times[(m, "bare")])
        bare_cpu = statistics.median(c for _, c in times[(m, "bare")])
        print(m)
        for v in VARIANTS:
            wall = statistics.median(w for w, _ in times[(m, v)])
            cpu = statistics.median(c for _, c in times[(m, v)])
            print(f"  {v:<42} {wall * 1e3:8.3f} ms/step  ratio {wall / bare_wall:5.3f}x   "
                  f"CPU {cpu * 1e3:8.3f} ms  ratio {cpu / bare_cpu:5.3f}x")


if __name__ == "__main__":
    main()
