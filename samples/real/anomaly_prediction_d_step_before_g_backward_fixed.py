# source: https://github.com/feiyuhuahuo/Anomaly_Prediction/issues/11 — train.py steps optimizer_D before G_l_t.backward() through discriminator(G_frame), fails since PyTorch 1.5
# fix-source: https://github.com/feiyuhuahuo/Anomaly_Prediction/commit/6295f5d99553461df6689560b66303364059dfc8 — maintainer's fix: both backwards first, then optimizer_D.step() and optimizer_G.step()
# expect-kind: none
# fix: compute both gradients first (D_l.backward(), G_l_t.backward()), then optimizer_D.step() and optimizer_G.step()
import torch
import torch.nn as nn
import torch.nn.functional as F
import numpy as np
from _device import DEVICE


class double_conv(nn.Module):
    def __init__(self, in_ch, out_ch):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(out_ch),
                                  nn.ReLU(inplace=True),
                                  nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(out_ch),
                                  nn.ReLU(inplace=True))

    def forward(self, x):
        return self.conv(x)


class down(nn.Module):
    def __init__(self, in_ch, out_ch):
        super().__init__()
        self.mpconv = nn.Sequential(nn.MaxPool2d(2), double_conv(in_ch, out_ch))

    def forward(self, x):
        return self.mpconv(x)


class up(nn.Module):
    def __init__(self, in_ch, out_ch):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_ch, in_ch // 2, 2, stride=2)
        self.conv = double_conv(in_ch, out_ch)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        x = torch.cat([x2, x1], dim=1)
        return self.conv(x)


