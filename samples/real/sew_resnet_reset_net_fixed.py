# source: https://github.com/fangwei123456/Spike-Element-Wise-ResNet/issues/19 — SEW-ResNet backbone in a fit_one_epoch loop: backward fails in the neuron kernel on the 2nd batch (issue)
# fix-source: https://github.com/fangwei123456/Spike-Element-Wise-ResNet/issues/19 — maintainer's comment: reset the network state (functional.reset_net) after each backward
# expect-kind: none
# fix: reset_net(model_train) after each optimizer step, so every batch starts from a fresh membrane state
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


class ATan(torch.autograd.Function):
    """Heaviside spike forward, arctan surrogate gradient backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x >= 0).to(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output / (1 + (torch.pi * x) ** 2)


class MultiStepIFNode(nn.Module):
    def __init__(self, v_threshold=1.0, v_reset=0.0):
        super().__init__()
        self.v_threshold = v_threshold
        self.v_reset = v_reset
        self.v = v_reset

    def reset(self):
        self.v = self.v_reset

    def forward(self, x_seq):
        spike_seq = []
        for t in range(x_seq.shape[0]):
            h = self.v + x_seq[t]
            spike = ATan.apply(h - self.v_threshold)
            self.v = h * (1.0 - spike) + self.v_reset * spike
            spike_seq.append(spike)
        return torch.stack(spike_seq)


class SeqToANNContainer(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.module = nn.Sequential(*args)

    def forward(self, x_seq):
        y = self.module(x_seq.flatten(0, 1))
        return y.view(x_seq.shape[0], x_seq.shape[1], *y.shape[1:])


class BasicBlock(nn.Module):
    def __init__(self, planes, connect_f="ADD"):
        super().__init__()
        self.connect_f = connect_f
        self.conv1 = SeqToANNContainer(nn.Conv2d(planes, planes, 3, padding=1, bias=False), nn.BatchNorm2d(planes))
        self.sn1 = MultiStepIFNode()
        self.conv2 = SeqToANNContainer(nn.Conv2d(planes, planes, 3, padding=1, bias=False), nn.BatchNorm2d(planes))
        self.sn2 = MultiStepIFNode()

    def forward(self, x):
        identity = x
        out = self.sn1(self.conv1(x))
        out = self.sn2(self.conv2(out))
        if self.connect_f == "ADD":
            out = out + identity
        return out


class SEWResNet(nn.Module):
    def __init__(self, T=2, planes=4, num_classes=3):
        super().__init__()
        self.T = T
        self.conv1 = nn.Conv2d(1, planes, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.sn1 = MultiStepIFNode()
        self.layer1 = BasicBlock(planes)
        self.fc = nn.Linear(planes, num_classes)

    def forward(self, x):
        x = self.bn1(self.conv1(x))
        x_seq = x.unsqueeze(0).repeat(self.T, 1, 1, 1, 1)
        x_seq = self.layer1(self.sn1(x_seq))
        x_seq = x_seq.mean(dim=(3, 4))
        return self.fc(x_seq.mean(0))


def reset_net(net):
    for m in net.modules():
        if hasattr(m, "reset"):
            m.reset()


def fit_one_epoch(model_train, loss_fn, optimizer, epoch, epoch_step, gen):
    loss = 0
    model_train.train()
    for iteration, batch in enumerate(gen):
        if iteration >= epoch_step:
            break
        images, targets = batch
        optimizer.zero_grad()
        outputs = model_train(images)
        loss_value = loss_fn(outputs, targets)
        loss_value.backward()
        optimizer.step()
        reset_net(model_train)
        loss += loss_value.item()
    return loss / epoch_step


model = SEWResNet().to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
gen = [(torch.randn(4, 1, 6, 6, device=DEVICE), torch.randint(0, 3, (4,), device=DEVICE)) for _ in range(3)]
for epoch in range(2):
    fit_one_epoch(model, F.cross_entropy, optimizer, epoch, len(gen), gen)
print("done")
