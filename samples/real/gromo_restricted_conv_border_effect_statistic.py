# source: https://github.com/growingnet/gromo/issues/96 — issue: memory leak in RestrictedConv2dGrowingModule when using cross-module input (the M_prev / cross-covariance statistics keep every batch's graph)
# fix-source: https://github.com/growingnet/gromo/pull/97 (commit 02b2423b) — maintainer's fix: apply_border_effect_on_unfolded decorated with @torch.no_grad
# expect-kind: graph-growth
# expect-culprit: self._tensor
import torch
from _device import DEVICE


class TensorStatistic:
    """A tensor averaged over the samples of several batches, updated batch by batch."""

    def __init__(self, shape, update_function, device=None, name=None):
        self._shape = shape
        self._update_function = update_function
        self.name = name if name is not None else "TensorStatistic"
        self._tensor = None
        self.samples = 0
        self.updated = True
        self.device = device

    def update(self, **kwargs):
        if self.updated is False:
            update, nb_sample = self._update_function(**kwargs)
            if self._tensor is not None:
                self._tensor += update  # culprit
            else:
                self._tensor = update
            self.samples += nb_sample
            self.updated = True

    def init(self):
        if self._shape is None:
            self._tensor = None
        else:
            self._tensor = torch.zeros(self._shape, device=self.device)
        self.samples = 0

    def reset(self):
        self._tensor = None
        self.samples = 0

    def __call__(self):
        return self._tensor / self.samples


def apply_border_effect_on_unfolded(unfolded_tensor, original_size, border_effect_conv):
    """Simulate the size effect of `border_effect_conv` on an unfolded tensor (1x1 centred kernel)."""
    unfolded_tensor = unfolded_tensor.reshape(
        unfolded_tensor.shape[0], unfolded_tensor.shape[1], original_size[0], original_size[1]
    )
    channels = unfolded_tensor.shape[1]
    identity_conv = torch.nn.Conv2d(
        channels, channels, kernel_size=border_effect_conv.kernel_size,
        padding=border_effect_conv.padding, stride=border_effect_conv.stride,
        dilation=border_effect_conv.dilation, bias=False,
    )
    identity_conv.weight.data.fill_(0)
    mid = (border_effect_conv.kernel_size[0] // 2, border_effect_conv.kernel_size[1] // 2)
    identity_conv.weight.data[:, :, mid[0]:mid[0] + 1, mid[1]:mid[1] + 1] = (
        torch.eye(channels).unsqueeze(-1).unsqueeze(-1)
    )
    identity_conv.weight.data = identity_conv.weight.data.to(unfolded_tensor.device)
    unfolded_tensor = identity_conv(unfolded_tensor)
    return unfolded_tensor.flatten(start_dim=2)


class Conv2dGrowingModule(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, padding=0, use_bias=True,
                 previous_module=None, device=None, name=None):
        super().__init__()
        self.layer = torch.nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding,
                                     bias=use_bias, device=device)
        self.post_layer_function = torch.nn.ReLU()
        self.previous_module = previous_module
        self.kernel_size = self.layer.kernel_size
        self.use_bias = use_bias
        self.device = device
        self.name = name
        self.input_size = (-1, -1)
        self.store_input = False
        self._input = None
        self._pre_activity = None
        d = use_bias + in_channels * self.kernel_size[0] * self.kernel_size[1]
        self.tensor_s = TensorStatistic((d, d), self.compute_s_update, device, f"S({name})")
        self.tensor_m = TensorStatistic((d, out_channels), self.compute_m_update, device, f"M({name})")

    def forward(self, x):
        self.tensor_s.updated = False
        self.tensor_m.updated = False
        if self.store_input:
            self._input = x.detach()
        pre_activity = self.layer(x)
        if self.store_input:
            self._pre_activity = pre_activity
            self._pre_activity.retain_grad()
        return self.post_layer_function(pre_activity)

    @property
    def input(self):
        return self._input

    def update_input_size(self):
        self.input_size = tuple(self.input.shape[-2:])

    @property
    def unfolded_extended_input(self):
        unfolded_input = torch.nn.functional.unfold(
            self.input, self.layer.kernel_size, padding=self.layer.padding,
            stride=self.layer.stride, dilation=self.layer.dilation,
        )
        ones = torch.ones(unfolded_input.shape[0], 1, unfolded_input.shape[2], device=self.device)
        return torch.cat((unfolded_input, ones), dim=1) if self.use_bias else unfolded_input

    def compute_s_update(self):
        b = self.unfolded_extended_input
        return torch.einsum("iam, ibm -> ab", b, b), self.input.shape[0]

    def compute_m_update(self, desired_activation=None):
        if desired_activation is None:
            desired_activation = self._pre_activity.grad
        desired_activation = desired_activation.flatten(start_dim=-2)
        return torch.einsum("iam, icm -> ac", self.unfolded_extended_input, desired_activation), \
            self.input.shape[0]

    def compute_optimal_delta(self):
        tensor_s, tensor_m = self.tensor_s(), self.tensor_m()
        try:
            self.delta_raw = torch.linalg.solve(tensor_s, tensor_m).t()
        except torch.linalg.LinAlgError:
            self.delta_raw = (torch.linalg.pinv(tensor_s) @ tensor_m).t()
        delta_weight = self.delta_raw[:, :-1] if self.use_bias else self.delta_raw
        delta_bias = self.delta_raw[:, -1] if self.use_bias else None
        return delta_weight.reshape(*self.layer.weight.shape), delta_bias

    def parameter_step(self, delta_weights, delta_biases=None):
        self.layer.weight.data += delta_weights
        if delta_biases is not None:
            self.layer.bias.data += delta_biases


