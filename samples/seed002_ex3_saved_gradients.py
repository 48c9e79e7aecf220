# expect-kind: none
import torch
from _device import DEVICE

model = torch.nn.Linear(10, 1).to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
criterion = torch.nn.MSELoss()

for batch in range(3):
    x = torch.randn(1, 10, device=DEVICE)
    y = torch.randn(1, 1, device=DEVICE)
    loss = criterion(model(x), y)

    loss.backward()
    saved_grads = [p.grad.clone().detach() for p in model.parameters()]
    optimizer.step()
    optimizer.zero_grad()

    for p, g in zip(model.parameters(), saved_grads):
        p.grad = g
    optimizer.step()
    optimizer.zero_grad()
print("done")
