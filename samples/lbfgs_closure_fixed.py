# expect-kind: none
# fix: LBFGS calls the closure several times per step, so the forward belongs inside it
import torch
from _device import DEVICE

x = torch.randn(32, 3, device=DEVICE)
y = x @ torch.tensor([[1.5], [-2.0], [0.5]], device=DEVICE) + 0.3
model = torch.nn.Linear(3, 1).to(DEVICE)
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
loss_fn = torch.nn.MSELoss()

for epoch in range(3):

    def closure():
        optimizer.zero_grad()
        pred = model(x)
        loss = loss_fn(pred, y)
        loss.backward()
        return loss

    optimizer.step(closure)
print("done")
