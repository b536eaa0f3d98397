"""Callbacks that record a training run of a framework's trainer with :class:`~comgra_ndbg.NeuralDbg`.

``comgra_ndbg.integrations.lightning.ComgraCallback`` (PyTorch Lightning, ``pip install
'comgra-ndbg[lightning]'``) and ``comgra_ndbg.integrations.transformers.ComgraCallback`` (Hugging Face
``Trainer``, ``pip install 'comgra-ndbg[transformers]'``). Each module imports its framework when it is
imported, and raises :class:`~comgra_ndbg.errors.MissingDependencyError` with the install line when the
framework is absent; this package itself imports no framework. What they share lives in
:mod:`~comgra_ndbg.integrations.core`.
"""
