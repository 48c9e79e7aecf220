# source: https://github.com/RangiLyu/nanodet/issues/7 — issue: training (after lowering warmup steps) stops in Trainer.run_step at loss.backward() with "element 0 of tensors does not require grad and does not have a grad_fn"; GFLHead.loss (nanodet/model/head/gfl_head.py) replaces all three losses by fresh torch.tensor(0) constants when a batch has no positive samples (avg_factor <= 0)
# fix-source: https://github.com/RangiLyu/nanodet/commit/a444d7232b602015f5054d244eae1f367a9ae537 — maintainer's "fix zero loss in issue #7": the three zero losses are created with requires_grad=True
# expect-kind: none
# fix: in the `avg_factor <= 0` branch of GFLHead.loss the three zero losses are created with `requires_grad=True`, so `loss` can be back-propagated (with zero gradients) on a batch without positives
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from _device import DEVICE


def multi_apply(func, *args, **kwargs):
    pfunc = partial(func, **kwargs) if kwargs else func
    map_results = map(pfunc, *args)
    return tuple(map(list, zip(*map_results)))


def reduce_mean(tensor):
    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    tensor = tensor.clone()
    dist.all_reduce(tensor.true_divide(dist.get_world_size()), op=dist.ReduceOp.SUM)
    return tensor


def distance2bbox(points, distance):
    x1 = points[:, 0] - distance[:, 0]
    y1 = points[:, 1] - distance[:, 1]
    x2 = points[:, 0] + distance[:, 2]
    y2 = points[:, 1] + distance[:, 3]
    return torch.stack([x1, y1, x2, y2], -1)


def bbox2distance(points, bbox, max_dis=None, eps=0.1):
    left = points[:, 0] - bbox[:, 0]
    top = points[:, 1] - bbox[:, 1]
    right = bbox[:, 2] - points[:, 0]
    bottom = bbox[:, 3] - points[:, 1]
    if max_dis is not None:
        left = left.clamp(min=0, max=max_dis - eps)
        top = top.clamp(min=0, max=max_dis - eps)
        right = right.clamp(min=0, max=max_dis - eps)
        bottom = bottom.clamp(min=0, max=max_dis - eps)
    return torch.stack([left, top, right, bottom], -1)


