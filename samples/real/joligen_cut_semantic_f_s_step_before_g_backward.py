# source: https://github.com/jolibrain/joliGEN/pull/20 — PR "fix: in place gradient error with f_s": CUTSemanticMaskModel.optimize_parameters (models/cut_semantic_mask_model.py at 283cb85^) steps the semantic net f_s before loss_G, whose loss_sem reads pfB = log_softmax(netf_s(fake_B)) from forward(), is back-propagated
# fix-source: https://github.com/jolibrain/joliGEN/commit/283cb8561800c9fe6dd3e2b9777c5f8f8dc94134 — maintainer's fix (PR #23, the one the PR #20 review points to): the f_s update (backward_f_s, optimizer_f_s.step()) moves after the G update
# expect-kind: inplace-modified
# expect-culprit: self.netf_s.outc.conv.weight
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


class Opt:
    """The training options the model reads (train.py's parsed options, trimmed)."""
    isTrain = True
    CUT_mode = "CUT"
    direction = "AtoB"
    input_nc = 3
    output_nc = 3
    semantic_nclasses = 3
    lambda_GAN = 1.0
    lambda_NCE = 0.0  # the PatchNCE branch is left out of this reconstruction
    nce_idt = True
    flip_equivariance = False
    train_f_s_B = False
    fs_light = True
    D_noise = 0.0
    out_mask = False
    gan_mode = "lsgan"
    netF = "reshape"
    lr = 0.0002
    lr_f_s = 0.0002
    beta1 = 0.5
    beta2 = 0.999


# --- models/modules/UNet_classification.py (the light f_s network), trimmed to one level ---
class double_conv(nn.Module):
    '''(conv => BN => ReLU) * 2'''

    def __init__(self, in_ch, out_ch):
        super(double_conv, self).__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(in_ch, out_ch, 3, padding=1),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_ch, out_ch, 3, padding=1),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(inplace=True)
        )

    def forward(self, x):
        return self.conv(x)


class inconv(nn.Module):
    def __init__(self, in_ch, out_ch):
        super(inconv, self).__init__()
        self.conv = double_conv(in_ch, out_ch)

    def forward(self, x):
        return self.conv(x)


class down(nn.Module):
    def __init__(self, in_ch, out_ch):
        super(down, self).__init__()
        self.mpconv = nn.Sequential(nn.MaxPool2d(2), double_conv(in_ch, out_ch))

    def forward(self, x):
        return self.mpconv(x)


class up(nn.Module):
    def __init__(self, in_ch, out_ch):
        super(up, self).__init__()
        self.conv = double_conv(in_ch, out_ch)

    def forward(self, x1, x2):
        x1 = F.interpolate(x1, scale_factor=2, mode='bilinear', align_corners=True)
        x = torch.cat([x2, x1], dim=1)
        return self.conv(x)


class outconv(nn.Module):
    def __init__(self, in_ch, out_ch):
        super(outconv, self).__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, 1)

    def forward(self, x):
        return self.conv(x)


class UNet(nn.Module):
    def __init__(self, classes):
        super(UNet, self).__init__()
        self.inc = inconv(3, 4)
        self.down1 = down(4, 4)
        self.up1 = up(8, 4)
        self.outc = outconv(4, classes)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x = self.up1(x2, x1)
        x = self.outc(x)
        return x


# --- models/networks.py, trimmed ---
def define_G(input_nc, output_nc):
    return nn.Sequential(
        nn.Conv2d(input_nc, 8, 3, padding=1), nn.ReLU(True),
        nn.Conv2d(8, output_nc, 3, padding=1), nn.Tanh(),
    ).to(DEVICE)


def define_D(input_nc):
    return nn.Sequential(
        nn.Conv2d(input_nc, 8, 4, stride=2, padding=1), nn.LeakyReLU(0.2, True),
        nn.Conv2d(8, 1, 3, padding=1),
    ).to(DEVICE)


def define_f(input_nc, nclasses, fs_light=False):
    net = UNet(classes=nclasses)
    return net.to(DEVICE)


class GANLoss(nn.Module):
    def __init__(self, gan_mode):
        super(GANLoss, self).__init__()
        self.loss = nn.MSELoss()

    def __call__(self, prediction, target_is_real):
        target = torch.ones_like(prediction) if target_is_real else torch.zeros_like(prediction)
        return self.loss(prediction, target)


class BaseModel:
    def __init__(self, opt):
        self.opt = opt
        self.isTrain = opt.isTrain
        self.device = DEVICE
        self.optimizers = []

    def set_requires_grad(self, nets, requires_grad=False):
        if not isinstance(nets, list):
            nets = [nets]
        for net in nets:
            if net is not None:
                for param in net.parameters():
                    param.requires_grad = requires_grad


