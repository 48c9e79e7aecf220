# expect-kind: none
# fix: the state re-enters each batch detached (none on the first)
# A Lightning forecaster (automatic optimization) that keeps its GRU state on `self` between
# batches: Lightning calls `training_step` and then the backward, from its own loops, so the
# only user frame on the stack is `trainer.fit(model, loader)`. The explanation still names the user's
# `self.hidden` at its line in `training_step`, and detaches it there.
import lightning as L
import torch
from _device import DEVICE


class Forecaster(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.GRU(3, 5, batch_first=True)
        self.head = torch.nn.Linear(5, 1)
        self.hidden = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.hidden is not None:
            self.hidden = self.hidden.detach()
        out, self.hidden = self.rnn(x, self.hidden)
        return torch.nn.functional.mse_loss(self.head(out), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.TensorDataset(torch.randn(8, 4, 3), torch.randn(8, 4, 1))
loader = torch.utils.data.DataLoader(data, batch_size=2)
trainer = L.Trainer(max_epochs=1, accelerator=DEVICE.type, devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
model = Forecaster()
trainer.fit(model, loader)
