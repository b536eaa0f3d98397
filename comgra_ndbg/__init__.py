"""comgra_ndbg: record what happens inside a neural network during training, and explain why it failed."""
from comgra_ndbg.errors import (ComgraError, CorruptRecordingError, DuplicateTensorError, InvalidArgumentError,
                                InvalidTensorError, RecorderStateError, RecordingExistsError, RecordingFormatError,
                                RecordingNotFoundError, UnknownSeriesError)

__version__ = "0.1.0"

from typing import TYPE_CHECKING  # noqa: E402

from comgra_ndbg.recorder import Recorder, RecorderWarning  # noqa: E402
from comgra_ndbg.neuraldbg import NeuralDbg  # noqa: E402

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these are imported on first use (below)
    from comgra_ndbg.analysis import analyze  # noqa: F401
    from comgra_ndbg.notebook import show  # noqa: F401
    from comgra_ndbg.store.check import check  # noqa: F401
    from comgra_ndbg.store.reader import Recording, open_recording  # noqa: F401

# Reading, checking, analysing and showing recordings are imported when first used: a training process that
# only records never loads them (about 2 MiB of resident memory, and their import time).
_LAZY = {"Recording": "comgra_ndbg.store.reader", "open_recording": "comgra_ndbg.store.reader",
         "check": "comgra_ndbg.store.check", "analyze": "comgra_ndbg.analysis", "show": "comgra_ndbg.notebook"}


def __getattr__(name: str) -> object:
    """The lazy names above, and any subpackage or module of comgra_ndbg (``comgra_ndbg.analysis``), imported
    when first asked for."""
    import importlib
    import importlib.util

    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'comgra_ndbg' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "__version__",
    "Recorder",
    "NeuralDbg",
    "open_recording",
    "Recording",
    "analyze",
    "check",
    "show",
    "RecorderWarning",
    "ComgraError",
    "RecorderStateError",
    "InvalidTensorError",
    "InvalidArgumentError",
    "DuplicateTensorError",
    "RecordingExistsError",
    "RecordingNotFoundError",
    "RecordingFormatError",
    "CorruptRecordingError",
    "UnknownSeriesError",
]
