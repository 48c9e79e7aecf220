# source: https://github.com/junyanz/pytorch-CycleGAN-and-pix2pix/issues/439 — comment: WGAN-GP added to pix2pix, D updated several times per G step, "backward through the graph a second time" though backward is called once
# fix-source: expert fix — cal_gradient_penalty is meant for a detached fake (it interpolates and calls requires_grad_ on the mix); pass fake_AB.detach() as the D step already does for pred_fake
# expect-kind: none
# fix: pass fake_AB.detach() to cal_gradient_penalty, so the D step no longer back-propagates into (and frees) netG's graph of self.fake_B
import torch
from _device import DEVICE


def cal_gradient_penalty(netD, real_data, fake_data, device, type='mixed', constant=1.0, lambda_gp=10.0):
    alpha = torch.rand(real_data.shape[0], 1, device=device)
    alpha = alpha.expand(real_data.shape[0], real_data.nelement() // real_data.shape[0]).contiguous().view(*real_data.shape)
    interpolatesv = alpha * real_data + ((1 - alpha) * fake_data)
    interpolatesv.requires_grad_(True)
    disc_interpolates = netD(interpolatesv)
    gradients = torch.autograd.grad(outputs=disc_interpolates, inputs=interpolatesv,
                                    grad_outputs=torch.ones(disc_interpolates.size(), device=device),
                                    create_graph=True, retain_graph=True, only_inputs=True)
    gradients = gradients[0].view(real_data.size(0), -1)
    gradient_penalty = (((gradients + 1e-16).norm(2, dim=1) - constant) ** 2).mean() * lambda_gp
    return gradient_penalty, gradients


class GANLoss(torch.nn.Module):
    def __init__(self, gan_mode):
        super().__init__()
        self.gan_mode = gan_mode

    def forward(self, prediction, target_is_real):
        if target_is_real:
            return -prediction.mean()
        return prediction.mean()


class Pix2PixModel:
    def __init__(self):
        self.device = DEVICE
        self.netG = torch.nn.Sequential(
            torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3), torch.nn.Tanh()
        ).to(DEVICE)
        self.netD = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1)
        ).to(DEVICE)
        self.criterionGAN = GANLoss('wgangp').to(DEVICE)
        self.criterionL1 = torch.nn.L1Loss()
        self.optimizer_G = torch.optim.Adam(self.netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.optimizer_D = torch.optim.Adam(self.netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.n_critic = 3
        self.L_GP = 10.0
        self.lambda_L1 = 100.0

    def set_input(self, input):
        self.real_A = input['A'].to(self.device)
        self.real_B = input['B'].to(self.device)

    def set_requires_grad(self, net, requires_grad=False):
        for param in net.parameters():
            param.requires_grad = requires_grad

    def forward(self):
        self.fake_B = self.netG(self.real_A)

    def backward_D(self):
        # Fake; stop backprop to the generator by detaching fake_B
        fake_AB = torch.cat((self.real_A, self.fake_B), 1)
        pred_fake = self.netD(fake_AB.detach())
        self.loss_D_fake = self.criterionGAN(pred_fake, False)
        # Real
        real_AB = torch.cat((self.real_A, self.real_B), 1)
        pred_real = self.netD(real_AB)
        self.loss_D_real = self.criterionGAN(pred_real, True)
        # gradient penalty
        self.gradient_penalty, self.gradients = cal_gradient_penalty(self.netD, real_AB, fake_AB.detach(), self.device, lambda_gp=self.L_GP)
        self.loss_D = self.loss_D_fake + self.loss_D_real + self.gradient_penalty
        self.loss_D.backward()

    def backward_G(self):
        fake_AB = torch.cat((self.real_A, self.fake_B), 1)
        pred_fake = self.netD(fake_AB)
        self.loss_G_GAN = self.criterionGAN(pred_fake, True)
        self.loss_G_L1 = self.criterionL1(self.fake_B, self.real_B) * self.lambda_L1
        self.loss_G = self.loss_G_GAN + self.loss_G_L1
        self.loss_G.backward()

    def optimize_parameters(self):
        self.forward()
        # update D (n_critic times before each G update)
        self.set_requires_grad(self.netD, True)
        for _ in range(self.n_critic):
            self.optimizer_D.zero_grad()
            self.backward_D()
            self.optimizer_D.step()
        # update G
        self.set_requires_grad(self.netD, False)
        self.optimizer_G.zero_grad()
        self.backward_G()
        self.optimizer_G.step()


model = Pix2PixModel()
for i in range(4):
    data = {'A': torch.randn(8, 3, device=DEVICE), 'B': torch.randn(8, 3, device=DEVICE).tanh()}
    model.set_input(data)
    model.optimize_parameters()
print("done")
