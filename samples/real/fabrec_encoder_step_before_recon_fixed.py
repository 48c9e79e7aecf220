# source: https://github.com/browatbn2/3FabRec/issues/3 — training the autoencoder with PyTorch 1.5 raises the in-place error at loss.backward() in _run_batch
# fix-source: https://github.com/browatbn2/3FabRec/commit/d67ca0e0c3eca93c0377035862dddfc82f7af279 — maintainer's fix: no separate encoder update step in update_encoding()
# expect-kind: none
# fix: drop update_encoding's separate optimizer_E.step() (and the Q.zero_grad() that would wipe loss_E's gradients), so the encoder steps once after loss.backward()
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from _device import DEVICE

eps = 1e-8


def loss_recon(X, X_recon, reduction='mean'):
    diff = torch.abs(X - X_recon) * 255
    l1_dist_per_img = diff.reshape(len(X), -1).mean(dim=1)
    return l1_dist_per_img.mean()


class Encoder(nn.Module):
    # stands in for resnet_ae.resnet18: features, then the fc layer that outputs z
    def __init__(self, z_dim):
        super(Encoder, self).__init__()
        self.features = nn.Sequential(nn.Linear(12, 16), nn.ReLU())
        self.fc = nn.Linear(16, z_dim)

    def forward(self, x):
        return self.fc(self.features(x))


class D_net_gauss(nn.Module):
    def __init__(self, z_dim, N=16):
        super(D_net_gauss, self).__init__()
        self.lin1 = nn.Linear(z_dim, N)
        self.lin2 = nn.Linear(N, N)
        self.lin3 = nn.Linear(N, 1)

    def forward(self, x):
        x = F.dropout(self.lin1(x), p=0.2, training=self.training)
        x = F.relu(x)
        x = F.dropout(self.lin2(x), p=0.2, training=self.training)
        x = F.relu(x)
        return torch.sigmoid(self.lin3(x))


class AAE(nn.Module):
    def __init__(self, z_dim=6):
        super(AAE, self).__init__()
        self.z_dim = z_dim
        self.Q = Encoder(z_dim)
        self.P = nn.Sequential(nn.Linear(z_dim, 20), nn.ReLU(), nn.Linear(20, 12))
        self.D_z = D_net_gauss(self.z_dim)


class Args:
    lr = 1e-3
    beta1 = 0.0
    beta2 = 0.999
    train_encoder = True
    train_decoder = True
    with_zgan = True
    w_rec = 1.0


class AAEUnsupervisedTraining(object):
    def __init__(self, args):
        self.args = args
        self.saae = AAE().to(DEVICE)
        self.iter_in_epoch = 0
        self.enc_rand_like = torch.randn_like
        betas = (self.args.beta1, self.args.beta2)
        Q_params = list(filter(lambda p: p.requires_grad, self.saae.Q.parameters()))
        self.optimizer_E = optim.Adam(Q_params, lr=args.lr, betas=betas)
        self.optimizer_G = optim.Adam(self.saae.P.parameters(), lr=args.lr, betas=betas)
        self.optimizer_D_z = optim.Adam(self.saae.D_z.parameters(), lr=args.lr, betas=betas)

    def update_encoding(self, z_sample):
        stats = {}
        # Discriminator
        if self.iter_in_epoch % 4 == 0:
            z_real = self.enc_rand_like(z_sample).to(DEVICE)
            D_real = self.saae.D_z(z_real)
            D_fake = self.saae.D_z(z_sample.detach())
            loss_D_z = -torch.mean(torch.log(D_real + eps) + torch.log(1 - D_fake + eps))
            loss_D_z.backward()
            self.optimizer_D_z.step()
            stats['loss_D_z'] = loss_D_z.item()

        # Encoder gaussian loss
        if self.iter_in_epoch % 2 == 0:
            D_fake = self.saae.D_z(z_sample)
            loss_E = -torch.mean(torch.log(D_fake + eps))
            loss_E.backward(retain_graph=True)
            stats['loss_E'] = loss_E.item()

        return stats

    def _run_batch(self, images, eval=False):
        iter_stats = {}
        X_target = images

        self.saae.zero_grad()
        loss = torch.zeros(1, requires_grad=True).to(DEVICE)

        # Encoding
        with torch.set_grad_enabled(self.args.train_encoder):
            z_sample = self.saae.Q(images)

            # Encoding regularization
            if not eval and self.args.with_zgan and self.args.train_encoder:
                encoding = self.update_encoding(z_sample)
                iter_stats.update(encoding)

        iter_stats['z_recon_mean'] = z_sample.mean().item()

        # Decoding
        if not self.args.train_encoder:
            z_sample = z_sample.detach()

        with torch.set_grad_enabled(self.args.train_decoder):
            # reconstruct images
            X_recon = self.saae.P(z_sample)

            # Reconstruction loss
            loss_recon_ = loss_recon(X_target, X_recon)
            loss = loss_recon_ * self.args.w_rec
            iter_stats['loss_recon'] = loss_recon_.item()
            iter_stats['loss'] = loss.item()

            if self.args.train_decoder:
                loss.backward()

            # Update auto-encoder
            if not eval:
                if self.args.train_encoder:
                    self.optimizer_E.step()
                if self.args.train_decoder:
                    self.optimizer_G.step()
        return iter_stats

    def train(self, num_batches):
        for i in range(num_batches):
            images = torch.randn(8, 12, device=DEVICE)
            self._run_batch(images)
            self.iter_in_epoch += 1


fntr = AAEUnsupervisedTraining(Args())
fntr.train(num_batches=4)
print("done")
