# expect-kind: none
import torch
from _device import DEVICE

model = torch.nn.Sequential(
    torch.nn.Linear(10, 5),
    torch.nn.ReLU(),
    torch.nn.Linear(5, 1),
).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
criterion = torch.nn.MSELoss()

for batch in range(3):
    x = torch.randn(1, 10, device=DEVICE)
    y1 = torch.randn(1, 1, device=DEVICE)
    y2 = torch.randn(1, 1, device=DEVICE)
    output1 = model(x)
    output2 = model(x)
    loss1 = criterion(output1, y1)
    loss2 = criterion(output2, y2)

    loss1.backward(retain_graph=True)
    loss2.backward()
    optimizer.step()
    optimizer.zero_grad()
print("done")
