# source: https://github.com/open-mmlab/mmocr/pull/884 — merged PR "[Fix] Fix a bug that may cause inplace operation error": training PANet/PSENet with the FPEM_FFM neck raises "one of the variables needed for gradient computation has been modified by an inplace operation" (issues #878, #648)
# fix-source: https://github.com/open-mmlab/mmocr/commit/7c9093684ecd39b13581723582e0c8a1e5dde5cb — merged fix: c2_ffm = c2_ffm + c2 (and c3/c4/c5) instead of c2_ffm += c2
# expect-kind: none
# fix: accumulate the FPEM outputs out of place (c2_ffm = c2_ffm + c2, likewise c3/c4/c5), so the first FPEM's ReLU outputs saved for backward are not overwritten
import torch
import torch.nn.functional as F
from torch import nn
from _device import DEVICE


class FPEM(nn.Module):
    """Feature pyramid enhancement: an up-scale pass then a down-scale pass over c2..c5."""

    def __init__(self, in_channels=128):
        super().__init__()
        self.up_add1 = SeparableConv2d(in_channels, in_channels, 1)
        self.up_add2 = SeparableConv2d(in_channels, in_channels, 1)
        self.up_add3 = SeparableConv2d(in_channels, in_channels, 1)
        self.down_add1 = SeparableConv2d(in_channels, in_channels, 2)
        self.down_add2 = SeparableConv2d(in_channels, in_channels, 2)
        self.down_add3 = SeparableConv2d(in_channels, in_channels, 2)

    def forward(self, c2, c3, c4, c5):
        # upsample
        c4 = self.up_add1(self._upsample_add(c5, c4))
        c3 = self.up_add2(self._upsample_add(c4, c3))
        c2 = self.up_add3(self._upsample_add(c3, c2))
        # downsample
        c3 = self.down_add1(self._upsample_add(c3, c2))
        c4 = self.down_add2(self._upsample_add(c4, c3))
        c5 = self.down_add3(self._upsample_add(c5, c4))
        return c2, c3, c4, c5

    def _upsample_add(self, x, y):
        return F.interpolate(x, size=y.size()[2:]) + y


class SeparableConv2d(nn.Module):

    def __init__(self, in_channels, out_channels, stride=1):
        super().__init__()
        self.depthwise_conv = nn.Conv2d(in_channels=in_channels, out_channels=in_channels, kernel_size=3,
                                        padding=1, stride=stride, groups=in_channels)
        self.pointwise_conv = nn.Conv2d(in_channels=in_channels, out_channels=out_channels, kernel_size=1)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.pointwise_conv(self.depthwise_conv(x))))


def reduce_conv(in_channels, conv_out):
    # 1x1 conv + BN + ReLU bringing a backbone stage to conv_out channels
    return nn.Sequential(nn.Conv2d(in_channels, conv_out, kernel_size=1), nn.BatchNorm2d(conv_out), nn.ReLU())


class FPEM_FFM(nn.Module):
    """PANet neck: fpem_repeat cascaded FPEMs, their outputs summed level by level (FFM)."""

    def __init__(self, in_channels, conv_out=128, fpem_repeat=2, align_corners=False):
        super().__init__()
        self.reduce_conv_c2 = reduce_conv(in_channels[0], conv_out)
        self.reduce_conv_c3 = reduce_conv(in_channels[1], conv_out)
        self.reduce_conv_c4 = reduce_conv(in_channels[2], conv_out)
        self.reduce_conv_c5 = reduce_conv(in_channels[3], conv_out)
        self.align_corners = align_corners
        self.fpems = nn.ModuleList(FPEM(conv_out) for _ in range(fpem_repeat))

    def forward(self, x):
        c2, c3, c4, c5 = x
        c2 = self.reduce_conv_c2(c2)
        c3 = self.reduce_conv_c3(c3)
        c4 = self.reduce_conv_c4(c4)
        c5 = self.reduce_conv_c5(c5)

        # FPEM
        for i, fpem in enumerate(self.fpems):
            c2, c3, c4, c5 = fpem(c2, c3, c4, c5)
            if i == 0:
                c2_ffm = c2
                c3_ffm = c3
                c4_ffm = c4
                c5_ffm = c5
            else:
                c2_ffm = c2_ffm + c2
                c3_ffm = c3_ffm + c3
                c4_ffm = c4_ffm + c4
                c5_ffm = c5_ffm + c5

        # FFM: bring every level to c2's resolution
        size = c2_ffm.size()[-2:]
        c5 = F.interpolate(c5_ffm, size, mode='bilinear', align_corners=self.align_corners)
        c4 = F.interpolate(c4_ffm, size, mode='bilinear', align_corners=self.align_corners)
        c3 = F.interpolate(c3_ffm, size, mode='bilinear', align_corners=self.align_corners)
        return c2_ffm, c3, c4, c5


class TinyResNet(nn.Module):
    """Stands in for the ResNet18 backbone: four stages at strides 4, 8, 16, 32."""

    def __init__(self, channels=(4, 8, 16, 32)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels[0], 3, stride=4, padding=1), nn.ReLU())
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Conv2d(channels[i - 1], channels[i], 3, stride=2, padding=1), nn.ReLU())
            for i in range(1, len(channels)))

    def forward(self, img):
        x = self.stem(img)
        outs = [x]
        for layer in self.layers:
            x = layer(x)
            outs.append(x)
        return tuple(outs)


class PANHead(nn.Module):
    def __init__(self, in_channels, out_channels=6):
        super().__init__()
        self.out_conv = nn.Conv2d(in_channels=sum(in_channels), out_channels=out_channels, kernel_size=1)

    def forward(self, inputs):
        outputs = torch.cat(inputs, dim=1)
        return self.out_conv(outputs)


class PANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = TinyResNet()
        self.neck = FPEM_FFM(in_channels=[4, 8, 16, 32], conv_out=8)
        self.bbox_head = PANHead(in_channels=[8, 8, 8, 8])

    def forward_train(self, img, gt_maps):
        preds = self.bbox_head(self.neck(self.backbone(img)))
        return F.binary_cross_entropy_with_logits(preds, gt_maps)


model = PANet().to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
model.train()
for it in range(3):
    img = torch.randn(2, 3, 64, 64, device=DEVICE)
    gt_maps = (torch.rand(2, 6, 16, 16, device=DEVICE) > 0.5).float()
    loss = model.forward_train(img, gt_maps)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
