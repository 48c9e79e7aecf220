# source: https://github.com/bayesiains/nflows/issues/10 — issue: RAM grows while training SimpleRealNVP(batch_norm_between_layers=True): BatchNorm.forward folds the batch mean/var, with their graph, into the running_mean/running_var buffers every step
# fix-source: https://github.com/bayesiains/nflows/pull/11 — merged PR (36dcabc): `self.running_mean.mul_(1 - self.momentum).add_(mean.detach() * self.momentum)`, and the same for running_var
# expect-kind: none
# fix: BatchNorm.forward folds mean.detach() and var.detach() into running_mean and running_var, so the buffers hold numbers, not every batch's graph
import numpy as np
import torch
from torch import nn
from torch import optim
from torch.nn import functional as F
from _device import DEVICE


def sum_except_batch(x, num_batch_dims=1):
    return torch.sum(x.reshape(*x.shape[:num_batch_dims], -1), dim=-1)


class Transform(nn.Module):
    def forward(self, inputs, context=None):
        raise NotImplementedError()


class CompositeTransform(Transform):
    def __init__(self, transforms):
        super().__init__()
        self._transforms = nn.ModuleList(transforms)

    def forward(self, inputs, context=None):
        outputs = inputs
        total_logabsdet = inputs.new_zeros(inputs.shape[0])
        for func in self._transforms:
            outputs, logabsdet = func(outputs, context)
            total_logabsdet += logabsdet
        return outputs, total_logabsdet


class BatchNorm(Transform):
    """Transform that performs batch normalization."""

    def __init__(self, features, eps=1e-5, momentum=0.1, affine=True):
        super().__init__()

        self.momentum = momentum
        self.eps = eps
        constant = np.log(np.exp(1 - eps) - 1)
        self.unconstrained_weight = nn.Parameter(constant * torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))

        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.zeros(features))

    @property
    def weight(self):
        return F.softplus(self.unconstrained_weight) + self.eps

    def forward(self, inputs, context=None):
        if self.training:
            mean, var = inputs.mean(0), inputs.var(0)
            self.running_mean.mul_(1 - self.momentum).add_(mean.detach() * self.momentum)
            self.running_var.mul_(1 - self.momentum).add_(var.detach() * self.momentum)
        else:
            mean, var = self.running_mean, self.running_var

        outputs = (
            self.weight * ((inputs - mean) / torch.sqrt((var + self.eps))) + self.bias
        )

        logabsdet_ = torch.log(self.weight) - 0.5 * torch.log(var + self.eps)
        logabsdet = torch.sum(logabsdet_) * torch.ones(inputs.shape[0], device=inputs.device)

        return outputs, logabsdet


class ResidualNet(nn.Module):
    """(Trimmed) stand-in for nflows.nn.nets.ResidualNet."""

    def __init__(self, in_features, out_features, hidden_features):
        super().__init__()
        self.initial_layer = nn.Linear(in_features, hidden_features)
        self.block = nn.Linear(hidden_features, hidden_features)
        self.final_layer = nn.Linear(hidden_features, out_features)

    def forward(self, inputs, context=None):
        temps = self.initial_layer(inputs)
        temps = temps + self.block(F.relu(temps))
        return self.final_layer(temps)


class AffineCouplingTransform(Transform):
    def __init__(self, mask, transform_net_create_fn):
        super().__init__()
        mask = torch.as_tensor(mask)
        self.features = len(mask)
        features_vector = torch.arange(self.features)
        self.register_buffer("identity_features", features_vector.masked_select(mask <= 0))
        self.register_buffer("transform_features", features_vector.masked_select(mask > 0))
        self.transform_net = transform_net_create_fn(
            len(self.identity_features), len(self.transform_features) * 2
        )

    def _scale_and_shift(self, transform_params):
        num_transform_features = len(self.transform_features)
        unconstrained_scale = transform_params[:, num_transform_features:, ...]
        shift = transform_params[:, :num_transform_features, ...]
        scale = torch.sigmoid(unconstrained_scale + 2) + 1e-3
        return scale, shift

    def forward(self, inputs, context=None):
        identity_split = inputs[:, self.identity_features, ...]
        transform_split = inputs[:, self.transform_features, ...]

        transform_params = self.transform_net(identity_split, context)
        scale, shift = self._scale_and_shift(transform_params)
        log_scale = torch.log(scale)
        transform_split = transform_split * scale + shift
        logabsdet = sum_except_batch(log_scale, num_batch_dims=1)

        outputs = torch.empty_like(inputs)
        outputs[:, self.identity_features, ...] = identity_split
        outputs[:, self.transform_features, ...] = transform_split
        return outputs, logabsdet


class StandardNormal(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self._shape = torch.Size(shape)
        self.register_buffer("_log_z", torch.tensor(0.5 * np.prod(shape) * np.log(2 * np.pi),
                                                    dtype=torch.float64), persistent=False)

    def log_prob(self, inputs, context=None):
        neg_energy = -0.5 * sum_except_batch(inputs ** 2, num_batch_dims=1)
        return neg_energy - self._log_z


class Flow(nn.Module):
    def __init__(self, transform, distribution):
        super().__init__()
        self._transform = transform
        self._distribution = distribution

    def log_prob(self, inputs, context=None):
        noise, logabsdet = self._transform(inputs, context=context)
        log_prob = self._distribution.log_prob(noise, context=context)
        return log_prob + logabsdet


class SimpleRealNVP(Flow):
    def __init__(self, features, hidden_features, num_layers, num_blocks_per_layer,
                 batch_norm_between_layers=False):
        mask = torch.ones(features)
        mask[::2] = -1

        def create_resnet(in_features, out_features):
            return ResidualNet(in_features, out_features, hidden_features=hidden_features)

        layers = []
        for _ in range(num_layers):
            transform = AffineCouplingTransform(mask=mask.clone(), transform_net_create_fn=create_resnet)
            layers.append(transform)
            mask *= -1
            if batch_norm_between_layers:
                layers.append(BatchNorm(features=features))

        super().__init__(
            transform=CompositeTransform(layers),
            distribution=StandardNormal([features]),
        )


flow = SimpleRealNVP(2, 8, 2, 1, batch_norm_between_layers=True).to(DEVICE)
optimizer = optim.Adam(flow.parameters())

num_iter = 3
for i in range(num_iter):
    x = torch.randn(16, 2)  # stands in for datasets.make_moons(1024, noise=.1)
    x = x.to(DEVICE)
    optimizer.zero_grad()
    loss = -flow.log_prob(inputs=x).mean()
    loss.backward()
    optimizer.step()

print("done")
