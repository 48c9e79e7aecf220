# source: https://github.com/exiawsh/StreamPETR/issues/63 — issue: why post_update_memory keeps .detach() on the top-k decoder outputs pushed into the memory queue (stream training)
# fix-source: maintainer's comment in the issue ("The memory tensor needs to be detached when using stream training, because of the RuntimeError: Trying to backward through the graph a second time"); the official code detaches it
# expect-kind: second-backward
# expect-culprit: self.memory_embedding
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


def memory_refresh(memory, prev_exist):
    view_shape = [1 for _ in range(memory.dim())]
    return memory * prev_exist.view(-1, *view_shape[1:])


def topk_gather(feat, topk_indexes):
    view_shape = [1 for _ in range(feat.dim())]
    view_shape[:2] = topk_indexes.shape[:2]
    index = topk_indexes.view(*view_shape).repeat(1, 1, *feat.shape[2:])
    return torch.gather(feat, 1, index)


def transform_reference_points(reference_points, egopose, reverse=False):
    reference_points = torch.cat([reference_points, torch.ones_like(reference_points[..., 0:1])], dim=-1)
    matrix = egopose.inverse() if reverse else egopose
    return (matrix.unsqueeze(1) @ reference_points.unsqueeze(-1)).squeeze(-1)[..., :3]


