"""Healthy loops: 68 small training loops that train well, in the shapes real code takes, recorded by NeuralDbg
at its defaults and analysed. Any hypothesis on them is a false alarm, and every recorded run must train
bit-identically to its bare run (per-step losses and every final ``state_dict``).

The loops cover learning-rate schedules and optimizers (``optimization``), model copies, freezing and
parametrisations (``parameters``), losses and generative models (``losses``), sequence models
(``sequences``), and dynamics that look alarming without being faults (``dynamics``): a curriculum, a delayed
drop, batches of 2, memorisation, two backward calls, a target network, weight clipping. They were written
without reading the analysis's rules and are kept apart from diagbench, whose healthy controls the rules
were tuned on.

Run: ``python -m benchmarks.healthy_loops [--only NAME ...] [--jobs 2] [--keep DIR]`` (about 7 minutes on
two cores); it prints each loop's first and last loss, whether the recorded run equals the bare one, and
every hypothesis and note, then the count of loops with a false alarm.
"""
from benchmarks.healthy_loops import dynamics, losses, optimization, parameters, sequences
from benchmarks.healthy_loops.common import REGISTRY

# importing the case modules registers their loops
__all__ = ["REGISTRY", "dynamics", "losses", "optimization", "parameters", "sequences"]
