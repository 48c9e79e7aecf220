# source: https://github.com/UCSC-VLAA/MicroDiffusion/issues/2 — running code/train.py (stage 2, the conditional diffusion model on top of the pretrained INR) fails at loss.backward() with "RuntimeError: Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed)"
# fix-source: https://github.com/UCSC-VLAA/MicroDiffusion/commit/b96cb61f53f6f5378b9b74a5720370c882753121 — the maintainer (TheFllood, who answered the issue) deletes the second `loss.backward(); optimizer.step()` of the training loop, the same day
# expect-kind: none
# fix: delete the repeated `loss.backward(); optimizer.step()` after the first update, as the maintainer did in b96cb61
"""code/train.py of MicroDiffusion at b96cb61^ (its training loop as written), with tiny stand-ins:
Unet -> a two-conv eps net conditioned on cemb; INREmbedding (ResNet-18 image encoder) -> one conv
and a Linear; OfficialNerfMean (the pretrained INR, normally loaded from a checkpoint) -> a small
MLP on positional encodings; DataLoaderAnyFolder -> random slices; GradualWarmupScheduler -> the
cosine scheduler alone; encode_position -> [p, sin(2^k p), cos(2^k p)] for k < 10 (21 features).
"""
import itertools

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim
from torch import nn
from _device import DEVICE


def encode_position(x, levels=10):
    out = [x]
    for k in range(levels):
        out += [torch.sin(2.0 ** k * x), torch.cos(2.0 ** k * x)]
    return torch.cat(out, -1)


def get_named_beta_schedule(num_diffusion_timesteps):
    scale = 1000 / num_diffusion_timesteps
    return np.linspace(scale * 0.0001, scale * 0.02, num_diffusion_timesteps, dtype=np.float64)


class Unet(nn.Module):
    def __init__(self, in_ch=1, mod_ch=8, out_ch=1, cdim=16):
        super().__init__()
        self.inc = nn.Conv2d(in_ch, mod_ch, 3, padding=1)
        self.cemb = nn.Linear(cdim, mod_ch)
        self.temb = nn.Embedding(1000, mod_ch)
        self.out = nn.Conv2d(mod_ch, out_ch, 3, padding=1)

    def forward(self, x, t, cemb):
        h = self.inc(x) + (self.temb(t) + self.cemb(cemb))[:, :, None, None]
        return self.out(F.silu(h))


