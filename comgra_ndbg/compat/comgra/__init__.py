"""Comgra 0.11.5's API on this library: change a Comgra script's import lines and it records here.

>>> import comgra_ndbg.compat.comgra as comgra                     # was: import comgra
>>> from comgra_ndbg.compat.comgra.recorder import ComgraRecorder  # was: from comgra.recorder import ...
>>> from comgra_ndbg.compat.comgra.objects import DecisionMakerForRecordingsFrequencyPerType
>>> hasattr(comgra, "my_recorder")                                 # the slot Comgra scripts assign
True

``my_recorder`` is the module-level slot that Comgra scripts assign a ``ComgraRecorder`` to and call from
anywhere (``comgra.my_recorder.register_tensor(...)`` inside a module's ``forward``). The trial is
written to ``comgra_root_path/group/trial_id/``; open it with ``comgra-ndbg gui comgra_root_path/group``.
What maps to what, what differs and why: ``docs/comgra.md``.
"""
from __future__ import annotations

from comgra_ndbg.compat.comgra import objects, recorder
from comgra_ndbg.compat.comgra.checks import CompatibilityWarning
from comgra_ndbg.compat.comgra.recorder import ComgraRecorder

__all__ = ["my_recorder", "ComgraRecorder", "CompatibilityWarning", "objects", "recorder"]

my_recorder: ComgraRecorder | None = None
