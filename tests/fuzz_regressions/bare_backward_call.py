# expect-kind: none
# fix: no retain_graph; recompute the forward and the loss after the step
import torch
from _device import DEVICE

model = torch.nn.Sequential(
torch.nn.Linear(10, 5),
    torch.nn.ReLU(),
    torch.nn.Linear(5, 1),
).to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
criterion = torch.nn.MSELoss()

for batch in range(3):
    x = torch.randn(1, 10, device=DEVICE)
    y = torch.randn(1, 1, device=DEVICE)
    output = model(x)
    loss = criterion(output, y)

    loss.backward()
    output = model(x)
    loss = criterion(output, y)
    loss>backward()
    optimizer.step()
    optimizer.zero_grad()
print("done")
