# source: https://github.com/Zhaoyi-Yan/Shift-Net_pytorch/issues/34 — "`re_avg_gan` is broken": backward_G reuses self.pred_fake stored by backward_D
# fix-source: expert fix — the merged fix (commit ac34fa7, loss_D.backward(retain_graph=True)) fails since torch 1.5 with the in-place version error (optimizer_D.step() runs in between); the generator loss must use D's fresh score of fake_B
# expect-kind: second-backward
# expect-culprit: self.pred_fake
import torch
import torch.nn as nn
from _device import DEVICE


class GANLoss(nn.Module):
    def __init__(self, gan_type):
        super().__init__()
        self.gan_type = gan_type
        self.loss = nn.BCEWithLogitsLoss()

    def forward(self, input, target_is_real):
        target = torch.full_like(input, 1.0 if target_is_real else 0.0)
        return self.loss(input, target)


class Options:
    gan_type = 're_avg_gan'
    lambda_A = 100.0
    gan_weight = 0.2


class ShiftNetModel:
    def __init__(self, opt):
        self.opt = opt
        self.device = DEVICE
        self.wgan_gp = False
        self.netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 4), nn.Tanh()).to(DEVICE)
        self.netD = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1)).to(DEVICE)
        self.criterionGAN = GANLoss(gan_type=opt.gan_type).to(DEVICE)
        self.criterionL1 = nn.L1Loss()
        self.optimizer_G = torch.optim.Adam(self.netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.optimizer_D = torch.optim.Adam(self.netD.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def set_input(self, input_A, input_B):
        self.real_A = input_A.to(self.device)
        self.real_B = input_B.to(self.device)

    def forward(self):
        self.fake_B = self.netG(self.real_A)

    def backward_D(self):
        fake_AB = self.fake_B
        # Real
        real_AB = self.real_B  # GroundTruth

        self.pred_fake = self.netD(fake_AB.detach())
        self.pred_real = self.netD(real_AB)

        if self.wgan_gp:
            self.loss_D = torch.mean(self.pred_fake) - torch.mean(self.pred_real)
        else:
            self.pred_fake = self.netD(fake_AB.detach())  # culprit

            if self.opt.gan_type in ['vanilla', 'lsgan']:
                self.loss_D_fake = self.criterionGAN(self.pred_fake, False)
                self.loss_D_real = self.criterionGAN(self.pred_real, True)
                self.loss_D = (self.loss_D_fake + self.loss_D_real) * 0.5

            elif self.opt.gan_type == 're_s_gan':
                self.loss_D = self.criterionGAN(self.pred_real - self.pred_fake, True)

            elif self.opt.gan_type == 're_avg_gan':
                self.loss_D = (self.criterionGAN(self.pred_real - torch.mean(self.pred_fake), True)
                               + self.criterionGAN(self.pred_fake - torch.mean(self.pred_real), False)) / 2.

        self.loss_D.backward()

    def backward_G(self):
        # First, G(A) should fake the discriminator
        fake_AB = self.fake_B
        pred_fake = self.netD(fake_AB)

        if self.wgan_gp:
            self.loss_G_GAN = torch.mean(pred_fake)
        else:
            if self.opt.gan_type in ['vanilla', 'lsgan']:
                self.loss_G_GAN = self.criterionGAN(pred_fake, True)

            elif self.opt.gan_type == 're_s_gan':
                pred_real = self.netD(self.real_B)
                self.loss_G_GAN = self.criterionGAN(pred_fake - pred_real, True)

            elif self.opt.gan_type == 're_avg_gan':
                self.pred_real = self.netD(self.real_B)
                self.loss_G_GAN = (self.criterionGAN(self.pred_real - torch.mean(self.pred_fake), False)
                                   + self.criterionGAN(self.pred_fake - torch.mean(self.pred_real), True)) / 2.

        self.loss_G_L1 = self.criterionL1(self.fake_B, self.real_B) * self.opt.lambda_A
        self.loss_G = self.loss_G_L1 + self.loss_G_GAN * self.opt.gan_weight
        self.loss_G.backward()

    def optimize_parameters(self):
        self.forward()
        # for other type of GAN, ncritic = 1.
        if not self.wgan_gp:
            self.ncritic = 1
        for i in range(self.ncritic):
            self.optimizer_D.zero_grad()
            self.backward_D()
            self.optimizer_D.step()

        self.optimizer_G.zero_grad()
        self.backward_G()
        self.optimizer_G.step()


model = ShiftNetModel(Options())
for it in range(4):
    model.set_input(torch.randn(8, 4, device=DEVICE), torch.randn(8, 4, device=DEVICE).tanh())
    model.optimize_parameters()
print("done")
