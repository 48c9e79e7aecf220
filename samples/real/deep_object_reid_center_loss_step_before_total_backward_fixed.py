# source: https://github.com/openvinotoolkit/deep-object-reid/pull/12 — merged PR "Fixes and AMSoftmax support in pytorchcv wrapper": with metric losses on, `_single_model_losses` calls `ml_loss_module.end_iteration()`, whose `center_optimizer.step()` updates the center-loss centers before `total_loss.backward()` back-propagates the same metric loss ("pytorch disables making optimizer.step() between two related backwards", the author's review comment)
# fix-source: https://github.com/openvinotoolkit/deep-object-reid/commit/d47bea944ad8019b51a47b7f3c3f98013644dec3 — maintainers' fix (with 983ef32 in the same PR): end_iteration moves after `total_loss.backward()` in forward_backward and no longer runs its own backward (`end_iteration(do_backward=False)`)
# expect-kind: none
# fix: forward_backward calls `end_iteration(do_backward=False)` for each metric-loss module after `total_loss.backward()` and before the optimizers step; `_single_model_losses` no longer calls end_iteration
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


# ---- torchreid/losses/metric.py (trimmed) ----
class CenterLoss(nn.Module):
    """Implementation of the Center loss from https://ydwen.github.io/papers/WenECCV16.pdf"""

    def __init__(self, num_classes, embed_size):
        super().__init__()
        self.num_classes = num_classes
        self.centers = nn.Parameter(torch.randn(self.num_classes, embed_size, device=DEVICE))
        self.embed_size = embed_size

    def get_centers(self):
        return self.centers

    def normalize_centers(self):
        self.centers.data = F.normalize(self.centers.data, p=2, dim=1)

    def forward(self, features, labels):
        features = F.normalize(features, p=2, dim=1)
        batch_size = labels.size(0)

        centers = F.normalize(self.centers, p=2, dim=1)
        centers_batch = centers[labels, :]

        cos_diff = 1.0 - torch.sum(features * centers_batch, dim=1).clamp(-1, 1)
        center_loss = torch.sum(cos_diff) / batch_size
        return center_loss


class CentersPush(nn.Module):
    def __init__(self, margin=0.3):
        super().__init__()
        self.margin = margin

    def forward(self, centers, labels):
        centers = F.normalize(centers, p=2, dim=1)
        unique_labels = torch.unique(labels)
        unique_centers = centers[unique_labels, :]

        distances = 1.0 - torch.mm(unique_centers, torch.t(unique_centers)).clamp(-1, 1)
        losses = self.margin - distances

        different_class_pairs = unique_labels.view(-1, 1) != unique_labels.view(1, -1)
        pairs_valid_mask = different_class_pairs & (losses > 0.0)
        losses = torch.where(pairs_valid_mask, losses, torch.zeros_like(losses))

        num_valid = pairs_valid_mask.sum().float()
        loss = losses.sum()
        if num_valid > 0.0:
            loss /= num_valid
        return loss


class MetricLosses:
    """Class-aggregator for metric-learning losses"""

    def __init__(self, num_classes, embed_size, center_coeff=1.0, center_margin=0.1,
                 loss_balancing=False, centers_lr=0.5, name='ml'):
        self.name = name
        self.center_coeff = center_coeff
        self.center_loss = CenterLoss(num_classes, embed_size)
        self.center_optimizer = torch.optim.SGD(self.center_loss.parameters(), lr=centers_lr)
        self.centers_push_loss = CentersPush(margin=center_margin)
        self.loss_balancing = loss_balancing

    def __call__(self, features, cos_theta, labels, iteration):
        loss_summary = dict()
        center_loss_val = self.center_loss(features, labels)
        loss_summary['{}/center'.format(self.name)] = center_loss_val.item()

        centers_push_loss_val = self.centers_push_loss(self.center_loss.get_centers(), labels)
        loss_summary['{}/push_center'.format(self.name)] = centers_push_loss_val.item()

        loss_value = self.center_coeff * (center_loss_val + centers_push_loss_val)
        self.last_loss_value = loss_value
        return loss_value, loss_summary

    def init_iteration(self):
        """Initializes a training iteration"""
        if self.center_coeff > 0.:
            self.center_optimizer.zero_grad()

    def end_iteration(self, do_backward=True):
        """Finalizes a training iteration"""
        if do_backward:
            self.last_loss_value.backward()

        if self.center_coeff > 0.:
            self.center_optimizer.step()
            self.center_loss.normalize_centers()


