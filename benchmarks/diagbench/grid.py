"""Candidate threshold settings of the analysis, scored leave-one-family-out.

Every run is analysed once per entry of ``GRID``; for each held-out family, ``lofo.py`` picks the entry
with the best objective on the *other* families' runs and scores the held-out family with it, so a
setting is never chosen on the family it is scored on. Add entries here (a name and a ``Thresholds``) to
let the benchmark choose among them; keep ``"default"``, the thresholds the library ships.
"""
from __future__ import annotations

from comgra_ndbg.analysis import Thresholds

GRID: dict[str, Thresholds] = {"default": Thresholds()}
