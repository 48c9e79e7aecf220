# source: https://github.com/jokester-zzz/SSA-SC/issues/2 — semantic scene completion: GPU memory keeps rising because LossesTrackEpoch sums the loss tensors (networks/common/metrics.py)
# fix-source: maintainer's comment in the issue (jokester-zzz agrees: `loss[key]` -> `loss[key].item()`)
# expect-kind: graph-growth
# expect-culprit: self.train_losses[key]
import torch
import torch.nn as nn
from _device import DEVICE


class LossesTrackEpoch:
    def __init__(self, num_iterations):
        # classes
        self.num_iterations = num_iterations
        self.validation_losses = {}
        self.train_losses = {}
        self.train_iteration_counts = 0
        self.validation_iteration_counts = 0

    def set_validation_losses(self, keys):
        for key in keys:
            self.validation_losses[key] = 0
        return

    def set_train_losses(self, keys):
        for key in keys:
            self.train_losses[key] = 0
        return

    def update_train_losses(self, loss):
        for key in loss:
            self.train_losses[key] += loss[key]  # culprit
        self.train_iteration_counts += 1
        return

    def restart_train_losses(self):
        for key in self.train_losses.keys():
            self.train_losses[key] = 0
        self.train_iteration_counts = 0
        return


class Metrics:
    def __init__(self, nbr_classes, num_iterations_epoch, scales):

        self.nbr_classes = nbr_classes
        self.losses_track = LossesTrackEpoch(num_iterations_epoch)
        self.best_metric_record = {'mIoU': 0, 'IoU': 0, 'epoch': 0, 'loss': 99999999}

        return


class SSA_SC(nn.Module):
    def __init__(self, class_num, input_dimensions):
        super().__init__()
        self.nbr_classes = class_num
        self.input_dimensions = input_dimensions
        self.encoder = nn.Sequential(
            nn.Conv3d(1, 8, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv3d(8, 8, kernel_size=3, padding=1),
            nn.ReLU(),
        )
        self.seg_head = nn.Conv3d(8, class_num, kernel_size=1)

    def forward(self, x, stat='train'):
        occupancy = x['3D_OCCUPANCY']
        scores = {'pred_semantic_1_1': self.seg_head(self.encoder(occupancy))}
        return scores  # [B, C, D, H, W]

    def compute_loss(self, scores, data):
        target = data['3D_LABEL']['1_1']
        device, dtype = target.device, target.dtype
        class_weights = self.get_class_weights().to(device=target.device, dtype=torch.float32)

        criterion = nn.CrossEntropyLoss(weight=class_weights, ignore_index=255, reduction='mean').to(device=device)

        loss_1_1 = criterion(scores['pred_semantic_1_1'], data['3D_LABEL']['1_1'].long())

        loss_seg = loss_1_1
        loss_total = loss_1_1
        loss = {'total': loss_total, 'semantic_1_1': loss_1_1, 'semantic_seg': loss_seg}

        return loss

    def get_class_weights(self):
        return torch.ones(self.nbr_classes)

    def get_scales(self):
        return ['1_1']

    def get_train_loss_keys(self):
        return ['total', 'semantic_1_1', 'semantic_seg']


def get_batch():
    occupancy = (torch.rand(2, 1, 4, 8, 8, device=DEVICE) > 0.5).float()
    label = torch.randint(0, 4, (2, 4, 8, 8), device=DEVICE)
    return {'3D_OCCUPANCY': occupancy, '3D_LABEL': {'1_1': label}}


model = SSA_SC(class_num=4, input_dimensions=[4, 8, 8]).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
dset = [get_batch() for _ in range(5)]
nbr_epochs = 1
nbr_iterations = len(dset)

metrics = Metrics(model.nbr_classes, nbr_iterations, model.get_scales())
metrics.losses_track.set_train_losses(model.get_train_loss_keys())

for epoch in range(1, nbr_epochs + 1):

    model.train()  # put model to training mode

    for t, data in enumerate(dset):

        scores = model(data)
        loss = model.compute_loss(scores, data)

        # Zero out the gradients.
        optimizer.zero_grad()
        # Backward pass: gradient of loss wr. each model parameter.
        loss['total'].backward()
        # update parameters of model by gradients.
        optimizer.step()

        # Updating batch losses to then get mean for epoch loss
        metrics.losses_track.update_train_losses(loss)

    epoch_loss = metrics.losses_track.train_losses['total'] / metrics.losses_track.train_iteration_counts

    metrics.losses_track.restart_train_losses()
print("done")