class UNet(nn.Module):
    def __init__(self, input_channels, output_channel=3):
        super().__init__()
        self.inc = double_conv(input_channels, 8)
        self.down1 = down(8, 16)
        self.up1 = up(16, 8)
        self.outc = nn.Conv2d(8, output_channel, 3, padding=1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x = self.up1(x2, x1)
        return torch.tanh(self.outc(x))


class PixelDiscriminator(nn.Module):
    def __init__(self, input_nc, num_filters=(8, 16, 16, 16)):
        super().__init__()
        self.net = []
        self.net.append(nn.Conv2d(input_nc, num_filters[0], kernel_size=4, padding=2, stride=2))
        self.net.append(nn.LeakyReLU(0.2, True))
        for i in range(1, len(num_filters) - 1):
            self.net.extend([nn.Conv2d(num_filters[i - 1], num_filters[i], 4, 2, 2),
                             nn.LeakyReLU(0.2, True)])
        self.net.extend([nn.Conv2d(num_filters[-2], num_filters[-1], 4, 1, 2),
                         nn.LeakyReLU(0.2, True)])
        self.net.append(nn.Conv2d(num_filters[-1], 1, 4, 1, 2))
        self.net = nn.Sequential(*self.net)

    def forward(self, input):
        return self.net(input)


class Network(nn.Module):  # stands in for the pretrained LiteFlownet, only used in eval mode
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(6, 2, 3, padding=1)

    def batch_estimate(self, x, net):
        return net.conv(x)


class Flow_Loss(nn.Module):
    def forward(self, gen_flows, gt_flows):
        return torch.mean(torch.abs(gen_flows - gt_flows))


class Intensity_Loss(nn.Module):
    def forward(self, gen_frames, gt_frames):
        return torch.mean(torch.abs((gen_frames - gt_frames) ** 2))


class Gradient_Loss(nn.Module):
    def __init__(self, channels):
        super().__init__()
        pos = torch.from_numpy(np.identity(channels, dtype=np.float32))
        neg = -1 * pos
        self.filter_x = torch.stack((neg, pos)).unsqueeze(0).permute(3, 2, 0, 1).to(DEVICE)
        self.filter_y = torch.stack((pos.unsqueeze(0), neg.unsqueeze(0))).permute(3, 2, 0, 1).to(DEVICE)

    def forward(self, gen_frames, gt_frames):
        gen_frames_x = F.pad(gen_frames, [0, 1, 0, 0])
        gen_frames_y = F.pad(gen_frames, [0, 0, 0, 1])
        gt_frames_x = F.pad(gt_frames, [0, 1, 0, 0])
        gt_frames_y = F.pad(gt_frames, [0, 0, 0, 1])
        gen_dx = torch.abs(F.conv2d(gen_frames_x, self.filter_x))
        gen_dy = torch.abs(F.conv2d(gen_frames_y, self.filter_y))
        gt_dx = torch.abs(F.conv2d(gt_frames_x, self.filter_x))
        gt_dy = torch.abs(F.conv2d(gt_frames_y, self.filter_y))
        return torch.mean(torch.abs(gt_dx - gen_dx) + torch.abs(gt_dy - gen_dy))


class Adversarial_Loss(nn.Module):
    def forward(self, fake_outputs):
        return torch.mean((fake_outputs - 1) ** 2 / 2)


class Discriminate_Loss(nn.Module):
    def forward(self, real_outputs, fake_outputs):
        return torch.mean((real_outputs - 1) ** 2 / 2) + torch.mean(fake_outputs ** 2 / 2)


def weights_init_normal(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        torch.nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find('BatchNorm2d') != -1:
        torch.nn.init.normal_(m.weight.data, 1.0, 0.02)
        torch.nn.init.constant_(m.bias.data, 0.0)


generator = UNet(input_channels=12, output_channel=3).to(DEVICE)
discriminator = PixelDiscriminator(input_nc=3).to(DEVICE)
optimizer_G = torch.optim.Adam(generator.parameters(), lr=2e-4)
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=2e-5)
generator.apply(weights_init_normal)
discriminator.apply(weights_init_normal)

flow_net = Network()
flow_net.to(DEVICE).eval()  # Use flow_net to generate optic flows, so set to eval mode.

adversarial_loss = Adversarial_Loss().to(DEVICE)
discriminate_loss = Discriminate_Loss().to(DEVICE)
gradient_loss = Gradient_Loss(3).to(DEVICE)
flow_loss = Flow_Loss().to(DEVICE)
intensity_loss = Intensity_Loss().to(DEVICE)

generator = generator.train()
discriminator = discriminator.train()

for step in range(4):
    clips = torch.rand(2, 15, 16, 16, device=DEVICE) * 2 - 1
    input_frames = clips[:, 0:12, :, :]
    target_frame = clips[:, 12:15, :, :]
    input_last = input_frames[:, 9:12, :, :]  # use for flow_loss

    G_frame = generator(input_frames)

    gt_flow_input = torch.cat([input_last, target_frame], 1)
    pred_flow_input = torch.cat([input_last, G_frame], 1)
    # No need to train flow_net, use .detach() to cut off gradients.
    flow_gt = flow_net.batch_estimate(gt_flow_input, flow_net).detach()
    flow_pred = flow_net.batch_estimate(pred_flow_input, flow_net).detach()

    inte_l = intensity_loss(G_frame, target_frame)
    grad_l = gradient_loss(G_frame, target_frame)
    fl_l = flow_loss(flow_pred, flow_gt)
    g_l = adversarial_loss(discriminator(G_frame))
    G_l_t = 1. * inte_l + 1. * grad_l + 2. * fl_l + 0.05 * g_l

    # Train discriminator
    # When training discriminator, don't train generator, so use .detach() to cut off gradients.
    D_l = discriminate_loss(discriminator(target_frame), discriminator(G_frame.detach()))
    optimizer_D.zero_grad()
    D_l.backward()
    # Train generator
    optimizer_G.zero_grad()
    G_l_t.backward()
    # Do .step() after all the gradients have been computed (the steps modify parameters in place).
    optimizer_D.step()
    optimizer_G.step()
print("done")
