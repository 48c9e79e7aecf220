# source: https://github.com/qianyu-dlut/MVANet/issues/2 — issue "Training error : Relu variables has been modified by an inplace operation": train.py fails in backward because MVANet.__init__ makes every nn.Dropout in-place and MCLM's first feed-forward feeds F.relu's output straight into self.dropout (model/MVANet.py at 03c5019)
# fix-source: https://github.com/qianyu-dlut/MVANet/commit/a7107e055d57bc3d55906c0f80fb1d974ad310fe — maintainer's "Update MVANet.py", announced in the issue: `self.activation(self.linear1(g_hw_b_c)).clone()` before the in-place dropout (as MCLM's second feed-forward and MCRM already did), and forward no longer resets self.p_poses
# expect-kind: none
# fix: clone MCLM's ReLU output before the in-place dropout, as the maintainer's commit does (and as the second feed-forward and MCRM already did); forward keeps the cached self.p_poses
import math

import torch
import torch.nn.functional as F
from torch import nn
from _device import DEVICE


def get_activation_fn(activation):
    """Return an activation function given a string"""
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    raise RuntimeError(F"activation should be relu/gelu, not {activation}.")


def make_cbr(in_dim, out_dim):
    return nn.Sequential(nn.Conv2d(in_dim, out_dim, kernel_size=3, padding=1), nn.BatchNorm2d(out_dim), nn.PReLU())


def make_cbg(in_dim, out_dim):
    return nn.Sequential(nn.Conv2d(in_dim, out_dim, kernel_size=3, padding=1), nn.BatchNorm2d(out_dim), nn.GELU())


def rescale_to(x, scale_factor: float = 2, interpolation='nearest'):
    return F.interpolate(x, scale_factor=scale_factor, mode=interpolation)


def resize_as(x, y, interpolation='bilinear'):
    return F.interpolate(x, size=y.shape[-2:], mode=interpolation)


