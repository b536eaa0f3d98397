"""Tutorial 3: the flight recorder catches a divergence that a sparse recording would miss.

Long runs record rarely to stay cheap (here: a summary every 25 steps, no snapshots), yet the steps just
before a failure are the ones that explain it. A FlightRecorder keeps the last steps in RAM and writes
them into the recording only when a trigger fires (a non-finite value, a loss spike, a gradient norm).

The bug: a learning-rate schedule that multiplies instead of divides, so the rate jumps 1000x late in
training and the loss explodes.

    python tutorials/03_flight_recorder.py --steps 200 --path runs/tutorial-03
"""
import argparse
import os
import time

import torch
from torch import nn

from comgra_ndbg import Recorder, analyze, open_recording
from comgra_ndbg.recorder.flight import FlightRecorder, LossSpike, NonFinite

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=int(os.environ.get("TUTORIAL_STEPS", 200)))
parser.add_argument("--path", default=time.strftime("runs/tutorial-03-%Y%m%d-%H%M%S"))
args = parser.parse_args()
torch.set_num_threads(1)  # tiny layers: one thread is fastest
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
centers = torch.randn(4, 16) * 2
bad_step = args.steps * 3 // 4  # where the schedule "decays" the learning rate

# Keep the last 8 steps in RAM; after a trigger, record 3 more steps in full.
flight = FlightRecorder(steps=8, after=3, triggers=[NonFinite(), LossSpike(factor=10, window=20, min_history=5)])
with Recorder(args.path, trial="lr-bug", summaries=25, snapshots=False, flight_recorder=flight) as rec:
    rec.track_module("model", model)
    for step in range(args.steps):
        if step == bad_step:
            for group in optimizer.param_groups:
                group["lr"] *= 1000  # the bug: meant to be /= 10
        y = torch.randint(0, 4, (32,))
        x = centers[y] + torch.randn(32, 16)
        with rec.step(step):
            rec.register_tensor("input", x, role="input")
            hidden = rec.register_tensor("hidden", model[1](model[0](x)))
            logits = rec.register_tensor("logits", model[2](hidden), role="output")
            loss = rec.register_tensor("loss", nn.functional.cross_entropy(logits, y), role="loss")
            optimizer.zero_grad()
            loss.backward()
            rec.record_gradients()
            optimizer.step()
            rec.record_kpi("loss", loss)  # KPIs are kept for every step, recorded or not

with open_recording(args.path, "lr-bug") as recording:
    # What fired, and at which step.
    for trigger in recording.triggers:
        print(f"trigger at step {trigger.step}: {trigger.reason}")
    # Which steps the file holds, and why: the policy's every-25th, the ring dumped retroactively,
    # and the steps recorded in full after the trigger.
    reasons = recording.step_reasons()
    dumped = [s for s, why in reasons.items() if "flight recorder" in why or "trigger" in why or "forced" in why]
    print(f"recorded steps: {sorted(reasons)}")
    print(f"steps written by the flight recorder: {sorted(dumped)}")
    steps, loss = recording.kpi("loss")
    around = [round(float(v), 3) for v in loss[bad_step - 1:bad_step + 3]]
    print(f"loss at steps {bad_step - 1}..{bad_step + 2}: {around}")

# The analysis reads those steps like any other.
print(analyze(args.path, trial="lr-bug").explain())
