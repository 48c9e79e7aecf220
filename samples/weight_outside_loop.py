# expect-kind: second-backward
# expect-culprit: w_hat
import torch
from _device import DEVICE

# Learn a unit-norm direction that best predicts the target.
true_dir = torch.tensor([0.6, -0.8, 0.0, 0.0, 0.0], device=DEVICE)
w = torch.randn(5, device=DEVICE, requires_grad=True)
optimizer = torch.optim.SGD([w], lr=0.1)
w_hat = w / w.norm()  # culprit

for step in range(4):
    x = torch.randn(16, 5, device=DEVICE)
    y = x @ true_dir
    loss = ((x @ w_hat - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
