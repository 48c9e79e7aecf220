# expect-kind: second-backward
# expect-culprit: cache["prev"]
import torch
from _device import DEVICE

# Autoregressive predictor: each step sees its own previous prediction.
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
cache = {}

for step in range(4):
    x = torch.randn(2, 3, device=DEVICE)
    target = torch.randn(2, 3, device=DEVICE)
    prev = cache.get("prev", torch.zeros(2, 3, device=DEVICE))
    out = model(torch.cat([x, prev], 1))
    cache["prev"] = out  # culprit
    loss = torch.nn.functional.mse_loss(out, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
