"""diagbench v2: training runs of seven architecture families with real-bug faults injected at known steps
and places, beside healthy look-alikes, scoring the diagnosis leave-one-family-out.

Run ``python -m benchmarks.diagbench [--smoke] [--jobs 2] [--out results.json]``; see docs/diagnosis.md.
"""
