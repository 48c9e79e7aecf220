# source: https://github.com/jeshraghian/snntorch/issues/250 — spiking CNN with init_hidden=True Leaky neurons: "Trying to backward through the graph a second time" on the 2nd batch (issue)
# fix-source: https://github.com/jeshraghian/snntorch/issues/250 — resolution in the thread: call utils.reset(self.net) at the start of forward
# expect-kind: second-backward
# expect-culprit: self.mem
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


class FastSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_, slope=25):
        ctx.save_for_backward(input_)
        ctx.slope = slope
        return (input_ > 0).float()

    @staticmethod
    def backward(ctx, grad_output):
        (input_,) = ctx.saved_tensors
        return grad_output / (ctx.slope * torch.abs(input_) + 1.0) ** 2, None


class Leaky(nn.Module):
    def __init__(self, beta, threshold=1.0, init_hidden=False, output=False):
        super().__init__()
        self.beta = beta
        self.threshold = threshold
        self.init_hidden = init_hidden
        self.output = output
        self.mem = torch.zeros(1)

    def reset_hidden(self):
        self.mem = torch.zeros(1)

    def forward(self, input_):
        mem = self.mem.to(input_.device)
        reset = (mem - self.threshold > 0).float().detach()
        self.mem = self.beta * mem + input_ - reset * self.threshold  # culprit
        spk = FastSigmoid.apply(self.mem - self.threshold)
        if self.output:
            return spk, self.mem
        return spk


def reset(net):
    for m in net.modules():
        if isinstance(m, Leaky) and m.init_hidden:
            m.reset_hidden()


utils = SimpleNamespace(reset=reset)


class Net(nn.Module):
    def __init__(self, num_steps, beta=0.5):
        super().__init__()
        self.num_steps = num_steps
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.MaxPool2d(2),
            Leaky(beta=beta, init_hidden=True),
            nn.Flatten(),
            nn.Linear(4 * 4 * 4, 3),
            Leaky(beta=beta, init_hidden=True, output=True),
        )

    def forward(self, x):
        mem_rec = []
        spk_rec = []
        for step in range(self.num_steps):
            spk_out, mem_out = self.net(x)
            spk_rec.append(spk_out)
            mem_rec.append(mem_out)
        return torch.stack(spk_rec), torch.stack(mem_rec)


model = Net(num_steps=4).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
train_loader = [(torch.rand(4, 1, 8, 8, device=DEVICE) * 2, torch.randint(0, 3, (4,), device=DEVICE)) for _ in range(3)]

for epoch in range(2):
    for data, targets in train_loader:
        model.train()
        spk_rec, mem_rec = model(data)
        loss_val = torch.zeros(1, device=DEVICE)
        for step in range(model.num_steps):
            loss_val += F.cross_entropy(mem_rec[step], targets)
        optimizer.zero_grad()
        loss_val.backward()
        optimizer.step()
print("done")
