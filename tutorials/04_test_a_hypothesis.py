"""Tutorial 4: test your own hypotheses over a finished recording, without rerunning anything.

The analysis said "Dead units originated in 'output'" about the demo's buggy trial (a ReLU left on the
output layer of a net that predicts log-probabilities, which are never positive). Is that the whole story?
Each question below is answered from the recorded summaries alone, with the query API and the reader.

    python tutorials/04_test_a_hypothesis.py --path runs/demo-...   (a group made by `comgra-ndbg demo`)
    python tutorials/04_test_a_hypothesis.py --steps 150 --path runs/tutorial-04   (records one first)
"""
import argparse
import io
import os
import time
from pathlib import Path

from comgra_ndbg import open_recording
from comgra_ndbg.analysis import query
from comgra_ndbg.demo import BUGGY, run_demo

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=int(os.environ.get("TUTORIAL_STEPS", 150)))
parser.add_argument("--path", default=time.strftime("runs/tutorial-04-%Y%m%d-%H%M%S"))
args = parser.parse_args()
if not (Path(args.path) / BUGGY).exists():  # no finished recording there yet: record the demo's two trials
    run_demo(args.path, steps=args.steps, stream=io.StringIO(), progress_stream=io.StringIO())

q = query(args.path, trial=BUGGY)  # the run's aligned series and its diagnosis; nothing is retrained
onset = q.diagnosis.top.onset
print(f"claim: {q.diagnosis.top.sentence}")

# H1: the output's units die, and stay dead. When does the share of dead units first pass 99 %?
dead_from = q.first_step("output", "value", "dead_fraction", above=0.99)
print(f"H1 output units dead from step {dead_from}; share at the last step: "
      f"{q.at('output', 'value', 'dead_fraction', q.run.steps[-1]):.2f}")

# H2: a dead ReLU passes no gradient, so the layers before it stop learning. Compare the gradient of the
# last hidden layer before and after the onset (in decades; -inf means it became exactly 0).
print(f"H2 gradient rms of 'hidden.1' changed by {q.change('hidden.1', 'grad', 'rms', at=onset, window=10):.1f} "
      f"decades at step {onset}")

# H3: so the loss stops improving. Median loss in the 10 steps before the onset and in the last 10 steps.
last = int(q.run.steps[-1])
before, after = q.median("loss", "kpi", "", onset - 10, onset), q.median("loss", "kpi", "", last - 9, last + 1)
print(f"H3 loss median {before:.2f} before the onset, {after:.2f} at the end: "
      f"{'stalled' if after > 0.5 * before else 'still improving'}")

# H4: cause or effect? If the hidden gradient vanished first, the output would be a victim, not the origin.
vanished = q.first_step("hidden.1", "grad", "rms", below=1e-9)
first = "the output is the origin" if vanished is None or vanished >= dead_from else "the hidden layer went first"
print(f"H4 hidden gradient below 1e-9 from step {vanished}, output dead from step {dead_from}: {first}")

# The reader gives the raw numbers behind any answer, e.g. the fixed trial's output at the same steps.
with open_recording(args.path, "fixed") as fixed:
    steps, share = fixed.summary("output", "value", "dead_fraction")
    print(f"fixed trial: dead share of 'output' never above {share.max():.2f} in {len(steps)} steps")
