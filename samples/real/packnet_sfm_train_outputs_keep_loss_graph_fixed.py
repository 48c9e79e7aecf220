# source: https://github.com/TRI-ML/packnet-sfm/pull/51 — merged PR "Fix memory leak": HorovodTrainer.train (packnet_sfm/trainers/horovod_trainer.py) appends each batch's `output` dict, whose 'loss' still carries the self-supervised depth/pose graph, to `outputs` for training_epoch_end
# fix-source: https://github.com/TRI-ML/packnet-sfm/commit/2698f1fb27785275ef847f3dbbd550cf8fff1799 — maintainers' fix: `output['loss'] = output['loss'].detach()` before `outputs.append(output)` (plus a re-wrap of the progress-bar line)
# expect-kind: none
# fix: HorovodTrainer.train detaches the loss, `output['loss'] = output['loss'].detach()`, before appending the batch output to `outputs` (and re-wraps the progress-bar line)
from collections import OrderedDict, deque

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


class AvgMeter:
    def __init__(self, n_max=100):
        self.n_max = n_max
        self.values = deque(maxlen=n_max)

    def __call__(self, value):
        self.values.append(value)
        return sum(self.values) / len(self.values)


def average_key(batch_list, key):
    values = [batch[key] for batch in batch_list]
    return sum(values) / len(values)


def average_sub_key(batch_list, key, sub_key):
    values = [batch[key][sub_key] for batch in batch_list]
    return sum(values) / len(values)


def average_loss_and_metrics(batch_list, prefix):
    values = OrderedDict()
    key = 'loss'
    values['{}-{}'.format(prefix, key)] = \
        average_key(batch_list, key)
    key = 'metrics'
    for sub_key in batch_list[0][key].keys():
        values['{}-{}'.format(prefix, sub_key)] = \
            average_sub_key(batch_list, key, sub_key)
    return values


def reduce_dict(data, to_item=False):
    for key, val in data.items():
        if to_item:
            data[key] = data[key].item()
    return data


class DepthNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ELU())
        self.disp = nn.Conv2d(8, 1, 3, padding=1)

    def forward(self, rgb):
        return [torch.sigmoid(self.disp(self.enc(rgb)))]


class PoseNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.ReLU())
        self.pose = nn.Conv2d(8, 2, 1)

    def forward(self, image, context):
        x = self.conv(torch.cat([image, context], 1))
        return [0.01 * self.pose(x).mean(dim=(2, 3))]


class SelfSupModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.depth_net = DepthNet()
        self.pose_net = PoseNet()

    def compute_inv_depths(self, image):
        return self.depth_net(image)

    def compute_poses(self, image, contexts):
        return [self.pose_net(image, context)[0] for context in contexts]

    def self_supervised_loss(self, image, ref_images, inv_depths, poses, progress=0.0):
        # stand-in for the photometric + smoothness MultiViewPhotometricLoss
        b, _, h, w = image.shape
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h, device=image.device),
                                torch.linspace(-1, 1, w, device=image.device), indexing='ij')
        grid = torch.stack([xs, ys], -1).unsqueeze(0).expand(b, -1, -1, -1)
        photometric = 0
        for ref_image, pose in zip(ref_images, poses):
            flow = inv_depths[0].permute(0, 2, 3, 1) * pose[:, None, None, :]
            warped = F.grid_sample(ref_image, grid + flow, align_corners=True)
            photometric = photometric + (warped - image).abs().mean()
        smoothness = (inv_depths[0][..., 1:] - inv_depths[0][..., :-1]).abs().mean()
        loss = photometric / len(ref_images) + 0.001 * smoothness
        # LossBase.add_metric stores metrics detached
        return {'loss': loss, 'metrics': {'photometric_loss': photometric.detach(), 'smoothness_loss': smoothness.detach()}}

    def forward(self, batch, return_logs=False, progress=0.0):
        inv_depths = self.compute_inv_depths(batch['rgb'])
        poses = self.compute_poses(batch['rgb'], batch['rgb_context'])
        output = {'inv_depths': inv_depths, 'poses': poses}
        if not self.training:
            return output
        else:
            self_sup_output = self.self_supervised_loss(
                batch['rgb_original'], batch['rgb_context_original'],
                output['inv_depths'], output['poses'], progress=progress)
            return {
                'loss': self_sup_output['loss'],
                'metrics': self_sup_output['metrics'],
                **output,
            }


class ModelWrapper(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.current_epoch = 0
        self.progress = 0.0

    def configure_optimizers(self):
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=2e-4)

    def training_step(self, batch, *args):
        output = self.model(batch, progress=self.progress)
        return {
            'loss': output['loss'],
            'metrics': output['metrics']
        }

    def training_epoch_end(self, output_batch):
        loss_and_metrics = average_loss_and_metrics(output_batch, 'avg_train')
        loss_and_metrics = reduce_dict(loss_and_metrics, to_item=True)
        return {
            **loss_and_metrics
        }


class ProgressBar:
    def __init__(self, dataloader):
        self.items = list(enumerate(dataloader))
        self.description = ''

    def __iter__(self):
        return iter(self.items)

    def set_description(self, description):
        self.description = description


class HorovodTrainer:
    def __init__(self, max_epochs=2):
        self.max_epochs = max_epochs
        self.avg_loss = AvgMeter(50)
        self.is_rank_0 = True

    def fit(self, module, train_dataloader):
        module.configure_optimizers()
        optimizer = module.optimizer
        for epoch in range(module.current_epoch, self.max_epochs):
            self.train(train_dataloader, module, optimizer)
            module.current_epoch += 1

    def train(self, dataloader, module, optimizer):
        # Set module to train
        module.train()
        # Prepare progress bar
        progress_bar = ProgressBar(dataloader)
        # Start training loop
        outputs = []
        # For all batches
        for i, batch in progress_bar:
            # Reset optimizer
            optimizer.zero_grad()
            # Send samples to GPU and take a training step
            batch = {k: (v.to(DEVICE) if torch.is_tensor(v) else [t.to(DEVICE) for t in v])
                     for k, v in batch.items()}
            output = module.training_step(batch, i)
            # Backprop through loss and take an optimizer step
            output['loss'].backward()
            optimizer.step()
            # Append output to list of outputs
            output['loss'] = output['loss'].detach()
            outputs.append(output)
            # Update progress bar if in rank 0
            if self.is_rank_0:
                progress_bar.set_description(
                    'Epoch {} | Avg.Loss {:.4f}'.format(
                        module.current_epoch, self.avg_loss(output['loss'].item())))
        # Return outputs for epoch end
        return module.training_epoch_end(outputs)


def make_batch():
    rgb = torch.rand(2, 3, 8, 8)
    context = [torch.rand(2, 3, 8, 8), torch.rand(2, 3, 8, 8)]
    return {'rgb': rgb, 'rgb_context': context,
            'rgb_original': rgb.clone(), 'rgb_context_original': [c.clone() for c in context]}


train_dataloader = [make_batch() for _ in range(3)]
module = ModelWrapper(SelfSupModel()).to(DEVICE)
trainer = HorovodTrainer(max_epochs=2)
trainer.fit(module, train_dataloader)
print("done")
