# source: https://github.com/buggyyang/CDC_compression/issues/1 — issue: training the conditional diffusion compression model on a new PyTorch raises "one of the variables needed for gradient computation has been modified by an inplace operation" (ResnetBlock's `h += self.mlp(time_emb)[...]` in modules/network_components.py, epsilonparam at 22574047)
# fix-source: https://github.com/buggyyang/CDC_compression/commit/538f0f4fc0fa2c41757dc54547b01d5ae26e9ada — maintainer's "fix inplace operation": h = h + self.mlp(time_emb)[:, :, None, None] (and x = x + ... in FlexiblePrior.cdf)
# expect-kind: none
# fix: ResnetBlock.forward adds the time embedding out of place, h = h + self.mlp(time_emb)[:, :, None, None], so the ReLU output that block1 saved is left intact
import math

import numpy as np
import torch
import torch.nn as nn
from _device import DEVICE


def exists(x):
    return x is not None


def extract(a, t, x_shape):
    b = t.shape[0]
    out = a.gather(-1, t)
    return out.reshape(b, *((1,) * (len(x_shape) - 1)))


def linear_beta_schedule(timesteps):
    return np.linspace(1e-4, 0.02, timesteps, dtype=np.float64)


class LayerNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.g = nn.Parameter(torch.ones(1, dim, 1, 1))
        self.b = nn.Parameter(torch.zeros(1, dim, 1, 1))

    def forward(self, x):
        var = torch.var(x, dim=1, unbiased=False, keepdim=True)
        mean = torch.mean(x, dim=1, keepdim=True)
        return (x - mean) / (var + self.eps).sqrt() * self.g + self.b


class Block(nn.Module):
    def __init__(self, dim, dim_out, large=False):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim_out, 7 if large else 3, padding=3 if large else 1), LayerNorm(dim_out), nn.ReLU()
        )

    def forward(self, x):
        return self.block(x)


class ResnetBlock(nn.Module):
    def __init__(self, dim, dim_out, time_emb_dim=None, large=False):
        super().__init__()
        self.mlp = (
            nn.Sequential(nn.LeakyReLU(0.2), nn.Linear(time_emb_dim, dim_out))
            if exists(time_emb_dim)
            else None
        )
        self.block1 = Block(dim, dim_out, large)
        self.block2 = Block(dim_out, dim_out)
        self.res_conv = nn.Conv2d(dim, dim_out, 1) if dim != dim_out else nn.Identity()

    def forward(self, x, time_emb=None):
        h = self.block1(x)

        if exists(time_emb):
            h = h + self.mlp(time_emb)[:, :, None, None]

        h = self.block2(h)
        return h + self.res_conv(x)


class Downsample(nn.Module):
    def __init__(self, dim_in):
        super().__init__()
        self.conv = nn.Conv2d(dim_in, dim_in, 3, 2, 1)

    def forward(self, x):
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, dim_in):
        super().__init__()
        self.conv = nn.ConvTranspose2d(dim_in, dim_in, 4, 2, 1)

    def forward(self, x):
        return self.conv(x)


class Unet(nn.Module):
    """Two resolutions of the epsilonparam Unet: context concatenated at the first level, time MLP on t/T."""

    def __init__(self, dim, channels=3, context_channels=3):
        super().__init__()
        time_dim = dim
        self.time_mlp = nn.Sequential(nn.Linear(1, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))
        self.downs = nn.ModuleList([
            nn.ModuleList([ResnetBlock(channels + context_channels, dim, time_dim, True),
                           ResnetBlock(dim, dim, time_dim), Downsample(dim)]),
        ])
        self.mid_block1 = ResnetBlock(dim, dim, time_dim)
        self.mid_block2 = ResnetBlock(dim, dim, time_dim)
        self.ups = nn.ModuleList([
            nn.ModuleList([ResnetBlock(dim * 2, dim, time_dim), ResnetBlock(dim, dim, time_dim), nn.Identity()]),
        ])
        self.upsample = Upsample(dim)
        self.final_conv = nn.Sequential(LayerNorm(dim), nn.Conv2d(dim, channels, 7, padding=3))

    def encode(self, x, t, context):
        h = []
        for idx, (backbone, backbone2, downsample) in enumerate(self.downs):
            x = torch.cat([x, context[idx]], dim=1) if idx < len(context) else x
            x = backbone(x, t)
            x = backbone2(x, t)
            h.append(x)
            x = downsample(x)
        x = self.mid_block1(x, t)
        return x, h

    def decode(self, x, h, t):
        x = self.mid_block2(x, t)
        x = self.upsample(x)
        for backbone, backbone2, upsample in self.ups:
            x = torch.cat((x, h.pop()), dim=1)
            x = backbone(x, t)
            x = backbone2(x, t)
            x = upsample(x)
        return self.final_conv(x)

    def forward(self, x, time=None, context=None):
        t = self.time_mlp(time) if exists(self.time_mlp) else None
        x, h = self.encode(x, t, context)
        return self.decode(x, h, t)


class ContextFn(nn.Module):
    """Stand-in for the compression context model: a context feature map and a bits-per-pixel estimate."""

    def __init__(self, channels=3):
        super().__init__()
        self.enc = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, images, bitrate_scale=None):
        c = self.enc(images)
        return {"output": [c], "bpp": c.abs().mean(dim=(1, 2, 3))}

    def get_extra_loss(self):
        return self.enc.bias.abs().sum() * 0.0


class GaussianDiffusion(nn.Module):
    def __init__(self, denoise_fn, context_fn, num_timesteps=20, lagrangian=1e-3):
        super().__init__()
        self.denoise_fn = denoise_fn
        self.context_fn = context_fn
        self.lagrangian_beta = lagrangian
        train_betas = linear_beta_schedule(num_timesteps)
        train_alphas_cumprod = np.cumprod(1.0 - train_betas, axis=0)
        self.num_timesteps = int(num_timesteps)
        to_torch = lambda a: torch.tensor(a, dtype=torch.float32)
        self.register_buffer("train_sqrt_alphas_cumprod", to_torch(np.sqrt(train_alphas_cumprod)))
        self.register_buffer("train_sqrt_one_minus_alphas_cumprod", to_torch(np.sqrt(1.0 - train_alphas_cumprod)))

    def get_extra_loss(self):
        return self.context_fn.get_extra_loss()

    def q_sample(self, x_start, t, noise):
        return (
            extract(self.train_sqrt_alphas_cumprod, t, x_start.shape) * x_start
            + extract(self.train_sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise
        )

    def p_losses(self, x_start, context_dict, t):
        noise = torch.randn_like(x_start)
        x_noisy = self.q_sample(x_start=x_start, t=t, noise=noise)
        fx = self.denoise_fn(x_noisy, t.float().unsqueeze(-1) / self.num_timesteps, context=context_dict["output"])
        err = (noise - fx).abs().mean()
        loss = self.lagrangian_beta * context_dict["bpp"].mean() + err
        return loss

    def forward(self, images):
        B = images.shape[0]
        t = torch.randint(0, self.num_timesteps, (B,), device=images.device).long()
        output_dict = self.context_fn(images, None)
        loss = self.p_losses(images, output_dict, t)
        return loss, self.get_extra_loss()


model = GaussianDiffusion(Unet(dim=8), ContextFn()).to(DEVICE)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)

for step in range(3):
    data = torch.rand(2, 3, 8, 8, device=DEVICE)
    opt.zero_grad()
    loss, aloss = model(data * 2.0 - 1.0)
    loss.backward()
    aloss.backward()
    opt.step()
print("done")
