# source: https://github.com/qdrant/quaterion/issues/181 — issue: training with cross-batch memory (XBM) fails in backward with "one of the variables needed for gradient computation has been modified by an inplace operation" (XbmBuffer.get returns views of the ring buffer that queue() then overwrites; Euclidean distance saves them; quaterion at f2be2a4)
# fix-source: https://github.com/qdrant/quaterion/pull/188 — maintainers' "Fix bug caused by Euclidean dist used with xbm" (commit 6d1c77c): XbmBuffer.get returns .clone() copies of the buffer, and Euclidean.distance_matrix becomes torch.cdist(x, y)
# expect-kind: none
# fix: XbmBuffer.get returns self._embeddings[: self._pointer].clone() (and .clone() of the targets and of the full buffer), so queue() overwrites the buffer and not the copy the distance matrix saved; as in the commit, Euclidean.distance_matrix is also replaced by torch.cdist(x, y), which the in-place error does not need
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import LongTensor, Tensor
from _device import DEVICE


class XbmConfig:
    def __init__(self, buffer_size=16, start_iteration=0, weight=1.0):
        self.buffer_size = buffer_size
        self.start_iteration = start_iteration
        self.weight = weight


class XbmBuffer:
    """Ring buffer holding the recent N embeddings and their group ids."""

    def __init__(self, config: XbmConfig, embedding_size: int):
        self._cfg = config
        self._embeddings = torch.zeros((self._cfg.buffer_size, embedding_size)).to(DEVICE)
        self._targets = torch.zeros(self._cfg.buffer_size, dtype=torch.long).to(DEVICE)
        self._pointer = 0
        self._is_full = False

    @property
    def is_full(self) -> bool:
        return self._is_full

    def get(self):
        if self.is_full:
            return self._embeddings.clone(), self._targets.clone()
        else:
            return (
                self._embeddings[: self._pointer].clone(),
                self._targets[: self._pointer].clone(),
            )

    def queue(self, embeddings: Tensor, targets: LongTensor) -> None:
        batch_size = len(targets)
        temp_size = self._pointer + batch_size

        if temp_size > self._cfg.buffer_size:
            excess = temp_size - self._cfg.buffer_size
            self._embeddings[-(batch_size - excess):] = embeddings[excess:]
            self._targets[-(batch_size - excess):] = targets[excess:]
            self._embeddings[:excess] = embeddings[:excess]
            self._targets[:excess] = targets[:excess]
            self._pointer = excess
        elif temp_size == self._cfg.buffer_size:
            self._embeddings[-batch_size:] = embeddings
            self._targets[-batch_size:] = targets
            self._pointer = 0
        else:
            self._embeddings[self._pointer: self._pointer + batch_size] = embeddings
            self._targets[self._pointer: self._pointer + batch_size] = targets
            self._pointer += batch_size

        if temp_size >= self._cfg.buffer_size and not self.is_full:
            self._is_full = True


class Euclidean:
    @staticmethod
    def distance_matrix(x: Tensor, y: Optional[Tensor] = None) -> Tensor:
        if y is None:
            y = x

        return torch.cdist(x, y)


def get_anchor_positive_mask(labels_a, labels_b):
    mask = labels_a.expand(labels_b.shape[0], labels_a.shape[0]).t() == labels_b.expand(labels_a.shape[0], labels_b.shape[0])
    if torch.equal(labels_a, labels_b):
        indices_not_equal = torch.logical_not(torch.eye(labels_a.size()[0], dtype=torch.bool, device=labels_a.device))
        mask = torch.logical_and(indices_not_equal, mask)
    return mask


def get_anchor_negative_mask(labels_a, labels_b):
    return labels_a.expand(labels_b.shape[0], labels_a.shape[0]).t() != labels_b.expand(labels_a.shape[0], labels_b.shape[0])


class TripletLoss(nn.Module):
    """Batch-hard triplet loss, with the XBM variant against the memory embeddings."""

    def __init__(self, margin=0.5):
        super().__init__()
        self._margin = margin
        self.distance_metric = Euclidean()

    def _hard_triplet_loss(self, embeddings_a, groups_a, embeddings_b, groups_b):
        dists = self.distance_metric.distance_matrix(embeddings_a, embeddings_b)
        anchor_positive_mask = get_anchor_positive_mask(groups_a, groups_b).float()
        anchor_positive_dists = anchor_positive_mask * dists
        hardest_positive_dists = anchor_positive_dists.max(dim=1)[0]

        anchor_negative_mask = get_anchor_negative_mask(groups_a, groups_b).float()
        anchor_negative_dists = dists + dists.max(dim=1, keepdim=True)[0] * (1.0 - anchor_negative_mask)
        hardest_negative_dists = anchor_negative_dists.min(dim=1)[0]

        triplet_loss = F.relu(
            (hardest_positive_dists - hardest_negative_dists) / hardest_negative_dists.mean() + self._margin
        )
        return triplet_loss.mean()

    def forward(self, embeddings, groups):
        return self._hard_triplet_loss(embeddings, groups, embeddings, groups)

    def xbm_loss(self, embeddings, groups, memory_embeddings, memory_groups):
        if len(memory_groups) == 0:
            return torch.tensor(0, device=embeddings.device)
        return self._hard_triplet_loss(embeddings, groups, memory_embeddings, memory_groups)


class Trainer:
    global_step = 0


class TrainableModel(nn.Module):
    """The parts of quaterion's TrainableModel that run one training step with XBM."""

    def __init__(self, embedding_size=8):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, embedding_size))
        self.loss = TripletLoss()
        self.trainer = Trainer()
        self._xbm_config = XbmConfig(buffer_size=16)
        self._xbm_buffer = XbmBuffer(self._xbm_config, embedding_size=embedding_size)

    def training_step(self, batch):
        features, targets = batch
        embeddings = self.model(features)
        loss = self.loss(embeddings=embeddings, **targets)
        loss = self._maybe_compute_xbm_loss(loss, embeddings, targets)
        return loss

    def _maybe_compute_xbm_loss(self, loss, embeddings, targets):
        if self.trainer.global_step > self._xbm_config.start_iteration:
            memory_embeddings, memory_groups = self._xbm_buffer.get()
            memory_loss = self.loss.xbm_loss(embeddings, targets["groups"], memory_embeddings, memory_groups)
            loss = loss + self._xbm_config.weight * memory_loss

            self._xbm_buffer.queue(embeddings.detach(), targets["groups"].detach())
        return loss


model = TrainableModel().to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for step in range(4):
    model.trainer.global_step = step
    features = torch.randn(4, 12, device=DEVICE)
    groups = torch.tensor([0, 0, 1, 1], device=DEVICE)
    optimizer.zero_grad()
    loss = model.training_step((features, {"groups": groups}))
    loss.backward()
    optimizer.step()
print("done")