class CUTSemanticMaskModel(BaseModel):
    def __init__(self, opt):
        BaseModel.__init__(self, opt)
        self.loss_names = ['G_GAN', 'D_real', 'D_fake', 'G', 'NCE', 'sem', 'f_s']

        self.netG = define_G(opt.input_nc, opt.output_nc)
        if self.isTrain:
            self.netD = define_D(opt.output_nc)
            self.netf_s = define_f(opt.input_nc, nclasses=opt.semantic_nclasses, fs_light=opt.fs_light)

            self.criterionGAN = GANLoss(opt.gan_mode).to(self.device)
            self.criterionf_s = torch.nn.modules.CrossEntropyLoss()

            self.optimizer_G = torch.optim.Adam(self.netG.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2))
            self.optimizer_D = torch.optim.Adam(self.netD.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2))
            self.optimizer_f_s = torch.optim.Adam(self.netf_s.parameters(), lr=opt.lr_f_s, betas=(opt.beta1, 0.999))
            self.optimizers.append(self.optimizer_G)
            self.optimizers.append(self.optimizer_D)

    def data_dependent_initialize(self, data):
        self.set_input(data)
        self.forward()                     # compute fake images: G(A)
        if self.opt.isTrain:
            self.compute_D_loss().backward()                  # calculate gradients for D
            self.backward_f_s()
            self.compute_G_loss().backward()                   # calculate graidents for G

    def optimize_parameters(self):
        # forward
        self.forward()

        # update D
        self.set_requires_grad(self.netD, True)
        self.optimizer_D.zero_grad()
        self.loss_D = self.compute_D_loss()
        self.loss_D.backward()
        self.optimizer_D.step()

        self.set_requires_grad(self.netf_s, True)
        self.backward_f_s()
        self.optimizer_f_s.step()  # step
        self.set_requires_grad(self.netf_s, False)

        # update G
        self.set_requires_grad(self.netD, False)
        self.optimizer_G.zero_grad()
        if self.opt.netF == 'mlp_sample':
            self.optimizer_F.zero_grad()
        self.loss_G = self.compute_G_loss()
        self.loss_G.backward()
        self.optimizer_G.step()
        if self.opt.netF == 'mlp_sample':
            self.optimizer_F.step()

    def set_input(self, input):
        AtoB = self.opt.direction == 'AtoB'
        self.real_A = input['A' if AtoB else 'B'].to(self.device)
        self.real_B = input['B' if AtoB else 'A'].to(self.device)
        if 'A_label' in input:
            self.input_A_label = input['A_label'].to(self.device).squeeze(1)
        if 'B_label' in input:
            self.input_B_label = input['B_label'].to(self.device).squeeze(1)

    def forward(self):
        """Run forward pass; called by both functions <optimize_parameters> and <test>."""
        self.real = torch.cat((self.real_A, self.real_B), dim=0) if self.opt.nce_idt and self.opt.isTrain else self.real_A
        if self.opt.flip_equivariance:
            self.flipped_for_equivariance = self.opt.isTrain and (np.random.random() < 0.5)
            if self.flipped_for_equivariance:
                self.real = torch.flip(self.real, [3])

        self.fake = self.netG(self.real)
        self.fake_B = self.fake[:self.real_A.size(0)]
        if self.opt.nce_idt:
            self.idt_B = self.fake[self.real_A.size(0):]

        d = 1
        self.pred_real_A = self.netf_s(self.real_A)
        self.gt_pred_A = F.log_softmax(self.pred_real_A, dim=d).argmax(dim=d)

        self.pred_fake_B = self.netf_s(self.fake_B)  # culprit
        self.pfB = F.log_softmax(self.pred_fake_B, dim=d)
        self.pfB_max = self.pfB.argmax(dim=d)

    def compute_D_loss(self):
        """Calculate GAN loss for the discriminator"""
        fake = self.fake_B.detach()
        pred_fake = self.netD(fake)
        self.loss_D_fake = self.criterionGAN(pred_fake, False).mean()
        real_B = self.real_B
        self.pred_real = self.netD(real_B)
        loss_D_real = self.criterionGAN(self.pred_real, True)
        self.loss_D_real = loss_D_real.mean()

        self.loss_D = (self.loss_D_fake + self.loss_D_real) * 0.5
        return self.loss_D

    def compute_G_loss(self):
        """Calculate GAN and NCE loss for the generator"""
        fake = self.fake_B
        if self.opt.lambda_GAN > 0.0:
            pred_fake = self.netD(fake)
            self.loss_G_GAN = self.criterionGAN(pred_fake, True).mean() * self.opt.lambda_GAN
        else:
            self.loss_G_GAN = 0.0

        if self.opt.lambda_NCE > 0.0:
            raise NotImplementedError("PatchNCE is not part of this reconstruction")
        else:
            self.loss_NCE, self.loss_NCE_bd = 0.0, 0.0
        loss_NCE_both = self.loss_NCE

        self.loss_sem = self.criterionf_s(self.pfB, self.input_A_label)
        if self.loss_f_s.detach().item() > 1.0:
            self.loss_sem = 0 * self.loss_sem
        self.loss_G = self.loss_G_GAN + loss_NCE_both + self.loss_sem
        return self.loss_G

    def backward_f_s(self):
        label_A = self.input_A_label
        # forward only real source image through semantic classifier
        pred_A = self.netf_s(self.real_A)
        self.loss_f_s = self.criterionf_s(pred_A, label_A)
        if self.opt.train_f_s_B:
            label_B = self.input_B_label
            pred_B = self.netf_s(self.real_B)
            self.loss_f_s += self.criterionf_s(pred_B, label_B)
        self.loss_f_s.backward()


opt = Opt()
model = CUTSemanticMaskModel(opt)
dataset = [
    {
        'A': torch.randn(2, 3, 8, 8, device=DEVICE),
        'B': torch.randn(2, 3, 8, 8, device=DEVICE),
        'A_label': torch.randint(0, opt.semantic_nclasses, (2, 1, 8, 8), device=DEVICE),
    }
    for _ in range(3)
]

# train.py: the first batch initialises the model, then every batch is one optimize_parameters()
for i, data in enumerate(dataset):
    if i == 0:
        model.data_dependent_initialize(data)
    model.set_input(data)
    model.optimize_parameters()
print("done")