def image2patches(x):
    """b c (hg h) (wg w) -> (hg wg b) c h w"""
    b, c, H, W = x.shape
    return x.view(b, c, 2, H // 2, 2, W // 2).permute(2, 4, 0, 1, 3, 5).reshape(4 * b, c, H // 2, W // 2)


def patches2image(x):
    """(hg wg b) c h w -> b c (hg h) (wg w)"""
    n, c, h, w = x.shape
    return x.view(2, 2, n // 4, c, h, w).permute(2, 3, 0, 4, 1, 5).reshape(n // 4, c, 2 * h, 2 * w)


def to_hw_b_c(x):
    """b c h w -> (h w) b c"""
    return x.flatten(2).permute(2, 0, 1)


class PositionEmbeddingSine:
    def __init__(self, num_pos_feats=64, temperature=10000, normalize=False, scale=None):
        super().__init__()
        self.num_pos_feats = num_pos_feats
        self.temperature = temperature
        self.normalize = normalize
        if scale is None:
            scale = 2 * math.pi
        self.scale = scale
        self.dim_t = torch.arange(0, self.num_pos_feats, dtype=torch.float32, device=DEVICE)

    def __call__(self, b, h, w):
        mask = torch.zeros([b, h, w], dtype=torch.bool, device=DEVICE)
        not_mask = ~mask
        y_embed = not_mask.cumsum(dim=1, dtype=torch.float32)
        x_embed = not_mask.cumsum(dim=2, dtype=torch.float32)
        if self.normalize:
            eps = 1e-6
            y_embed = (y_embed - 0.5) / (y_embed[:, -1:, :] + eps) * self.scale
            x_embed = (x_embed - 0.5) / (x_embed[:, :, -1:] + eps) * self.scale

        dim_t = self.temperature ** (2 * (self.dim_t // 2) / self.num_pos_feats)

        pos_x = x_embed[:, :, :, None] / dim_t
        pos_y = y_embed[:, :, :, None] / dim_t
        pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
        pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
        return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


class MCLM(nn.Module):
    def __init__(self, d_model, num_heads, pool_ratios=[1, 4, 8]):
        super(MCLM, self).__init__()
        self.attention = nn.ModuleList([
            nn.MultiheadAttention(d_model, num_heads, dropout=0.1),
            nn.MultiheadAttention(d_model, num_heads, dropout=0.1),
            nn.MultiheadAttention(d_model, num_heads, dropout=0.1),
            nn.MultiheadAttention(d_model, num_heads, dropout=0.1),
            nn.MultiheadAttention(d_model, num_heads, dropout=0.1)
        ])

        self.linear1 = nn.Linear(d_model, d_model * 2)
        self.linear2 = nn.Linear(d_model * 2, d_model)
        self.linear3 = nn.Linear(d_model, d_model * 2)
        self.linear4 = nn.Linear(d_model * 2, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(0.1)
        self.dropout1 = nn.Dropout(0.1)
        self.dropout2 = nn.Dropout(0.1)
        self.activation = get_activation_fn('relu')
        self.pool_ratios = pool_ratios
        self.p_poses = []
        self.g_pos = None
        self.positional_encoding = PositionEmbeddingSine(num_pos_feats=d_model // 2, normalize=True)

    def forward(self, l, g):
        """
        l: 4,c,h,w
        g: 1,c,h,w
        """
        b, c, h, w = l.size()
        # 4,c,h,w -> 1,c,2h,2w
        concated_locs = patches2image(l)

        pools = []
        for pool_ratio in self.pool_ratios:
            # b,c,h,w
            tgt_hw = (round(h / pool_ratio), round(w / pool_ratio))
            pool = F.adaptive_avg_pool2d(concated_locs, tgt_hw)
            pools.append(to_hw_b_c(pool))
            if self.g_pos is None:
                pos_emb = self.positional_encoding(pool.shape[0], pool.shape[2], pool.shape[3])
                pos_emb = to_hw_b_c(pos_emb)
                self.p_poses.append(pos_emb)
        pools = torch.cat(pools, 0)
        if self.g_pos is None:
            self.p_poses = torch.cat(self.p_poses, dim=0)
            pos_emb = self.positional_encoding(g.shape[0], g.shape[2], g.shape[3])
            self.g_pos = to_hw_b_c(pos_emb)

        # attention between glb (q) & multisensory concated-locs (k,v)
        g_hw_b_c = to_hw_b_c(g)
        g_hw_b_c = g_hw_b_c + self.dropout1(self.attention[0](g_hw_b_c + self.g_pos, pools + self.p_poses, pools)[0])
        g_hw_b_c = self.norm1(g_hw_b_c)
        g_hw_b_c = g_hw_b_c + self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(g_hw_b_c)).clone())))
        g_hw_b_c = self.norm2(g_hw_b_c)

        # attention between origin locs (q) & freashed glb (k,v)
        l_hw_b_c = to_hw_b_c(l)
        _g_hw_b_c = g_hw_b_c.view(h, w, 1, c)
        # (ng h) (nw w) b c -> (h w) (ng nw b) c
        _g_hw_b_c = _g_hw_b_c.view(2, h // 2, 2, w // 2, 1, c).permute(1, 3, 0, 2, 4, 5).reshape(h * w // 4, 4, c)
        outputs_re = []
        for i, (_l, _g) in enumerate(zip(l_hw_b_c.chunk(4, dim=1), _g_hw_b_c.chunk(4, dim=1))):
            outputs_re.append(self.attention[i + 1](_l, _g, _g)[0])  # (h w) 1 c
        outputs_re = torch.cat(outputs_re, 1)  # (h w) 4 c

        l_hw_b_c = l_hw_b_c + self.dropout1(outputs_re)
        l_hw_b_c = self.norm1(l_hw_b_c)
        l_hw_b_c = l_hw_b_c + self.dropout2(self.linear4(self.dropout(self.activation(self.linear3(l_hw_b_c)).clone())))
        l_hw_b_c = self.norm2(l_hw_b_c)

        l = torch.cat((l_hw_b_c, g_hw_b_c), 1)  # hw,b(5),c
        return l.permute(1, 2, 0).reshape(5, c, h, w)  ## (5,c,h*w)


class MCRM(nn.Module):
    def __init__(self, d_model, num_heads, pool_ratios=[4, 8, 16], h=None):
        super(MCRM, self).__init__()
        self.attention = nn.ModuleList([
            nn.MultiheadAttention(d_model, num_heads, dropout=0.1),
            nn.MultiheadAttention(d_model, num_heads, dropout=0.1),
            nn.MultiheadAttention(d_model, num_heads, dropout=0.1),
            nn.MultiheadAttention(d_model, num_heads, dropout=0.1)
        ])

        self.linear1 = nn.Linear(d_model, d_model * 2)
        self.linear2 = nn.Linear(d_model * 2, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(0.1)
        self.dropout1 = nn.Dropout(0.1)
        self.dropout2 = nn.Dropout(0.1)
        self.sigmoid = nn.Sigmoid()
        self.activation = get_activation_fn('relu')
        self.sal_conv = nn.Conv2d(d_model, 1, 1)
        self.pool_ratios = pool_ratios

    def forward(self, x):
        b, c, h, w = x.size()
        loc, glb = x.split([4, 1], dim=0)  # 4,c,h,w; 1,c,h,w
        # b(4),c,h,w
        patched_glb = image2patches(glb)

        # generate token attention map
        token_attention_map = self.sigmoid(self.sal_conv(glb))
        token_attention_map = F.interpolate(token_attention_map, size=patches2image(loc).shape[-2:], mode='nearest')
        loc = loc * image2patches(token_attention_map)
        pools = []
        for pool_ratio in self.pool_ratios:
            tgt_hw = (round(h / pool_ratio), round(w / pool_ratio))
            pool = F.adaptive_avg_pool2d(patched_glb, tgt_hw)
            pools.append(pool.flatten(2))  # nl(4),c,hw
        # nl(4),c,nphw -> nl(4),nphw,1,c
        pools = torch.cat(pools, 2).permute(0, 2, 1).unsqueeze(2)
        loc_ = loc.flatten(2).permute(0, 2, 1).unsqueeze(2)
        outputs = []
        for i, q in enumerate(loc_.unbind(dim=0)):  # traverse all local patches
            # np*hw,1,c
            v = pools[i]
            k = v
            outputs.append(self.attention[i](q, k, v)[0])
        outputs = torch.cat(outputs, 1)
        src = loc.view(4, c, -1).permute(2, 0, 1) + self.dropout1(outputs)
        src = self.norm1(src)
        src = src + self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(src)).clone())))
        src = self.norm2(src)

        src = src.permute(1, 2, 0).reshape(4, c, h, w)  # freshed loc
        glb = glb + F.interpolate(patches2image(src), size=glb.shape[-2:], mode='nearest')  # freshed glb
        return torch.cat((src, glb), 0), token_attention_map


