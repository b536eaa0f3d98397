"""diagbench: training runs with faults injected at known steps and places, scoring the diagnosis.

Run ``python -m benchmarks.diagbench [--smoke] [--jobs 2] [--out results.json]``; see docs/diagnosis.md.
"""
