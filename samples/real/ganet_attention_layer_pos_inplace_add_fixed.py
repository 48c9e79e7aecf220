# source: https://github.com/Wolfwjs/GANet/issues/20 — AttentionLayer.forward (mmdet/models/necks/dcn_fpn.py) adds the sine position embedding with `x += pos` onto `x`, the output of pre_conv's ReLU that ReluBackward0 saved, so training GANet's transformer neck (trans_head of DeformFPN) fails with "one of the variables needed for gradient computation has been modified by an inplace operation"
# fix-source: https://github.com/Wolfwjs/GANet/commit/7378d7bd34e5d355353de3ac4961accf06b75e94 — the maintainers' fix ("fix inplace error"): `x += pos` becomes `x = x + pos` in AttentionLayer.forward
# expect-kind: none
# fix: AttentionLayer.forward adds the position embedding out of place (`x = x + pos`), so the pre_conv ReLU output that ReluBackward0 saved keeps its version
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


# --- mmcv/cnn/bricks/conv_module.py (trimmed: conv -> BN -> ReLU) ---
class ConvModule(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1,
                 padding=0, norm_cfg=None, act_cfg=dict(type='ReLU'), inplace=True):
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


# --- mmdet/models/necks/dcn_fpn.py (at 7378d7b^, trimmed to the transformer neck) ---
class PositionEmbeddingSine(nn.Module):
    def __init__(self,
                 num_pos_feats=64,
                 temperature=10000,
                 normalize=False,
                 scale=None):
        super().__init__()
        self.num_pos_feats = num_pos_feats
        self.temperature = temperature
        self.normalize = normalize
        if scale is not None and normalize is False:
            raise ValueError("normalize should be True if scale is passed")
        if scale is None:
            scale = 2 * math.pi
        self.scale = scale

    def forward(self, mask):
        assert mask is not None
        not_mask = ~mask
        y_embed = not_mask.cumsum(1, dtype=torch.float32)
        x_embed = not_mask.cumsum(2, dtype=torch.float32)
        if self.normalize:
            eps = 1e-6
            y_embed = y_embed / (y_embed[:, -1:, :] + eps) * self.scale
            x_embed = x_embed / (x_embed[:, :, -1:] + eps) * self.scale

        dim_t = torch.arange(
            self.num_pos_feats, dtype=torch.float32, device=mask.device)
        dim_t = self.temperature ** (2 * (dim_t // 2) / self.num_pos_feats)

        pos_x = x_embed[:, :, :, None] / dim_t
        pos_y = y_embed[:, :, :, None] / dim_t
        pos_x = torch.stack(
            (pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()),
            dim=4).flatten(3)
        pos_y = torch.stack(
            (pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()),
            dim=4).flatten(3)
        pos = torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)
        return pos


def build_position_encoding(hidden_dim, shape):
    mask = torch.zeros(shape, dtype=torch.bool)
    pos_module = PositionEmbeddingSine(hidden_dim // 2)
    pos_embs = pos_module(mask)
    return pos_embs


class AttentionLayer(nn.Module):
    """ Position attention module"""

    def __init__(self, in_dim, out_dim, ratio=4, stride=1):
        super(AttentionLayer, self).__init__()
        self.chanel_in = in_dim
        norm_cfg = dict(type='BN', requires_grad=True)
        act_cfg = dict(type='ReLU')
        self.pre_conv = ConvModule(
            in_dim,
            out_dim,
            kernel_size=3,
            stride=stride,
            padding=1,
            norm_cfg=norm_cfg,
            act_cfg=act_cfg,
            inplace=False)
        self.query_conv = nn.Conv2d(
            in_channels=out_dim, out_channels=out_dim // ratio, kernel_size=1)
        self.key_conv = nn.Conv2d(
            in_channels=out_dim, out_channels=out_dim // ratio, kernel_size=1)
        self.value_conv = nn.Conv2d(
            in_channels=out_dim, out_channels=out_dim, kernel_size=1)
        self.final_conv = ConvModule(
            out_dim,
            out_dim,
            kernel_size=3,
            padding=1,
            norm_cfg=norm_cfg,
            act_cfg=act_cfg)
        self.softmax = nn.Softmax(dim=-1)
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x, pos=None):
        x = self.pre_conv(x)
        m_batchsize, _, height, width = x.size()
        if pos is not None:
            x = x + pos
        proj_query = self.query_conv(x).view(m_batchsize, -1,
                                             width * height).permute(0, 2, 1)
        proj_key = self.key_conv(x).view(m_batchsize, -1, width * height)

        energy = torch.bmm(proj_query, proj_key)
        attention = self.softmax(energy)
        attention = attention.permute(0, 2, 1)
        proj_value = self.value_conv(x).view(m_batchsize, -1, width * height)
        out = torch.bmm(proj_value, attention)
        out = out.view(m_batchsize, -1, height, width)
        proj_value = proj_value.view(m_batchsize, -1, height, width)
        out_feat = self.gamma * out + x
        out_feat = self.final_conv(out_feat)
        return out_feat


class TransConvEncoderModule(nn.Module):
    def __init__(self, in_dim, attn_in_dims, attn_out_dims, strides, ratios, downscale=True, pos_shape=None):
        super(TransConvEncoderModule, self).__init__()
        if downscale:
            stride = 2
        else:
            stride = 1
        attn_layers = []
        for dim1, dim2, stride, ratio in zip(attn_in_dims, attn_out_dims, strides, ratios):
            attn_layers.append(AttentionLayer(dim1, dim2, ratio, stride))
        if pos_shape is not None:
            self.attn_layers = nn.ModuleList(attn_layers)
        else:
            self.attn_layers = nn.Sequential(*attn_layers)
        self.pos_shape = pos_shape
        self.pos_embeds = []
        if not self.training:
            self.pos_shape[0] = 1
        if pos_shape is not None:
            for dim in attn_out_dims:
                pos_embed = build_position_encoding(dim, pos_shape).to(DEVICE)
                self.pos_embeds.append(pos_embed)

    def forward(self, src):
        if self.pos_shape is None:
            src = self.attn_layers(src)
        else:
            for layer, pos in zip(self.attn_layers, self.pos_embeds):
                src = layer(src, pos.to(src.device))
        return src


# --- DeformFPN's trans_head on the last backbone level (configs/culane/final_exp_res18_s8.py trans_cfg, widths / 8) ---
trans_cfg = dict(
    in_dim=64,
    attn_in_dims=[64, 8],
    attn_out_dims=[8, 8],
    strides=[1, 1],
    ratios=[4, 4],
    pos_shape=(1, 10, 25),
)
trans_head = TransConvEncoderModule(**trans_cfg).to(DEVICE)
hm_head = nn.Conv2d(8, 1, kernel_size=1).to(DEVICE)
params = list(trans_head.parameters()) + list(hm_head.parameters())
optimizer = torch.optim.Adam(params, lr=1e-3)

for it in range(2):
    c5 = torch.randn(2, 64, 10, 25, device=DEVICE)  # last ResNet-18 level (512 channels / 8)
    gt_hm = (torch.rand(2, 1, 10, 25, device=DEVICE) > 0.9).float()
    trans_feat = trans_head(c5)
    hm = torch.sigmoid(hm_head(trans_feat))
    loss = F.binary_cross_entropy(hm, gt_hm)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
