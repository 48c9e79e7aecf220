# source: https://github.com/iMED-Lab/CS-Net/pull/6 — ResEncoder.forward (model/csnet.py) adds the 1x1 shortcut with `out += residual` onto `out`, the output of self.relu that ReluBackward0 saved, so training CS-Net with later PyTorch versions fails with "one of the variables needed for gradient computation has been modified by an inplace operation"
# fix-source: https://github.com/iMED-Lab/CS-Net/commit/0cbe18d307900397456b3848287635ee2393d485 — the merged PR's fix commit: `out += residual` becomes `out = out + residual` in ResEncoder (model/csnet.py) and ResEncoder3d (model/csnet_3d.py)
# expect-kind: none
# fix: ResEncoder.forward adds the shortcut out of place (`out = out + residual`), so the ReLU output that ReluBackward0 saved keeps its version
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from _device import DEVICE


# --- model/csnet.py (channel widths divided by 8) ---
def downsample():
    return nn.MaxPool2d(kernel_size=2, stride=2)


def deconv(in_channels, out_channels):
    return nn.ConvTranspose2d(in_channels, out_channels, kernel_size=2, stride=2)


def initialize_weights(*models):
    for model in models:
        for m in model.modules():
            if isinstance(m, nn.Conv2d) or isinstance(m, nn.Linear):
                nn.init.kaiming_normal_(m.weight)
                if m.bias is not None:
                    m.bias.data.zero_()
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()


class ResEncoder(nn.Module):
    def __init__(self, in_channels, out_channels):
        super(ResEncoder, self).__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=False)
        self.conv1x1 = nn.Conv2d(in_channels, out_channels, kernel_size=1)

    def forward(self, x):
        residual = self.conv1x1(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = out + residual
        out = self.relu(out)
        return out


class Decoder(nn.Module):
    def __init__(self, in_channels, out_channels):
        super(Decoder, self).__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True)
        )

    def forward(self, x):
        out = self.conv(x)
        return out


