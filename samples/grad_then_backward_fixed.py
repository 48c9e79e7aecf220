# expect-kind: none
# fix: create_graph=True keeps the graph and makes the penalty differentiable
import torch
from _device import DEVICE

# Regression with an input-gradient penalty ("double backprop") for smoothness.
model = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
penalty_weight = 0.1

for step in range(4):
    inputs = torch.randn(16, 3, device=DEVICE, requires_grad=True)
    targets = torch.randn(16, 1, device=DEVICE)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    grads = torch.autograd.grad(loss, inputs, create_graph=True)
    penalty = grads[0].pow(2).sum(1).mean()
    optimizer.zero_grad()
    (loss + penalty_weight * penalty).backward()
    optimizer.step()
print("done")
