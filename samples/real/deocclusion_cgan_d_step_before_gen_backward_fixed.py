# source: https://github.com/XiaohangZhan/deocclusion/pull/39 — PartialCompletionContentCGAN.step (issue #38): optimD.step() runs before gen_loss.backward(), whose adversarial term goes through the netD forward on the non-detached output: "one of the variables needed for gradient computation has been modified by an inplace operation"
# fix-source: https://github.com/XiaohangZhan/deocclusion/commit/db0e5190f5d16268d27c0d205f64195e054c78f8 — merged fix (PR #39): update the generator (optim.zero_grad, gen_loss.backward, average_gradients, optim.step) before the discriminator
# expect-kind: none
# fix: the generator update (optim.zero_grad, gen_loss.backward, average_gradients, optim.step) moves before the discriminator update (optimD.zero_grad, dis_loss.backward, average_gradients, optimD.step)
import torch
import torch.nn as nn
from _device import DEVICE

world_size = 1


def spectral_norm(module, mode=True):
    if mode:
        return nn.utils.spectral_norm(module)
    return module


def average_gradients(model):
    for param in model.parameters():
        if param.requires_grad and param.grad is not None:
            param.grad.data /= world_size


class FixModule(nn.Module):
    def __init__(self, m):
        super(FixModule, self).__init__()
        self.module = m

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class PConvUNet(nn.Module):
    def __init__(self, in_channels=3, ch=8):
        super().__init__()
        self.enc = nn.Conv2d(in_channels, ch, 3, padding=1)
        self.dec = nn.Conv2d(ch, 3, 3, padding=1)

    def forward(self, x, mask):
        h = torch.relu(self.enc(x * mask))
        return torch.sigmoid(self.dec(h)), mask


class InpaintDiscriminator(nn.Module):
    def __init__(self, in_channels, ch=8, use_sigmoid=True, use_spectral_norm=True):
        super(InpaintDiscriminator, self).__init__()
        self.use_sigmoid = use_sigmoid
        self.conv1 = self.features = nn.Sequential(
            spectral_norm(nn.Conv2d(in_channels, ch, 4, 2, 1, bias=not use_spectral_norm), use_spectral_norm),
            nn.LeakyReLU(0.2, inplace=True))
        self.conv2 = nn.Sequential(
            spectral_norm(nn.Conv2d(ch, ch, 4, 2, 1, bias=not use_spectral_norm), use_spectral_norm),
            nn.LeakyReLU(0.2, inplace=True))
        self.conv3 = nn.Sequential(
            spectral_norm(nn.Conv2d(ch, ch, 4, 2, 1, bias=not use_spectral_norm), use_spectral_norm),
            nn.LeakyReLU(0.2, inplace=True))
        self.conv4 = nn.Sequential(
            spectral_norm(nn.Conv2d(ch, ch, 4, 1, 1, bias=not use_spectral_norm), use_spectral_norm),
            nn.LeakyReLU(0.2, inplace=True))
        self.conv5 = nn.Sequential(
            spectral_norm(nn.Conv2d(ch, 1, 4, 1, 1, bias=not use_spectral_norm), use_spectral_norm))

    def forward(self, x):
        conv1 = self.conv1(x)
        conv2 = self.conv2(conv1)
        conv3 = self.conv3(conv2)
        conv4 = self.conv4(conv3)
        conv5 = self.conv5(conv4)
        outputs = conv5
        if self.use_sigmoid:
            outputs = torch.sigmoid(conv5)
        return outputs, [conv1, conv2, conv3, conv4, conv5]


class AdversarialLoss(nn.Module):
    def __init__(self, type='nsgan', target_real_label=1.0, target_fake_label=0.0):
        super(AdversarialLoss, self).__init__()
        self.type = type
        self.register_buffer('real_label', torch.tensor(target_real_label))
        self.register_buffer('fake_label', torch.tensor(target_fake_label))
        self.criterion = nn.BCELoss()

    def __call__(self, outputs, is_real, is_disc=None):
        labels = (self.real_label if is_real else self.fake_label).expand_as(outputs)
        return self.criterion(outputs, labels)


class InpaintingLoss(nn.Module):
    def forward(self, input, mask, output, gt):
        return {'valid': torch.mean(torch.abs(mask * (output - gt))),
                'hole': torch.mean(torch.abs((1 - mask) * (output - gt)))}


class PartialCompletionContentCGAN(nn.Module):
    def __init__(self, params):
        super(PartialCompletionContentCGAN, self).__init__()
        self.params = params
        self.model = FixModule(PConvUNet().to(DEVICE))
        self.optim = torch.optim.Adam(
            filter(lambda p: p.requires_grad, self.model.parameters()), lr=params['lr'])
        self.netD = FixModule(InpaintDiscriminator(**params['discriminator_params']).to(DEVICE))
        self.optimD = torch.optim.Adam(
            self.netD.parameters(), lr=params['lr'] * params['d2g_lr'], betas=(0.0, 0.9))
        self.criterion = InpaintingLoss().to(DEVICE)
        self.gan_criterion = AdversarialLoss(type=params['gan_type']).to(DEVICE)
        self.world_size = world_size

    def set_input(self, rgb, visible_mask, rgb_gt):
        self.rgb = rgb
        self.visible_mask3 = visible_mask.repeat(1, 3, 1, 1)
        self.rgb_gt = rgb_gt

    def step(self):
        output, _ = self.model(self.rgb, self.visible_mask3)

        # discriminator loss
        dis_input_real = self.rgb_gt
        dis_input_fake = output.detach()
        dis_real, _ = self.netD(dis_input_real)
        dis_fake, _ = self.netD(dis_input_fake)
        dis_real_loss = self.gan_criterion(dis_real, True, True) / self.world_size
        dis_fake_loss = self.gan_criterion(dis_fake, False, True) / self.world_size
        dis_loss = (dis_real_loss + dis_fake_loss) / 2

        # generator adversarial loss
        gen_loss = 0
        gen_input_fake = output
        gen_fake, _ = self.netD(gen_input_fake)
        gen_gan_loss = self.gan_criterion(gen_fake, True, False) * \
            self.params['adv_loss_weight'] / self.world_size
        gen_loss += gen_gan_loss

        # other losses
        loss_dict = self.criterion(self.rgb, self.visible_mask3, output, self.rgb_gt)
        for k in loss_dict.keys():
            loss_dict[k] /= self.world_size
        for key, coef in self.params['lambda_dict'].items():
            value = coef * loss_dict[key]
            gen_loss += value

        loss_dict['dis'] = dis_loss
        loss_dict['adv'] = gen_gan_loss

        # update
        self.optim.zero_grad()
        gen_loss.backward()
        average_gradients(self.model)
        self.optim.step()

        self.optimD.zero_grad()
        dis_loss.backward()
        average_gradients(self.netD)
        self.optimD.step()

        return loss_dict


params = {'lr': 1e-4, 'd2g_lr': 0.1, 'gan_type': 'nsgan', 'adv_loss_weight': 0.1,
          'lambda_dict': {'valid': 1.0, 'hole': 6.0},
          'discriminator_params': {'in_channels': 3, 'use_sigmoid': True}}
model = PartialCompletionContentCGAN(params)
for i in range(3):
    rgb_gt = torch.rand(2, 3, 32, 32, device=DEVICE)
    visible_mask = (torch.rand(2, 1, 32, 32, device=DEVICE) > 0.3).float()
    model.set_input(rgb_gt * visible_mask, visible_mask, rgb_gt)
    loss_dict = model.step()
print("done")
