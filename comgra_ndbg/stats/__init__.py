"""The numerical bottom layer: sufficient-statistic rows (``fields``), the kernels and reductions that fill
them (``kernels``, ``unit_kernels``, ``parallel``, ``segmented``, ``host``, ``reducer``, ``exact``) and the
statistics derived from them on read (``statistics``).

It imports only numpy, torch and numba, never the recorder, store or analysis that call it
(``tests/test_stats_layer.py`` checks this), so every layer above can share one formula.
"""
