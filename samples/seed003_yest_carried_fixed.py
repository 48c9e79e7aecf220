# expect-kind: none
# fix: start each gradient-descent iteration from the buffer under a fresh local name
import torch
from _device import DEVICE

# Unrolled one-node recurrence y(t) = y(t-1) + w * x(t), trained by gradient descent.
X = torch.randn(100, 1, device=DEVICE)
Y = torch.randn(100, 1, device=DEVICE)

n_gd = 5
n_time = 5
gamma = 0.1
w = torch.randn(1, 1, device=DEVICE, requires_grad=True)
Yest = 0.5 * torch.ones(100, 1, device=DEVICE)  # allocated once, reused every iteration

for i_gd in range(n_gd):
    Yest_local = Yest
    for i_time in range(n_time):
        Yest_local = Yest_local + w * X
    cost = torch.mean((Y - Yest_local) ** 2)
    cost.backward()
    with torch.no_grad():
        w -= gamma * w.grad
        w.grad.zero_()
print("done")
