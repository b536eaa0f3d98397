"""Candidate threshold settings of the analysis, scored leave-one-family-out.

Every run is analysed once per entry of ``GRID``; for each held-out family, ``lofo.py`` picks the entry
with the best objective on the *other* families' runs and scores the held-out family with it, so a
setting is never chosen on the family it is scored on. Add entries here (a name and a ``Thresholds``) to
let the benchmark choose among them; keep ``"default"``, the thresholds the library ships. The other
entries move the thresholds a false alarm or a miss is most sensitive to — how far a scale shift must go
and how much worse the loss must get — one notch each way.
"""
from __future__ import annotations

from comgra_ndbg.analysis import Thresholds

GRID: dict[str, Thresholds] = {
    "default": Thresholds(),
    "stricter": Thresholds(enter_decades=1.25, harm_factor=1.5, divergence_floor=3.0, spike_floor=1.5),
    "looser": Thresholds(enter_decades=0.75, harm_factor=1.1, divergence_floor=1.5, spike_floor=0.5),
}
