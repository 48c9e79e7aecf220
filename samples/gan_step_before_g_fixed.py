# expect-kind: none
# fix: score the fakes again with the updated discriminator before the generator loss
import torch
from _device import DEVICE

latent_dim = 4
generator = torch.nn.Sequential(
    torch.nn.Linear(latent_dim, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
).to(DEVICE)
discriminator = torch.nn.Sequential(
    torch.nn.Linear(2, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1), torch.nn.Sigmoid()
).to(DEVICE)
opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)

for it in range(4):
    real = torch.randn(8, 2, device=DEVICE) * 0.5 + 2.0
    z = torch.randn(8, latent_dim, device=DEVICE)
    fake = generator(z)
    prob_real = discriminator(real)
    prob_fake = discriminator(fake)

    d_loss = -torch.mean(torch.log(prob_real) + torch.log(1.0 - prob_fake))

    opt_d.zero_grad()
    d_loss.backward(retain_graph=True)
    opt_d.step()

    g_loss = torch.mean(torch.log(1.0 - discriminator(fake)))
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
print("done")
