"""Analysis: semantic events, causal compression and ranked, calibrated hypotheses over recorded summaries.

Pure functions over :class:`~comgra_ndbg.analysis.series.RunSeries` return frozen dataclasses; only
:mod:`~comgra_ndbg.analysis.api` (``analyze``, ``query``) and :mod:`~comgra_ndbg.analysis.loading` read a
recording. See ``docs/diagnosis.md``.
"""
from comgra_ndbg.analysis.api import analyze, detect_events, diagnose, query, stored_diagnosis
from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import (CausalChain, CausalLink, Diagnosis, Event, Evidence, Hypothesis,
                                         diagnosis_from_dict, to_dict)
from comgra_ndbg.analysis.query import Query
from comgra_ndbg.analysis.series import NodeSeries, RunSeries, build_series

__all__ = ["analyze", "diagnose", "detect_events", "query", "stored_diagnosis", "Thresholds", "Diagnosis",
           "Event", "Evidence", "CausalLink", "CausalChain", "Hypothesis", "Query", "RunSeries", "NodeSeries",
           "build_series", "to_dict", "diagnosis_from_dict"]
