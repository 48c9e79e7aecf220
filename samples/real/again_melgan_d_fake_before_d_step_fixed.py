# source: https://github.com/vlomme/AGAIN-MelGan-Voice-Cloning/issues/2 — MelGAN vocoder training: d_fake = D(fake_audio) is scored before d_optimizer.step(), g_loss backward fails
# fix-source: maintainer's commit b83c595 (melgan.py): d_fake = D(fake_audio) moved below d_optimizer.step(), into the generator section
# expect-kind: none
# fix: score the fake audio for the generator loss after the discriminator step (d_fake = D(fake_audio) moved below d_optimizer.step())
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.utils import weight_norm
from _device import DEVICE

warnings.filterwarnings("ignore", category=FutureWarning)


class Hparams:
    n_mels = 4
    lr = 1e-3
    betas1 = 0.5
    betas2 = 0.9
    lambda_feat = 10
    max_epoch = 4


class residual_stack(nn.Module):
    def __init__(self, size, dilation):
        super().__init__()
        self.block = nn.Sequential(
            nn.LeakyReLU(0.2),
            nn.ReflectionPad1d(dilation),
            weight_norm(nn.Conv1d(size, size, kernel_size=3, dilation=dilation)),
            nn.LeakyReLU(0.2),
            weight_norm(nn.Conv1d(size, size, kernel_size=1))
        )
        self.shortcut = weight_norm(nn.Conv1d(size, size, kernel_size=1))

    def forward(self, x):
        return self.block(x) + self.shortcut(x)


def encoder_sequential(input_size, output_size, *args, **kwargs):
    return nn.Sequential(
        nn.LeakyReLU(0.2),
        weight_norm((nn.ConvTranspose1d(input_size, output_size, *args, **kwargs)))
    )


class GeneratorMel(nn.Module):
    def __init__(self, mel_dim):
        super().__init__()
        factor = [4, 2]
        layers = [
            nn.ReflectionPad1d(3),
            weight_norm(nn.Conv1d(mel_dim, 16, kernel_size=7)),
        ]
        input_size = 16
        for f in factor:
            layers += [encoder_sequential(input_size, input_size // 2, kernel_size=f * 2, stride=f,
                                          padding=f // 2 + f % 2)]
            input_size //= 2
            for d in range(2):
                layers += [residual_stack(input_size, 3 ** d)]
        layers += [
            nn.LeakyReLU(0.2),
            nn.ReflectionPad1d(3),
            weight_norm(nn.Conv1d(input_size, 1, kernel_size=7)),
            nn.Tanh(),
        ]
        self.generator = nn.Sequential(*layers)

    def forward(self, x):
        return self.generator(x)


def decoder_sequential(input_size, output_size, *args, **kwargs):
    return nn.Sequential(
        weight_norm((nn.Conv1d(input_size, output_size, *args, **kwargs))),
        nn.LeakyReLU(0.2, inplace=True)
    )


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.discriminator = nn.ModuleList([
            nn.Sequential(
                nn.ReflectionPad1d(7),
                weight_norm(nn.Conv1d(1, 4, kernel_size=15)),
                nn.LeakyReLU(0.2, inplace=True)
            ),
            decoder_sequential(4, 8, kernel_size=41, stride=4, padding=20, groups=2),
            decoder_sequential(8, 16, kernel_size=41, stride=4, padding=20, groups=4),
            decoder_sequential(16, 16, kernel_size=41, stride=4, padding=20, groups=8),
            decoder_sequential(16, 16, kernel_size=41, stride=4, padding=20, groups=8),
            nn.Sequential(
                weight_norm(nn.Conv1d(16, 16, kernel_size=5, padding=2)),
                nn.LeakyReLU(0.2, inplace=True)
            ),
            weight_norm(nn.Conv1d(16, 1, kernel_size=3, padding=1))
        ])

    def forward(self, x):
        feature_map = []
        for module in self.discriminator:
            x = module(x)
            feature_map.append(x)
        return feature_map


class MultiScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.ModuleList([Discriminator() for _ in range(3)])
        self.avgpool = nn.AvgPool1d(kernel_size=4, stride=2, padding=1, count_include_pad=False)

    def forward(self, x):
        result = []
        for idx, module in enumerate(self.block):
            result.append(module(x))
            if idx <= 1:
                x = self.avgpool(x)
        return result


def train():
    train_loader = [(torch.randn(2, hp.n_mels, 16), torch.rand(2, 1, 128) * 2 - 1) for _ in range(1)]

    G = GeneratorMel(hp.n_mels).to(DEVICE)
    D = MultiScale().to(DEVICE)
    g_optimizer = optim.Adam(G.parameters(), lr=hp.lr, betas=(hp.betas1, hp.betas2))
    d_optimizer = optim.Adam(D.parameters(), lr=hp.lr, betas=(hp.betas1, hp.betas2))

    step, epochs = 0, 0
    for epoch in range(epochs, hp.max_epoch):
        for (mel, audio) in train_loader:
            mel = mel.to(DEVICE)
            audio = audio.to(DEVICE)

            fake_audio = G(mel)
            d_fake_detach = D(fake_audio.to(DEVICE).detach())
            d_real = D(audio)

            # ------------ discriminator ---------------
            d_loss_real = 0
            for scale in d_real:
                d_loss_real += F.relu(1 - scale[-1]).mean()

            d_loss_fake = 0
            for scale in d_fake_detach:
                d_loss_fake += F.relu(1 + scale[-1]).mean()

            d_loss = d_loss_real + d_loss_fake

            D.zero_grad()
            d_loss.backward()
            d_optimizer.step()

            # ------------ generator ---------------
            d_fake = D(fake_audio.to(DEVICE))
            g_loss = 0
            for scale in d_fake:
                g_loss += -scale[-1].mean()

            feature_loss = 0
            for i in range(len(d_fake)):
                for j in range(len(d_fake[i]) - 1):
                    feature_loss += F.l1_loss(d_fake[i][j], d_real[i][j].detach())

            g_loss += hp.lambda_feat * feature_loss

            G.zero_grad()
            g_loss.backward()
            g_optimizer.step()

            step += 1


hp = Hparams()
train()
print("done")
