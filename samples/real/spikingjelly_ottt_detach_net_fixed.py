# source: https://github.com/fangwei123456/spikingjelly/issues/593 — issue: functional.ottt_online_training fails with "Trying to backward through the graph a second time" on the 2nd time step; the neurons' state is never detached
# fix-source: https://github.com/fangwei123456/spikingjelly/pull/754 — merged fix: ottt_online_training calls detach_net(model) after each time step's backward and online optimizer step
# expect-kind: none
# fix: ottt_online_training calls detach_net(model) after each time step's backward and optimizer step, so the LIF membrane starts every step detached (spikingjelly PR #754)
import copy

import torch
from torch import nn
from torch.nn import functional as F
from _device import DEVICE


class sigmoid(torch.autograd.Function):
    """Heaviside forward, sigmoid-derivative surrogate backward."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return (x >= 0).to(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        sg = torch.sigmoid(ctx.alpha * x)
        return grad_output * (1.0 - sg) * sg * ctx.alpha, None


class Sigmoid(nn.Module):
    def __init__(self, alpha=4.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return sigmoid.apply(x, self.alpha)


class MemoryModule(nn.Module):
    def __init__(self):
        super().__init__()
        self._memories = {}
        self._memories_rv = {}

    def register_memory(self, name, value):
        self._memories[name] = value
        self._memories_rv[name] = copy.deepcopy(value)

    def reset(self):
        for key in self._memories:
            self._memories[key] = copy.deepcopy(self._memories_rv[key])

    def detach(self):
        for key in self._memories:
            if isinstance(self._memories[key], torch.Tensor):
                self._memories[key].detach_()

    def __getattr__(self, name):
        memories = self.__dict__.get("_memories")
        if memories is not None and name in memories:
            return memories[name]
        return super().__getattr__(name)

    def __setattr__(self, name, value):
        memories = self.__dict__.get("_memories")
        if memories is not None and name in memories:
            memories[name] = value
        else:
            super().__setattr__(name, value)


class LIFNode(MemoryModule):
    def __init__(self, tau=2.0, decay_input=True, v_threshold=1.0, v_reset=0.0,
                 surrogate_function=Sigmoid(), detach_reset=False):
        super().__init__()
        self.tau, self.decay_input = tau, decay_input
        self.v_threshold, self.v_reset = v_threshold, v_reset
        self.surrogate_function, self.detach_reset = surrogate_function, detach_reset
        self.register_memory("v", 0.0 if v_reset is None else v_reset)

    def v_float_to_tensor(self, x):
        if isinstance(self.v, float):
            self.v = torch.full_like(x, self.v)

    def neuronal_charge(self, x):
        if self.decay_input:
            self.v = self.v + (self.v_reset - self.v + x) / self.tau
        else:
            self.v = self.v - (self.v - (0.0 if self.v_reset is None else self.v_reset)) / self.tau + x

    def neuronal_reset(self, spike):
        spike_d = spike.detach() if self.detach_reset else spike
        if self.v_reset is None:
            self.v = self.v - spike_d * self.v_threshold
        else:
            self.v = (1.0 - spike_d) * self.v + spike_d * self.v_reset

    def forward(self, x):
        self.v_float_to_tensor(x)
        self.neuronal_charge(x)
        spike = self.surrogate_function(self.v - self.v_threshold)
        self.neuronal_reset(spike)
        return spike


class OTTTLIFNode(LIFNode):
    def __init__(self, tau=2.0, decay_input=False, v_threshold=1.0, v_reset=None,
                 surrogate_function=Sigmoid(), detach_reset=True):
        super().__init__(tau, decay_input, v_threshold, v_reset, surrogate_function, detach_reset)
        self.register_memory("trace", None)

    @staticmethod
    def track_trace(spike, trace, tau):
        with torch.no_grad():
            return trace * (1.0 - 1.0 / tau) + spike

    def forward(self, x):
        self.v_float_to_tensor(x)
        if self.training:
            self.v = self.v.detach()  # OTTT: no gradient through the membrane across time steps
        spike = super().forward(x)
        if not self.training:
            return spike
        if self.trace is None:
            self.trace = torch.zeros_like(spike)
        self.trace = self.track_trace(spike, self.trace, self.tau)
        return [spike, self.trace]


class ReplaceforGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, x_r):
        return x_r

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


def _grad_with_trace(module, x):
    spike, trace = x
    with torch.no_grad():
        out = module(spike)
    out_for_grad = module(ReplaceforGrad.apply(spike, trace))
    return ReplaceforGrad.apply(out_for_grad, out)


def _apply_to_spike_and_trace(module, x):
    spike, trace = x
    spike = module(spike)
    with torch.no_grad():
        trace = module(trace)
    return [spike, trace]


class OTTTSequential(nn.Sequential):
    def forward(self, input):
        for module in self:
            if isinstance(input, list):
                if next(module.parameters(), None) is None:
                    input = _apply_to_spike_and_trace(module, input)
                else:
                    input = _grad_with_trace(module, input)
                continue
            input = module(input)
        return input


def reset_net(net):
    for m in net.modules():
        if hasattr(m, "reset"):
            m.reset()


def detach_net(net):
    for m in net.modules():
        if isinstance(m, MemoryModule):
            m.detach()


def ottt_online_training(model, optimizer, x_seq, target_seq, f_loss_t, online):
    x_seq = x_seq.transpose(0, 1)
    target_seq = target_seq.transpose(0, 1)
    batch_loss = 0.0
    y_all = []
    if not online:
        optimizer.zero_grad()
    for t, x_t in enumerate(x_seq):
        target_t = target_seq[t]
        if online:
            optimizer.zero_grad()
        y_t = model(x_t)
        loss = f_loss_t(y_t, target_t.contiguous())
        loss.backward()
        if online:
            optimizer.step()
        detach_net(model)
        batch_loss += loss.detach()
        y_all.append(y_t.detach())
    if not online:
        optimizer.step()
    return batch_loss, torch.stack(y_all, dim=1)


net = OTTTSequential(
    nn.Linear(8, 4),
    OTTTLIFNode(),
    nn.Linear(4, 2),
    LIFNode(),
).to(DEVICE)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

T = 4
N = 2
online = True
for epoch in range(2):
    x_seq = torch.rand([N, T, 8], device=DEVICE)
    target_seq = torch.rand([N, T, 2], device=DEVICE)
    ottt_online_training(model=net, optimizer=optimizer, x_seq=x_seq, target_seq=target_seq,
                         f_loss_t=F.mse_loss, online=online)
    reset_net(net)
print("done")
