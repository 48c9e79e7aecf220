# expect-kind: second-backward
# expect-culprit: fake
# A GAN under Hugging Face accelerate: the discriminator's loss back-propagates into the
# generator through `fake`, freeing the generator's graph that the generator's own loss needs.
# The right fix detaches `fake` for the discriminator's update only; detaching it for the
# generator's too would run, and the generator would never train.
import torch
from _device import DEVICE
from accelerate import Accelerator

accelerator = Accelerator(cpu=DEVICE.type == "cpu")
G = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
D = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
G, D, opt_g, opt_d = accelerator.prepare(G, D, opt_g, opt_d)
bce = torch.nn.BCEWithLogitsLoss()
ones = torch.ones(16, 1, device=accelerator.device)
zeros = torch.zeros(16, 1, device=accelerator.device)
for step in range(3):
    real = torch.randn(16, 2, device=accelerator.device) * 0.5 + 1.0
    fake = G(torch.randn(16, 4, device=accelerator.device))  # culprit
    d_loss = bce(D(real), ones) + bce(D(fake), zeros)
    opt_d.zero_grad()
    accelerator.backward(d_loss)
    opt_d.step()
    g_loss = bce(D(fake), ones)
    opt_g.zero_grad()
    accelerator.backward(g_loss)
    opt_g.step()
