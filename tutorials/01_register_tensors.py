"""Tutorial 1: record a model by registering its tensors explicitly, then hunt its bug in the GUI.

The bug: the hidden layer's bias is initialised to -4 ("start sparse", said a comment somewhere). With
inputs of unit scale every ReLU of that layer is off for every sample from the first step, so the layer
passes no signal and no gradient: the network learns through its skip connection only.

    python tutorials/01_register_tensors.py --steps 150 --path runs/tutorial-01
"""
import argparse
import os
import time

import torch
from torch import nn

from comgra_ndbg import Recorder, analyze

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=int(os.environ.get("TUTORIAL_STEPS", 150)))
parser.add_argument("--path", default=time.strftime("runs/tutorial-01-%Y%m%d-%H%M%S"))
args = parser.parse_args()
torch.set_num_threads(1)  # tiny layers: one thread is fastest
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(8, 64)
        self.out = nn.Linear(64, 1)
        self.skip = nn.Linear(8, 1)
        nn.init.constant_(self.hidden.bias, -4.0)  # the bug

    def forward(self, x: torch.Tensor, rec: Recorder) -> torch.Tensor:
        # register_tensor returns its argument, so it wraps any expression; the name is the graph node.
        h = rec.register_tensor("hidden", torch.relu(self.hidden(x)))
        return rec.register_tensor("prediction", self.out(h) + self.skip(x), role="output")


net = Net()
optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
with Recorder(args.path, trial="bias-init") as rec:  # one group folder, one trial per run
    rec.track_module("net", net)  # parameters: value, gradient and update (ΔW) of every step
    for step in range(args.steps):
        x = torch.randn(32, 8)
        y = torch.sin(2 * x[:, :1]) + x[:, 1:2] ** 2  # a non-linear target the skip path cannot fit
        with rec.step(step):  # start_step ... finish_step
            rec.register_tensor("input", x, role="input")
            rec.register_tensor("target", y, role="target")
            loss = rec.register_tensor("loss", nn.functional.mse_loss(net(x, rec), y), role="loss")
            optimizer.zero_grad()
            loss.backward()
            rec.record_gradients()  # gradients of every registered tensor and tracked parameter
            optimizer.step()
            rec.record_kpi("loss", loss)

# The analysis reads the recording (no rerun) and stores its result next to it for the GUI.
diagnosis = analyze(args.path, trial="bias-init")
print(diagnosis.explain())
node = diagnosis.top.node if diagnosis.top else "hidden"
print(f"""
Open the explorer:  comgra-ndbg gui {args.path}
What to look at:    the graph marks node '{node}'; click it and set the timeline statistic to
                    'dead_fraction': it is 1 from step 0. The histogram of its values is a spike at 0.
                    Switch the kind to 'grad': no gradient flows through it, so node 'net.hidden'
                    (its weights) never changes - compare the 'update' kind of 'net.skip'.""")
