"""Doctest collection (``--doctest-modules`` over ``comgra_ndbg``) leaves out the modules whose import needs
an optional framework that is not installed; their tests skip in the same case (``pytest.importorskip``)."""
from __future__ import annotations

import importlib.util

OPTIONAL_FRAMEWORKS = {
    "comgra_ndbg/integrations/lightning.py": ("lightning", "pytorch_lightning"),
    "comgra_ndbg/integrations/transformers.py": ("transformers",),
}

collect_ignore = [path for path, modules in OPTIONAL_FRAMEWORKS.items()
                  if not any(importlib.util.find_spec(module) is not None for module in modules)]