class SwinB(nn.Module):
    """Stands in for the Swin-B backbone: five feature maps at strides 4, 4, 8, 16, 32 (channels / 16)."""
    def __init__(self, pretrained=False):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, kernel_size=4, stride=4)
        self.stage1 = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.GELU())
        self.stage2 = nn.Sequential(nn.Conv2d(8, 16, 2, stride=2), nn.GELU())
        self.stage3 = nn.Sequential(nn.Conv2d(16, 32, 2, stride=2), nn.GELU())
        self.stage4 = nn.Sequential(nn.Conv2d(32, 64, 2, stride=2), nn.GELU())

    def forward(self, x):
        f0 = self.stem(x)
        f1 = self.stage1(f0)
        f2 = self.stage2(f1)
        f3 = self.stage3(f2)
        f4 = self.stage4(f3)
        return [f0, f1, f2, f3, f4]


# model for single-scale training
class MVANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = SwinB(pretrained=False)
        emb_dim = 8
        self.sideout5 = nn.Sequential(nn.Conv2d(emb_dim, 1, kernel_size=3, padding=1))
        self.sideout4 = nn.Sequential(nn.Conv2d(emb_dim, 1, kernel_size=3, padding=1))
        self.sideout3 = nn.Sequential(nn.Conv2d(emb_dim, 1, kernel_size=3, padding=1))
        self.sideout2 = nn.Sequential(nn.Conv2d(emb_dim, 1, kernel_size=3, padding=1))
        self.sideout1 = nn.Sequential(nn.Conv2d(emb_dim, 1, kernel_size=3, padding=1))

        self.output5 = make_cbr(64, emb_dim)
        self.output4 = make_cbr(32, emb_dim)
        self.output3 = make_cbr(16, emb_dim)
        self.output2 = make_cbr(8, emb_dim)
        self.output1 = make_cbr(8, emb_dim)

        self.multifieldcrossatt = MCLM(emb_dim, 1, [1, 2, 4])  # [1, 4, 8] in the original, whose maps are 4x larger
        self.conv1 = make_cbr(emb_dim, emb_dim)
        self.conv2 = make_cbr(emb_dim, emb_dim)
        self.conv3 = make_cbr(emb_dim, emb_dim)
        self.conv4 = make_cbr(emb_dim, emb_dim)
        self.dec_blk1 = MCRM(emb_dim, 1, [2, 4, 8])
        self.dec_blk2 = MCRM(emb_dim, 1, [2, 4, 8])
        self.dec_blk3 = MCRM(emb_dim, 1, [2, 4, 8])
        self.dec_blk4 = MCRM(emb_dim, 1, [2, 4, 8])

        self.insmask_head = nn.Sequential(
            nn.Conv2d(emb_dim, 12, kernel_size=3, padding=1),
            nn.BatchNorm2d(12),
            nn.PReLU(),
            nn.Conv2d(12, 12, kernel_size=3, padding=1),
            nn.BatchNorm2d(12),
            nn.PReLU(),
            nn.Conv2d(12, emb_dim, kernel_size=3, padding=1)
        )

        self.shallow = nn.Sequential(nn.Conv2d(3, emb_dim, kernel_size=3, padding=1))
        self.upsample1 = make_cbg(emb_dim, emb_dim)
        self.upsample2 = make_cbg(emb_dim, emb_dim)
        self.output = nn.Sequential(nn.Conv2d(emb_dim, 1, kernel_size=3, padding=1))

        for m in self.modules():
            if isinstance(m, nn.ReLU) or isinstance(m, nn.Dropout):
                m.inplace = True

    def forward(self, x):
        shallow = self.shallow(x)
        glb = rescale_to(x, scale_factor=0.5, interpolation='bilinear')
        loc = image2patches(x)
        input = torch.cat((loc, glb), dim=0)
        feature = self.backbone(input)
        e5 = self.output5(feature[4])
        e4 = self.output4(feature[3])
        e3 = self.output3(feature[2])
        e2 = self.output2(feature[1])
        e1 = self.output1(feature[0])
        loc_e5, glb_e5 = e5.split([4, 1], dim=0)
        e5 = self.multifieldcrossatt(loc_e5, glb_e5)

        e4, tokenattmap4 = self.dec_blk4(e4 + resize_as(e5, e4))
        e4 = self.conv4(e4)
        e3, tokenattmap3 = self.dec_blk3(e3 + resize_as(e4, e3))
        e3 = self.conv3(e3)
        e2, tokenattmap2 = self.dec_blk2(e2 + resize_as(e3, e2))
        e2 = self.conv2(e2)
        e1, tokenattmap1 = self.dec_blk1(e1 + resize_as(e2, e1))
        e1 = self.conv1(e1)
        loc_e1, glb_e1 = e1.split([4, 1], dim=0)
        output1_cat = patches2image(loc_e1)
        # add glb feat in
        output1_cat = output1_cat + resize_as(glb_e1, output1_cat)
        # merge
        final_output = self.insmask_head(output1_cat)
        # shallow feature merge
        final_output = final_output + resize_as(shallow, final_output)
        final_output = self.upsample1(rescale_to(final_output))
        final_output = rescale_to(final_output + resize_as(shallow, final_output))
        final_output = self.upsample2(final_output)
        final_output = self.output(final_output)
        ####
        sideout5 = self.sideout5(e5)
        sideout4 = self.sideout4(e4)
        sideout3 = self.sideout3(e3)
        sideout2 = self.sideout2(e2)
        sideout1 = self.sideout1(e1)
        #######glb_sideouts ######
        glb5 = self.sideout5(glb_e5)
        glb4 = sideout4[-1, :, :, :].unsqueeze(0)
        glb3 = sideout3[-1, :, :, :].unsqueeze(0)
        glb2 = sideout2[-1, :, :, :].unsqueeze(0)
        glb1 = sideout1[-1, :, :, :].unsqueeze(0)
        ####### concat 4 to 1 #######
        sideout1 = patches2image(sideout1[:-1])
        sideout2 = patches2image(sideout2[:-1])
        sideout3 = patches2image(sideout3[:-1])
        sideout4 = patches2image(sideout4[:-1])
        sideout5 = patches2image(sideout5[:-1])
        if self.training:
            return sideout5, sideout4, sideout3, sideout2, sideout1, final_output, glb5, glb4, glb3, glb2, glb1, tokenattmap4, tokenattmap3, tokenattmap2, tokenattmap1
        else:
            return final_output


