# expect-kind: second-backward
# expect-culprit: total
import torch
from _device import DEVICE

model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = torch.nn.MSELoss()

total = 0
for batch in range(4):
    x = torch.randn(16, 5, device=DEVICE)
    y = torch.randn(16, 1, device=DEVICE)
    loss = loss_fn(model(x), y)
    total = total + loss  # culprit
    optimizer.zero_grad()
    total.backward()
    optimizer.step()
print("done")
