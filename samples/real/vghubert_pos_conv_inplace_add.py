# source: https://github.com/jasonppy/word-discovery/pull/4 — VG-HuBERT's AudioEncoder adds the positional convolution into its own input in place (x += x_conv), which the pos_conv saved for backward
# fix-source: https://github.com/jasonppy/word-discovery/commit/74cab62942d8baad85d94cc7253298e9efc5d5bc — merged PR #4: `x += x_conv` becomes `x = x + x_conv` in AudioEncoder.forward (and get_last_selfattention)
# expect-kind: inplace-modified
# expect-culprit: x
import argparse
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


def Margin_InfoNCE_loss(S, margin, img_id=None):
    target = torch.LongTensor(list(range(S.size(0)))).to(S.device)
    deltas = margin * torch.eye(S.size(0)).to(S.device)
    S = S - deltas
    very_neg = torch.tensor(-10000.).to(S)
    if img_id is not None:
        img_id_equal_matrix = torch.from_numpy((img_id[:, None] == img_id[None, :])).to(S)
        diag_mask = (-1. * torch.eye(S.size(0)).to(S.device)) + torch.ones_like(S)
        mask = img_id_equal_matrix * diag_mask * very_neg
        S = S + mask
    I2C_loss = F.nll_loss(F.log_softmax(S, dim=1), target)
    C2I_loss = F.nll_loss(F.log_softmax(S.t(), dim=1), target)
    return I2C_loss + C2I_loss


class SamePad(nn.Module):
    def __init__(self, kernel_size):
        super().__init__()
        self.remove = 1 if kernel_size % 2 == 0 else 0

    def forward(self, x):
        if self.remove > 0:
            x = x[:, :, :-self.remove]
        return x


class ConvFeatureExtractionModel(nn.Module):
    def __init__(self, conv_layers, dropout=0.0, conv_bias=False):
        super().__init__()
        in_d = 1
        self.conv_layers = nn.ModuleList()
        for i, (dim, k, stride) in enumerate(conv_layers):
            conv = nn.Conv1d(in_d, dim, k, stride=stride, bias=conv_bias)
            nn.init.kaiming_normal_(conv.weight)
            if i == 0:
                self.conv_layers.append(nn.Sequential(conv, nn.Dropout(p=dropout), nn.GroupNorm(dim, dim, affine=True), nn.GELU()))
            else:
                self.conv_layers.append(nn.Sequential(conv, nn.Dropout(p=dropout), nn.GELU()))
            in_d = dim

    def forward(self, x):
        if len(x.shape) == 2:
            x = x.unsqueeze(1)
        for conv in self.conv_layers:
            x = conv(x)
        return x


