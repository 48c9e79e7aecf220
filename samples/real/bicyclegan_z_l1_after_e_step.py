# source: https://github.com/junyanz/BicycleGAN/issues/87 — issue "Compute graph wrong": backward_G_alone's self.loss_z_L1.backward() fails with "one of the variables needed for gradient computation has been modified by an inplace operation: [...], which is output 0 of TBackward, is at version 2; expected version 1"
# fix-source: https://github.com/junyanz/BicycleGAN/commit/6f0eec8ef0a147a80f64f25103089feb33553a06 and 8dc078bde7889fcaff246cf97c0b97a0e0e9ce87 — maintainer's fix "fix runtime error #87" + "enable update G alone": both backwards (netE frozen for the z loss) before optimizer_E/G step
# expect-kind: inplace-modified
# expect-culprit: self.netE.fc[0].weight
import argparse

import torch
import torch.nn as nn
from _device import DEVICE


class GANLoss(nn.Module):
    def __init__(self, gan_mode, target_real_label=1.0, target_fake_label=0.0):
        super(GANLoss, self).__init__()
        self.register_buffer('real_label', torch.tensor(target_real_label))
        self.register_buffer('fake_label', torch.tensor(target_fake_label))
        self.gan_mode = gan_mode
        self.loss = nn.MSELoss()

    def get_target_tensor(self, prediction, target_is_real):
        target_tensor = self.real_label if target_is_real else self.fake_label
        return target_tensor.expand_as(prediction)

    def __call__(self, predictions, target_is_real):
        all_losses = []
        for prediction in predictions:
            target_tensor = self.get_target_tensor(prediction, target_is_real)
            all_losses.append(self.loss(prediction, target_tensor))
        total_loss = sum(all_losses)
        return total_loss, all_losses


class G_Tiny(nn.Module):
    """Stands in for G_Unet_add_all: z is tiled over the image and concatenated to A."""

    def __init__(self, input_nc, output_nc, nz, ngf):
        super(G_Tiny, self).__init__()
        self.nz = nz
        self.model = nn.Sequential(nn.Conv2d(input_nc + nz, ngf, 3, padding=1), nn.ReLU(),
                                   nn.Conv2d(ngf, output_nc, 3, padding=1), nn.Tanh())

    def forward(self, x, z):
        z_img = z.view(z.size(0), z.size(1), 1, 1).expand(z.size(0), z.size(1), x.size(2), x.size(3))
        return self.model(torch.cat([x, z_img], 1))


class E_ResNet(nn.Module):
    def __init__(self, input_nc=1, output_nc=1, ndf=8, vaeLike=False):
        super(E_ResNet, self).__init__()
        self.vaeLike = vaeLike
        conv_layers = [nn.Conv2d(input_nc, ndf, kernel_size=4, stride=2, padding=1, bias=True),
                       nn.LeakyReLU(0.2), nn.AvgPool2d(4)]
        self.fc = nn.Sequential(*[nn.Linear(ndf, output_nc)])
        if vaeLike:
            self.fcVar = nn.Sequential(*[nn.Linear(ndf, output_nc)])
        self.conv = nn.Sequential(*conv_layers)

    def forward(self, x):
        x_conv = self.conv(x)
        conv_flat = x_conv.view(x.size(0), -1)
        output = self.fc(conv_flat)
        if self.vaeLike:
            outputVar = self.fcVar(conv_flat)
            return output, outputVar
        return output


class D_NLayersMulti(nn.Module):
    def __init__(self, input_nc, ndf=8):
        super(D_NLayersMulti, self).__init__()
        self.model = nn.Sequential(nn.Conv2d(input_nc, ndf, kernel_size=4, stride=2, padding=1),
                                   nn.LeakyReLU(0.2), nn.Conv2d(ndf, 1, kernel_size=3, stride=1, padding=1))

    def forward(self, input):
        return [self.model(input)]


class BaseModel():
    def __init__(self, opt):
        self.opt = opt
        self.device = DEVICE

    def set_requires_grad(self, nets, requires_grad=False):
        if not isinstance(nets, list):
            nets = [nets]
        for net in nets:
            if net is not None:
                for param in net.parameters():
                    param.requires_grad = requires_grad


