# expect-kind: no-grad
# expect-culprit: out
import torch
from _device import DEVICE

model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

for step in range(3):
    x = torch.randn(8, 4, device=DEVICE)
    y = torch.randn(8, 1, device=DEVICE)
    with torch.no_grad():
        out = model(x)  # culprit
    loss = torch.nn.functional.mse_loss(out, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
