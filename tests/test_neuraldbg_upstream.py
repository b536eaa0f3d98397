"""The upstream NeuralDBG README's usage, run as it is written: only its import names this package."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis.events import CausalLink, Hypothesis
from comgra_ndbg.neuraldbg import Explanations

README = Path(__file__).parent / "data" / "neuraldbg_readme_usage.md"


def readme_code() -> str:
    """The README's Python blocks, in order, with the upstream import replaced by this package's."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 2 and "from neuraldbg import NeuralDbg" in blocks[0]
    return "\n".join(blocks).replace("from neuraldbg import NeuralDbg", "from comgra_ndbg import NeuralDbg")


def regression_data(steps: int, nan_at: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(10, 1, generator=g)
    data = []
    for step in range(steps):
        inputs = torch.randn(16, 10, generator=g)
        if step == nan_at:
            inputs[3, 4] = float("nan")
        data.append((inputs, inputs @ weights + 0.1 * torch.randn(16, 1, generator=g)))
    return data


def test_the_readme_snippet_explains_a_failure_with_its_best_sentence(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # NeuralDbg(model) writes under ./runs/
    torch.manual_seed(0)
    namespace = {"dataloader": regression_data(40, nan_at=25)}
    exec(compile(readme_code(), str(README), "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    explanations, hypotheses = namespace["explanations"], namespace["hypotheses"]
    assert isinstance(explanations, Explanations) and isinstance(namespace["dbg"], NeuralDbg)
    assert hypotheses and all(isinstance(h, Hypothesis) for h in hypotheses)
    assert explanations == tuple(h.sentence for h in hypotheses)
    assert printed[-1] == explanations[0] == hypotheses[0].sentence  # the whole best sentence, not a character
    assert hypotheses[0].onset == 25 and "non-finite" in explanations[0].lower()
    assert str(explanations).splitlines()[0] == f"1. {hypotheses[0].sentence}"
    assert namespace["chain"] is None  # no vanishing gradient in this run
    assert isinstance(namespace["couplings"], tuple) and all(isinstance(c, CausalLink) for c in namespace["couplings"])


def test_the_readme_snippet_on_a_healthy_run_prints_that_no_failure_was_found(tmp_path: Path, monkeypatch,
                                                                              capsys) -> None:
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace = {"dataloader": regression_data(30)}
    exec(compile(readme_code(), str(README), "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == "No failure found in 30 recorded steps."
    assert str(namespace["explanations"]) == printed[-1] and len(namespace["explanations"]) == 1
    assert namespace["hypotheses"] == () and namespace["chain"] is None and namespace["couplings"] == ()
