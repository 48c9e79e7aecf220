# source: https://github.com/synsense/sinabs/issues/5 — reset_states() zeroes the state buffers in place, so they keep the old graph and the 2nd loss.backward() fails (issue)
# fix-source: https://github.com/synsense/sinabs/commit/ffae161ae46e5a32057b98e199da1e9762c585c6 — maintainers' fix: buffer.zero_().detach_() in reset_states
# expect-kind: second-backward
# expect-culprit: self.v_mem
from typing import List

import torch
import torch.nn as nn
from _device import DEVICE


class SingleSpike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v_mem, threshold):
        ctx.save_for_backward(v_mem)
        ctx.threshold = threshold
        return (v_mem >= threshold).float()

    @staticmethod
    def backward(ctx, grad_output):
        (v_mem,) = ctx.saved_tensors
        surrogate = torch.clamp(1.0 - (v_mem - ctx.threshold).abs(), min=0.0)
        return grad_output * surrogate, None


def lif_forward(input_data, state, threshold):
    v_mem = state["v_mem"]
    spikes = []
    for step in range(input_data.shape[1]):
        v_mem = v_mem + input_data[:, step]
        spike = SingleSpike.apply(v_mem, threshold)
        v_mem = v_mem - spike * threshold
        spikes.append(spike)
    return torch.stack(spikes, 1), {"v_mem": v_mem}


class StatefulLayer(nn.Module):
    def __init__(self, state_names: List[str]):
        super().__init__()
        for state_name in state_names:
            self.register_buffer(state_name, torch.zeros((0)))

    def zero_grad(self, set_to_none: bool = False) -> None:
        super().zero_grad(set_to_none)
        if self.is_state_initialised():
            for b in self.buffers():
                if b.grad_fn is not None:
                    b.detach_()
                else:
                    b.requires_grad_(False)

    def is_state_initialised(self) -> bool:
        for buffer in self.buffers():
            if buffer.shape == torch.Size([0]):
                return False
        return True

    def state_has_shape(self, shape) -> bool:
        for buff in self.buffers():
            if buff.shape != shape:
                return False
        return True

    def init_state_with_shape(self, shape, randomize: bool = False) -> None:
        for name, buffer in self.named_buffers():
            self.register_buffer(name, torch.zeros(shape, device=buffer.device))
        self.reset_states(randomize=randomize)

    def reset_states(self, randomize=False):
        if self.is_state_initialised():
            for buffer in self.buffers():
                if randomize:
                    torch.nn.init.uniform_(buffer)
                else:
                    buffer.zero_()


class IAF(StatefulLayer):
    def __init__(self, threshold=1.0):
        super().__init__(state_names=["v_mem"])
        self.threshold = threshold

    def forward(self, input_data: torch.Tensor):
        batch_size, time_steps, *trailing_dim = input_data.shape
        if not self.is_state_initialised() or not self.state_has_shape((batch_size, *trailing_dim)):
            self.init_state_with_shape((batch_size, *trailing_dim))
        spikes, state = lif_forward(input_data, state=dict(self.named_buffers()), threshold=self.threshold)
        self.v_mem = state["v_mem"]  # culprit
        self.firing_rate = spikes.sum() / spikes.numel()
        return spikes


def reset_states(model):
    for layer in model.modules():
        if isinstance(layer, StatefulLayer):
            layer.reset_states()


model = nn.Sequential(nn.Linear(6, 8), IAF(), nn.Linear(8, 3)).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
criterion = nn.CrossEntropyLoss()
batches = [(torch.rand(4, 5, 6, device=DEVICE) * 2, torch.randint(0, 3, (4,), device=DEVICE)) for _ in range(3)]

for epoch in range(2):
    for data, target in batches:
        reset_states(model)
        optimizer.zero_grad()
        out = model(data)
        loss = criterion(out.sum(1), target)
        loss.backward()
        optimizer.step()
print("done")