class ConditionalEmbedding(nn.Module):
    def __init__(self, num_labels: int, d_model: int, dim: int):
        assert d_model % 2 == 0
        super().__init__()
        self.condEmbedding = nn.Sequential(
            nn.Linear(num_labels, d_model),
            nn.Linear(d_model, dim),
            nn.SiLU(),
            nn.Linear(dim, dim),
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        emb = self.condEmbedding(t)
        return emb


class INREmbedding(nn.Module):
    def __init__(self, feature_emb=8, H=8, W=8):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.fc = nn.Linear(4 * (H // 2) * (W // 2), feature_emb)

    def forward(self, x):
        out = self.conv1(x)
        return self.fc(out.view(out.size(0), -1))


class OfficialNerfMean(nn.Module):
    def __init__(self, hidden_dims=16):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(3, hidden_dims), nn.ReLU(), nn.Linear(hidden_dims, 1))

    def forward(self, pos_enc, params=None, _=None, z_total=None, z_sample=None, test=True):
        # (6, H, W, 3) positions -> (6, 6, H, W, 1): one (6, H, W, 1) rendering per sampled z
        return self.layers(pos_enc).unsqueeze(0).expand(pos_enc.shape[0], -1, -1, -1, -1)


class GaussianDiffusion(nn.Module):
    def __init__(self, dtype, model, betas, w, v, device):
        super().__init__()
        self.dtype = dtype
        self.model = model.to(device)
        self.betas = torch.tensor(betas, dtype=self.dtype)
        self.w = w
        self.v = v
        self.T = len(betas)
        self.device = device
        self.alphas = 1 - self.betas
        self.alphas_bar = torch.cumprod(self.alphas, dim=0)
        self.sqrt_alphas_bar = torch.sqrt(self.alphas_bar)
        self.sqrt_one_minus_alphas_bar = torch.sqrt(1 - self.alphas_bar)

    @staticmethod
    def _extract(coef, t, x_shape):
        chosen = coef.to(t.device)[t]
        return chosen.reshape(t.shape[0], *([1] * (len(x_shape) - 1)))

    def q_sample(self, x_0, t):
        eps = torch.randn_like(x_0, requires_grad=False)
        return self._extract(self.sqrt_alphas_bar, t, x_0.shape) * x_0 \
            + self._extract(self.sqrt_one_minus_alphas_bar, t, x_0.shape) * eps, eps

    def trainloss(self, x_inter, x_0, cembs):
        pred_eps_total = []
        eps_total = []
        t = torch.randint(self.T, size=(x_0.shape[0],), device=self.device)

        x_inter = torch.mean(torch.stack(x_inter).squeeze(dim=1), dim=0).unsqueeze(0)
        cemb = torch.mean(torch.stack(cembs).squeeze(dim=1), dim=0).unsqueeze(0)
        x_0 = 0.1 * x_0 + 0.9 * x_inter
        x_t, eps = self.q_sample(x_0, t)
        pred_eps = self.model(x_t, t, cemb=cemb)
        eps_total.append(eps)
        pred_eps_total.append(pred_eps)

        pred_eps_total = torch.stack(pred_eps_total, dim=0).to(x_0.device)
        eps_total = torch.stack(eps_total, dim=0).to(x_0.device)

        pred_eps_mean = torch.mean(pred_eps_total, dim=0).squeeze()
        eps_mean = torch.mean(eps_total, dim=0).squeeze()

        loss = F.mse_loss(pred_eps_mean, eps_mean, reduction='mean')
        return loss, pred_eps_total


def get_all_pos_enc(H, W, z_total, device):
    xs = torch.arange(-1, 1, 2.0 / H)
    ys = torch.arange(-1, 1, 2.0 / W)
    zs = torch.arange(z_total) * 2.0 / z_total - 1.0
    grid = torch.stack(torch.meshgrid(zs, xs, ys, indexing="ij"), -1)  # (z, H, W, [z, x, y])
    return grid[..., [1, 2, 0]].to(device)


def train(epochs=2, H=8, W=8, n_imgs=18, cdim=8, device=DEVICE):
    imgs = torch.rand(n_imgs, H, W, 1, device=device)  # data_loader.imgs

    net = Unet(in_ch=1, mod_ch=8, out_ch=1, cdim=cdim + 8)
    cemblayer = ConditionalEmbedding(21, cdim, cdim).to(device)
    inremblayer = INREmbedding(feature_emb=8, H=H, W=W).to(device)
    model = OfficialNerfMean(16).to(device)  # pretrained INR
    lastepc = 0

    betas = get_named_beta_schedule(num_diffusion_timesteps=10)
    diffusion = GaussianDiffusion(dtype=torch.float32, model=net, betas=betas, w=1.8, v=0.3, device=device)

    optimizer = torch.optim.AdamW(
        itertools.chain(
            diffusion.model.parameters(),
            cemblayer.parameters(),
            inremblayer.parameters(),
        ),
        lr=1e-3,
        weight_decay=1e-4
    )
    cosineScheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer=optimizer, T_max=epochs, eta_min=0)

    z_total = n_imgs
    total_pos_enc = get_all_pos_enc(H, W, z_total, device)

    for epc in range(lastepc, epochs):
        diffusion.model.train()
        cemblayer.train()
        model.train()
        inremblayer.train()

        for z_space in range(3, n_imgs - 3, 6):
            z = 2 * z_space / n_imgs - 1.0  # Normalize -1, 1

            total_tmp = total_pos_enc[z_space - 3:z_space + 3, :, :, :].clone()
            rendered = model(total_tmp, None, None, z_total, 6, test=True)
            rendered = rendered[0, :, :, :, :] * 0.05 + rendered[1, :, :, :, :] * 0.15 + \
                rendered[2, :, :, :, :] * 0.3 + \
                rendered[3, :, :, :, :] * 0.3 + \
                rendered[4, :, :, :, :] * 0.15 + \
                rendered[5, :, :, :, :] * 0.05
            # Condition from INR

            # Artificat Input image; Ground truth
            img = imgs[z_space - 3:z_space + 3].mean(dim=0).squeeze(0)
            img = img.permute(2, 0, 1)
            img = img.unsqueeze(0)

            optimizer.zero_grad()
            x_0 = img.to(device)
            cembs = []
            inters = []
            inr_feature = inremblayer(x_0)
            for i in range(-3, 3):
                z_tmp = z + i * (2.0 / n_imgs)
                lab = encode_position(torch.tensor([[z_tmp]]).float())
                lab = lab.to(device)
                cemb = cemblayer(lab)
                inter = rendered[i + 3].permute(2, 0, 1)
                cembcat = torch.cat([cemb, inr_feature], 1)
                cembs.append(cembcat)
                inters.append(inter)
            loss, generated = diffusion.trainloss(inters, x_0, cembs=cembs)
            loss.backward()
            optimizer.step()

        cosineScheduler.step()


if __name__ == "__main__":
    torch.manual_seed(0)
    train()
    print("done")
