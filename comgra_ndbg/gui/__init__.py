"""The explorer: a Dash 4 app to browse a recording's graph, tensors, KPIs and diagnosis.

``comgra-ndbg gui PATH`` starts it; ``create_app(path)`` builds it for embedding or testing.
"""
from comgra_ndbg.gui.app import create_app, serve

__all__ = ["create_app", "serve"]
