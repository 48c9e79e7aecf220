# source: https://github.com/rishikksh20/VocGAN/pull/24 — "severe memory accumulation" while training VocGAN: utils/train.py appends the adversarial loss tensor adv_loss (with its whole generator+discriminator graph) to the avg_adv_loss logging list every step
# fix-source: https://github.com/rishikksh20/VocGAN/commit/5c5b5c85cd39fba9b7d5c44d8225a5662f9495fc — the PR's commit, merged by the maintainer (c6ef83b): avg_adv_loss.append(adv_loss) becomes avg_adv_loss.append(adv_loss.item())
# expect-kind: none
# fix: as in PR #24 (5c5b5c8), the logging list keeps the float, avg_adv_loss.append(adv_loss.item()), not the loss tensor with its graph
import math
import itertools
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


# --- model/discriminator.py + model/multiscale.py (MelGAN discriminator; widths shrunk, weight_norm left out) ---
class Discriminator(nn.Module):
    def __init__(self, ndf=4, n_layers=2, downsampling_factor=4, disc_out=16):
        super(Discriminator, self).__init__()
        discriminator = nn.ModuleDict()
        discriminator["layer_0"] = nn.Sequential(
            nn.ReflectionPad1d(7),
            nn.Conv1d(1, ndf, kernel_size=15, stride=1),
            nn.LeakyReLU(0.2, True),
        )
        nf = ndf
        stride = downsampling_factor
        for n in range(1, n_layers + 1):
            nf_prev = nf
            nf = min(nf * stride, disc_out)
            discriminator["layer_%d" % n] = nn.Sequential(
                nn.Conv1d(nf_prev, nf, kernel_size=stride * 10 + 1, stride=stride,
                          padding=stride * 5, groups=nf_prev // 4),
                nn.LeakyReLU(0.2, True),
            )
        nf = min(nf * 2, disc_out)
        discriminator["layer_%d" % (n_layers + 1)] = nn.Sequential(
            nn.Conv1d(nf, disc_out, kernel_size=5, stride=1, padding=2),
            nn.LeakyReLU(0.2, True),
        )
        discriminator["layer_%d" % (n_layers + 2)] = nn.Conv1d(nf, 1, kernel_size=3, stride=1, padding=1)
        self.discriminator = discriminator

    def forward(self, x):
        features = list()
        for key, module in self.discriminator.items():
            x = module(x)
            features.append(x)
        return features[:-1], features[-1]


class MultiScaleDiscriminator(nn.Module):
    def __init__(self, num_D=3, downsampling_factor=4):
        super().__init__()
        self.model = nn.ModuleDict()
        for i in range(num_D):
            self.model[f"disc_{i}"] = Discriminator()
        self.downsample = nn.AvgPool1d(downsampling_factor, stride=2, padding=1, count_include_pad=False)

    def forward(self, x):
        results = []
        for key, disc in self.model.items():
            results.append(disc(x))
            x = self.downsample(x)
        return results


# --- stand-in for model/generator.py ModifiedGenerator: mel -> two transposed-conv upsamplings -> tanh ---
class ModifiedGenerator(nn.Module):
    def __init__(self, mel_channel, ratios=(4, 4), mult=8):
        super().__init__()
        self.start = nn.Sequential(nn.ReflectionPad1d(3), nn.Conv1d(mel_channel, mult, kernel_size=7))
        ups = []
        for r in ratios:
            ups += [nn.LeakyReLU(0.2), nn.ConvTranspose1d(mult, mult // 2, kernel_size=r * 2, stride=r,
                                                         padding=r // 2 + r % 2, output_padding=r % 2)]
            mult //= 2
        self.ups = nn.Sequential(*ups)
        self.out = nn.Sequential(nn.LeakyReLU(0.2), nn.ReflectionPad1d(3), nn.Conv1d(mult, 1, kernel_size=7), nn.Tanh())

    def forward(self, mel):
        return self.out(self.ups(self.start(mel)))


# --- utils/stft_loss.py (FFT sizes shrunk; torch.stft with return_complex) ---
def stft(x, fft_size, hop_size, win_length, window):
    x_stft = torch.stft(x, fft_size, hop_size, win_length, window, return_complex=True)
    real = x_stft.real
    imag = x_stft.imag
    return torch.sqrt(torch.clamp(real ** 2 + imag ** 2, min=1e-7)).transpose(2, 1)


class STFTLoss(nn.Module):
    def __init__(self, fft_size, shift_size, win_length):
        super().__init__()
        self.fft_size, self.shift_size, self.win_length = fft_size, shift_size, win_length
        self.window = torch.hann_window(win_length, device=DEVICE)

    def forward(self, x, y):
        x_mag = stft(x, self.fft_size, self.shift_size, self.win_length, self.window)
        y_mag = stft(y, self.fft_size, self.shift_size, self.win_length, self.window)
        sc_loss = torch.norm(y_mag - x_mag, p="fro") / torch.norm(y_mag, p="fro")
        mag_loss = F.l1_loss(torch.log(y_mag), torch.log(x_mag))
        return sc_loss, mag_loss


class MultiResolutionSTFTLoss(nn.Module):
    def __init__(self, fft_sizes=(64, 128, 32), hop_sizes=(8, 16, 4), win_lengths=(32, 64, 16)):
        super().__init__()
        self.stft_losses = nn.ModuleList([STFTLoss(fs, ss, wl) for fs, ss, wl in zip(fft_sizes, hop_sizes, win_lengths)])

    def forward(self, x, y):
        sc_loss = 0.0
        mag_loss = 0.0
        for f in self.stft_losses:
            sc_l, mag_l = f(x, y)
            sc_loss += sc_l
            mag_loss += mag_l
        sc_loss /= len(self.stft_losses)
        mag_loss /= len(self.stft_losses)
        return sc_loss, mag_loss


class Loader(list):
    """stand-in for the tqdm-wrapped DataLoader (only set_description is used)"""
    def set_description(self, desc):
        self.desc = desc


class Quiet:
    """stand-in for the logger and the tensorboard writer"""
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


# --- utils/train.py train() at 5c5b5c8^ (validation, checkpointing, resume left out) ---
def train(trainloader, writer, logger, hp, num_epochs=1):
    model_g = ModifiedGenerator(hp.audio.n_mel_channels).to(DEVICE)
    model_d = MultiScaleDiscriminator().to(DEVICE)
    optim_g = torch.optim.Adam(model_g.parameters(),
        lr=hp.train.adam.lr, betas=(hp.train.adam.beta1, hp.train.adam.beta2))
    optim_d = torch.optim.Adam(model_d.parameters(),
        lr=hp.train.adam.lr, betas=(hp.train.adam.beta1, hp.train.adam.beta2))
    step = 0

    model_g.train()
    model_d.train()
    stft_loss = MultiResolutionSTFTLoss()
    criterion = torch.nn.MSELoss().to(DEVICE)

    for epoch in itertools.islice(itertools.count(0), num_epochs):
        loader = trainloader
        avg_g_loss = []
        avg_d_loss = []
        avg_adv_loss = []
        for (melG, audioG), \
            (melD, audioD) in loader:
            # generator
            optim_g.zero_grad()
            fake_audio = model_g(melG)
            fake_audio = fake_audio[:, :, :hp.audio.segment_length]

            sc_loss, mag_loss = stft_loss(fake_audio[:, :, :audioG.size(2)].squeeze(1), audioG.squeeze(1))
            loss_g = sc_loss + mag_loss

            adv_loss = 0.0

            if step > hp.train.discriminator_train_start_steps:

                disc_real = model_d(audioG)
                disc_fake = model_d(fake_audio)
                # for multi-scale discriminator

                for feats_fake, score_fake in disc_fake:
                    adv_loss += criterion(score_fake, torch.ones_like(score_fake))
                adv_loss = adv_loss / len(disc_fake)  # len(disc_fake) = 3

                if hp.model.feat_loss:
                    for (feats_fake, score_fake), (feats_real, _) in zip(disc_fake, disc_real):
                        for feat_f, feat_r in zip(feats_fake, feats_real):
                            adv_loss += hp.model.feat_match * torch.mean(torch.abs(feat_f - feat_r))

                loss_g += hp.model.lambda_adv * adv_loss

            loss_g.backward()
            optim_g.step()

            # discriminator
            loss_d_avg = 0.0
            if step > hp.train.discriminator_train_start_steps:
                fake_audio = model_g(melD)[:, :, :hp.audio.segment_length]
                fake_audio = fake_audio.detach()
                loss_d_sum = 0.0
                for _ in range(hp.train.rep_discriminator):
                    optim_d.zero_grad()
                    disc_fake = model_d(fake_audio)
                    disc_real = model_d(audioD)
                    loss_d = 0.0
                    loss_d_real = 0.0
                    loss_d_fake = 0.0
                    for (_, score_fake), (_, score_real) in zip(disc_fake, disc_real):
                        loss_d_real += criterion(score_real, torch.ones_like(score_real))
                        loss_d_fake += criterion(score_fake, torch.zeros_like(score_fake))
                    loss_d_real = loss_d_real / len(disc_real)  # len(disc_real) = 3
                    loss_d_fake = loss_d_fake / len(disc_fake)  # len(disc_fake) = 3
                    loss_d = loss_d_real + loss_d_fake
                    loss_d.backward()
                    optim_d.step()
                    loss_d_sum += loss_d
                loss_d_avg = loss_d_sum / hp.train.rep_discriminator
                loss_d_avg = loss_d_avg.item()

            step += 1
            # logging
            loss_g = loss_g.item()
            avg_g_loss.append(loss_g)
            avg_d_loss.append(loss_d_avg)
            avg_adv_loss.append(adv_loss.item())
            if any([loss_g > 1e8, math.isnan(loss_g), loss_d_avg > 1e8, math.isnan(loss_d_avg)]):
                logger.error("loss_g %.01f loss_d_avg %.01f at step %d!" % (loss_g, loss_d_avg, step))
                raise Exception("Loss exploded")

            if step % hp.log.summary_interval == 0:
                writer.log_training(loss_g, loss_d_avg, adv_loss, step)
                loader.set_description("Avg : g %.04f d %.04f ad %.04f| step %d" % (sum(avg_g_loss) / len(avg_g_loss),
                                                                            sum(avg_d_loss) / len(avg_d_loss),
                                                                            sum(avg_adv_loss) / len(avg_adv_loss),
                                                                            step))


if __name__ == "__main__":
    torch.manual_seed(0)
    # config/default.yaml, shrunk; the discriminator is switched on from the first step
    # (default discriminator_train_start_steps is 100000) so the adversarial branch runs in 5 steps
    hp = SimpleNamespace(
        train=SimpleNamespace(rep_discriminator=1, discriminator_train_start_steps=-1,
                              adam=SimpleNamespace(lr=1e-4, beta1=0.5, beta2=0.9)),
        audio=SimpleNamespace(n_mel_channels=8, segment_length=256),
        model=SimpleNamespace(feat_match=10.0, lambda_adv=1, feat_loss=False),
        log=SimpleNamespace(summary_interval=1),
    )
    # stand-in for the (melG, audioG), (melD, audioD) batches of the VocGAN dataloader
    trainloader = Loader(
        ((torch.randn(2, 8, 16, device=DEVICE), torch.rand(2, 1, 256, device=DEVICE) * 2 - 1),
         (torch.randn(2, 8, 16, device=DEVICE), torch.rand(2, 1, 256, device=DEVICE) * 2 - 1))
        for _ in range(5)
    )
    train(trainloader, Quiet(), Quiet(), hp)
    print("done")
