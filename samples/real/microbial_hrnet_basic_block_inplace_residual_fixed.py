# source: https://github.com/jarek-pawlowski/microbial-dataset-generation/pull/1 — PR: photorealistic style transfer (HRNet trained against VGG features, transfer_style_lib.py at 499474d) fails at total_loss.backward() with "one of the variables needed for gradient computation has been modified by an inplace operation" on newer PyTorch (BasicBlock's `out += residual`)
# fix-source: https://github.com/jarek-pawlowski/microbial-dataset-generation/commit/79498a9348df48c336135eed077ea2bbd86a5e06 — merged by the maintainer (d788392): `out = out + residual` in BasicBlock.forward and `style_loss = style_loss + layer_style_loss / (c * h * w)` in style_transfer
# expect-kind: none
# fix: BasicBlock.forward adds the shortcut out of place, out = out + residual, so the ReLU output that identity_block saved is left intact (the merged commit also rewrites style_loss += ... as style_loss = style_loss + ..., which the error does not need)
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from _device import DEVICE

IN_MOMENTUM = 0.15


class ConvLayer(nn.Module):
    """zero-padding convolution"""

    def __init__(self, in_channels, out_channels, kernel_size, stride):
        super(ConvLayer, self).__init__()
        conv_padding = int(np.floor(kernel_size / 2))
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=conv_padding)

    def forward(self, x):
        return self.conv(x)


class BasicBlock(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride):
        super(BasicBlock, self).__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.relu = nn.ReLU(inplace=True)

        self.identity_block = nn.Sequential(
            ConvLayer(in_channels, out_channels // 4, kernel_size=1, stride=1),
            nn.InstanceNorm2d(out_channels // 4, momentum=IN_MOMENTUM),
            nn.ReLU(),
            ConvLayer(out_channels // 4, out_channels // 4, kernel_size, stride=stride),
            nn.InstanceNorm2d(out_channels // 4, momentum=IN_MOMENTUM),
            nn.ReLU(),
            ConvLayer(out_channels // 4, out_channels, kernel_size=1, stride=1),
            nn.InstanceNorm2d(out_channels, momentum=IN_MOMENTUM),
            nn.ReLU(),
        )
        self.shortcut = nn.Sequential(
            ConvLayer(in_channels, out_channels, 1, stride),
            nn.InstanceNorm2d(out_channels),
        )

    def forward(self, x):
        out = self.identity_block(x)
        if self.in_channels == self.out_channels:
            residual = x
        else:
            residual = self.shortcut(x)
        out = out + residual
        out = self.relu(out)

        return out


class HRNet(nn.Module):
    """Two resolutions of the HRNet style network: a full-resolution pass and a half-resolution branch."""

    def __init__(self):
        super(HRNet, self).__init__()
        self.pass1_1 = BasicBlock(3, 16, kernel_size=3, stride=1)
        self.pass1_2 = BasicBlock(16, 32, kernel_size=3, stride=1)
        self.pass1_3 = BasicBlock(32, 32, kernel_size=3, stride=1)
        self.pass1_4 = BasicBlock(64, 64, kernel_size=3, stride=1)
        self.pass1_7 = BasicBlock(64, 16, kernel_size=3, stride=1)
        self.pass1_8 = nn.Conv2d(16, 3, kernel_size=3, stride=1, padding=1)
        self.pass2_1 = BasicBlock(32, 32, kernel_size=3, stride=1)
        self.downsample1_1 = nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1)
        self.upsample1_1 = nn.Upsample(scale_factor=2, mode='bilinear')

    def forward(self, x):
        map1 = self.pass1_1(x)
        map2 = self.pass1_2(map1)
        map3 = self.downsample1_1(map1)
        map4 = torch.cat((self.pass1_3(map2), self.upsample1_1(self.pass2_1(map3))), 1)
        out = self.pass1_4(map4)
        out = self.pass1_7(out)
        out = self.pass1_8(out)
        return out


def vgg_features():
    """Stand-in for models.vgg19(pretrained=True).features: same layer indices, tiny widths, random weights."""
    cfg = [4, 4, 'M', 8, 8, 'M', 8, 8, 8, 8, 'M', 8, 8, 8, 8, 'M', 8]
    layers, c = [], 3
    for v in cfg:
        if v == 'M':
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU(inplace=True)]
            c = v
    return nn.Sequential(*layers)


def get_features(image, model, layers=None):
    if layers is None:
        layers = {'0': 'conv1_1', '5': 'conv2_1', '10': 'conv3_1', '19': 'conv4_1', '21': 'conv4_2', '28': 'conv5_1'}
    features = {}
    x = image
    for name, layer in model._modules.items():
        x = layer(x)
        if name in layers:
            features[layers[name]] = x
    return features


def get_grim_matrix(tensor):
    b, c, h, w = tensor.size()
    tensor = tensor.view(b * c, h * w)
    gram_matrix = torch.mm(tensor, tensor.t())
    return gram_matrix


def style_transfer(content_image, style_image, steps=2):
    VGG = vgg_features().to(DEVICE)
    for parameter in VGG.parameters():
        parameter.requires_grad_(False)

    style_net = HRNet().to(DEVICE)

    content_features = get_features(content_image, VGG)
    style_features = get_features(style_image, VGG)
    style_gram_matrixs = {layer: get_grim_matrix(style_features[layer]) for layer in style_features}

    style_weights = {'conv1_1': 0.1, 'conv2_1': 0.2, 'conv3_1': 0.4, 'conv4_1': 0.8, 'conv5_1': 1.6}
    content_weight = 150
    style_weight = 0.5

    optimizer = optim.Adam(style_net.parameters(), lr=5e-3)

    for epoch in range(0, steps + 1):
        target = style_net(content_image).to(DEVICE)
        target.requires_grad_(True)
        target_features = get_features(target, VGG)
        content_loss = torch.mean((target_features['conv4_2'] - content_features['conv4_2']) ** 2)
        style_loss = 0
        for layer in style_weights:
            target_feature = target_features[layer]
            target_gram_matrix = get_grim_matrix(target_feature)
            style_gram_matrix = style_gram_matrixs[layer]

            layer_style_loss = style_weights[layer] * torch.mean((target_gram_matrix - style_gram_matrix) ** 2)
            b, c, h, w = target_feature.shape
            style_loss = style_loss + layer_style_loss / (c * h * w)

        total_loss = content_weight * content_loss + style_weight * style_loss

        optimizer.zero_grad()
        total_loss.backward()
        optimizer.step()
    return target.detach(), style_net.state_dict()


content_image = torch.randn(1, 3, 16, 16, device=DEVICE)
style_image = torch.randn(1, 3, 16, 16, device=DEVICE)
style_transfer(content_image, style_image)
print("done")
