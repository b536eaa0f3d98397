"""comgra_ndbg: record what happens inside a neural network during training, and explain why it failed."""
from comgra_ndbg.errors import (ComgraError, CorruptRecordingError, DuplicateTensorError, InvalidArgumentError,
                                InvalidTensorError, RecorderStateError, RecordingExistsError, RecordingFormatError,
                                RecordingNotFoundError, UnknownSeriesError)

__version__ = "0.1.0"

from comgra_ndbg.recorder import Recorder, RecorderWarning  # noqa: E402
from comgra_ndbg.store import Recording, open_recording  # noqa: E402
from comgra_ndbg.store.check import check  # noqa: E402
from comgra_ndbg.analysis import analyze  # noqa: E402
from comgra_ndbg.neuraldbg import NeuralDbg  # noqa: E402
from comgra_ndbg.notebook import show  # noqa: E402

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
