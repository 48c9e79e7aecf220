# expect-kind: second-backward
# expect-culprit: features
import torch
from _device import DEVICE

trunk = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU()).to(DEVICE)
cls_head = torch.nn.Linear(16, 3).to(DEVICE)
reg_head = torch.nn.Linear(16, 1).to(DEVICE)
params = [*trunk.parameters(), *cls_head.parameters(), *reg_head.parameters()]
optimizer = torch.optim.Adam(params, lr=1e-3)

for step in range(4):
    x = torch.randn(8, 6, device=DEVICE)
    labels = torch.randint(0, 3, (8,), device=DEVICE)
    targets = torch.randn(8, 1, device=DEVICE)
    features = trunk(x)  # culprit
    loss1 = torch.nn.functional.cross_entropy(cls_head(features), labels)
    loss2 = torch.nn.functional.mse_loss(reg_head(features), targets)
    optimizer.zero_grad()
    loss1.backward()
    loss2.backward()
    optimizer.step()
print("done")
