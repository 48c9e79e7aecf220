# expect-kind: second-backward
# expect-culprit: pred
import torch
from _device import DEVICE

x = torch.randn(32, 3, device=DEVICE)
y = x @ torch.tensor([[1.5], [-2.0], [0.5]], device=DEVICE) + 0.3
model = torch.nn.Linear(3, 1).to(DEVICE)
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
loss_fn = torch.nn.MSELoss()

for epoch in range(3):
    pred = model(x)  # culprit

    def closure():
        optimizer.zero_grad()
        loss = loss_fn(pred, y)
        loss.backward()
        return loss

    optimizer.step(closure)
print("done")
