# source: https://github.com/MultimediaTechLab/YOLO/pull/83 — PR "[FIX] Fixes memory leak": ModelTrainer.train_one_epoch (yolo/tools/solver.py) sums each batch's loss_dict tensors, which still carry their graphs, into `total_loss = defaultdict(lambda: torch.tensor(0.0, ...))`, so every batch's graph stays alive until the epoch ends (1-2 MB leaked per batch)
# fix-source: https://github.com/MultimediaTechLab/YOLO/commit/dea5a8ada1b6d55c8542a40d284f41707134d445 — the merged PR's squash commit: total_loss becomes `defaultdict(float)` and collects `loss_val.item() * batch_size`
# expect-kind: graph-growth
# expect-culprit: total_loss[loss_name]
from collections import defaultdict

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE

class_num, reg_max, image_size, batch_size, num_batches = 3, 4, 8, 2, 3


class YOLO(nn.Module):
    # a stem and two prediction heads, standing in for the AUX and Main branches of the real model
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.SiLU())
        self.heads = nn.ModuleDict({
            "AUX": nn.Conv2d(8, class_num + 4 * reg_max, 1),
            "Main": nn.Conv2d(8, class_num + 4 * reg_max, 1),
        })

    def forward(self, images):
        feature = self.stem(images)
        return {name: head(feature) for name, head in self.heads.items()}


class Vec2Box:
    def __call__(self, predicts):
        predicts = predicts.flatten(2).transpose(1, 2)  # [B, anchors, C]
        pred_cls, pred_anc = predicts.split([class_num, 4 * reg_max], dim=-1)
        pred_anc = pred_anc.view(*pred_anc.shape[:2], 4, reg_max)
        pred_box = (pred_anc.softmax(dim=-1) * torch.arange(reg_max, device=predicts.device)).sum(-1)
        return pred_cls, pred_anc, pred_box


class YOLOLoss:
    def __call__(self, predicts, targets):
        pred_cls, pred_anc, pred_box = predicts
        target_cls, target_box = targets
        loss_iou = F.l1_loss(pred_box, target_box)
        loss_dfl = F.cross_entropy(pred_anc.flatten(0, 2), target_box.round().long().clamp(0, reg_max - 1).flatten())
        loss_cls = F.binary_cross_entropy_with_logits(pred_cls, target_cls)
        return loss_iou, loss_dfl, loss_cls


class DualLoss:
    def __init__(self):
        self.loss = YOLOLoss()
        self.aux_rate = 0.25
        self.iou_rate, self.dfl_rate, self.cls_rate = 7.5, 1.5, 0.5

    def __call__(self, aux_predicts, main_predicts, targets):
        aux_iou, aux_dfl, aux_cls = self.loss(aux_predicts, targets)
        main_iou, main_dfl, main_cls = self.loss(main_predicts, targets)

        loss_dict = {
            "BoxLoss": self.iou_rate * (aux_iou * self.aux_rate + main_iou),
            "DFLoss": self.dfl_rate * (aux_dfl * self.aux_rate + main_dfl),
            "BCELoss": self.cls_rate * (aux_cls * self.aux_rate + main_cls),
        }
        loss_sum = sum(list(loss_dict.values())) / len(loss_dict)
        return loss_sum, loss_dict


class ModelTrainer:
    def __init__(self, model, vec2box, device):
        self.model = model
        self.vec2box = vec2box
        self.device = device
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937)
        self.loss_fn = DualLoss()

    def train_one_batch(self, images, targets):
        images = images.to(self.device)
        targets = tuple(t.to(self.device) for t in targets)
        self.optimizer.zero_grad()

        predicts = self.model(images)
        aux_predicts = self.vec2box(predicts["AUX"])
        main_predicts = self.vec2box(predicts["Main"])
        loss, loss_item = self.loss_fn(aux_predicts, main_predicts, targets)

        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=10.0)
        self.optimizer.step()

        return loss_item

    def train_one_epoch(self, dataloader):
        self.model.train()
        total_loss = defaultdict(lambda: torch.tensor(0.0, device=self.device))
        total_samples = 0
        for batch_size, images, targets in dataloader:
            loss_each = self.train_one_batch(images, targets)

            for loss_name, loss_val in loss_each.items():
                total_loss[loss_name] += loss_val * batch_size  # culprit
            total_samples += batch_size

        for loss_val in total_loss.values():
            loss_val /= total_samples

        return total_loss


anchors = (image_size // 2) ** 2
dataloader = [
    (batch_size,
     torch.randn(batch_size, 3, image_size, image_size, device=DEVICE),
     ((torch.rand(batch_size, anchors, class_num, device=DEVICE) > 0.5).float(),
      torch.rand(batch_size, anchors, 4, device=DEVICE) * (reg_max - 1)))
    for _ in range(num_batches)
]
trainer = ModelTrainer(YOLO().to(DEVICE), Vec2Box(), DEVICE)
epoch_loss = trainer.train_one_epoch(dataloader)
print("done")