class RestrictedConv2dGrowingModule(Conv2dGrowingModule):
    """Conv2dGrowingModule for a growth scheme Conv -> Conv 1x1."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tensor_m_prev = TensorStatistic(None, self.compute_m_prev_update, self.device,
                                             f"M_prev({self.name})")
        self.cross_covariance = TensorStatistic(None, self.compute_cross_covariance_update,
                                                self.device, f"C({self.name})")

    def forward(self, x):
        self.tensor_m_prev.updated = False
        self.cross_covariance.updated = False
        return super().forward(x)

    @property
    def bordered_unfolded_extended_prev_input(self):
        self.previous_module.update_input_size()
        return apply_border_effect_on_unfolded(
            unfolded_tensor=self.previous_module.unfolded_extended_input,
            original_size=self.previous_module.input_size,
            border_effect_conv=self.layer,
        )

    def compute_m_prev_update(self, desired_activation=None):
        if desired_activation is None:
            desired_activation = self._pre_activity.grad
        desired_activation = desired_activation.flatten(start_dim=-2)
        unfolded_extended_input = self.bordered_unfolded_extended_prev_input
        return torch.einsum("iax, icx -> ac", unfolded_extended_input, desired_activation), \
            desired_activation.shape[0]

    def compute_cross_covariance_update(self):
        return torch.einsum("iax, ibx -> ab", self.bordered_unfolded_extended_prev_input,
                            self.unfolded_extended_input), self.input.shape[0]

    def init_computation(self):
        self.store_input = True
        self.tensor_s.init()
        self.tensor_m.init()
        self.previous_module.store_input = True
        self.tensor_m_prev.init()
        self.cross_covariance.init()

    def update_computation(self):
        self.tensor_s.update()
        self.tensor_m.update()
        self.tensor_m_prev.update()
        self.cross_covariance.update()

    def reset_computation(self):
        self.store_input = False
        self.previous_module.store_input = False
        for statistic in (self.tensor_s, self.tensor_m, self.tensor_m_prev, self.cross_covariance):
            statistic.reset()


first = Conv2dGrowingModule(2, 3, 3, padding=1, device=DEVICE, name="conv1")
second = RestrictedConv2dGrowingModule(3, 2, 3, padding=1, previous_module=first, device=DEVICE,
                                       name="conv2")
batches = [(torch.randn(2, 2, 6, 6, device=DEVICE), torch.randn(2, 2, 6, 6, device=DEVICE))
           for _ in range(4)]

second.init_computation()
for x, target in batches:
    first.zero_grad()
    second.zero_grad()
    y = second(first(x))
    loss = ((y - target) ** 2).sum()
    loss.backward()
    second.update_computation()

delta_weight, delta_bias = second.compute_optimal_delta()
second.parameter_step(-0.01 * delta_weight, -0.01 * delta_bias)
second.reset_computation()
print("done")
