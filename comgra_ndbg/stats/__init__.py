"""The numerical bottom layer: the sufficient-statistic row (``fields``), the kernels and reductions that
fill it (``kernels``, compiled from the numba source in ``compiled`` and run from a module that ``backend``
builds ahead of time, or through numba's JIT; ``parallel`` and ``openmp`` over torch's threads;
``segmented``, ``host``, ``reducer``, ``collected`` and ``transfer`` for host and device tensors; ``fused``
for device tensors in one Triton launch per group where Triton is installed; ``exact`` for the float64
recompute; ``bounds`` for saturation) and the statistics derived from the rows on read (``statistics``).

It imports only numpy, torch, numba and Triton (numba only in ``compiled``, which a process running the
module built ahead of time never imports; Triton only in ``fused_kernels``, where it is installed), never the
recorder, store or analysis that call it (``tests/test_stats_layer.py`` checks this), so every layer above
shares one formula.
"""