class SpatialAttentionBlock(nn.Module):
    def __init__(self, in_channels):
        super(SpatialAttentionBlock, self).__init__()
        self.query = nn.Sequential(
            nn.Conv2d(in_channels, in_channels // 8, kernel_size=(1, 3), padding=(0, 1)),
            nn.BatchNorm2d(in_channels // 8),
            nn.ReLU(inplace=True)
        )
        self.key = nn.Sequential(
            nn.Conv2d(in_channels, in_channels // 8, kernel_size=(3, 1), padding=(1, 0)),
            nn.BatchNorm2d(in_channels // 8),
            nn.ReLU(inplace=True)
        )
        self.value = nn.Conv2d(in_channels, in_channels, kernel_size=1)
        self.gamma = nn.Parameter(torch.zeros(1))
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        B, C, H, W = x.size()
        proj_query = self.query(x).view(B, -1, W * H).permute(0, 2, 1)
        proj_key = self.key(x).view(B, -1, W * H)
        affinity = torch.matmul(proj_query, proj_key)
        affinity = self.softmax(affinity)
        proj_value = self.value(x).view(B, -1, H * W)
        weights = torch.matmul(proj_value, affinity.permute(0, 2, 1))
        weights = weights.view(B, C, H, W)
        out = self.gamma * weights + x
        return out


class ChannelAttentionBlock(nn.Module):
    def __init__(self, in_channels):
        super(ChannelAttentionBlock, self).__init__()
        self.gamma = nn.Parameter(torch.zeros(1))
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        B, C, H, W = x.size()
        proj_query = x.view(B, C, -1)
        proj_key = x.view(B, C, -1).permute(0, 2, 1)
        affinity = torch.matmul(proj_query, proj_key)
        affinity_new = torch.max(affinity, -1, keepdim=True)[0].expand_as(affinity) - affinity
        affinity_new = self.softmax(affinity_new)
        proj_value = x.view(B, C, -1)
        weights = torch.matmul(affinity_new, proj_value)
        weights = weights.view(B, C, H, W)
        out = self.gamma * weights + x
        return out


class AffinityAttention(nn.Module):
    def __init__(self, in_channels):
        super(AffinityAttention, self).__init__()
        self.sab = SpatialAttentionBlock(in_channels)
        self.cab = ChannelAttentionBlock(in_channels)

    def forward(self, x):
        sab = self.sab(x)
        cab = self.cab(x)
        out = sab + cab
        return out


class CSNet(nn.Module):
    def __init__(self, classes, channels):
        super(CSNet, self).__init__()
        self.enc_input = ResEncoder(channels, 4)
        self.encoder1 = ResEncoder(4, 8)
        self.encoder2 = ResEncoder(8, 16)
        self.encoder3 = ResEncoder(16, 32)
        self.encoder4 = ResEncoder(32, 64)
        self.downsample = downsample()
        self.affinity_attention = AffinityAttention(64)
        self.decoder4 = Decoder(64, 32)
        self.decoder3 = Decoder(32, 16)
        self.decoder2 = Decoder(16, 8)
        self.decoder1 = Decoder(8, 4)
        self.deconv4 = deconv(64, 32)
        self.deconv3 = deconv(32, 16)
        self.deconv2 = deconv(16, 8)
        self.deconv1 = deconv(8, 4)
        self.final = nn.Conv2d(4, classes, kernel_size=1)
        initialize_weights(self)

    def forward(self, x):
        enc_input = self.enc_input(x)
        down1 = self.downsample(enc_input)
        enc1 = self.encoder1(down1)
        down2 = self.downsample(enc1)
        enc2 = self.encoder2(down2)
        down3 = self.downsample(enc2)
        enc3 = self.encoder3(down3)
        down4 = self.downsample(enc3)
        input_feature = self.encoder4(down4)

        # Do Attenttion operations here
        attention = self.affinity_attention(input_feature)
        attention_fuse = input_feature + attention

        # Do decoder operations here
        up4 = self.deconv4(attention_fuse)
        up4 = torch.cat((enc3, up4), dim=1)
        dec4 = self.decoder4(up4)
        up3 = self.deconv3(dec4)
        up3 = torch.cat((enc2, up3), dim=1)
        dec3 = self.decoder3(up3)
        up2 = self.deconv2(dec3)
        up2 = torch.cat((enc1, up2), dim=1)
        dec2 = self.decoder2(up2)
        up1 = self.deconv1(dec2)
        up1 = torch.cat((enc_input, up1), dim=1)
        dec1 = self.decoder1(up1)
        final = self.final(dec1)
        final = torch.sigmoid(final)
        return final


# --- utils/dice_loss_single_class.py (DiceCoeff.forward inlined as plain tensor ops) ---
def dice_coeff(input, target):
    s = torch.zeros(1, device=input.device)
    for i, c in enumerate(zip(input, target)):
        eps = 0.0001
        inter = torch.dot(c[0].reshape(-1), c[1].reshape(-1))
        union = torch.sum(c[0]) + torch.sum(c[1]) + eps
        s = s + (2 * inter.float() + eps) / union.float()
    return s / (i + 1)


def dice_coeff_loss(input, target):
    return 1 - dice_coeff(input, target)


# --- train.py ---
net = CSNet(classes=1, channels=3).to(DEVICE)
optimizer = optim.Adam(net.parameters(), lr=1e-4, weight_decay=0.0005)
critrion = nn.MSELoss().to(DEVICE)
net.train()
for idx in range(2):
    image = torch.rand(2, 3, 16, 16, device=DEVICE)
    label = (torch.rand(2, 1, 16, 16, device=DEVICE) > 0.5).float()
    optimizer.zero_grad()
    pred = net(image)
    loss1 = critrion(pred, label)
    loss2 = dice_coeff_loss(pred, label)
    loss = loss1 + loss2
    loss.backward()
    optimizer.step()
print("done")
