"""Two CPU ranks of a Lightning ``Trainer(strategy="ddp")`` run with ``ComgraCallback`` (gloo): rank 1 edits
one weight under ``torch.no_grad()`` after its second optimizer step, a desync DDP does not repair. The
callback hooks the network ``training_step`` calls (``module="net"``). Lightning
starts rank 1 by running this script again. Global rank zero writes what its callback found to
``<folder>/result.json`` (``tests/test_integrations_lightning.py``).

Run as ``python tests/lightning_ddp_run.py <folder>``; it exits non-zero when a rank fails.
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn

from comgra_ndbg.integrations.lightning import ComgraCallback

EDIT_AFTER = 2  # rank 1's weight is edited once this many optimizer steps are done


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs: object, batch: tuple, batch_idx: int) -> None:
        if self.global_rank == 1 and self.trainer.global_step == EDIT_AFTER:
            with torch.no_grad():
                self.net[0].weight[0, 0] += 0.01

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(folder: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long())
    callback = ComgraCallback(folder / "runs", module="net")
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", limit_train_batches=4,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(folder), callbacks=[callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=8))
    if trainer.is_global_zero:
        diagnosis = callback.diagnosis
        (folder / "result.json").write_text(json.dumps({
            "path": str(callback.path), "steps": diagnosis.num_steps,
            "hypotheses": [[h.type, h.node, h.onset, h.sentence] for h in diagnosis.hypotheses]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
