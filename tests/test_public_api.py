"""The public surface is small and deliberate: an addition to ``comgra_ndbg.__all__`` changes this test."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

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


def test_a_process_that_only_records_loads_no_reader_analysis_or_gui(tmp_path) -> None:
    """Reading, analysing and showing recordings are imported on first use (``__getattr__`` of the package and
    of ``store``): a training process does not pay their memory. The names still resolve when asked for."""
    script = textwrap.dedent(f"""
        import sys, torch
        from torch import nn
        import comgra_ndbg
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with comgra_ndbg.NeuralDbg(model, {str(tmp_path)!r}, trial="t", optimizer=optimizer,
                                   loss=nn.CrossEntropyLoss()):
            for step in range(5):
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
                optimizer.step()
        loaded = [m for m in ("comgra_ndbg.store.reader", "comgra_ndbg.analysis", "comgra_ndbg.gui", "dash", "pdb")
                  if m in sys.modules]
        from comgra_ndbg import analyze, open_recording
        with open_recording({str(tmp_path)!r}, trial="t") as recording:
            steps = len(recording.steps)
        print(loaded, callable(analyze), steps, "analyze" in dir(comgra_ndbg))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[] True 5 True"


def test_an_unknown_name_of_the_package_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Recordings'"):
        comgra_ndbg.Recordings  # noqa: B018
    from comgra_ndbg import store

    with pytest.raises(AttributeError, match="'comgra_ndbg.store' has no attribute 'reader_cache'"):
        store.reader_cache  # noqa: B018
