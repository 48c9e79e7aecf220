# source: https://github.com/lucidrains/denoising-diffusion-pytorch/issues/109 — training GaussianDiffusion step by step, the first loss.backward() works and the second raises "RuntimeError: Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed) ..."
# fix-source: https://github.com/lucidrains/denoising-diffusion-pytorch/issues/109 — the reporter's resolution (comment of 2022-10-31), acknowledged by the maintainer, who closed the issue: the conv1D that reshapes the data to the network's input was run once outside the training loop; it is moved into the loop so each step builds its own graph
# expect-kind: second-backward
# expect-culprit: training_images
import torch
import torch.nn as nn
import torch.nn.functional as F

from _device import DEVICE


def normalize_to_neg_one_to_one(img):
    return img * 2 - 1


def extract(a, t, x_shape):
    b, *_ = t.shape
    out = a.gather(-1, t)
    return out.reshape(b, *((1,) * (len(x_shape) - 1)))


def linear_beta_schedule(timesteps):
    scale = 1000 / timesteps
    return torch.linspace(scale * 0.0001, scale * 0.02, timesteps, dtype=torch.float64)


class Unet(nn.Module):
    """A very small stand-in for the library's Unet: conv in, time embedding, conv out."""

    def __init__(self, dim, channels=3):
        super().__init__()
        self.channels = channels
        self.init_conv = nn.Conv2d(channels, dim, 3, padding=1)
        self.time_mlp = nn.Sequential(nn.Linear(1, dim), nn.GELU(), nn.Linear(dim, dim))
        self.mid = nn.Conv2d(dim, dim, 3, padding=1)
        self.final_conv = nn.Conv2d(dim, channels, 1)

    def forward(self, x, time, x_self_cond=None):
        h = self.init_conv(x)
        emb = self.time_mlp(time.float().unsqueeze(-1) / 1000)
        h = F.silu(self.mid(h + emb[:, :, None, None]))
        return self.final_conv(h)


class GaussianDiffusion(nn.Module):
    def __init__(self, model, image_size, timesteps=1000, loss_type='l1'):
        super().__init__()
        self.model = model
        self.channels = model.channels
        self.image_size = image_size
        self.loss_type = loss_type

        betas = linear_beta_schedule(timesteps)
        alphas_cumprod = torch.cumprod(1. - betas, dim=0)
        self.num_timesteps = int(timesteps)

        register_buffer = lambda name, val: self.register_buffer(name, val.to(torch.float32))
        register_buffer('sqrt_alphas_cumprod', torch.sqrt(alphas_cumprod))
        register_buffer('sqrt_one_minus_alphas_cumprod', torch.sqrt(1. - alphas_cumprod))

    def q_sample(self, x_start, t, noise=None):
        noise = noise if noise is not None else torch.randn_like(x_start)
        return (extract(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start +
                extract(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise)

    @property
    def loss_fn(self):
        return F.l1_loss if self.loss_type == 'l1' else F.mse_loss

    def p_losses(self, x_start, t, noise=None):
        noise = noise if noise is not None else torch.randn_like(x_start)
        x = self.q_sample(x_start=x_start, t=t, noise=noise)
        model_out = self.model(x, t)
        loss = self.loss_fn(model_out, noise, reduction='none')
        return loss.mean()

    def forward(self, img, *args, **kwargs):
        b, c, h, w, device, img_size = *img.shape, img.device, self.image_size
        assert h == img_size and w == img_size, f'height and width of image must be {img_size}'
        t = torch.randint(0, self.num_timesteps, (b,), device=device).long()
        img = normalize_to_neg_one_to_one(img)
        return self.p_losses(img, t, *args, **kwargs)


image_size = 8
model = Unet(dim=16).to(DEVICE)
diffusion = GaussianDiffusion(model, image_size=image_size, timesteps=100, loss_type='l1').to(DEVICE)
optimizer = torch.optim.Adam(diffusion.parameters(), lr=1e-4)

# the raw data are 1-D signals; a conv1D maps them to 3 channels, then they are folded to 8x8 "images"
raw_signals = torch.rand(4, 2, image_size * image_size, device=DEVICE)
to_input = nn.Conv1d(in_channels=2, out_channels=3, kernel_size=1).to(DEVICE)
training_images = torch.sigmoid(to_input(raw_signals)).view(4, 3, image_size, image_size)  # culprit

for step in range(4):
    loss = diffusion(training_images)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print('done')
