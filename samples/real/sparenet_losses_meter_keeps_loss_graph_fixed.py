# source: https://github.com/microsoft/SpareNet/issues/12 — issue "GPU memory leakage (CUDA out of memory after 2 epochs)": sparenetRunner.train_step passes the loss tensors themselves (coarse_loss * 1000, refine_loss * 1000) to self.losses.update, and AverageMeter sums them into self._sum, so every batch's graph stays reachable and GPU memory climbs
# fix-source: https://github.com/microsoft/SpareNet/commit/8bbc200f25a3c9e5e9e4d03b685f9c5c655ef071 — maintainer's "fix: losses take item": the runners pass `coarse_loss.item() * 1000, refine_loss.item() * 1000` to self.losses.update
# expect-kind: none
# fix: train_step hands self.losses.update plain floats, coarse_loss.item() * 1000 and refine_loss.item() * 1000, so AverageMeter._sum no longer chains every batch's loss graph
from types import SimpleNamespace

import torch
from torch import nn
from _device import DEVICE


class AverageMeter(object):
    """Computes and stores the average and current value"""

    def __init__(self, items=None):
        self.items = items
        self.n_items = 1 if items is None else len(items)
        self.reset()

    def reset(self):
        self._val = [0] * self.n_items
        self._sum = [0] * self.n_items
        self._count = [0] * self.n_items

    def update(self, values):
        if type(values).__name__ == "list":
            for idx, v in enumerate(values):
                self._val[idx] = v
                self._sum[idx] += v
                self._count[idx] += 1
        else:
            self._val[0] = values
            self._sum[0] += values
            self._count[0] += 1

    def val(self, idx=None):
        if idx is None:
            return self._val[0] if self.items is None else [self._val[i] for i in range(self.n_items)]
        else:
            return self._val[idx]

    def avg(self, idx=None):
        if idx is None:
            return self._sum[0] / self._count[0] if self.items is None else [self._sum[i] / self._count[i] for i in range(self.n_items)]
        else:
            return self._sum[idx] / self._count[idx]


class ChamferDistanceMean(nn.Module):
    # stands in for the CUDA chamfer_distance extension
    def forward(self, xyz1, xyz2):
        dist = torch.cdist(xyz1, xyz2) ** 2
        dist1 = dist.min(dim=2)[0]
        dist2 = dist.min(dim=1)[0]
        return (dist1.mean(1) + dist2.mean(1)) / 2


class SpareNetGenerator(nn.Module):
    # a tiny coarse -> middle -> refine point completion network in place of SpareNet's
    def __init__(self, num_points=16, bottleneck=8):
        super().__init__()
        self.num_points = num_points
        self.encoder = nn.Sequential(nn.Linear(3, bottleneck), nn.ReLU())
        self.decoder = nn.Linear(bottleneck, num_points * 3)
        self.refine = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, data):
        feat = self.encoder(data["partial_cloud"]).max(dim=1)[0]
        coarse_ptcloud = self.decoder(feat).view(-1, self.num_points, 3)
        middle_ptcloud = coarse_ptcloud + 0.1 * torch.tanh(self.refine(coarse_ptcloud))
        refine_ptcloud = middle_ptcloud + 0.1 * torch.tanh(self.refine(middle_ptcloud))
        expansion_penalty = (coarse_ptcloud[:, 1:] - coarse_ptcloud[:, :-1]).pow(2).sum(-1)
        return coarse_ptcloud, middle_ptcloud, refine_ptcloud, expansion_penalty


class BaseRunner(object):
    """Defines the base runner class."""

    def __init__(self, config):
        self.config = config
        self.train_loader = None
        self.train_writer = {}
        self.models = None
        self.optimizers = None
        self.loss = {}
        self.losses = None
        self.batch_idx = 0
        self.build_dataset()
        self.build_models()

    def build_dataset(self):
        self.train_loader = [
            ("02691156", "model_%d" % i, None, {"partial_cloud": torch.rand(2, 12, 3), "gtcloud": torch.rand(2, 16, 3)})
            for i in range(4)
        ]

    def build_models(self):
        self.models = SpareNetGenerator().to(DEVICE)
        self.optimizers = torch.optim.Adam(self.models.parameters(), lr=1e-3)

    def train_step(self, data):
        raise NotImplementedError("Should be implemented in derived class.")

    def save_item_train_info(self):
        if self.batch_idx % self.config.TRAIN.log_freq == 0:
            for k, v in self.loss.items():
                self.train_writer["Loss/Batch/" + k] = v.item()

    def train(self):
        self.models.train()
        for items in enumerate(self.train_loader):
            self.batch_idx, _ = items
            self.train_step(items)
            self.save_item_train_info()


class sparenetRunner(BaseRunner):
    """Define the SpareNet runner class"""

    def __init__(self, config):
        super().__init__(config)
        self.losses = AverageMeter(["CoarseLoss", "RefineLoss"])
        self.chamfer_dist_mean = ChamferDistanceMean()

    def train_step(self, items):
        _, (_, _, _, data) = items
        for k, v in data.items():
            data[k] = v.float().to(DEVICE)

        _loss, _, _, _, refine_loss, coarse_loss = self.completion(data)
        self.models.zero_grad()
        _loss.backward()
        self.optimizers.step()

        self.loss["coarse_loss"] = coarse_loss * 1000
        self.loss["refine_loss"] = refine_loss * 1000
        self.loss["rec_loss"] = _loss
        self.losses.update([coarse_loss.item() * 1000, refine_loss.item() * 1000])

    def completion(self, data):
        (coarse_ptcloud, middle_ptcloud, refine_ptcloud, expansion_penalty) = self.models(data)

        if self.config.NETWORK.metric == "chamfer":
            coarse_loss = self.chamfer_dist_mean(coarse_ptcloud, data["gtcloud"]).mean()
            middle_loss = self.chamfer_dist_mean(middle_ptcloud, data["gtcloud"]).mean()
            refine_loss = self.chamfer_dist_mean(refine_ptcloud, data["gtcloud"]).mean()
        else:
            raise Exception("unknown training metric")

        _loss = coarse_loss + middle_loss + refine_loss + expansion_penalty.mean() * 0.1
        return _loss, refine_ptcloud, middle_ptcloud, coarse_ptcloud, refine_loss, coarse_loss


if __name__ == "__main__":
    torch.manual_seed(0)
    config = SimpleNamespace(TRAIN=SimpleNamespace(n_epochs=1, log_freq=1), NETWORK=SimpleNamespace(metric="chamfer"))
    runner = sparenetRunner(config)
    for epoch_idx in range(config.TRAIN.n_epochs):
        runner.train()
    print("done")