def pos2posemb(pos, num_pos_feats, temperature=10000):
    pos = pos * 2 * math.pi
    dim_t = torch.arange(num_pos_feats, dtype=torch.float32, device=pos.device)
    dim_t = temperature ** (2 * (dim_t // 2) / num_pos_feats)
    embs = []
    for i in range(pos.shape[-1]):
        p = pos[..., i, None] / dim_t
        embs.append(torch.stack((p[..., 0::2].sin(), p[..., 1::2].cos()), dim=-1).flatten(-2))
    return torch.cat(embs, dim=-1)


class TemporalDecoderLayer(nn.Module):
    def __init__(self, d, heads=2):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(3))

    def forward(self, tgt, query_pos, memory, pos_embed, temp_memory, temp_pos):
        q = tgt + query_pos
        k = torch.cat([q, temp_memory + temp_pos], dim=1)
        v = torch.cat([tgt, temp_memory], dim=1)
        tgt = self.norms[0](tgt + self.self_attn(q, k, v)[0])
        tgt = self.norms[1](tgt + self.cross_attn(tgt + query_pos, memory + pos_embed, memory)[0])
        return self.norms[2](tgt + self.ffn(tgt))


class PETRTemporalTransformer(nn.Module):
    def __init__(self, d, num_layers=2):
        super().__init__()
        self.layers = nn.ModuleList(TemporalDecoderLayer(d) for _ in range(num_layers))

    def forward(self, memory, tgt, query_pos, pos_embed, attn_mask, temp_memory, temp_pos):
        intermediate = []
        for layer in self.layers:
            tgt = layer(tgt, query_pos, memory, pos_embed, temp_memory, temp_pos)
            intermediate.append(tgt)
        return torch.stack(intermediate), None


class StreamPETRHead(nn.Module):
    def __init__(self, num_classes=3, in_channels=8, embed_dims=16, num_query=6, memory_len=8,
                 topk_proposals=4, num_propagated=2, code_size=10, num_pred=2):
        super().__init__()
        self.num_classes, self.embed_dims, self.num_query = num_classes, embed_dims, num_query
        self.memory_len, self.topk_proposals, self.num_propagated = memory_len, topk_proposals, num_propagated
        self.register_buffer("pc_range", torch.tensor([-10.0, -10.0, -3.0, 10.0, 10.0, 3.0]))
        self.transformer = PETRTemporalTransformer(embed_dims, num_pred)
        self.cls_branches = nn.ModuleList(nn.Linear(embed_dims, num_classes) for _ in range(num_pred))
        self.reg_branches = nn.ModuleList(nn.Linear(embed_dims, code_size) for _ in range(num_pred))
        self.position_encoder = nn.Sequential(nn.Linear(2, embed_dims), nn.ReLU(), nn.Linear(embed_dims, embed_dims))
        self.memory_embed = nn.Sequential(nn.Linear(in_channels, embed_dims), nn.ReLU(), nn.Linear(embed_dims, embed_dims))
        self.reference_points = nn.Embedding(num_query, 3)
        self.pseudo_reference_points = nn.Embedding(num_propagated, 3)
        self.query_embedding = nn.Sequential(nn.Linear(embed_dims * 3 // 2, embed_dims), nn.ReLU(),
                                             nn.Linear(embed_dims, embed_dims))
        self.time_embedding = nn.Sequential(nn.Linear(embed_dims, embed_dims), nn.LayerNorm(embed_dims))
        self.init_weights()
        self.reset_memory()

    def init_weights(self):
        nn.init.uniform_(self.reference_points.weight.data, 0, 1)
        nn.init.uniform_(self.pseudo_reference_points.weight.data, 0, 1)
        self.pseudo_reference_points.weight.requires_grad = False

    def reset_memory(self):
        self.memory_embedding = None
        self.memory_reference_point = None
        self.memory_timestamp = None
        self.memory_egopose = None
        self.memory_velo = None

    def pre_update_memory(self, data):
        x = data['prev_exists']
        B = x.size(0)
        if self.memory_embedding is None:
            self.memory_embedding = x.new_zeros(B, self.memory_len, self.embed_dims)
            self.memory_reference_point = x.new_zeros(B, self.memory_len, 3)
            self.memory_timestamp = x.new_zeros(B, self.memory_len, 1)
            self.memory_egopose = x.new_zeros(B, self.memory_len, 4, 4)
            self.memory_velo = x.new_zeros(B, self.memory_len, 2)
        else:
            self.memory_timestamp += data['timestamp'].unsqueeze(-1).unsqueeze(-1)
            self.memory_egopose = data['ego_pose_inv'].unsqueeze(1) @ self.memory_egopose
            self.memory_reference_point = transform_reference_points(self.memory_reference_point, data['ego_pose_inv'])
            self.memory_timestamp = memory_refresh(self.memory_timestamp[:, :self.memory_len], x)
            self.memory_reference_point = memory_refresh(self.memory_reference_point[:, :self.memory_len], x)
            self.memory_embedding = memory_refresh(self.memory_embedding[:, :self.memory_len], x)
            self.memory_egopose = memory_refresh(self.memory_egopose[:, :self.memory_len], x)
            self.memory_velo = memory_refresh(self.memory_velo[:, :self.memory_len], x)
        # first frame of a scene: pad with the (frozen) pseudo reference points
        pseudo = self.pseudo_reference_points.weight * (self.pc_range[3:6] - self.pc_range[0:3]) + self.pc_range[0:3]
        self.memory_reference_point[:, :self.num_propagated] = \
            self.memory_reference_point[:, :self.num_propagated] + (1 - x).view(B, 1, 1) * pseudo
        self.memory_egopose[:, :self.num_propagated] = \
            self.memory_egopose[:, :self.num_propagated] + (1 - x).view(B, 1, 1, 1) * torch.eye(4, device=x.device)

    def post_update_memory(self, data, rec_ego_pose, all_cls_scores, all_bbox_preds, outs_dec):
        rec_reference_points = all_bbox_preds[..., :3][-1]
        rec_velo = all_bbox_preds[..., -2:][-1]
        rec_memory = outs_dec[-1]
        rec_score = all_cls_scores[-1].sigmoid().topk(1, dim=-1).values[..., 0:1]
        rec_timestamp = torch.zeros_like(rec_score)

        _, topk_indexes = torch.topk(rec_score, self.topk_proposals, dim=1)
        rec_timestamp = topk_gather(rec_timestamp, topk_indexes)
        rec_reference_points = topk_gather(rec_reference_points, topk_indexes).detach()
        rec_memory = topk_gather(rec_memory, topk_indexes)
        rec_ego_pose = topk_gather(rec_ego_pose, topk_indexes)
        rec_velo = topk_gather(rec_velo, topk_indexes).detach()

        self.memory_embedding = torch.cat([rec_memory, self.memory_embedding], dim=1)  # culprit
        self.memory_timestamp = torch.cat([rec_timestamp, self.memory_timestamp], dim=1)
        self.memory_egopose = torch.cat([rec_ego_pose, self.memory_egopose], dim=1)
        self.memory_reference_point = torch.cat([rec_reference_points, self.memory_reference_point], dim=1)
        self.memory_velo = torch.cat([rec_velo, self.memory_velo], dim=1)
        self.memory_reference_point = transform_reference_points(self.memory_reference_point, data['ego_pose'])
        self.memory_timestamp -= data['timestamp'].unsqueeze(-1).unsqueeze(-1)
        self.memory_egopose = data['ego_pose'].unsqueeze(1) @ self.memory_egopose

    def temporal_alignment(self, query_pos, tgt, reference_points):
        B = query_pos.size(0)
        temp_reference_point = (self.memory_reference_point - self.pc_range[:3]) / (self.pc_range[3:6] - self.pc_range[0:3])
        temp_pos = self.query_embedding(pos2posemb(temp_reference_point, self.embed_dims // 2))
        temp_memory = self.memory_embedding
        rec_ego_pose = torch.eye(4, device=query_pos.device).unsqueeze(0).unsqueeze(0).repeat(B, query_pos.size(1), 1, 1)
        query_pos = query_pos + self.time_embedding(pos2posemb(torch.zeros_like(reference_points[..., :1]), self.embed_dims))
        temp_pos = temp_pos + self.time_embedding(pos2posemb(self.memory_timestamp, self.embed_dims))
        if self.num_propagated > 0:
            tgt = torch.cat([tgt, temp_memory[:, :self.num_propagated]], dim=1)
            query_pos = torch.cat([query_pos, temp_pos[:, :self.num_propagated]], dim=1)
            reference_points = torch.cat([reference_points, temp_reference_point[:, :self.num_propagated]], dim=1)
            rec_ego_pose = torch.eye(4, device=query_pos.device).unsqueeze(0).unsqueeze(0).repeat(B, query_pos.shape[1], 1, 1)
            temp_memory = temp_memory[:, self.num_propagated:]
            temp_pos = temp_pos[:, self.num_propagated:]
        return tgt, query_pos, reference_points, temp_memory, temp_pos, rec_ego_pose

    def forward(self, memory_center, **data):
        self.pre_update_memory(data)
        x = data['img_feats']
        B, N, C, H, W = x.shape
        memory = self.memory_embed(x.permute(0, 1, 3, 4, 2).reshape(B, N * H * W, C))
        pos_embed = self.position_encoder(memory_center.reshape(B, N * H * W, 2))

        reference_points = self.reference_points.weight.unsqueeze(0).repeat(B, 1, 1)
        query_pos = self.query_embedding(pos2posemb(reference_points, self.embed_dims // 2))
        tgt = torch.zeros_like(query_pos)
        tgt, query_pos, reference_points, temp_memory, temp_pos, rec_ego_pose = \
            self.temporal_alignment(query_pos, tgt, reference_points)

        outs_dec, _ = self.transformer(memory, tgt, query_pos, pos_embed, None, temp_memory, temp_pos)
        outputs_classes, outputs_coords = [], []
        for lvl in range(outs_dec.shape[0]):
            reference = torch.logit(reference_points.clone().clamp(1e-3, 1 - 1e-3))
            tmp = self.reg_branches[lvl](outs_dec[lvl])
            tmp = torch.cat([(tmp[..., 0:3] + reference).sigmoid(), tmp[..., 3:]], dim=-1)
            outputs_classes.append(self.cls_branches[lvl](outs_dec[lvl]))
            outputs_coords.append(tmp)
        all_cls_scores = torch.stack(outputs_classes)
        all_bbox_preds = torch.stack(outputs_coords)
        all_bbox_preds = torch.cat([all_bbox_preds[..., 0:3] * (self.pc_range[3:6] - self.pc_range[0:3]) + self.pc_range[0:3],
                                    all_bbox_preds[..., 3:]], dim=-1)

        self.post_update_memory(data, rec_ego_pose, all_cls_scores, all_bbox_preds, outs_dec)
        return {'all_cls_scores': all_cls_scores, 'all_bbox_preds': all_bbox_preds}

    def loss(self, gt_bboxes_3d, gt_labels_3d, preds_dicts):
        losses = {}
        for lvl, (cls_scores, bbox_preds) in enumerate(zip(preds_dicts['all_cls_scores'], preds_dicts['all_bbox_preds'])):
            target = F.one_hot(gt_labels_3d, self.num_classes).float()
            losses[f'd{lvl}.loss_cls'] = F.binary_cross_entropy_with_logits(cls_scores, target)
            losses[f'd{lvl}.loss_bbox'] = 0.25 * F.l1_loss(bbox_preds, gt_bboxes_3d)
        return losses


class Petr3D(nn.Module):
    def __init__(self):
        super().__init__()
        self.pts_bbox_head = StreamPETRHead()

    def forward_pts_train(self, gt_bboxes_3d, gt_labels_3d, location, **data):
        outs = self.pts_bbox_head(location, **data)
        return self.pts_bbox_head.loss(gt_bboxes_3d, gt_labels_3d, outs)

    def forward_train(self, gt_bboxes_3d, gt_labels_3d, location, **data):
        return self.forward_pts_train(gt_bboxes_3d, gt_labels_3d, location, **data)


def make_frame(i, B=2, Q=8):
    angle = torch.full((B,), 0.05 * i, device=DEVICE)
    ego_pose = torch.eye(4, device=DEVICE).repeat(B, 1, 1)
    ego_pose[:, 0, 0], ego_pose[:, 0, 1] = angle.cos(), -angle.sin()
    ego_pose[:, 1, 0], ego_pose[:, 1, 1] = angle.sin(), angle.cos()
    ego_pose[:, 0, 3] = 0.5 * i
    return dict(
        img_feats=torch.randn(B, 1, 8, 2, 2, device=DEVICE),
        location=torch.rand(B, 2, 2, 2, device=DEVICE),
        prev_exists=torch.full((B,), float(i > 0), device=DEVICE),
        timestamp=torch.full((B,), 0.5, device=DEVICE),
        ego_pose=ego_pose,
        ego_pose_inv=torch.linalg.inv(ego_pose),
        gt_bboxes_3d=torch.randn(B, Q, 10, device=DEVICE),
        gt_labels_3d=torch.randint(0, 3, (B, Q), device=DEVICE),
    )


model = Petr3D().to(DEVICE)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.01)
scene = [make_frame(i) for i in range(4)]
model.train()
for data in scene:  # stream training: one frame per iteration, the memory queue carries over
    losses = model.forward_train(**data)
    loss = sum(losses.values())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
