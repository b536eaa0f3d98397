"""The recipes of docs/neuraldbg.md run as they are written, and record what they say they record."""
from __future__ import annotations

import functools
import re
import warnings
from pathlib import Path

import pytest
import torch

from comgra_ndbg import NeuralDbg, RecorderWarning, open_recording
from comgra_ndbg.instrument import patches

DOC = Path(__file__).parent.parent / "docs" / "neuraldbg.md"


def recipes() -> dict[str, str]:
    """Title -> code of each ``### title`` of the Recipes section (its one Python block)."""
    text = DOC.read_text()
    section = text[text.index("\n## Recipes\n"):]
    section = section[:section.index("\n## ", 1)]
    found = {}
    for part in section.split("\n### ")[1:]:
        title = part.splitlines()[0].strip()
        blocks = re.findall(r"```python\n(.*?)```", part, re.S)
        assert len(blocks) == 1, f"recipe {title!r} has {len(blocks)} code blocks"
        found[title] = blocks[0]
    return found


RECIPES = recipes()


def test_the_recipes_cover_the_patterns_users_train_with() -> None:
    assert list(RECIPES) == ["GAN: two models, two optimizers", "Frozen backbone", "Gradient accumulation",
                             "Mixed precision: autocast, GradScaler, clipping", "torch.compile",
                             "Activation checkpointing", "Custom training steps"]


@pytest.mark.parametrize("title", list(RECIPES))
def test_a_recipe_runs_as_written_and_records_one_step_per_update(title: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # NeuralDbg(model) records under ./runs/
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", functools.partial(compile_, backend="aot_eager"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    namespace: dict = {"__name__": "recipe"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(RECIPES[title], f"{DOC}: {title}", "exec"), namespace)
    torch._dynamo.reset()
    assert [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)] == []
    assert not patches.installed()
    dbgs = [value for value in namespace.values() if isinstance(value, NeuralDbg)]
    assert dbgs
    for dbg in dbgs:
        assert dbg.steps == 3
        with open_recording(dbg.path) as rec:
            assert rec.steps.tolist() == [0, 1, 2] and rec.kpi("loss")[0].tolist() == [0, 1, 2]
            graph = rec.graph("train").graph
            linked = {e.source for e in graph.edges} | {e.target for e in graph.edges}
            assert sorted(set(graph.node_names) - linked) == []
            assert {"input", "model", "loss"} <= linked
            if title == "Gradient accumulation":
                assert rec.step_iterations.tolist() == [4, 4, 4]
            if title == "Frozen backbone":
                assert rec.kinds("model.0.0.weight") == ["value"]
            if title == "Custom training steps":
                assert rec.kpi("accuracy")[0].tolist() == [0, 1, 2]
