# source: https://github.com/chaiyujin/glow-pytorch/pull/6 — merged PR "Fixed un-computable gradients": FlowStep.normal_flow (glow/models.py) applies the affine coupling in place on `z2`, a view of `z` whose other half `z1` the coupling network's first convolution saved, so training Glow fails with "one of the variables needed for gradient computation has been modified by an inplace operation"
# fix-source: https://github.com/chaiyujin/glow-pytorch/commit/3aa18c3bb73ce87260fcc7d561f60bf494ca26e9 — fix merged by the maintainer: every coupling update in normal_flow and reverse_flow becomes out of place (`z2 = z2 + shift`, `z2 = z2 * scale`, ...)
# expect-kind: inplace-modified
# expect-culprit: z2
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


# --- glow/thops.py ---
def thops_sum(tensor, dim=None, keepdim=False):
    if dim is None:
        return torch.sum(tensor)
    else:
        if isinstance(dim, int):
            dim = [dim]
        dim = sorted(dim)
        for d in dim:
            tensor = tensor.sum(dim=d, keepdim=True)
        if not keepdim:
            for i, d in enumerate(dim):
                tensor.squeeze_(d-i)
        return tensor


def thops_mean(tensor, dim, keepdim=False):
    for d in sorted(dim):
        tensor = tensor.mean(dim=d, keepdim=True)
    return tensor


