# expect-kind: none
# A physics-informed Lightning model whose test differentiates its output with respect to the
# input (the residual of u'' + u = 0), under `torch.enable_grad()`, as pinns-torch's `eval_step`
# does. Lightning runs `trainer.test` under `torch.inference_mode()` unless the trainer is built
# with `inference_mode=False`, and `enable_grad()` does not leave inference mode: `u` is an
# inference tensor, with no graph for `autograd.grad`. The only user frames are `test_step`,
# `residual` and `trainer.test(...)`.
import lightning as L
import torch
from _device import DEVICE


class Oscillator(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def residual(self, t):
        t = t.requires_grad_(True)
        u = self.net(t)
        du = torch.autograd.grad(u.sum(), t, create_graph=True)[0]
        ddu = torch.autograd.grad(du.sum(), t, create_graph=True)[0]
        return ddu + u

    def training_step(self, batch, batch_idx):
        (t,) = batch
        return self.residual(t.clone()).pow(2).mean()

    def test_step(self, batch, batch_idx):
        (t,) = batch
        with torch.enable_grad():
            self.log("test_residual", self.residual(t.clone()).pow(2).mean().detach())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.TensorDataset(torch.rand(8, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
trainer = L.Trainer(max_epochs=2, accelerator=DEVICE.type, devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, inference_mode=False)
model = Oscillator()
trainer.fit(model, loader)
trainer.test(model, loader, verbose=False)
print("done")