class BiCycleGANModel(BaseModel):
    def __init__(self, opt):
        BaseModel.__init__(self, opt)
        self.netG = G_Tiny(opt.input_nc, opt.output_nc, opt.nz, opt.ngf).to(self.device)
        self.netD = D_NLayersMulti(opt.output_nc, opt.ndf).to(self.device)
        self.netD2 = D_NLayersMulti(opt.output_nc, opt.ndf).to(self.device)
        self.netE = E_ResNet(opt.output_nc, opt.nz, opt.nef, vaeLike=True).to(self.device)
        self.criterionGAN = GANLoss(gan_mode=opt.gan_mode).to(self.device)
        self.criterionL1 = torch.nn.L1Loss()
        self.criterionZ = torch.nn.L1Loss()
        self.optimizer_G = torch.optim.Adam(self.netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
        self.optimizer_E = torch.optim.Adam(self.netE.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
        self.optimizer_D = torch.optim.Adam(self.netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
        self.optimizer_D2 = torch.optim.Adam(self.netD2.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

    def set_input(self, input):
        self.real_A = input['A'].to(self.device)
        self.real_B = input['B'].to(self.device)

    def get_z_random(self, batch_size, nz):
        z = torch.randn(batch_size, nz)
        return z.to(self.device)

    def encode(self, input_image):
        mu, logvar = self.netE.forward(input_image)
        std = logvar.mul(0.5).exp_()
        eps = self.get_z_random(std.size(0), std.size(1))
        z = eps.mul(std).add_(mu)
        return z, mu, logvar

    def forward(self):
        half_size = self.opt.batch_size // 2
        # A1, B1 for encoded; A2, B2 for random
        self.real_A_encoded = self.real_A[0:half_size]
        self.real_B_encoded = self.real_B[0:half_size]
        self.real_A_random = self.real_A[half_size:]
        self.real_B_random = self.real_B[half_size:]
        self.z_encoded, self.mu, self.logvar = self.encode(self.real_B_encoded)
        self.z_random = self.get_z_random(self.real_A_encoded.size(0), self.opt.nz)
        self.fake_B_encoded = self.netG(self.real_A_encoded, self.z_encoded)
        self.fake_B_random = self.netG(self.real_A_encoded, self.z_random)
        self.fake_data_encoded = self.fake_B_encoded
        self.fake_data_random = self.fake_B_random
        self.real_data_encoded = self.real_B_encoded
        self.real_data_random = self.real_B_random
        # compute z_predict
        if self.opt.lambda_z > 0.0:
            self.mu2, logvar2 = self.netE(self.fake_B_random)  # culprit

    def backward_D(self, netD, real, fake):
        pred_fake = netD(fake.detach())
        pred_real = netD(real)
        loss_D_fake, _ = self.criterionGAN(pred_fake, False)
        loss_D_real, _ = self.criterionGAN(pred_real, True)
        loss_D = loss_D_fake + loss_D_real
        loss_D.backward()
        return loss_D, [loss_D_fake, loss_D_real]

    def backward_G_GAN(self, fake, netD=None, ll=0.0):
        if ll > 0.0:
            pred_fake = netD(fake)
            loss_G_GAN, _ = self.criterionGAN(pred_fake, True)
        else:
            loss_G_GAN = 0
        return loss_G_GAN * ll

    def backward_EG(self):
        # 1, G(A) should fool D
        self.loss_G_GAN = self.backward_G_GAN(self.fake_data_encoded, self.netD, self.opt.lambda_GAN)
        self.loss_G_GAN2 = self.backward_G_GAN(self.fake_data_random, self.netD2, self.opt.lambda_GAN2)
        # 2. KL loss
        self.loss_kl = torch.sum(1 + self.logvar - self.mu.pow(2) - self.logvar.exp()) * (-0.5 * self.opt.lambda_kl)
        # 3, reconstruction |fake_B-real_B|
        self.loss_G_L1 = self.criterionL1(self.fake_B_encoded, self.real_B_encoded) * self.opt.lambda_L1
        self.loss_G = self.loss_G_GAN + self.loss_G_GAN2 + self.loss_G_L1 + self.loss_kl
        self.loss_G.backward(retain_graph=True)

    def update_D(self):
        self.set_requires_grad([self.netD, self.netD2], True)
        self.optimizer_D.zero_grad()
        self.loss_D, self.losses_D = self.backward_D(self.netD, self.real_data_encoded, self.fake_data_encoded)
        self.optimizer_D.step()
        self.optimizer_D2.zero_grad()
        self.loss_D2, self.losses_D2 = self.backward_D(self.netD2, self.real_data_random, self.fake_data_random)
        self.optimizer_D2.step()

    def backward_G_alone(self):
        # 3, reconstruction |(E(G(A, z_random)))-z_random|
        if self.opt.lambda_z > 0.0:
            self.loss_z_L1 = torch.mean(torch.abs(self.mu2 - self.z_random)) * self.opt.lambda_z
            self.loss_z_L1.backward()
        else:
            self.loss_z_L1 = 0.0

    def update_G_and_E(self):
        # update G and E
        self.set_requires_grad([self.netD, self.netD2], False)
        self.optimizer_E.zero_grad()
        self.optimizer_G.zero_grad()
        self.backward_EG()
        self.optimizer_G.step()
        self.optimizer_E.step()  # step
        # update G only
        if self.opt.lambda_z > 0.0:
            self.optimizer_G.zero_grad()
            self.optimizer_E.zero_grad()
            self.backward_G_alone()
            self.optimizer_G.step()

    def optimize_parameters(self):
        self.forward()
        self.update_G_and_E()
        self.update_D()


parser = argparse.ArgumentParser()
parser.add_argument('--batch_size', type=int, default=4)
parser.add_argument('--input_nc', type=int, default=1)
parser.add_argument('--output_nc', type=int, default=1)
parser.add_argument('--nz', type=int, default=4)
parser.add_argument('--ngf', type=int, default=8)
parser.add_argument('--ndf', type=int, default=8)
parser.add_argument('--nef', type=int, default=8)
parser.add_argument('--gan_mode', type=str, default='lsgan')
parser.add_argument('--lr', type=float, default=0.0002)
parser.add_argument('--beta1', type=float, default=0.5)
parser.add_argument('--lambda_L1', type=float, default=10.0)
parser.add_argument('--lambda_GAN', type=float, default=1.0)
parser.add_argument('--lambda_GAN2', type=float, default=1.0)
parser.add_argument('--lambda_z', type=float, default=0.5)
parser.add_argument('--lambda_kl', type=float, default=0.01)
opt = parser.parse_args([])

model = BiCycleGANModel(opt)
for i in range(4):
    data = {'A': torch.rand(opt.batch_size, opt.input_nc, 8, 8) * 2 - 1,
            'B': torch.rand(opt.batch_size, opt.output_nc, 8, 8) * 2 - 1}
    model.set_input(data)
    model.optimize_parameters()
print("done")
