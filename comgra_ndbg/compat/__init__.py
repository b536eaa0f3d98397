"""Drop-in layers for other recording libraries' APIs, recorded by this library.

``comgra_ndbg.compat.comgra`` runs a Comgra script after only its import lines change (see
``docs/comgra.md``).
"""
