"""The failure signature: its matrices against the recorded series, the PNG it draws (decoded, non-blank, the
origin row boxed), ``comgra-ndbg signature`` exit codes, and the Diagnosis tab's image.

The group is the demo job's (a trial with a ReLU on its output layer that goes dead at step 16, and a fixed
trial), 40 steps each, recorded and analysed for real.
"""
from __future__ import annotations

import base64
import io
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from dash import html

from cli_support import demo_group, run_cli as run
from comgra_ndbg import cli, open_recording
from comgra_ndbg.analysis import analyze
from comgra_ndbg.analysis.events import CausalChain, Diagnosis, Event, Hypothesis
from comgra_ndbg.analysis.loading import load_series
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.signature import failure_signature
from comgra_ndbg.analysis.synthetic import summary_rows
from comgra_ndbg.errors import ComgraError, InvalidArgumentError, NoFailureError
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.state import ReaderCache, Selection, ViewOptions
from comgra_ndbg.gui.tabs import diagnosis_tab
from comgra_ndbg.signature import ORIGIN_COLOUR, signature_figure, signature_of

STEPS = 40
DPI = 100


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_group(tmp_path_factory, "signature", STEPS)



def red_pixels(image: np.ndarray) -> np.ndarray:
    rgb = image[..., :3]
    return (rgb[..., 0] > 0.95) & (rgb[..., 1] < 0.05) & (rgb[..., 2] < 0.05)


def test_the_matrices_are_the_recorded_norms_in_the_window_up_to_the_failure(group: Path) -> None:
    diagnosis = analyze(group, trial="buggy", store=False)
    with open_recording(group, "buggy") as recording:
        series = load_series(recording)
    top = diagnosis.top
    assert (top.type, top.node, top.onset) == ("dead_units", "output", 16)
    sig = failure_signature(series, diagnosis, steps=5)
    assert sig.steps == (12, 13, 14, 15, 16) and sig.onset == sig.failure_step == 16 and sig.onset_column == 4
    assert sig.layers == ("input", "model.hidden.0", "hidden.0", "model.hidden.1", "hidden.1", "model.head",
                          "output", "loss")
    assert sig.origin == "output" and sig.origin_row == 6 and sig.title == top.sentence
    for row, name in enumerate(sig.layers):
        node = series.node(name)
        expected = node.stats["value"]["l2"][12:17]
        np.testing.assert_array_equal(sig.activation[row], expected)
        if node.has("grad"):
            np.testing.assert_array_equal(sig.gradient[row], node.stats["grad"]["l2"][12:17])
        else:
            assert np.isnan(sig.gradient[row]).all()  # the input has no gradient: not recorded, not zero
    assert not sig.nonfinite.any()
    early = failure_signature(series, diagnosis, steps=30)  # fewer than 30 steps precede 16: the window runs on
    assert early.steps == tuple(range(30)) and early.onset_column == 16


def test_non_finite_cells_are_marked_and_an_optimizer_origin_has_no_row() -> None:
    bad = np.zeros(10)
    bad[7:] = 3
    series = build_series({("h", "value"): summary_rows(rms=np.ones(10), nonfinite=bad),
                           ("h", "grad"): summary_rows(rms=np.ones(10))}, roles={"h": "intermediate"}, kpis={})
    root = Event("nonfinite", "h", "value", "finite", "non-finite", 7, 9, 3.0, 1.0)
    top = Hypothesis("optimizer_instability", "optimizer", "", 6, 0.7, "The optimizer diverged.",
                     CausalChain(root))
    sig = failure_signature(series, Diagnosis("t", 10, 9, (root,), (), (top,)), steps=4)
    assert sig.steps == (4, 5, 6, 7) and sig.origin_row is None and sig.onset_column == 2
    assert sig.nonfinite[1, 0].tolist() == [False, False, False, True]  # the activation at step 7
    assert not sig.nonfinite[0].any()
    figure = signature_figure(sig, dpi=DPI)
    figure.canvas.draw()
    assert not red_pixels(np.asarray(figure.canvas.buffer_rgba(), dtype=np.float64) / 255).any()


def test_a_healthy_run_raises_no_failure_error_that_says_what_to_do(group: Path) -> None:
    with pytest.raises(NoFailureError) as raised:
        signature_of(group, trial="fixed")
    assert isinstance(raised.value, ComgraError) and isinstance(raised.value, LookupError)
    message = str(raised.value)
    assert message.startswith(f"trial 'fixed' has no failure: the analysis of its {STEPS} recorded steps")
    assert "comgra-ndbg explain PATH" in message and "--activation-threshold" in message
    with pytest.raises(InvalidArgumentError, match="holds 2 trials \\(buggy, fixed\\); name the one"):
        signature_of(group)
    diagnosis = analyze(group, trial="buggy", store=False)
    with open_recording(group, "buggy") as recording:
        series = load_series(recording)
    with pytest.raises(InvalidArgumentError, match="steps must be a positive number"):
        failure_signature(series, diagnosis, steps=0)


