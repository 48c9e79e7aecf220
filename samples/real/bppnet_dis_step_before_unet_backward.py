# source: https://github.com/ayu-22/BPPNet-Back-Projected-Pyramid-Network/issues/6 — issue: DU_Net.backward steps the discriminator, then back-propagates unet_loss through the discriminator's old graph
# fix-source: https://github.com/ayu-22/BPPNet-Back-Projected-Pyramid-Network/issues/6 — maintainer's comment: step the discriminator first, then compute the generator loss and step it
# expect-kind: inplace-modified
# expect-culprit: self.discriminator.conv5[0].weight_orig
from collections import OrderedDict
from math import exp

import torch
import torch.nn as nn
import torch.nn.functional as F3
import torch.optim as optim
from _device import DEVICE


class UNet(nn.Module):
    def __init__(self, in_channels=3, out_channels=3, init_features=4):
        super(UNet, self).__init__()
        features = init_features
        self.encoder1 = UNet._block(in_channels, features, name="enc1")
        self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.bottleneck = UNet._block(features, features * 2, name="bottleneck")
        self.upconv1 = nn.ConvTranspose2d(features * 2, features, kernel_size=2, stride=2)
        self.decoder1 = UNet._block(features * 2, features, name="dec1")
        self.conv = nn.Conv2d(in_channels=features, out_channels=out_channels, kernel_size=1)

    def forward(self, x):
        enc1 = self.encoder1(x)
        bottleneck = self.bottleneck(self.pool1(enc1))
        dec1 = self.upconv1(bottleneck)
        dec1 = torch.cat((dec1, enc1), dim=1)
        dec1 = self.decoder1(dec1)
        return torch.sigmoid(self.conv(dec1))

    @staticmethod
    def _block(in_channels, features, name):
        return nn.Sequential(OrderedDict([
            (name + "conv1", nn.Conv2d(in_channels, features, kernel_size=3, padding=1, bias=False)),
            (name + "norm1", nn.BatchNorm2d(num_features=features)),
            (name + "relu1", nn.ReLU(inplace=True)),
        ]))


class Discriminator(nn.Module):
    def __init__(self, in_channels, use_sigmoid=True, use_spectral_norm=True):
        super().__init__()
        self.use_sigmoid = use_sigmoid
        self.conv1 = self.features = nn.Sequential(
            spectral_norm(nn.Conv2d(in_channels=in_channels, out_channels=8, kernel_size=4, stride=2, padding=1, bias=not use_spectral_norm), use_spectral_norm),
            nn.LeakyReLU(0.2, inplace=True),
        )
        self.conv2 = nn.Sequential(
            spectral_norm(nn.Conv2d(in_channels=8, out_channels=16, kernel_size=4, stride=2, padding=1, bias=not use_spectral_norm), use_spectral_norm),
            nn.LeakyReLU(0.2, inplace=True),
        )
        self.conv5 = nn.Sequential(
            spectral_norm(nn.Conv2d(in_channels=16, out_channels=1, kernel_size=4, stride=1, padding=1, bias=not use_spectral_norm), use_spectral_norm),
        )

    def forward(self, x):
        conv1 = self.conv1(x)
        conv2 = self.conv2(conv1)
        conv5 = self.conv5(conv2)
        outputs = conv5
        if self.use_sigmoid:
            outputs = torch.sigmoid(conv5)
        return outputs, [conv1, conv2, conv5]


def spectral_norm(module, mode=True):
    if mode:
        return nn.utils.spectral_norm(module)
    return module


class AdversarialLoss(nn.Module):
    def __init__(self, type='hinge', target_real_label=1.0, target_fake_label=0.0):
        super().__init__()
        self.type = type
        self.register_buffer('real_label', torch.tensor(target_real_label))
        self.register_buffer('fake_label', torch.tensor(target_fake_label))
        if type == 'hinge':
            self.criterion = nn.ReLU()

    def __call__(self, outputs, is_real, is_disc=None):
        if self.type == 'hinge':
            if is_real:
                return -torch.log(outputs).mean()
            else:
                return -torch.log(1 - outputs).mean()


class VGG19(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # Stands in for the pretrained VGG19 features (no download): two small frozen slices.
        self.relu1_1 = torch.nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
        self.relu2_1 = torch.nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(4, 8, 3, padding=1), nn.ReLU())
        # don't need the gradients, just want the features
        for param in self.parameters():
            param.requires_grad = False

    def forward(self, x):
        relu1_1 = self.relu1_1(x)
        relu2_1 = self.relu2_1(relu1_1)
        return {'relu1_1': relu1_1, 'relu2_1': relu2_1}


class ContentLoss(nn.Module):
    def __init__(self, weights=[1.0, 1.0]):
        super().__init__()
        self.add_module('vgg', VGG19().to(DEVICE))
        self.criterion = torch.nn.L1Loss().to(DEVICE)
        self.weights = weights

    def __call__(self, x, y):
        x_vgg, y_vgg = self.vgg(x), self.vgg(y)
        content_loss = 0.0
        content_loss += self.weights[0] * self.criterion(x_vgg['relu1_1'], y_vgg['relu1_1'])
        content_loss += self.weights[1] * self.criterion(x_vgg['relu2_1'], y_vgg['relu2_1'])
        return content_loss


