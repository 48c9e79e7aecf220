# expect-kind: second-backward
# expect-culprit: hidden
# Truncated BPTT under Hugging Face accelerate: `accelerator.backward(loss)` calls
# `loss.backward()` inside accelerate, whose frames are library code. The explanation names the
# user's `hidden` and line, and the user's `accelerator.backward(loss)` as the backward.
import torch
from _device import DEVICE
from accelerate import Accelerator

accelerator = Accelerator(cpu=DEVICE.type == "cpu")
model = torch.nn.GRU(3, 5, batch_first=True)
head = torch.nn.Linear(5, 1)
optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
model, head, optimizer = accelerator.prepare(model, head, optimizer)
hidden = torch.zeros(1, 2, 5, device=accelerator.device)
for step in range(4):
    x = torch.randn(2, 4, 3, device=accelerator.device)
    out, hidden = model(x, hidden)  # culprit
    loss = head(out).pow(2).mean()
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
