"""The numerical bottom layer: the sufficient-statistic row (``fields``), the kernels and reductions that
fill it (``kernels``, compiled from the numba source in ``compiled`` and run from a module that ``backend``
builds ahead of time, or through numba's JIT; ``parallel`` and ``openmp`` over torch's threads;
``segmented``, ``host``, ``reducer`` and ``transfer`` for host and device tensors; ``exact`` for the
float64 recompute; ``bounds`` for saturation) and the statistics derived from the rows on read
(``statistics``).

It imports only numpy, torch and numba (numba only in ``compiled``, which a process running the module
built ahead of time never imports), never the recorder, store or analysis that call it
(``tests/test_stats_layer.py`` checks this), so every layer above shares one formula.
"""
