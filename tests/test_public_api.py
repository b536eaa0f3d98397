"""The public surface is small and deliberate: an addition to ``comgra_ndbg.__all__`` changes this test."""
from __future__ import annotations

import comgra_ndbg
from comgra_ndbg import errors


def test_the_public_names_are_exactly_these() -> None:
    assert comgra_ndbg.__all__ == [
        "__version__", "Recorder", "NeuralDbg", "open_recording", "Recording", "analyze", "check",
        "show", "RecorderWarning", "ComgraError", "RecorderStateError", "InvalidTensorError", "InvalidArgumentError",
        "DuplicateTensorError", "RecordingExistsError", "RecordingNotFoundError", "RecordingFormatError",
        "CorruptRecordingError", "UnknownSeriesError",
    ]
    for name in comgra_ndbg.__all__:
        assert getattr(comgra_ndbg, name) is not None


def test_every_error_is_a_comgra_error_and_corrupt_recordings_are_format_errors() -> None:
    for name in errors.__all__:
        error = getattr(errors, name)
        if name != "RecorderWarning":
            assert issubclass(error, errors.ComgraError), name
    assert issubclass(errors.CorruptRecordingError, errors.RecordingFormatError)
    assert errors.CorruptRecordingError("x", ("d",)).damage == ("d",)
    assert issubclass(comgra_ndbg.RecorderWarning, UserWarning)
