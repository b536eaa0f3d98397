"""Notebooks: the tutorial notebook runs in a real Jupyter kernel (nbclient), its diagnoses render as HTML
tables, ``comgra_ndbg.show`` serves the explorer from the kernel into an iframe that answers, and outside a
kernel ``show`` raises ``NotebookError``."""
from __future__ import annotations

import os
import re
import urllib.request
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

import comgra_ndbg  # noqa: E402
from comgra_ndbg.analysis.events import CausalChain, Diagnosis, Event, Hypothesis  # noqa: E402
from comgra_ndbg.errors import NotebookError  # noqa: E402
from comgra_ndbg.neuraldbg import Explanations  # noqa: E402
from comgra_ndbg.notebook import diagnosis_html  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "tutorials" / "06_notebook.ipynb"


def _html(cell: dict) -> str:
    return "".join(str(o.get("data", {}).get("text/html", "")) for o in cell.outputs)


def test_the_tutorial_notebook_runs_and_shows_the_diagnosis_and_the_explorer(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TUTORIAL_STEPS", "40")
    monkeypatch.setenv("TUTORIAL_PATH", str(tmp_path / "runs"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    code = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"]
    with client.setup_kernel():
        for index in code:
            client.execute_cell(notebook.cells[index], index)
        iframe = re.search(r'<iframe[^>]*src="(http://127\.0\.0\.1:\d+/)"', _html(notebook.cells[code[-1]]))
        assert iframe, notebook.cells[code[-1]].outputs
        with urllib.request.urlopen(iframe.group(1), timeout=30) as page:  # served by the kernel's thread
            assert page.status == 200 and "<title>comgra_ndbg explorer</title>" in page.read().decode()
        with urllib.request.urlopen(iframe.group(1) + "_dash-layout", timeout=60) as layout:
            assert "sigmoids" in layout.read().decode()
    with comgra_ndbg.open_recording(tmp_path / "runs", "sigmoids") as recording:
        assert len(recording.steps) == 40
    diagnosis = comgra_ndbg.analyze(tmp_path / "runs", trial="sigmoids", store=False)
    top = diagnosis.top
    assert top is not None and top.type == "vanishing"
    explained, analysed = _html(notebook.cells[code[1]]), _html(notebook.cells[code[2]])
    for shown in (explained, analysed):
        assert shown.startswith('<div class="comgra-diagnosis">') and shown.count("<tr>") == 1 + len(
            diagnosis.hypotheses)
        assert f"<td style=\"padding:3px 8px;border-bottom:1px solid #ddd;vertical-align:top\">{top.type}</td>" \
            in shown
    printed = "".join(o.get("text", "") for o in notebook.cells[code[2]].outputs)
    assert printed.startswith(f"top hypothesis: vanishing in {top.node!r} from step {top.onset}")


def _hypothesis(sentence: str, remedy: str) -> Hypothesis:
    event = Event("gradient_health", "fc<1>", "grad", "stable", "vanishing", 3, 9, -2.0, 0.8)
    return Hypothesis("vanishing", "node", "fc<1>", 3, 0.875, sentence, CausalChain(event, ()), remedy=remedy)


def test_diagnosis_html_escapes_and_lists_every_hypothesis_with_its_remedy() -> None:
    diagnosis = Diagnosis("t", 20, 19, (), (), (_hypothesis("Gradients <vanish> in 'fc<1>'.", "Use ReLU & init."),
                                                 _hypothesis("Second.", "")), notes=("frozen <head>",))
    shown = diagnosis._repr_html_()
    assert shown == diagnosis_html(diagnosis)
    assert "2 failure hypotheses in 20 recorded steps" in shown and shown.count("<tr>") == 3
    assert "Gradients &lt;vanish&gt; in &#x27;fc&lt;1&gt;&#x27;." in shown and "<vanish>" not in shown
    assert "<i>Remedy:</i> Use ReLU &amp; init." in shown and "<code>fc&lt;1&gt;</code>" in shown
    assert ">0.88<" in shown and "<i>Note:</i> frozen &lt;head&gt;" in shown
    explanations = Explanations(["Gradients vanish.", "Second."], diagnosis=diagnosis)
    assert explanations._repr_html_() == shown
    assert Explanations(["a <b>", "c"])._repr_html_() == "<ol><li>a &lt;b&gt;</li><li>c</li></ol>"


def test_show_outside_a_notebook_kernel_is_a_notebook_error(tmp_path: Path) -> None:
    with pytest.raises(NotebookError, match=r"not a Jupyter kernel; in a terminal run `comgra-ndbg gui "):
        comgra_ndbg.show(tmp_path)