def structure_loss(pred, mask):
    weit = 1 + 5 * torch.abs(F.avg_pool2d(mask, kernel_size=31, stride=1, padding=15) - mask)
    wbce = F.binary_cross_entropy_with_logits(pred, mask, reduction='none')
    wbce = (weit * wbce).sum(dim=(2, 3)) / weit.sum(dim=(2, 3))

    pred = torch.sigmoid(pred)
    inter = ((pred * mask) * weit).sum(dim=(2, 3))
    union = ((pred + mask) * weit).sum(dim=(2, 3))
    wiou = 1 - (inter + 1) / (union - inter + 1)

    return (wbce + wiou).mean()


# train.py (DIS5K loader, argparse and tensorboard left out)
generator = MVANet().to(DEVICE)
generator_params = generator.parameters()
generator_optimizer = torch.optim.Adam(generator_params, 1e-5)
train_loader = [(torch.rand(1, 3, 256, 256), (torch.rand(1, 1, 256, 256) > 0.5).float()) for _ in range(3)]
size_rates = [1]
use_fp16 = False  # the original trains under fp16 autocast on CUDA
scaler = torch.amp.GradScaler(DEVICE.type, enabled=use_fp16)

for epoch in range(1, 2):
    generator.train()
    for i, pack in enumerate(train_loader, start=1):
        for rate in size_rates:
            generator_optimizer.zero_grad()
            images, gts = pack
            images = images.to(DEVICE)
            gts = gts.to(DEVICE)

            b, c, h, w = gts.size()
            target_1 = F.interpolate(gts, size=h // 4, mode='nearest')
            target_2 = F.interpolate(gts, size=h // 8, mode='nearest')
            target_3 = F.interpolate(gts, size=h // 16, mode='nearest')
            target_4 = F.interpolate(gts, size=h // 32, mode='nearest')
            target_5 = F.interpolate(gts, size=h // 64, mode='nearest')

            with torch.autocast(DEVICE.type, enabled=use_fp16):
                sideout5, sideout4, sideout3, sideout2, sideout1, final, glb5, glb4, glb3, glb2, glb1, tokenattmap4, tokenattmap3, tokenattmap2, tokenattmap1 = generator.forward(images)
                loss1 = structure_loss(sideout5, target_4)
                loss2 = structure_loss(sideout4, target_3)
                loss3 = structure_loss(sideout3, target_2)
                loss4 = structure_loss(sideout2, target_1)
                loss5 = structure_loss(sideout1, target_1)
                loss6 = structure_loss(final, gts)
                loss7 = structure_loss(glb5, target_5)
                loss8 = structure_loss(glb4, target_4)
                loss9 = structure_loss(glb3, target_3)
                loss10 = structure_loss(glb2, target_2)
                loss11 = structure_loss(glb1, target_2)
                loss12 = structure_loss(tokenattmap4, target_3)
                loss13 = structure_loss(tokenattmap3, target_2)
                loss14 = structure_loss(tokenattmap2, target_1)
                loss15 = structure_loss(tokenattmap1, target_1)
                loss = loss1 + loss2 + loss3 + loss4 + loss5 + loss6 + 0.3 * (loss7 + loss8 + loss9 + loss10 + loss11) + 0.3 * (loss12 + loss13 + loss14 + loss15)

            generator_optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(generator_optimizer)
            scaler.update()
print("done")