# ---- torchreid/losses/am_softmax.py (trimmed) ----
class AMSoftmaxLoss(nn.Module):
    def __init__(self, m=0.35, s=30.0):
        super().__init__()
        self.m = m
        self.s = s

    def get_last_scale(self):
        return self.s

    def forward(self, cos_theta, target, iteration=None):
        one_hot = F.one_hot(target, cos_theta.size(1)).to(cos_theta.dtype)
        output = self.s * (cos_theta - self.m * one_hot)
        return F.cross_entropy(output, target)


# ---- a tiny re-id model: backbone + AngleSimpleLinear head ----
class TinyReIdNet(nn.Module):
    def __init__(self, in_dim=10, feature_dim=6, num_classes=4):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(in_dim, 8), nn.ReLU(), nn.Linear(8, feature_dim))
        self.weight = nn.Parameter(torch.randn(feature_dim, num_classes))

    def forward(self, x):
        embd = self.backbone(x)
        cos_theta = F.normalize(embd, dim=1).mm(F.normalize(self.weight, dim=0))
        return [cos_theta.clamp(-1, 1)], [embd]


# ---- torchreid/engine/image/am_softmax.py (trimmed) ----
class ImageAMSoftmaxEngine:
    def __init__(self, models, optimizers, num_classes, feature_dim):
        self.models = models
        self.optims = optimizers
        self.num_targets = 1
        self.enable_metric_losses = True
        self.main_losses = [AMSoftmaxLoss()]
        self.ml_losses = list()
        for trg_id in range(self.num_targets):
            trg_ml_losses = dict()
            for model_name in self.models:
                trg_ml_losses[model_name] = MetricLosses(num_classes, feature_dim)
            self.ml_losses.append(trg_ml_losses)

    def get_model_names(self):
        return list(self.models.keys())

    def forward_backward(self, imgs, obj_ids, dataset_id, n_iter):
        model_names = self.get_model_names()
        num_models = len(model_names)

        total_loss = torch.zeros([], dtype=imgs.dtype, device=imgs.device)
        loss_summary = dict()

        for model_name in model_names:
            self.optims[model_name].zero_grad()

            model_loss, model_loss_summary = self._single_model_losses(
                self.models[model_name], imgs, obj_ids, dataset_id, n_iter, model_name
            )
            total_loss += model_loss / float(num_models)
            loss_summary.update(model_loss_summary)

        total_loss.backward()

        for model_name in model_names:
            for trg_id in range(self.num_targets):
                if self.enable_metric_losses:
                    ml_loss_module = self.ml_losses[trg_id][model_name]
                    ml_loss_module.end_iteration(do_backward=False)

            self.optims[model_name].step()

        loss_summary['loss'] = total_loss.item()
        return loss_summary

    def _single_model_losses(self, model, imgs, obj_ids, dataset_id, n_iter, model_name):
        all_logits, all_embeddings = model(imgs)

        total_loss = torch.zeros([], dtype=imgs.dtype, device=imgs.device)
        loss_summary = dict()
        num_trg_losses = 0
        for trg_id in range(self.num_targets):
            trg_mask = dataset_id == trg_id
            trg_obj_ids = obj_ids[trg_mask]
            trg_logits = all_logits[trg_id][trg_mask]

            main_loss = self.main_losses[trg_id](trg_logits, trg_obj_ids, iteration=n_iter)
            loss_summary['main_{}/{}'.format(trg_id, model_name)] = main_loss.item()

            trg_loss = main_loss
            if self.enable_metric_losses:
                ml_loss_module = self.ml_losses[trg_id][model_name]
                embd = all_embeddings[trg_id][trg_mask]

                ml_loss_module.init_iteration()
                ml_loss, ml_loss_summary = ml_loss_module(embd, trg_logits, trg_obj_ids, n_iter)

                loss_summary['ml_{}/{}'.format(trg_id, model_name)] = ml_loss.item()
                loss_summary.update(ml_loss_summary)
                trg_loss += ml_loss

            total_loss += trg_loss
            num_trg_losses += 1
        total_loss /= float(num_trg_losses)
        return total_loss, loss_summary


num_classes, feature_dim = 4, 6
models = {'model': TinyReIdNet(feature_dim=feature_dim, num_classes=num_classes).to(DEVICE)}
optims = {'model': torch.optim.SGD(models['model'].parameters(), lr=0.01, momentum=0.9)}
engine = ImageAMSoftmaxEngine(models, optims, num_classes, feature_dim)

for n_iter in range(3):
    imgs = torch.randn(8, 10, device=DEVICE)
    obj_ids = torch.randint(0, num_classes, (8,), device=DEVICE)
    dataset_id = torch.zeros(8, dtype=torch.long, device=DEVICE)
    summary = engine.forward_backward(imgs, obj_ids, dataset_id, n_iter)
    print(n_iter, round(summary['loss'], 4))

print("done")
