# expect-kind: second-backward
# expect-culprit: fake
import torch
from _device import DEVICE

latent_dim = 4
generator = torch.nn.Sequential(
    torch.nn.Linear(latent_dim, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
).to(DEVICE)
discriminator = torch.nn.Sequential(
    torch.nn.Linear(2, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1)
).to(DEVICE)
opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
bce = torch.nn.BCEWithLogitsLoss()

for it in range(4):
    real = torch.randn(8, 2, device=DEVICE) * 0.5 + 2.0
    z = torch.randn(8, latent_dim, device=DEVICE)
    ones = torch.ones(8, 1, device=DEVICE)
    zeros = torch.zeros(8, 1, device=DEVICE)
    fake = generator(z)  # culprit

    # discriminator step
    d_loss = bce(discriminator(real), ones) + bce(discriminator(fake), zeros)
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()

    # generator step
    g_loss = bce(discriminator(fake), ones)
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
print("done")