class TransformerSentenceEncoderLayer(nn.Module):
    def __init__(self, embedding_dim, ffn_embedding_dim, num_attention_heads, dropout, attention_dropout, activation_dropout):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(embedding_dim, num_attention_heads, dropout=attention_dropout)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(activation_dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.self_attn_layer_norm = nn.LayerNorm(embedding_dim)
        self.fc1 = nn.Linear(embedding_dim, ffn_embedding_dim)
        self.fc2 = nn.Linear(ffn_embedding_dim, embedding_dim)
        self.final_layer_norm = nn.LayerNorm(embedding_dim)

    def forward(self, x, self_attn_padding_mask=None):
        residual = x
        x, attn = self.self_attn(x, x, x, key_padding_mask=self_attn_padding_mask)
        x = self.dropout1(x)
        x = residual + x
        x = self.self_attn_layer_norm(x)
        residual = x
        x = F.gelu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        x = self.dropout3(x)
        x = residual + x
        x = self.final_layer_norm(x)
        return x, attn


class TransformerEncoder(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.layer_use = args.layer_use
        self.dropout = args.dropout
        self.layers = nn.ModuleList([
            TransformerSentenceEncoderLayer(args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads,
                                            args.dropout, args.attention_dropout, args.activation_dropout)
            for _ in range(args.encoder_layers)
        ])
        self.layer_norm = nn.LayerNorm(args.encoder_embed_dim)

    def forward(self, x, padding_mask=None, tgt_layer=None):
        x = self.layer_norm(x)
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = x.transpose(0, 1)
        for i, layer in enumerate(self.layers):
            x, z = layer(x, self_attn_padding_mask=padding_mask)
            if i == tgt_layer:
                layer_feats = x.transpose(0, 1)
                return layer_feats, layer_feats
        x = x.transpose(0, 1)
        return x, x


class AudioEncoder(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args
        feature_enc_layers = eval(args.conv_feature_layers)
        self.embed = feature_enc_layers[-1][0]
        self.feature_extractor = ConvFeatureExtractionModel(conv_layers=feature_enc_layers, dropout=0.0, conv_bias=False)
        self.post_extract_proj = nn.Linear(self.embed, args.encoder_embed_dim)
        self.dropout_input = nn.Dropout(args.dropout_input)
        self.dropout_features = nn.Dropout(args.dropout_features)
        self.feature_grad_mult = args.feature_grad_mult

        self.pos_conv = nn.Conv1d(
            self.args.encoder_embed_dim,
            self.args.encoder_embed_dim,
            kernel_size=args.conv_pos,
            padding=args.conv_pos // 2,
            groups=args.conv_pos_groups,
        )
        dropout = 0
        std = math.sqrt((4 * (1.0 - dropout)) / (args.conv_pos * self.args.encoder_embed_dim))
        nn.init.normal_(self.pos_conv.weight, mean=0, std=std)
        nn.init.constant_(self.pos_conv.bias, 0)
        self.pos_conv = nn.utils.weight_norm(self.pos_conv, name="weight", dim=2)
        self.pos_conv = nn.Sequential(self.pos_conv, SamePad(args.conv_pos), nn.GELU())
        args.encoder_layers = args.layer_use + 1
        self.encoder = TransformerEncoder(args)
        self.layer_norm = nn.LayerNorm(self.embed)
        if self.args.use_audio_cls_token:
            self.cls_token = torch.nn.Parameter(torch.randn((1, 1, args.encoder_embed_dim)), requires_grad=True)

    def forward(self, source, padding_mask=None, mask=None, tgt_layer=None):
        if self.feature_grad_mult > 0:
            features = self.feature_extractor(source)
        else:
            with torch.no_grad():
                features = self.feature_extractor(source)

        features_pen = features.float().pow(2).mean()
        features = features.transpose(1, 2)
        features = self.layer_norm(features)
        unmasked_features = features.clone()

        if padding_mask is not None:
            extra = padding_mask.size(1) % features.size(1)
            if extra > 0:
                padding_mask = padding_mask[:, :-extra]
            padding_mask = padding_mask.view(padding_mask.size(0), features.size(1), -1)
            padding_mask = padding_mask.all(-1)
        if self.post_extract_proj is not None:
            features = self.post_extract_proj(features)

        features = self.dropout_input(features)
        unmasked_features = self.dropout_features(unmasked_features)

        x = features
        x_conv = self.pos_conv(x.transpose(1, 2))  # culprit
        x_conv = x_conv.transpose(1, 2)
        x += x_conv  # step
        if self.args.use_audio_cls_token:
            x = torch.cat([self.cls_token.repeat(x.shape[0], 1, 1), x], dim=1)
            if padding_mask is not None:
                cls_token_padding_mask = torch.zeros((padding_mask.shape[0], 1)).to(padding_mask)
                padding_mask = torch.cat([cls_token_padding_mask, padding_mask], dim=1)

        features, layer_feats = self.encoder(x, padding_mask=padding_mask, tgt_layer=tgt_layer)
        if self.args.use_audio_cls_token:
            cls_token = layer_feats[:, 0]
            features = features[:, 1:]
            layer_feats = layer_feats[:, 1:]
            if padding_mask is not None:
                padding_mask = padding_mask[:, 1:]
        else:
            cls_token = None
        return {"features": features, "layer_feats": layer_feats, "cls_token": cls_token,
                "padding_mask": padding_mask, "features_pen": features_pen}


class VisionTransformer(nn.Module):
    """A stand-in for the DINO ViT-small: patch embedding, a cls token, one block."""

    def __init__(self, patch_size, embed_dim):
        super().__init__()
        self.embed_dim = embed_dim
        self.patch_embed = nn.Conv2d(3, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.block = nn.TransformerEncoderLayer(embed_dim, 2, dim_feedforward=2 * embed_dim, batch_first=True)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.norm(self.block(x))
        return {"visual_cls": x[:, 0], "visual_feats": x[:, 1:]}


class DualEncoder(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.args.encoder_layers = self.args.layer_use + 1
        self.audio_encoder = AudioEncoder(argparse.Namespace(**vars(self.args)))
        self.trm = VisionTransformer(patch_size=self.args.vit_patch_size, embed_dim=8)
        if self.args.cls_loss:
            self.audio_cls_token_proj = nn.Sequential(nn.Linear(self.args.encoder_embed_dim, self.args.encoder_embed_dim * 2), nn.GELU(), nn.Linear(self.args.encoder_embed_dim * 2, self.args.common_embed_dim))
            self.visual_cls_token_proj = nn.Sequential(nn.Linear(self.trm.embed_dim, self.args.encoder_embed_dim * 2), nn.GELU(), nn.Linear(self.args.encoder_embed_dim * 2, self.args.common_embed_dim))
        self.apply(self.init_weights)

    def init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=self.args.initializer_range)
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()

    def forward_image(self, images):
        out = self.trm(images)
        if self.args.cls_loss:
            out['visual_cls'] = self.visual_cls_token_proj(out['visual_cls'])
        return out

    def forward_audio(self, audio_feats, audio_attention_mask, test=False):
        self.audio_encoder.train()
        trm2_out = self.audio_encoder(audio_feats, padding_mask=audio_attention_mask, mask=False, tgt_layer=self.args.layer_use)
        cls_token = trm2_out['cls_token']
        audio_feats = trm2_out['layer_feats']
        attention_mask = trm2_out['padding_mask']
        if self.args.cls_loss:
            cls_token = self.audio_cls_token_proj(cls_token)
        extended_attention_mask = attention_mask.unsqueeze(1).unsqueeze(2)
        extended_audio_attention_mask = extended_attention_mask * -10000.0
        return audio_feats, cls_token, extended_audio_attention_mask

    def forward(self, audio_feats, images, attention_mask=None, test=False):
        visual_out = self.forward_image(images)
        audio_feats, audio_cls, extended_audio_attention_mask = self.forward_audio(audio_feats, attention_mask)
        nframes = (extended_audio_attention_mask.squeeze(1).squeeze(1) == 0.0).to(audio_feats).sum(1)
        return audio_feats.sum(1) / nframes.unsqueeze(-1), audio_cls, extended_audio_attention_mask, visual_out['visual_feats'].mean(1), visual_out['visual_cls']


class Trainer:
    def __init__(self, args):
        self.args = args
        self.device = DEVICE
        self.dual_encoder, self.trainables = self._setup_models()
        self.optimizer = torch.optim.Adam(self.trainables, lr=self.args.lr)

    def _setup_models(self):
        model = DualEncoder(self.args)
        if self.args.feature_grad_mult <= 0.:
            for name, p in model.named_parameters():
                if "feature_extractor" in name:
                    p.requires_grad = False
        trainables = [p for p in model.parameters() if p.requires_grad]
        model.to(self.device)
        return model, trainables

    def forward(self, batch):
        audio_feats, audio_cls, extended_audio_attention_mask, visual_feats, visual_cls, = self.dual_encoder(audio_feats=batch['audio'], attention_mask=batch['audio_attention_mask'], images=batch['images'])
        losses = {}
        if self.args.cls_loss:
            coarse_cross_relationship_score_matrix = visual_cls @ audio_cls.transpose(0, 1)
            losses['cls_matching_loss'] = Margin_InfoNCE_loss(coarse_cross_relationship_score_matrix, margin=self.args.margin, img_id=batch['img_id'])
        return losses

    def weight_loss(self, losses):
        weighted_loss = 0.
        if "cls_matching_loss" in losses:
            weighted_loss += losses['cls_matching_loss'] * self.args.cls_coarse_matching_weight
        return weighted_loss

    def train(self, train_loader):
        for i, batch in enumerate(train_loader):
            self.dual_encoder.train()
            cur_batch = {
                "images": batch['images'].to(self.device),
                "audio": batch['audio'].to(self.device),
                "audio_attention_mask": batch['audio_attention_mask'].to(self.device),
                "img_id": batch['img_id'],
            }
            losses = self.forward(cur_batch)
            weighted_loss = self.weight_loss(losses)
            weighted_loss.backward()
            torch.nn.utils.clip_grad_norm_(self.trainables, 1.)
            self.optimizer.step()
            self.optimizer.zero_grad()


args = argparse.Namespace(
    conv_feature_layers="[(8, 4, 2), (8, 3, 2)]", encoder_embed_dim=12, encoder_ffn_embed_dim=16,
    encoder_attention_heads=2, layer_use=1, dropout=0.1, attention_dropout=0.1, activation_dropout=0.0,
    dropout_input=0.1, dropout_features=0.1, feature_grad_mult=0., conv_pos=4, conv_pos_groups=2,
    use_audio_cls_token=True, cls_loss=True, common_embed_dim=6, vit_patch_size=4, initializer_range=0.02,
    margin=1.0, cls_coarse_matching_weight=1.0, lr=5e-5,
)
train_loader = [
    {
        "images": torch.randn(3, 3, 8, 8, device=DEVICE),
        "audio": torch.randn(3, 64, device=DEVICE),
        "audio_attention_mask": torch.zeros(3, 64, dtype=torch.bool, device=DEVICE),
        "img_id": np.array([0, 1, 2]),
    }
    for _ in range(2)
]
trainer = Trainer(args)
trainer.train(train_loader)
print("done")
