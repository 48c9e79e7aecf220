# expect-kind: none
# fix: both gradients at the weights the forward ran with: G's update first (its graph kept for D's loss), then D's, its backward kept off the stepped G with inputs=, as MorvanZhou's tutorial (f52e199) updates G before D
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
    g_loss = torch.mean(torch.log(1.0 - prob_fake))

    opt_g.zero_grad()
    g_loss.backward(retain_graph=True)
    opt_g.step()

    opt_d.zero_grad()
    d_loss.backward(inputs=list(discriminator.parameters()))
    opt_d.step()
print("done")
