"""Tutorial 5: stop inside the training loop — breakpoints, step hooks, halting, the failure signature.

A breakpoint stops at a module (or calls your function there) when a condition holds for its output or
its gradient; a hook runs your code after every layer or step with the recorded statistics; a halting
trigger stops the whole run when it fails, with the steps before the failure on disk and the diagnosis
printed and drawn as a failure signature for a bug report, instead of training on after the loss exploded.

The bug: a schedule that sets the learning rate of a small ConvNet to 100 half-way through training.

    python tutorials/05_breakpoints_and_halt.py --steps 60 --path runs/tutorial-05
"""
import argparse
import os
import time

import torch
from torch import nn

from comgra_ndbg import NeuralDbg, open_recording
from comgra_ndbg.errors import TrainingHalted
from comgra_ndbg.recorder.flight import LossSpike
from comgra_ndbg.signature import signature_of, write_png

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=int(os.environ.get("TUTORIAL_STEPS", 60)))
parser.add_argument("--path", default=time.strftime("runs/tutorial-05-%Y%m%d-%H%M%S"))
args = parser.parse_args()
torch.set_num_threads(1)  # tiny layers: one thread is fastest
torch.manual_seed(0)

model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
prototypes = torch.randn(4, 1, 8, 8)
bad_step = args.steps // 2


def first_blow_up(call):
    """A breakpoint action: report the first step whose conv output leaves its range, then stop watching.
    (action="pdb" would open the debugger here, with module, inputs, output and step in scope.)"""
    print(f"breakpoint: step {call.step}, {call.reason}")
    watch.remove()


def every_tenth_step(info):
    """An after_step hook: the step's recorded summaries and KPIs."""
    if info.step % 10 == 0:
        print(f"step {info.step}: loss {info.kpis['loss']:.3f}, "
              f"|grad| max of model.0.weight {info.stat('model.0.weight', 'abs_max', 'grad'):.3g}")


# Record a summary every 25 steps; stop when the loss spikes or anything turns NaN (the flight recorder
# keeps the last 20 steps in RAM and writes them when it fires).
halt_on = ["nonfinite", LossSpike(factor=10, window=10, min_history=5)]
try:
    with NeuralDbg(model, args.path, trial="lr100", summaries=25, snapshots=None, halt_on=halt_on) as dbg:
        watch = dbg.break_at("2", when="abs_max > 100", action=first_blow_up)
        dbg.on("after_step", every_tenth_step)
        for step in range(args.steps):  # the loop itself is unchanged
            if step == bad_step:
                optimizer.param_groups[0]["lr"] = 100.0  # the bug: meant to be 0.01
            y = torch.randint(0, 4, (32,))
            x = prototypes[y] + 0.5 * torch.randn(32, 1, 8, 8)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
except TrainingHalted as halted:  # NeuralDbg(..., halt_mode="flag") sets dbg.should_stop instead
    top = halted.diagnosis.hypotheses[0]
    print(f"halted: trigger at step {halted.step}, stopped after step {halted.last_step} of {args.steps}")
    print(f"top hypothesis: {top.type} from step {top.onset}")

with open_recording(args.path, "lr100") as recording:
    reasons = recording.step_reasons()
    dumped = [step for step, why in reasons.items() if why.startswith("flight recorder")]
    print(f"on disk: steps {sorted(reasons)[0]}..{sorted(reasons)[-1]}, of which written by the flight recorder "
          f"when it fired: {dumped[0]}..{dumped[-1]}")
png = write_png(signature_of(args.path, trial="lr100"), os.path.join(args.path, "failure.png"))
print(f"failure signature: {png}   (the same as: comgra-ndbg signature {args.path} -o failure.png)")
print(f"\nBrowse it: comgra-ndbg gui {args.path}   or   comgra-ndbg explain {args.path}")