def bbox_overlaps(bboxes1, bboxes2, is_aligned=True, eps=1e-6):
    lt = torch.max(bboxes1[:, :2], bboxes2[:, :2])
    rb = torch.min(bboxes1[:, 2:], bboxes2[:, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[:, 0] * wh[:, 1]
    area1 = (bboxes1[:, 2] - bboxes1[:, 0]) * (bboxes1[:, 3] - bboxes1[:, 1])
    area2 = (bboxes2[:, 2] - bboxes2[:, 0]) * (bboxes2[:, 3] - bboxes2[:, 1])
    return overlap / (area1 + area2 - overlap).clamp(min=eps)


class QualityFocalLoss(nn.Module):
    def __init__(self, use_sigmoid=True, beta=2.0, loss_weight=1.0):
        super().__init__()
        self.beta = beta
        self.loss_weight = loss_weight

    def forward(self, pred, target, weight=None, avg_factor=None):
        label, score = target
        pred_sigmoid = pred.sigmoid()
        zerolabel = pred_sigmoid.new_zeros(pred.shape)
        loss = F.binary_cross_entropy_with_logits(
            pred, zerolabel, reduction='none') * pred_sigmoid.pow(self.beta)
        bg_class_ind = pred.size(1)
        pos = torch.nonzero((label >= 0) & (label < bg_class_ind), as_tuple=False).squeeze(1)
        pos_label = label[pos].long()
        scale_factor = score[pos] - pred_sigmoid[pos, pos_label]
        loss[pos, pos_label] = F.binary_cross_entropy_with_logits(
            pred[pos, pos_label], score[pos], reduction='none') * scale_factor.abs().pow(self.beta)
        loss = loss.sum(dim=1) * weight
        return self.loss_weight * loss.sum() / avg_factor


class DistributionFocalLoss(nn.Module):
    def __init__(self, loss_weight=1.0):
        super().__init__()
        self.loss_weight = loss_weight

    def forward(self, pred, label, weight=None, avg_factor=None):
        dis_left = label.long()
        dis_right = dis_left + 1
        weight_left = dis_right.float() - label
        weight_right = label - dis_left.float()
        loss = F.cross_entropy(pred, dis_left, reduction='none') * weight_left \
            + F.cross_entropy(pred, dis_right, reduction='none') * weight_right
        return self.loss_weight * (loss * weight).sum() / avg_factor


class GIoULoss(nn.Module):
    def __init__(self, loss_weight=1.0, eps=1e-6):
        super().__init__()
        self.loss_weight = loss_weight
        self.eps = eps

    def forward(self, pred, target, weight=None, avg_factor=None):
        lt = torch.max(pred[:, :2], target[:, :2])
        rb = torch.min(pred[:, 2:], target[:, 2:])
        wh = (rb - lt).clamp(min=0)
        overlap = wh[:, 0] * wh[:, 1]
        area1 = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
        area2 = (target[:, 2] - target[:, 0]) * (target[:, 3] - target[:, 1])
        union = (area1 + area2 - overlap).clamp(min=self.eps)
        ious = overlap / union
        enclose_lt = torch.min(pred[:, :2], target[:, :2])
        enclose_rb = torch.max(pred[:, 2:], target[:, 2:])
        enclose_wh = (enclose_rb - enclose_lt).clamp(min=0)
        enclose_area = enclose_wh[:, 0] * enclose_wh[:, 1] + self.eps
        gious = ious - (enclose_area - union) / enclose_area
        loss = 1 - gious
        return self.loss_weight * (loss * weight).sum() / avg_factor


class Integral(nn.Module):
    def __init__(self, reg_max=16):
        super(Integral, self).__init__()
        self.reg_max = reg_max
        self.register_buffer('project', torch.linspace(0, self.reg_max, self.reg_max + 1))

    def forward(self, x):
        x = F.softmax(x.reshape(-1, self.reg_max + 1), dim=1)
        x = F.linear(x, self.project.type_as(x)).reshape(-1, 4)
        return x


class Scale(nn.Module):
    def __init__(self, scale=1.0):
        super(Scale, self).__init__()
        self.scale = nn.Parameter(torch.tensor(scale, dtype=torch.float))

    def forward(self, x):
        return x * self.scale


class GFLHead(nn.Module):
    def __init__(self, num_classes, input_channel, feat_channels=8, stacked_convs=1,
                 anchor_strides=(8, 16), reg_max=4):
        super(GFLHead, self).__init__()
        self.num_classes = num_classes
        self.cls_out_channels = num_classes
        self.in_channels = input_channel
        self.feat_channels = feat_channels
        self.stacked_convs = stacked_convs
        self.anchor_strides = anchor_strides
        self.reg_max = reg_max
        self._init_layers()
        self.distribution_project = Integral(self.reg_max)
        self.loss_qfl = QualityFocalLoss(use_sigmoid=True, beta=2.0, loss_weight=1.0)
        self.loss_dfl = DistributionFocalLoss(loss_weight=0.25)
        self.loss_bbox = GIoULoss(loss_weight=2.0)

    def _init_layers(self):
        self.cls_convs = nn.ModuleList()
        self.reg_convs = nn.ModuleList()
        for i in range(self.stacked_convs):
            chn = self.in_channels if i == 0 else self.feat_channels
            self.cls_convs.append(nn.Sequential(
                nn.Conv2d(chn, self.feat_channels, 3, padding=1, bias=False),
                nn.GroupNorm(4, self.feat_channels), nn.ReLU(inplace=True)))
            self.reg_convs.append(nn.Sequential(
                nn.Conv2d(chn, self.feat_channels, 3, padding=1, bias=False),
                nn.GroupNorm(4, self.feat_channels), nn.ReLU(inplace=True)))
        self.gfl_cls = nn.Conv2d(self.feat_channels, self.cls_out_channels, 3, padding=1)
        self.gfl_reg = nn.Conv2d(self.feat_channels, 4 * (self.reg_max + 1), 3, padding=1)
        self.scales = nn.ModuleList([Scale(1.0) for _ in self.anchor_strides])

    def forward(self, feats):
        return multi_apply(self.forward_single, feats, self.scales)

    def forward_single(self, x, scale):
        cls_feat = x
        reg_feat = x
        for cls_conv in self.cls_convs:
            cls_feat = cls_conv(cls_feat)
        for reg_conv in self.reg_convs:
            reg_feat = reg_conv(reg_feat)
        cls_score = self.gfl_cls(cls_feat)
        bbox_pred = scale(self.gfl_reg(reg_feat)).float()
        return cls_score, bbox_pred

    def get_anchors(self, featmap_sizes, batch_size, device):
        anchor_list = []
        for (h, w), stride in zip(featmap_sizes, self.anchor_strides):
            ys, xs = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing='ij')
            cx = (xs.reshape(-1).float() + 0.5) * stride
            cy = (ys.reshape(-1).float() + 0.5) * stride
            half = 2.0 * stride
            anchors = torch.stack([cx - half, cy - half, cx + half, cy + half], -1)
            anchor_list.append(anchors.unsqueeze(0).expand(batch_size, -1, -1))
        return anchor_list

    def gfl_target(self, anchor_list, gt_bboxes, gt_labels):
        # stand-in for the ATSS assignment: an anchor is positive when its centre lies in a gt box
        labels_list, label_weights_list, bbox_targets_list = [], [], []
        num_total_pos = 0
        for anchors in anchor_list:
            n_img, n_anchor = anchors.shape[:2]
            labels = anchors.new_full((n_img, n_anchor), self.num_classes, dtype=torch.long)
            bbox_targets = anchors.new_zeros((n_img, n_anchor, 4))
            for i in range(n_img):
                centers = self.anchor_center(anchors[i])
                for box, lab in zip(gt_bboxes[i], gt_labels[i]):
                    inside = (centers[:, 0] > box[0]) & (centers[:, 0] < box[2]) & \
                             (centers[:, 1] > box[1]) & (centers[:, 1] < box[3])
                    labels[i, inside] = lab
                    bbox_targets[i, inside] = box
            num_total_pos += int((labels < self.num_classes).sum())
            labels_list.append(labels)
            label_weights_list.append(anchors.new_ones((n_img, n_anchor)))
            bbox_targets_list.append(bbox_targets)
        return anchor_list, labels_list, label_weights_list, bbox_targets_list, num_total_pos

    def anchor_center(self, anchors):
        anchors_cx = (anchors[:, 2] + anchors[:, 0]) / 2
        anchors_cy = (anchors[:, 3] + anchors[:, 1]) / 2
        return torch.stack([anchors_cx, anchors_cy], dim=-1)

    def loss_single(self, anchors, cls_score, bbox_pred, labels,
                    label_weights, bbox_targets, stride, num_total_samples):

        anchors = anchors.reshape(-1, 4)
        cls_score = cls_score.permute(0, 2, 3, 1).reshape(-1, self.cls_out_channels)
        bbox_pred = bbox_pred.permute(0, 2, 3, 1).reshape(-1, 4 * (self.reg_max + 1))
        bbox_targets = bbox_targets.reshape(-1, 4)
        labels = labels.reshape(-1)
        label_weights = label_weights.reshape(-1)

        # FG cat_id: [0, num_classes -1], BG cat_id: num_classes
        bg_class_ind = self.num_classes
        pos_inds = torch.nonzero((labels >= 0)
                                 & (labels < bg_class_ind), as_tuple=False).squeeze(1)

        score = label_weights.new_zeros(labels.shape)

        if len(pos_inds) > 0:
            pos_bbox_targets = bbox_targets[pos_inds]
            pos_bbox_pred = bbox_pred[pos_inds]
            pos_anchors = anchors[pos_inds]
            pos_anchor_centers = self.anchor_center(pos_anchors) / stride

            weight_targets = cls_score.detach().sigmoid()
            weight_targets = weight_targets.max(dim=1)[0][pos_inds]
            pos_bbox_pred_corners = self.distribution_project(pos_bbox_pred)
            pos_decode_bbox_pred = distance2bbox(pos_anchor_centers, pos_bbox_pred_corners)
            pos_decode_bbox_targets = pos_bbox_targets / stride
            score[pos_inds] = bbox_overlaps(
                pos_decode_bbox_pred.detach(),
                pos_decode_bbox_targets,
                is_aligned=True)
            pred_corners = pos_bbox_pred.reshape(-1, self.reg_max + 1)
            target_corners = bbox2distance(pos_anchor_centers,
                                           pos_decode_bbox_targets,
                                           self.reg_max).reshape(-1)

            # regression loss
            loss_bbox = self.loss_bbox(
                pos_decode_bbox_pred,
                pos_decode_bbox_targets,
                weight=weight_targets,
                avg_factor=1.0)

            # dfl loss
            loss_dfl = self.loss_dfl(
                pred_corners,
                target_corners,
                weight=weight_targets[:, None].expand(-1, 4).reshape(-1),
                avg_factor=4.0)
        else:
            loss_bbox = bbox_pred.sum() * 0
            loss_dfl = bbox_pred.sum() * 0
            weight_targets = torch.tensor(0).to(cls_score.device)

        # qfl loss
        loss_qfl = self.loss_qfl(
            cls_score, (labels, score),
            weight=label_weights,
            avg_factor=num_total_samples)

        return loss_qfl, loss_bbox, loss_dfl, weight_targets.sum()

    def loss(self, preds, gt_meta):
        cls_scores, bbox_preds = preds

        gt_bboxes = gt_meta['gt_bboxes']
        gt_labels = gt_meta['gt_labels']

        featmap_sizes = [featmap.size()[-2:] for featmap in cls_scores]
        device = cls_scores[0].device
        anchor_list = self.get_anchors(featmap_sizes, cls_scores[0].shape[0], device=device)

        (anchor_list, labels_list, label_weights_list, bbox_targets_list,
         num_total_pos) = self.gfl_target(anchor_list, gt_bboxes, gt_labels)

        num_total_samples = reduce_mean(
            torch.tensor(num_total_pos).to(device)).item()
        num_total_samples = max(num_total_samples, 1.0)

        losses_qfl, losses_bbox, losses_dfl, \
        avg_factor = multi_apply(
            self.loss_single,
            anchor_list,
            cls_scores,
            bbox_preds,
            labels_list,
            label_weights_list,
            bbox_targets_list,
            self.anchor_strides,
            num_total_samples=num_total_samples)

        avg_factor = sum(avg_factor)
        avg_factor = reduce_mean(avg_factor).item()
        if avg_factor <= 0:
            loss_qfl = torch.tensor(0, dtype=torch.float32, requires_grad=True).to(device)
            loss_bbox = torch.tensor(0, dtype=torch.float32, requires_grad=True).to(device)
            loss_dfl = torch.tensor(0, dtype=torch.float32, requires_grad=True).to(device)
        else:
            losses_bbox = list(map(lambda x: x / avg_factor, losses_bbox))
            losses_dfl = list(map(lambda x: x / avg_factor, losses_dfl))

            loss_qfl = sum(losses_qfl)
            loss_bbox = sum(losses_bbox)
            loss_dfl = sum(losses_dfl)

        loss = loss_qfl + loss_bbox + loss_dfl
        loss_states = dict(
            loss_qfl=loss_qfl,
            loss_bbox=loss_bbox,
            loss_dfl=loss_dfl)

        return loss, loss_states


class OneStageDetector(nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.backbone = nn.ModuleList([
            nn.Sequential(nn.Conv2d(3, 8, 3, stride=8, padding=1), nn.ReLU(inplace=True)),
            nn.Sequential(nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(inplace=True)),
        ])
        self.head = GFLHead(num_classes, input_channel=8)

    def forward(self, x):
        feats = []
        for stage in self.backbone:
            x = stage(x)
            feats.append(x)
        return self.head(feats)

    def forward_train(self, gt_meta):
        preds = self(gt_meta['img'])
        loss, loss_states = self.head.loss(preds, gt_meta)
        return preds, loss, loss_states


class Trainer:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.SGD(params=self.model.parameters(), lr=0.01, momentum=0.9)

    def run_step(self, model, meta, mode='train'):
        output, loss, loss_dict = model.forward_train(meta)
        loss = loss.mean()
        if mode == 'train':
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return output, loss, loss_dict

    def warm_up(self, data_loader):
        model = self.model
        model.train()
        for iter_id, batch in enumerate(data_loader):
            output, loss, loss_stats = self.run_step(model, batch)


def make_batch(boxes):
    return {'img': torch.randn(2, 3, 32, 32, device=DEVICE),
            'gt_bboxes': [torch.tensor(b, dtype=torch.float32, device=DEVICE).reshape(-1, 4) for b in boxes],
            'gt_labels': [torch.zeros(len(b), dtype=torch.long, device=DEVICE) for b in boxes]}


# the second batch has no annotated objects, so no anchor is positive
train_loader = [make_batch([[[4., 4., 20., 20.]], [[8., 10., 30., 28.]]]),
                make_batch([[], []]),
                make_batch([[[2., 6., 16., 24.]], []])]

model = OneStageDetector().to(DEVICE)
trainer = Trainer(model)
trainer.warm_up(train_loader)
print("done")
