# expect-kind: none
# fix: back-propagate each batch's loss; keep the running total as a plain number
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
    total += loss.item()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
