# source: https://whosebug.com/question/5232549/How-does-PyTorch-s-loss-backward-work-when-retain-graph-True-is-specified — Stack Overflow question (mirrored): a GAN trained generator-first computes loss_g and loss_d from one G(z); loss_d.backward() after loss_g.backward() fails
# fix-source: https://whosebug.com/question/5232549/How-does-PyTorch-s-loss-backward-work-when-retain-graph-True-is-specified — accepted answer: retain_graph=True only hides the bug; the discriminator's loss must take the generator's output detached
# expect-kind: second-backward
# expect-culprit: fake
import torch
import torch.nn as nn
import torch.optim as optim
from _device import DEVICE

generator = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6)).to(DEVICE)
discriminator = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1)).to(DEVICE)
optim_g = optim.Adam(generator.parameters(), lr=1e-3)
optim_d = optim.Adam(discriminator.parameters(), lr=1e-3)
criterion = nn.BCEWithLogitsLoss()

for step in range(3):
    real = torch.randn(5, 6, device=DEVICE)
    z = torch.randn(5, 4, device=DEVICE)
    ones = torch.ones(5, 1, device=DEVICE)
    zeros = torch.zeros(5, 1, device=DEVICE)

    # computing loss_g and loss_d...
    fake = generator(z)  # culprit
    loss_g = criterion(discriminator(fake), ones)
    loss_d = criterion(discriminator(real), ones) + criterion(discriminator(fake), zeros)

    optim_g.zero_grad()
    loss_g.backward()
    optim_g.step()

    optim_d.zero_grad()
    loss_d.backward()
    optim_d.step()
    print("step", step, round(loss_g.item(), 4), round(loss_d.item(), 4))

print("done")
