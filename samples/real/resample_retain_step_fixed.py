# source: https://github.com/JerryYLi/bg-resample-ood/issues/1 — issue: train_epoch_resample does loss.backward(retain_graph=True), optimizer.step(), then loss_w.backward() through the same outputs: "[512, 10], output 0 of TBackward, is at version 2; expected version 1"
# fix-source: reporter's comment in the issue (back-propagate loss_w before the classifier is updated), with loss_w's backward kept to the resampling weights so each optimizer still gets the gradient it got before
# expect-kind: none
# fix: both backwards before either step (loss_w's backward restricted to weight_params), then optimizer.step() and optimizer_w.step()
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.features(x))


def loss2(outputs, weights):
    # weighted cross-entropy of the background samples to the uniform label
    return (weights * -F.log_softmax(outputs, dim=1).mean(1)).mean()


model = Net().to(DEVICE)
weight_params = torch.zeros(20, device=DEVICE, requires_grad=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
optimizer_w = torch.optim.SGD([weight_params], lr=1.0)
model.eval()

for i in range(4):
    inputs, targets = torch.randn(4, 6, device=DEVICE), torch.randint(0, 3, (4,), device=DEVICE)
    indices = torch.randint(0, 20, (4,), device=DEVICE)
    inputs2 = torch.randn(4, 6, device=DEVICE)
    N = inputs.size(0)
    inputs = torch.cat((inputs, inputs2), 0)

    # resampling weights
    w = F.softplus(weight_params)
    scale = (w ** .5).mean() / (w.mean() ** .5)
    weights = scale * (w[indices] / w.mean()) ** .5

    # forward
    outputs = model(inputs)
    loss = F.cross_entropy(outputs[:N], targets)
    loss_ood = loss2(outputs[N:], weights)
    loss += loss_ood
    loss_w = -loss_ood

    # backward
    optimizer.zero_grad()
    loss.backward(retain_graph=True)
    optimizer_w.zero_grad()
    loss_w.backward(inputs=[weight_params])
    optimizer.step()
    optimizer_w.step()
print("done")