def gaussian(window_size, sigma):
    gauss = torch.Tensor([exp(-(x - window_size // 2) ** 2 / float(2 * sigma ** 2)) for x in range(window_size)])
    return gauss / gauss.sum()


def create_window(window_size, channel):
    _1D_window = gaussian(window_size, 1.5).unsqueeze(1)
    _2D_window = _1D_window.mm(_1D_window.t()).float().unsqueeze(0).unsqueeze(0)
    return _2D_window.expand(channel, 1, window_size, window_size).contiguous()


def _ssim(img1, img2, window, window_size, channel, size_average=True):
    mu1 = F3.conv2d(img1, window, padding=window_size // 2, groups=channel)
    mu2 = F3.conv2d(img2, window, padding=window_size // 2, groups=channel)
    mu1_sq = mu1.pow(2)
    mu2_sq = mu2.pow(2)
    mu1_mu2 = mu1 * mu2
    sigma1_sq = F3.conv2d(img1 * img1, window, padding=window_size // 2, groups=channel) - mu1_sq
    sigma2_sq = F3.conv2d(img2 * img2, window, padding=window_size // 2, groups=channel) - mu2_sq
    sigma12 = F3.conv2d(img1 * img2, window, padding=window_size // 2, groups=channel) - mu1_mu2
    C1 = 0.01 ** 2
    C2 = 0.03 ** 2
    ssim_map = ((2 * mu1_mu2 + C1) * (2 * sigma12 + C2)) / ((mu1_sq + mu2_sq + C1) * (sigma1_sq + sigma2_sq + C2))
    return ssim_map.mean()


class SSIM(torch.nn.Module):
    def __init__(self, window_size=11, size_average=True):
        super(SSIM, self).__init__()
        self.window_size = window_size
        self.size_average = size_average

    def forward(self, img1, img2):
        (_, channel, _, _) = img1.size()
        window = create_window(self.window_size, channel).to(img1.device).type_as(img1)
        return _ssim(img1, img2, window, self.window_size, channel, self.size_average)


class DU_Net(nn.Module):

    def __init__(self, unet_input, unet_output, discriminator_input):
        super().__init__()
        unet = UNet(in_channels=unet_input, out_channels=unet_output)
        unet = unet.to(DEVICE)
        discriminator = Discriminator(in_channels=discriminator_input, use_sigmoid=True)
        discriminator = discriminator.to(DEVICE)

        self.add_module('unet', unet)
        self.add_module('discriminator', discriminator)
        self.add_module('criterion', nn.MSELoss())
        self.add_module('adversarial_loss', AdversarialLoss(type='hinge'))
        self.add_module('content_loss', ContentLoss())
        self.add_module('ssim_loss', SSIM(window_size=11))

        self.unet_optimizer = optim.Adam(unet.parameters(), lr=float(0.00001), betas=(0.9, 0.999))
        self.dis_optimizer = optim.Adam(params=discriminator.parameters(), lr=float(0.00001), betas=(0.9, 0.999))

    def process(self, haze_images, dehaze_images):
        # zero optimizers
        self.unet_optimizer.zero_grad()
        self.dis_optimizer.zero_grad()

        unet_loss = 0
        dis_loss = 0

        outputs = self.unet(haze_images.to(DEVICE))

        # discriminator loss
        dis_real, dis_real_feat = self.discriminator(dehaze_images.to(DEVICE))
        dis_fake, dis_fake_feat = self.discriminator(outputs.detach().to(DEVICE))
        dis_real_loss = self.adversarial_loss(dis_real, True, True)
        dis_fake_loss = self.adversarial_loss(dis_fake, False, True)
        dis_loss += (dis_real_loss + dis_fake_loss) / 2

        # unet loss
        unet_fake, unet_fake_feat = self.discriminator(outputs.to(DEVICE))  # culprit
        unet_gan_loss = self.adversarial_loss(unet_fake, True, False) * 0.7
        unet_loss += unet_gan_loss

        unet_criterion = self.criterion(outputs.to(DEVICE), dehaze_images.to(DEVICE))
        unet_loss += unet_criterion

        gen_content_loss = self.content_loss(outputs.to(DEVICE), dehaze_images.to(DEVICE))
        gen_content_loss = (gen_content_loss * 0.7).to(DEVICE)
        unet_loss += gen_content_loss.to(DEVICE)

        ssim_loss = self.ssim_loss(outputs.to(DEVICE), dehaze_images.to(DEVICE))
        ssim_loss = (1 - ssim_loss) * 2
        unet_loss += ssim_loss.to(DEVICE)

        return unet_loss, dis_loss, unet_criterion, 1 - ssim_loss / 2

    def backward(self, unet_loss, dis_loss):
        dis_loss.backward(retain_graph=True)
        self.dis_optimizer.step()  # step

        unet_loss.backward()
        self.unet_optimizer.step()


train_loader = [(torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16)) for _ in range(3)]
DUNet = DU_Net(3, 3, 3).to(DEVICE)


def train(max_epochs):
    for epoch in range(max_epochs):
        for haze_images, dehaze_images, in train_loader:
            unet_loss, dis_loss, mse, ssim = DUNet.process(haze_images.to(DEVICE), dehaze_images.to(DEVICE))
            DUNet.backward(unet_loss.to(DEVICE), dis_loss.to(DEVICE))


train(1)
print("done")
