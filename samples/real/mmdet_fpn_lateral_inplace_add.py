# source: https://github.com/open-mmlab/mmdetection/pull/7175 — FPN.forward (mmdet/models/necks/fpn.py) builds the top-down path with `laterals[i - 1] += F.interpolate(...)`; with an activation in the lateral ConvModules (act_cfg=dict(type='ReLU')) that in-place add overwrites the ReLU output that ReluBackward0 saved, so training fails with "one of the variables needed for gradient computation has been modified by an inplace operation"
# fix-source: https://github.com/open-mmlab/mmdetection/pull/7175 — the merged PR ("Remove the inplace addition in `FPN`", released in v2.22.0) rewrites both branches of the top-down loop as `laterals[i - 1] = laterals[i - 1] + F.interpolate(...)`, with the comment `# fix runtime error of "+=" inplace operation in PyTorch 1.10`
# expect-kind: inplace-modified
# expect-culprit: laterals
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


# --- mmcv/cnn/bricks/conv_module.py (trimmed: conv -> norm -> act) ---
class ConvModule(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1,
                 padding=0, conv_cfg=None, norm_cfg=None, act_cfg=dict(type='ReLU'),
                 inplace=True):
        super(ConvModule, self).__init__()
        self.with_norm = norm_cfg is not None
        self.with_activation = act_cfg is not None
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              padding=padding, bias=not self.with_norm)
        if self.with_norm:
            self.bn = nn.BatchNorm2d(out_channels)
        if self.with_activation:
            self.activate = nn.ReLU(inplace=inplace)

    def forward(self, x):
        x = self.conv(x)
        if self.with_norm:
            x = self.bn(x)
        if self.with_activation:
            x = self.activate(x)
        return x


# --- mmdet/models/necks/fpn.py (v2.21, before the fix) ---
class FPN(nn.Module):
    def __init__(self,
                 in_channels,
                 out_channels,
                 num_outs,
                 start_level=0,
                 end_level=-1,
                 add_extra_convs=False,
                 relu_before_extra_convs=False,
                 no_norm_on_lateral=False,
                 conv_cfg=None,
                 norm_cfg=None,
                 act_cfg=None,
                 upsample_cfg=dict(mode='nearest')):
        super(FPN, self).__init__()
        assert isinstance(in_channels, list)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.num_ins = len(in_channels)
        self.num_outs = num_outs
        self.relu_before_extra_convs = relu_before_extra_convs
        self.no_norm_on_lateral = no_norm_on_lateral
        self.upsample_cfg = upsample_cfg.copy()

        if end_level == -1:
            self.backbone_end_level = self.num_ins
            assert num_outs >= self.num_ins - start_level
        else:
            self.backbone_end_level = end_level
            assert end_level <= len(in_channels)
            assert num_outs == end_level - start_level
        self.start_level = start_level
        self.end_level = end_level
        self.add_extra_convs = add_extra_convs

        self.lateral_convs = nn.ModuleList()
        self.fpn_convs = nn.ModuleList()

        for i in range(self.start_level, self.backbone_end_level):
            l_conv = ConvModule(
                in_channels[i],
                out_channels,
                1,
                conv_cfg=conv_cfg,
                norm_cfg=norm_cfg if not self.no_norm_on_lateral else None,
                act_cfg=act_cfg,
                inplace=False)
            fpn_conv = ConvModule(
                out_channels,
                out_channels,
                3,
                padding=1,
                conv_cfg=conv_cfg,
                norm_cfg=norm_cfg,
                act_cfg=act_cfg,
                inplace=False)

            self.lateral_convs.append(l_conv)
            self.fpn_convs.append(fpn_conv)

    def forward(self, inputs):
        """Forward function."""
        assert len(inputs) == len(self.in_channels)

        # build laterals
        laterals = [lateral_conv(inputs[i + self.start_level]) for i, lateral_conv in enumerate(self.lateral_convs)]  # culprit

        # build top-down path
        used_backbone_levels = len(laterals)
        for i in range(used_backbone_levels - 1, 0, -1):
            # In some cases, fixing `scale factor` (e.g. 2) is preferred, but
            #  it cannot co-exist with `size` in `F.interpolate`.
            if 'scale_factor' in self.upsample_cfg:
                laterals[i - 1] += F.interpolate(laterals[i], **self.upsample_cfg)
            else:
                prev_shape = laterals[i - 1].shape[2:]
                laterals[i - 1] += F.interpolate(laterals[i], size=prev_shape, **self.upsample_cfg)  # step

        # build outputs
        # part 1: from original levels
        outs = [
            self.fpn_convs[i](laterals[i]) for i in range(used_backbone_levels)
        ]
        # part 2: add extra levels
        if self.num_outs > len(outs):
            # use max pool to get more levels on top of outputs
            # (e.g., Faster R-CNN, Mask R-CNN)
            for i in range(self.num_outs - used_backbone_levels):
                outs.append(F.max_pool2d(outs[-1], 1, stride=2))
        return tuple(outs)


# --- a tiny stand-in for backbone + dense head of a one-stage detector ---
class TinyBackbone(nn.Module):
    def __init__(self):
        super(TinyBackbone, self).__init__()
        self.stem = ConvModule(3, 4, 3, stride=2, padding=1)
        self.layer1 = ConvModule(4, 8, 3, stride=2, padding=1)
        self.layer2 = ConvModule(8, 16, 3, stride=2, padding=1)
        self.layer3 = ConvModule(16, 32, 3, stride=2, padding=1)

    def forward(self, x):
        x = self.stem(x)
        c2 = self.layer1(x)
        c3 = self.layer2(c2)
        c4 = self.layer3(c3)
        return (c2, c3, c4)


backbone = TinyBackbone().to(DEVICE)
neck = FPN(in_channels=[8, 16, 32], out_channels=8, num_outs=4,
           act_cfg=dict(type='ReLU')).to(DEVICE)
cls_head = nn.Conv2d(8, 3, 3, padding=1).to(DEVICE)
params = list(backbone.parameters()) + list(neck.parameters()) + list(cls_head.parameters())
optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9)

for it in range(2):
    img = torch.randn(2, 3, 32, 32, device=DEVICE)
    feats = neck(backbone(img))
    losses = []
    for feat in feats:
        cls_score = cls_head(feat)
        target = torch.randint(0, 3, (cls_score.shape[0], cls_score.shape[2], cls_score.shape[3]), device=DEVICE)
        losses.append(F.cross_entropy(cls_score, target))
    loss = sum(losses)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
