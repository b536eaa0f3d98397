"""The numerical bottom layer: the sufficient-statistic row (``fields``), the kernels and reductions that
fill it (``kernels``, ``unit_kernels`` and ``bits`` compiled; ``parallel`` and ``openmp`` over torch's
threads; ``segmented``, ``host``, ``reducer`` and ``transfer`` for host and device tensors; ``exact`` for the
float64 recompute; ``bounds`` for saturation) and the statistics derived from the rows on read
(``statistics``).

It imports only numpy, torch and numba, never the recorder, store or analysis that call it
(``tests/test_stats_layer.py`` checks this), so every layer above shares one formula.
"""
