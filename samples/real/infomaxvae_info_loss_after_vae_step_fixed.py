# source: https://github.com/AliLotfi92/InfoMaxVAE/issues/1 — InfoMax-VAE training: the mutual-information critic's info_loss.backward() runs after optim_VAE.step() changed the encoder it back-propagates through
# fix-source: https://github.com/AliLotfi92/InfoMaxVAE/commit/91c9530 — maintainer's main.py: info_loss.backward(inputs=list(D.parameters())), the critic's backward stops at D's own parameters
# expect-kind: none
# fix: the critic's backward is restricted to the critic (info_loss.backward(inputs=list(D.parameters()))), so it no longer runs back into the encoder that optim_VAE.step() changed
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from _device import DEVICE

N_PIX = 16  # a 4x4 "image" (784 in the original)


class Discriminator(nn.Module):
    def __init__(self, z_dim=2):
        super(Discriminator, self).__init__()
        self.z_dim = z_dim
        self.net = nn.Sequential(
            nn.Linear(N_PIX + z_dim, 12),
            nn.ReLU(True),
            nn.Linear(12, 8),
            nn.ReLU(True),
            nn.Linear(8, 1),
        )

    def forward(self, x, z):
        x = x.view(-1, N_PIX)
        x = torch.cat((x, z), 1)
        return self.net(x).squeeze()


class VAE1(nn.Module):
    def __init__(self, z_dim=2):
        super(VAE1, self).__init__()
        self.z_dim = z_dim
        self.encode = nn.Sequential(
            nn.Linear(N_PIX, 12),
            nn.ReLU(True),
            nn.Linear(12, 12),
            nn.ReLU(True),
            nn.Linear(12, 2 * z_dim),
        )
        self.decode = nn.Sequential(
            nn.Linear(z_dim, 12),
            nn.ReLU(True),
            nn.Linear(12, N_PIX),
            nn.Sigmoid(),
        )

    def reparametrize(self, mu, logvar):
        std = logvar.mul(0.5).exp_()
        eps = std.data.new(std.size()).normal_()
        return eps.mul(std).add_(mu)

    def forward(self, x):
        stats = self.encode(x.view(-1, N_PIX))
        mu = stats[:, :self.z_dim]
        logvar = stats[:, self.z_dim:]
        z = self.reparametrize(mu, logvar)
        x_recon = self.decode(z).view(x.size())
        return x_recon, mu, logvar, z.squeeze()


def recon_loss(x_recon, x):
    n = x.size(0)
    return F.binary_cross_entropy(x_recon, x, reduction="sum").div(n)


def kl_divergence(mu, logvar):
    return -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(1).mean()


def permute_dims(z):
    assert z.dim() == 2
    B, _ = z.size()
    perm = torch.randperm(B).to(DEVICE)
    return z[perm]


max_iter = 2
batch_size = 8
z_dim = 2
lr_D = 0.0001
beta1_D = 0.9
beta2_D = 0.999
gamma = 10

data_loader = [(torch.rand(batch_size, 1, 4, 4), torch.zeros(batch_size)) for _ in range(2)]

VAE = VAE1(z_dim).to(DEVICE)
D = Discriminator(z_dim).to(DEVICE)
optim_VAE = optim.Adam(VAE.parameters(), lr=lr_D, betas=(beta1_D, beta2_D))
optim_D = optim.Adam(D.parameters(), lr=0.00001, betas=(beta1_D, beta2_D))

for epoch in range(max_iter):
    train_loss = 0
    train_info_loss = 0
    for batch_idx, (x_true, _) in enumerate(data_loader):
        x_true = x_true.to(DEVICE)
        x_recon, mu, logvar, z = VAE(x_true)

        D_xz = D(x_true, z)
        z_perm = permute_dims(z)
        D_x_z = D(x_true, z_perm)

        Info_xz = -(D_xz.mean() - (torch.exp(D_x_z - 1).mean()))

        vae_recon_loss = recon_loss(x_recon, x_true)
        vae_kld = kl_divergence(mu, logvar)

        vae_loss = vae_recon_loss + vae_kld + gamma * Info_xz

        optim_VAE.zero_grad()
        vae_loss.backward(retain_graph=True)
        optim_VAE.step()

        info_loss = Info_xz

        train_loss += vae_loss.item()
        train_info_loss += -info_loss.item()

        optim_D.zero_grad()
        info_loss.backward(inputs=list(D.parameters()))
        optim_D.step()

    print("epoch", epoch, "loss", round(train_loss / (batch_idx + 1), 4), "info", round(train_info_loss / (batch_idx + 1), 4))

print("done")
