# expect-kind: none
# fix: the discriminator's update sees `fake` detached; the generator's still trains through it
# A GAN in Lightning with manual optimization: `self.manual_backward(d_loss)` back-propagates
# the discriminator's loss into the generator through `fake` and frees the generator's graph,
# which `self.manual_backward(g_loss)` needs. Lightning's own frames sit between the user's
# `training_step` and the backward; the fix detaches `fake` for the discriminator only, so the
# generator still trains.
import lightning as L
import torch
from _device import DEVICE


class GAN(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.G = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        self.D = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        self.bce = torch.nn.BCEWithLogitsLoss()

    def training_step(self, batch, batch_idx):
        opt_g, opt_d = self.optimizers()
        (real,) = batch
        ones = torch.ones(real.size(0), 1, device=self.device)
        zeros = torch.zeros(real.size(0), 1, device=self.device)
        fake = self.G(torch.randn(real.size(0), 4, device=self.device))
        d_loss = self.bce(self.D(real), ones) + self.bce(self.D(fake.detach()), zeros)
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = self.bce(self.D(fake), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()

    def configure_optimizers(self):
        return torch.optim.Adam(self.G.parameters(), lr=1e-3), torch.optim.Adam(self.D.parameters(), lr=1e-3)


loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(48, 2) * 0.5 + 1), batch_size=16)
trainer = L.Trainer(max_epochs=1, accelerator=DEVICE.type, devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(GAN(), loader)
