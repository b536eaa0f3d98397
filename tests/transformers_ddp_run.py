"""Two CPU ranks of a Hugging Face ``Trainer`` run under ``torchrun`` (gloo) with ``ComgraCallback``: rank 1
edits one weight under ``torch.no_grad()`` once two optimizer steps are done, a desync DDP does not repair.
The world-process zero writes what its callback found to ``<folder>/result.json``
(``tests/test_integrations_transformers.py``).

Run as ``torchrun --nproc-per-node 2 tests/transformers_ddp_run.py <folder>``.
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
import transformers
from torch import nn

from comgra_ndbg.integrations.transformers import ComgraCallback

EDIT_AFTER = 2  # rank 1's weight is edited once this many optimizer steps are done


class TinyClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.net(x)
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}


class EditOnRankOne(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kwargs) -> None:
        if args.process_index == 1 and state.global_step == EDIT_AFTER:
            with torch.no_grad():
                model.net[0].weight[0, 0] += 0.01


def main(folder: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    data = [{"x": x[i], "labels": y[i]} for i in range(64)]
    args = transformers.TrainingArguments(
        output_dir=str(folder / "out"), per_device_train_batch_size=8, max_steps=4, learning_rate=0.005,
        lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        ddp_backend="gloo", disable_tqdm=True, seed=0, dataloader_num_workers=0)
    callback = ComgraCallback(folder / "runs", trial="hf-ddp")
    trainer = transformers.Trainer(model=TinyClassifier(), args=args, train_dataset=data,
                                   callbacks=[EditOnRankOne(), callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    if trainer.is_world_process_zero():
        diagnosis = callback.diagnosis
        (folder / "result.json").write_text(json.dumps({
            "steps": diagnosis.num_steps,
            "hypotheses": [[h.type, h.node, h.onset, h.sentence] for h in diagnosis.hypotheses]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