def split_feature(tensor, type="split"):
    C = tensor.size(1)
    if type == "split":
        return tensor[:, :C // 2, ...], tensor[:, C // 2:, ...]
    elif type == "cross":
        return tensor[:, 0::2, ...], tensor[:, 1::2, ...]


def cat_feature(tensor_a, tensor_b):
    return torch.cat((tensor_a, tensor_b), dim=1)


def pixels(tensor):
    return int(tensor.size(2) * tensor.size(3))


# --- glow/modules.py ---
class ActNorm2d(nn.Module):
    def __init__(self, num_features, scale=1.):
        super().__init__()
        size = [1, num_features, 1, 1]
        self.register_parameter("bias", nn.Parameter(torch.zeros(*size)))
        self.register_parameter("logs", nn.Parameter(torch.zeros(*size)))
        self.scale = float(scale)
        self.inited = False

    def initialize_parameters(self, input):
        if not self.training:
            return
        with torch.no_grad():
            bias = thops_mean(input.clone(), dim=[0, 2, 3], keepdim=True) * -1.0
            vars = thops_mean((input.clone() + bias) ** 2, dim=[0, 2, 3], keepdim=True)
            logs = torch.log(self.scale/(torch.sqrt(vars)+1e-6))
            self.bias.data.copy_(bias.data)
            self.logs.data.copy_(logs.data)
            self.inited = True

    def forward(self, input, logdet=None, reverse=False):
        if not self.inited:
            self.initialize_parameters(input)
        input = input + self.bias
        input = input * torch.exp(self.logs)
        if logdet is not None:
            logdet = logdet + thops_sum(self.logs) * pixels(input)
        return input, logdet


class Conv2d(nn.Conv2d):
    def __init__(self, in_channels, out_channels, kernel_size=[3, 3], weight_std=0.05):
        padding = [(k - 1) // 2 for k in kernel_size]
        super().__init__(in_channels, out_channels, kernel_size, 1, padding, bias=False)
        self.weight.data.normal_(mean=0.0, std=weight_std)
        self.actnorm = ActNorm2d(out_channels)

    def forward(self, input):
        x = super().forward(input)
        x, _ = self.actnorm(x)
        return x


class Conv2dZeros(nn.Conv2d):
    def __init__(self, in_channels, out_channels, kernel_size=[3, 3], logscale_factor=3):
        super().__init__(in_channels, out_channels, kernel_size, 1, [1, 1])
        self.logscale_factor = logscale_factor
        self.register_parameter("logs", nn.Parameter(torch.zeros(out_channels, 1, 1)))
        self.weight.data.zero_()
        self.bias.data.zero_()

    def forward(self, input):
        output = super().forward(input)
        return output * torch.exp(self.logs * self.logscale_factor)


class InvertibleConv1x1(nn.Module):
    def __init__(self, num_channels):
        super().__init__()
        w_shape = [num_channels, num_channels]
        w_init = np.linalg.qr(np.random.RandomState(0).randn(*w_shape))[0].astype(np.float32)
        self.register_parameter("weight", nn.Parameter(torch.Tensor(w_init)))
        self.w_shape = w_shape

    def forward(self, input, logdet=None, reverse=False):
        dlogdet = torch.log(torch.abs(torch.det(self.weight))) * pixels(input)
        weight = self.weight.view(self.w_shape[0], self.w_shape[1], 1, 1)
        z = F.conv2d(input, weight)
        if logdet is not None:
            logdet = logdet + dlogdet
        return z, logdet


class GaussianDiag:
    Log2PI = float(np.log(2 * np.pi))

    @staticmethod
    def logp(mean, logs, x):
        likelihood = -0.5 * (logs * 2. + ((x - mean) ** 2) / torch.exp(logs * 2.) + GaussianDiag.Log2PI)
        return thops_sum(likelihood, dim=[1, 2, 3])


class SqueezeLayer(nn.Module):
    def forward(self, input, logdet=None, reverse=False):
        B, C, H, W = input.size()
        x = input.view(B, C, H // 2, 2, W // 2, 2)
        x = x.permute(0, 1, 3, 5, 2, 4).contiguous()
        return x.view(B, C * 4, H // 2, W // 2), logdet


# --- glow/models.py ---
def f(in_channels, out_channels, hidden_channels):
    return nn.Sequential(
        Conv2d(in_channels, hidden_channels), nn.ReLU(inplace=False),
        Conv2d(hidden_channels, hidden_channels, kernel_size=[1, 1]), nn.ReLU(inplace=False),
        Conv2dZeros(hidden_channels, out_channels))


class FlowStep(nn.Module):
    def __init__(self, in_channels, hidden_channels, flow_coupling="affine"):
        super().__init__()
        self.flow_coupling = flow_coupling
        self.actnorm = ActNorm2d(in_channels)
        self.invconv = InvertibleConv1x1(in_channels)
        if flow_coupling == "additive":
            self.f = f(in_channels // 2, in_channels // 2, hidden_channels)
        elif flow_coupling == "affine":
            self.f = f(in_channels // 2, in_channels, hidden_channels)

    def forward(self, input, logdet=None, reverse=False):
        return self.normal_flow(input, logdet)

    def normal_flow(self, input, logdet):
        # 1. actnorm
        z, logdet = self.actnorm(input, logdet=logdet, reverse=False)
        # 2. permute
        z, logdet = self.invconv(z, logdet, False)
        # 3. coupling
        z1, z2 = split_feature(z, "split")  # culprit
        if self.flow_coupling == "additive":
            z2 += self.f(z1)
        elif self.flow_coupling == "affine":
            h = self.f(z1)
            shift, scale = split_feature(h, "cross")
            scale = torch.sigmoid(scale + 2.)
            z2 += shift  # step
            z2 *= scale
            logdet = thops_sum(torch.log(scale), dim=[1, 2, 3]) + logdet
        z = cat_feature(z1, z2)
        return z, logdet


class FlowNet(nn.Module):
    def __init__(self, image_shape, hidden_channels, K, flow_coupling):
        super().__init__()
        self.layers = nn.ModuleList()
        H, W, C = image_shape
        C, H, W = C * 4, H // 2, W // 2
        self.layers.append(SqueezeLayer())
        for _ in range(K):
            self.layers.append(FlowStep(C, hidden_channels, flow_coupling=flow_coupling))
        self.output_shape = [-1, C, H, W]

    def forward(self, z, logdet=0.):
        for layer in self.layers:
            z, logdet = layer(z, logdet, reverse=False)
        return z, logdet


class Glow(nn.Module):
    def __init__(self, image_shape, hidden_channels, K, flow_coupling, batch_size):
        super().__init__()
        self.flow = FlowNet(image_shape, hidden_channels, K, flow_coupling)
        _, C, H, W = self.flow.output_shape
        self.register_parameter("prior_h", nn.Parameter(torch.zeros([batch_size, C * 2, H, W])))

    def prior(self):
        h = self.prior_h.detach().clone()
        return split_feature(h, "split")

    def forward(self, x):
        n_pixels = pixels(x)
        z = x + torch.normal(mean=torch.zeros_like(x), std=torch.ones_like(x) * (1. / 256.))
        logdet = torch.zeros_like(x[:, 0, 0, 0])
        logdet += float(-np.log(256.) * n_pixels)
        z, objective = self.flow(z, logdet=logdet)
        mean, logs = self.prior()
        objective += GaussianDiag.logp(mean, logs, z)
        nll = (-objective) / float(np.log(2.) * n_pixels)
        return z, nll, None

    @staticmethod
    def loss_generative(nll):
        return torch.mean(nll)


batch_size = 2
graph = Glow(image_shape=(4, 4, 3), hidden_channels=8, K=2, flow_coupling="affine",
             batch_size=batch_size).to(DEVICE)
optim = torch.optim.Adam(graph.parameters(), lr=1e-3)
for step in range(3):
    x = torch.rand(batch_size, 3, 4, 4, device=DEVICE) - 0.5
    z, nll, y_logits = graph(x=x)
    loss = Glow.loss_generative(nll)
    graph.zero_grad()
    optim.zero_grad()
    loss.backward()
    optim.step()
print("done")
