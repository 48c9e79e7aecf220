# source: https://github.com/Lornatang/SRGAN-PyTorch/issues/37 — issue: GAN stage of train.py fails at g_loss.backward(); the D step freezes the generator before sr = generator(lr)
# fix-source: https://github.com/Lornatang/SRGAN-PyTorch/commit/531beb5 — maintainer ("I fix."): train_adversarial no longer toggles requires_grad, so sr keeps its history
# expect-kind: none
# fix: drop the requires_grad toggling around the D and G steps (as 531beb5 did), so sr = generator(lr) keeps the generator's history
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch import Tensor
from _device import DEVICE


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super(ResidualBlock, self).__init__()
        self.conv_block = nn.Sequential(
            nn.Conv2d(channels, channels, 3, 1, 1, bias=False),
            nn.BatchNorm2d(channels),
            nn.PReLU(),
            nn.Conv2d(channels, channels, 3, 1, 1, bias=False),
            nn.BatchNorm2d(channels)
        )

    def forward(self, x: Tensor) -> Tensor:
        identity = x
        out = self.conv_block(x)
        out = out + identity
        return out


class Discriminator(nn.Module):
    def __init__(self, image_size: int = 16) -> None:
        super(Discriminator, self).__init__()
        feature_size = image_size // 4
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, 1, 1),
            nn.LeakyReLU(0.2, True),
            nn.Conv2d(8, 8, 3, 2, 1, bias=False),
            nn.BatchNorm2d(8),
            nn.LeakyReLU(0.2, True),
            nn.Conv2d(8, 16, 3, 2, 1, bias=False),
            nn.BatchNorm2d(16),
            nn.LeakyReLU(0.2, True)
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * feature_size * feature_size, 32),
            nn.LeakyReLU(0.2, True),
            nn.Linear(32, 1),
            nn.Sigmoid()
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.features(x)
        out = torch.flatten(out, 1)
        out = self.classifier(out)
        return out


class Generator(nn.Module):
    def __init__(self) -> None:
        super(Generator, self).__init__()
        self.conv_block1 = nn.Sequential(nn.Conv2d(3, 8, 9, 1, 4), nn.PReLU())
        self.trunk = nn.Sequential(*[ResidualBlock(8) for _ in range(2)])
        self.conv_block2 = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8))
        self.upsampling = nn.Sequential(
            nn.Conv2d(8, 32, 3, 1, 1, bias=False),
            nn.BatchNorm2d(32),
            nn.PixelShuffle(upscale_factor=2),
            nn.PReLU()
        )
        self.conv_block3 = nn.Conv2d(8, 3, 9, 1, 4)

    def forward(self, x: Tensor) -> Tensor:
        out1 = self.conv_block1(x)
        out = self.trunk(out1)
        out2 = self.conv_block2(out)
        out = out1 + out2
        out = self.upsampling(out)
        out = self.conv_block3(out)
        return out


class PerceptualLoss(nn.Module):
    def __init__(self) -> None:
        super(PerceptualLoss, self).__init__()
        # Stands in for the pretrained VGG19 features (no download): a small frozen conv stack.
        self.feature_extractor = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.ReLU(), nn.Conv2d(8, 8, 3, 1, 1)).eval()
        # Freeze model parameters.
        for parameters in self.feature_extractor.parameters():
            parameters.requires_grad = False
        self.register_buffer("mean", torch.Tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std",  torch.Tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    def forward(self, sr: Tensor, hr: Tensor) -> Tensor:
        sr = (sr - self.mean) / self.std
        hr = (hr - self.mean) / self.std
        sr = F.interpolate(sr, size=[24, 24])
        hr = F.interpolate(hr, size=[24, 24])
        loss = F.mse_loss(self.feature_extractor(sr), self.feature_extractor(hr))
        return loss


device = DEVICE
image_size = 16
discriminator = Discriminator(image_size).to(device)
generator = Generator().to(device)
p_epochs = 1
g_epochs = 1
pixel_criterion = nn.MSELoss().to(device)
perceptual_criterion = PerceptualLoss().to(device)
adversarial_criterion = nn.BCELoss().to(device)
perceptual_weight = 6e-03
adversarial_weight = 1e-03
p_optimizer = optim.Adam(generator.parameters(), 1e-4)
d_optimizer = optim.Adam(discriminator.parameters(), 1e-4)
g_optimizer = optim.Adam(generator.parameters(), 1e-4)
dataloader = [(torch.rand(2, 3, 8, 8), torch.rand(2, 3, 16, 16)) for _ in range(3)]


def main() -> None:
    discriminator.train()
    generator.train()

    # Train PSNR-Oral.
    for epoch in range(p_epochs):
        for index, data in enumerate(dataloader, 1):
            lr = data[0].to(device)
            hr = data[1].to(device)
            generator.zero_grad()
            sr = generator(lr)
            loss = pixel_criterion(sr, hr)
            loss.backward()
            p_optimizer.step()

    # Train GAN-Oral.
    for epoch in range(g_epochs):
        for index, data in enumerate(dataloader, 1):
            lr = data[0].to(device)
            hr = data[1].to(device)
            label_size = lr.size(0)
            real_label = torch.full([label_size, 1], 1.0, dtype=lr.dtype, device=device)
            fake_label = torch.full([label_size, 1], 0.0, dtype=lr.dtype, device=device)
            # (1) Update D network.
            discriminator.zero_grad()

            hr_output = discriminator(hr)
            d_loss_hr = adversarial_criterion(hr_output, real_label)
            d_loss_hr.backward()

            # Generate a super-resolution image.
            sr = generator(lr)

            sr_output = discriminator(sr.detach())
            d_loss_sr = adversarial_criterion(sr_output, fake_label)
            d_loss_sr.backward()

            d_loss = d_loss_hr + d_loss_sr
            d_optimizer.step()
            # (2) Update G network.
            generator.zero_grad()

            sr_output = discriminator(sr)
            perceptual_loss = perceptual_weight * perceptual_criterion(sr, hr.detach())
            adversarial_loss = adversarial_weight * adversarial_criterion(sr_output, real_label)

            g_loss = perceptual_loss + adversarial_loss
            g_loss.backward()
            g_optimizer.step()


main()
print("done")