def test_the_cli_writes_a_non_blank_png_with_the_origin_row_boxed(group: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "failure.png"
    code, printed, _ = run(["signature", str(group), "--trial", "buggy", "-o", str(out), "--steps", "20"], capsys)
    assert code == 0
    assert printed == f"{out}: trial buggy, 8 layers × 20 steps (0–19), onset step 16, origin 'output'\n"
    image = matplotlib.image.imread(out)
    figure = signature_figure(signature_of(group, trial="buggy", steps=20), dpi=DPI)
    width, height = (figure.get_size_inches() * DPI).round().astype(int)
    assert image.shape[:2] == (height, width)
    rgb = image[..., :3]
    assert rgb.std() > 0.1 and len(np.unique(rgb.reshape(-1, 3).round(2), axis=0)) > 50  # not blank
    figure.canvas.draw()
    for ax in figure.axes[:2]:  # the two heatmaps (the others are colour bars)
        (left, top_y), (right, bottom_y) = ax.transData.transform([(-0.5, 5.5), (19.5, 6.5)])
        inside = red_pixels(image[:, int(left) + 8:int(right) - 8])
        rows = np.flatnonzero(inside.any(axis=1))
        assert len(rows) and inside.sum() > (right - left)  # the box's top and bottom edges span the row
        low, high = height - max(top_y, bottom_y), height - min(top_y, bottom_y)  # image rows grow downwards
        assert low - 4 <= rows.min() and rows.max() <= high + 4  # ... and nothing red outside row 6 (output)


def test_cli_exit_codes(group: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "healthy.png"
    code, printed, err = run(["signature", str(group), "--trial", "fixed", "-o", str(out)], capsys)
    assert (code, printed) == (1, "") and not out.exists()
    assert err.startswith("comgra-ndbg signature: trial 'fixed' has no failure")
    code, _, err = run(["signature", str(group), "-o", str(out)], capsys)
    assert code == 2 and "name the one to draw with trial=... (--trial on the command line)" in err
    code, _, err = run(["signature", str(tmp_path / "nothing"), "-o", str(out)], capsys)
    assert code == 2 and err.startswith("comgra-ndbg signature: ")
    code, _, err = run(["signature", str(group), "--trial", "buggy", "--steps", "0", "-o", str(out)], capsys)
    assert code == 2 and "steps must be a positive number of recorded steps, got 0" in err and not out.exists()


def images(component: object) -> list[html.Img]:
    found = [component] if isinstance(component, html.Img) else []
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children] if children is not None else []:
        found += images(child)
    return found


def test_the_diagnosis_tab_shows_the_signature_of_a_failing_trial_only(group: Path) -> None:
    cache = ReaderCache(group)
    try:
        failing = images(diagnosis_tab(cache, Selection("buggy", "default", 0, 0, None, None, None), ViewOptions()))
        healthy = images(diagnosis_tab(cache, Selection("fixed", "default", 0, 0, None, None, None), ViewOptions()))
    finally:
        cache.close()
    assert [img.id for img in failing] == [ids.SIGNATURE] and healthy == []
    prefix = "data:image/png;base64,"
    assert failing[0].src.startswith(prefix)
    image = matplotlib.image.imread(io.BytesIO(base64.b64decode(failing[0].src[len(prefix):])), format="png")
    assert image.shape[0] > 200 and image[..., :3].std() > 0.1 and red_pixels(image).sum() > 100


def test_a_large_network_keeps_the_image_bounded_and_names_the_origin() -> None:
    from comgra_ndbg.analysis.signature import Signature
    from comgra_ndbg.signature import MAX_HEIGHT_INCHES

    layers = 300
    norms = np.logspace(-3, 0, layers * 20).reshape(layers, 20)
    sig = Signature("t", tuple(f"block.{i}" for i in range(layers)), ("intermediate",) * layers, tuple(range(20)),
                    norms, norms, np.zeros((2, layers, 20), bool), 10, 10, "block.137", 137, "Exploding.",
                    "exploding", "node")
    figure = signature_figure(sig, dpi=50)
    assert figure.get_size_inches()[1] == MAX_HEIGHT_INCHES
    labels = {t.get_text(): t for t in figure.axes[0].get_yticklabels()}
    assert 50 <= len(labels) <= 80 and "block.0" in labels  # every k-th layer named ...
    assert labels["block.137"].get_color() == ORIGIN_COLOUR  # ... and always the origin, in red


def test_the_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["signature", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Exits 0 when written, 1 when the run has no failure (nothing to draw), 2 on bad input." in out
    assert "--steps N" in out and "-o PNG, --out PNG" in out
