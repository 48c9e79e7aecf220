# source: https://github.com/yuval-alaluf/restyle-encoder/issues/15 — training ReStyle from a converted StyleGAN2 without a saved latent_avg fails: "Trying to backward through the graph a second time"
# fix-source: https://github.com/yuval-alaluf/restyle-encoder/pull/16 (commit 4097d6f, merged by the maintainer) — estimate latent_avg as self.net.decoder.mean_latent(int(1e5))[0].detach()
# expect-kind: second-backward
# expect-culprit: self.net.latent_avg
import math
from types import SimpleNamespace

import torch
from torch import nn
import torch.nn.functional as F
from _device import DEVICE


class PixelNorm(nn.Module):
    def forward(self, input):
        return input * torch.rsqrt(torch.mean(input ** 2, dim=1, keepdim=True) + 1e-8)


class ConstantInput(nn.Module):
    def __init__(self, channel, size=4):
        super().__init__()
        self.input = nn.Parameter(torch.randn(1, channel, size, size))

    def forward(self, batch):
        return self.input.repeat(batch, 1, 1, 1)


class Generator(nn.Module):
    def __init__(self, size, style_dim, n_mlp):
        super().__init__()
        self.size = size
        self.style_dim = style_dim
        layers = [PixelNorm()]
        for i in range(n_mlp):
            layers.append(nn.Linear(style_dim, style_dim))
            layers.append(nn.LeakyReLU(0.2))
        self.style = nn.Sequential(*layers)
        self.input = ConstantInput(style_dim)
        self.n_latent = int(math.log(size, 2)) * 2 - 2
        self.to_rgb = nn.Linear(self.n_latent * style_dim, 3 * size * size)

    def mean_latent(self, n_latent):
        latent_in = torch.randn(n_latent, self.style_dim, device=self.input.input.device)
        latent = self.style(latent_in).mean(0, keepdim=True)
        return latent

    def forward(self, styles, return_latents=False, input_is_latent=False, randomize_noise=True):
        if not input_is_latent:
            styles = [self.style(s) for s in styles]
        latent = styles[0]
        if latent.ndim < 3:
            latent = latent.unsqueeze(1).repeat(1, self.n_latent, 1)
        out = self.input(latent.shape[0]).mean((2, 3))
        image = self.to_rgb((latent + out.unsqueeze(1)).flatten(1)).view(-1, 3, self.size, self.size)
        if return_latents:
            return image, latent
        return image, None


class BackboneEncoder(nn.Module):
    def __init__(self, n_styles, opts):
        super().__init__()
        self.n_styles = n_styles
        self.input_layer = nn.Conv2d(opts.input_nc, 8, 3, padding=1)
        self.styles = nn.Linear(8, n_styles * 8)

    def forward(self, x):
        x = F.relu(self.input_layer(x)).mean((2, 3))
        return self.styles(x).view(-1, self.n_styles, 8)


class pSp(nn.Module):
    def __init__(self, opts):
        super(pSp, self).__init__()
        self.opts = opts
        self.n_styles = int(math.log(self.opts.output_size, 2)) * 2 - 2
        self.encoder = BackboneEncoder(self.n_styles, self.opts)
        self.decoder = Generator(self.opts.output_size, 8, 2)
        self.face_pool = torch.nn.AdaptiveAvgPool2d((8, 8))
        self.latent_avg = None  # the converted generator's checkpoint has no 'latent_avg'

    def forward(self, x, latent=None, resize=True, input_code=False, randomize_noise=True,
                return_latents=False, average_code=False):
        if input_code:
            codes = x
        else:
            codes = self.encoder(x)
            # residual step
            if x.shape[1] == 6 and latent is not None:
                # learn error with respect to previous iteration
                codes = codes + latent
            else:
                # first iteration is with respect to the avg latent code
                codes = codes + self.latent_avg.repeat(codes.shape[0], 1, 1)
        if average_code:
            input_is_latent = True
        else:
            input_is_latent = not input_code
        images, result_latent = self.decoder([codes], input_is_latent=input_is_latent,
                                             randomize_noise=randomize_noise, return_latents=return_latents)
        if resize:
            images = self.face_pool(images)
        if return_latents:
            return images, result_latent
        return images


class Coach:
    def __init__(self, opts):
        self.opts = opts
        self.global_step = 0
        self.device = DEVICE
        # Initialize network
        self.net = pSp(self.opts).to(self.device)

        # Estimate latent_avg via dense sampling if latent_avg is not available
        if self.net.latent_avg is None:
            self.net.latent_avg = self.net.decoder.mean_latent(int(1e5))[0]  # culprit

        # get the image corresponding to the latent average
        self.avg_image = self.net(self.net.latent_avg.unsqueeze(0),
                                  input_code=True,
                                  randomize_noise=False,
                                  return_latents=False,
                                  average_code=True)[0]
        self.avg_image = self.avg_image.to(self.device).float().detach()

        self.mse_loss = nn.MSELoss().to(self.device).eval()
        self.optimizer = self.configure_optimizers()
        self.train_dataloader = [(torch.rand(2, 3, 8, 8) * 2 - 1, torch.rand(2, 3, 8, 8) * 2 - 1)
                                 for _ in range(3)]

    def perform_train_iteration_on_batch(self, x, y):
        y_hat, latent = None, None
        loss_dict = None
        y_hats = {idx: [] for idx in range(x.shape[0])}
        for iter in range(self.opts.n_iters_per_batch):
            if iter == 0:
                avg_image_for_batch = self.avg_image.unsqueeze(0).repeat(x.shape[0], 1, 1, 1)
                x_input = torch.cat([x, avg_image_for_batch], dim=1)
                y_hat, latent = self.net.forward(x_input, latent=None, return_latents=True)
            else:
                y_hat_clone = y_hat.clone().detach().requires_grad_(True)
                latent_clone = latent.clone().detach().requires_grad_(True)
                x_input = torch.cat([x, y_hat_clone], dim=1)
                y_hat, latent = self.net.forward(x_input, latent=latent_clone, return_latents=True)

            loss, loss_dict = self.calc_loss(x, y, y_hat, latent)
            loss.backward()
            # store intermediate outputs
            for idx in range(x.shape[0]):
                y_hats[idx].append(y_hat[idx].detach())
        return y_hats, loss_dict

    def train(self):
        self.net.train()
        while self.global_step < self.opts.max_steps:
            for batch_idx, batch in enumerate(self.train_dataloader):
                self.optimizer.zero_grad()
                x, y = batch
                x, y = x.to(self.device).float(), y.to(self.device).float()
                y_hats, loss_dict = self.perform_train_iteration_on_batch(x, y)
                self.optimizer.step()
                if self.global_step == self.opts.max_steps:
                    break
                self.global_step += 1

    def configure_optimizers(self):
        params = list(self.net.encoder.parameters())
        if self.opts.train_decoder:
            params += list(self.net.decoder.parameters())
        return torch.optim.Adam(params, lr=self.opts.learning_rate)

    def calc_loss(self, x, y, y_hat, latent):
        loss_dict = {}
        loss = 0.0
        if self.opts.l2_lambda > 0:
            loss_l2 = F.mse_loss(y_hat, y)
            loss_dict['loss_l2'] = loss_l2.item()
            loss += loss_l2 * self.opts.l2_lambda
        if self.opts.w_norm_lambda > 0:
            loss_w_norm = torch.sum((latent - self.net.latent_avg) ** 2, dim=2).mean()
            loss_dict['loss_w_norm'] = loss_w_norm.item()
            loss += loss_w_norm * self.opts.w_norm_lambda
        loss_dict['loss'] = loss.item()
        return loss, loss_dict


opts = SimpleNamespace(output_size=8, input_nc=6, n_iters_per_batch=2, l2_lambda=1.0, w_norm_lambda=0.0,
                       learning_rate=1e-3, train_decoder=False, max_steps=3)
coach = Coach(opts)
coach.train()
print("done")
